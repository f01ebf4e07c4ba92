"""What SimCSETrainer relies on of `transformers.Trainer` beyond its public hooks, in one place: the private methods
it overrides (at most three), each with the reason no public hook serves, and the check that an installed
transformers still has them (SimCSETrainer refuses to start without; tests/test_trainer_hooks.py
runs it on every CI run).

Everything else stands on public hooks: compute_loss, get_train_dataloader, get_eval_dataloader, prediction_step,
save_model, log, train, and callbacks (training.callbacks: the non-finite gradient guard, the sampler's epoch and
saved schedule, topic re-clustering, the checkpoint commit (training.checkpoints.CheckpointCommit), checkpoint
rotation and keep-the-best at the end). Not relied on: the Trainer's
batch size of the moment (`_train_batch_size`: `args.train_batch_size`; auto_find_batch_size is not followed), its
input preparation (`_prepare_inputs`), the tuple of `set_initial_training_values` (`planned_steps` below) and a
hyperparameter-search trial's folder (`_get_output_dir`: checkpoints are output_dir's). The loss's scaling under
gradient accumulation is set through the model's public `accepts_loss_kwargs` (SimCSETrainer.__init__), which every
5.x Trainer reads; the Trainer's class attribute `loss_is_scaled_for_ga` is newer than 5.17."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math

from transformers import Trainer

logger = logging.getLogger(__name__)

@dataclasses.dataclass(frozen=True)
class TrainerInternal:
    """A part of `transformers.Trainer` outside its public hooks that SimCSETrainer relies on: its `name`, the
    parameters after `self` it is overridden with, `why` no public hook serves, and
    whether a Trainer without it would train or load wrongly (`essential`) or only more slowly."""

    name: str
    parameters: tuple[str, ...]
    why: str
    essential: bool = True


PRIVATE_TRAINER_OVERRIDES = (
    TrainerInternal("_get_grad_norm", ("model", "grad_norm"), "the step's total gradient norm, which the Trainer "
                    "computes anyway for clipping and logging, goes to the non-finite guard: a finite norm spares it "
                    "a pass over every gradient. No callback receives the norm.", essential=False),
    TrainerInternal("_load_from_checkpoint", ("resume_from_checkpoint", "model"), "a resume loads the saved folder's "
                    "own files (encoder in transformers format, head, loss state: SimCSEModel.load_weights). "
                    "SimCSEModel is no PreTrainedModel: the Trainer's loader, non-strict, would match none of its "
                    "keys and load nothing. A sharded model goes to the Trainer's loader."),
    TrainerInternal("_load_best_model", (), "load_best_model_at_end, for the same reason as _load_from_checkpoint."),
)  # fmt: skip


def trainer_internals_problems(trainer_class: type = Trainer) -> list[str]:
    """What `trainer_class` lacks of PRIVATE_TRAINER_OVERRIDES (a name gone, a method's
    parameters renamed or reordered), one line each; [] when it has them all."""
    return [problem for _, problem in _problems(trainer_class)]


def check_trainer_internals(trainer_class: type = Trainer) -> None:
    """Refuse (RuntimeError) an installed transformers whose Trainer lacks an essential one: an override that no
    longer overrides anything would leave the Trainer's own method running, silently (a resume loading no weights).
    Without one that is not essential, a warning: the run is slower, not wrong."""
    problems = _problems(trainer_class)
    fatal = [problem for internal, problem in problems if internal.essential]
    if fatal:
        raise RuntimeError("this transformers release lacks what SimCSETrainer relies on: " + "; ".join(fatal))
    for _, problem in problems:
        logger.warning("this transformers release lacks what SimCSETrainer uses: %s", problem)


def _problems(trainer_class: type) -> list[tuple[TrainerInternal, str]]:
    problems = []
    for internal in PRIVATE_TRAINER_OVERRIDES:
        where = f"{trainer_class.__name__}.{internal.name}"
        if not hasattr(trainer_class, internal.name):
            problems.append((internal, f"{where} is gone ({internal.why})"))
        else:
            member = getattr(trainer_class, internal.name)
            found = tuple(inspect.signature(member).parameters)[1:] if callable(member) else None
            if found != internal.parameters:
                shown = "not a method" if found is None else f"({', '.join(found)})"
                wanted = ", ".join(internal.parameters)
                problems.append((internal, f"{where} is {shown}, simcse-hn overrides ({wanted})"))
    return problems


def planned_steps(args, batches: int | None) -> int:
    """The optimizer steps of the whole run, as the Trainer plans them: `max_steps` when set, else `num_train_epochs`
    times an epoch's steps (its `batches` over the accumulation steps, rounded up, at least 1), rounded up. The
    Trainer's own count is the last of the tuple `set_initial_training_values` returns, whose order a release may
    change; tests/test_trainer_hooks.py holds this one to it."""
    if args.max_steps > 0:
        return args.max_steps
    per_epoch = max(math.ceil(batches / args.gradient_accumulation_steps), 1)
    return math.ceil(args.num_train_epochs * per_epoch)
