"""What SimCSETrainer relies on of `transformers.Trainer` beyond its public hooks: the private methods it overrides
(at most three; listed, each with the reason no public hook serves, with every other private member simcse-hn uses,
in simcse_hn.private_api) and the check that an installed transformers still has them (SimCSETrainer refuses to
start without; tests/test_trainer_hooks.py runs it on every CI run).

Everything else stands on public hooks: compute_loss, get_train_dataloader, get_eval_dataloader, prediction_step,
save_model, log, train, and callbacks (training.callbacks: the non-finite gradient guard; training.batches: the
sampler's epoch and saved schedule, topic re-clustering; the checkpoint commit (training.checkpoints.CheckpointCommit);
checkpoint rotation and keep-the-best at the end). Not relied on: the Trainer's batch size of the moment
(`_train_batch_size`: `args.train_batch_size`; auto_find_batch_size is not followed), its input preparation
(`_prepare_inputs`), the tuple of `set_initial_training_values` (`planned_steps` below) and a hyperparameter-search
trial's folder (`_get_output_dir`: checkpoints are output_dir's). The loss's scaling under gradient accumulation is set
through the model's public `accepts_loss_kwargs` (SimCSETrainer.__init__), which every 5.x Trainer reads; the Trainer's
class attribute `loss_is_scaled_for_ga` is newer than 5.17."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sized

from transformers import Trainer, TrainerState

from simcse_hn.private_api import PRIVATE_TRAINER_OVERRIDES, problems
from simcse_hn.training.checkpoints import TRAINER_STATE

logger = logging.getLogger(__name__)


def trainer_internals_problems(trainer_class: type = Trainer) -> list[str]:
    """What `trainer_class` lacks of PRIVATE_TRAINER_OVERRIDES (a name gone, a method's
    parameters renamed or reordered), one line each; [] when it has them all."""
    return [problem for _, problem in problems(trainer_class, PRIVATE_TRAINER_OVERRIDES)]


def check_trainer_internals(trainer_class: type = Trainer) -> None:
    """Refuse (RuntimeError) an installed transformers whose Trainer lacks an essential one: an override that no
    longer overrides anything would leave the Trainer's own method running, silently (a resume loading no weights).
    Without one that is not essential, a warning: the run is slower, not wrong."""
    found = problems(trainer_class, PRIVATE_TRAINER_OVERRIDES)
    fatal = [problem for member, problem in found if member.essential]
    if fatal:
        raise RuntimeError("this transformers release lacks what SimCSETrainer relies on: " + "; ".join(fatal))
    for _, problem in found:
        logger.warning("this transformers release lacks what SimCSETrainer uses: %s", problem)


def planned_steps(args, batches: int | None) -> int:
    """The optimizer steps of the whole run, as the Trainer plans them: `max_steps` when set, else `num_train_epochs`
    times an epoch's steps (its `batches` over the accumulation steps, rounded up, at least 1), rounded up. The
    Trainer's own count is the last of the tuple `set_initial_training_values` returns, whose order a release may
    change; tests/test_trainer_hooks.py holds this one to it."""
    if args.max_steps > 0:
        return args.max_steps
    per_epoch = max(math.ceil(batches / args.gradient_accumulation_steps), 1)
    return math.ceil(args.num_train_epochs * per_epoch)


def reached_planned_steps(args, checkpoint: str, loader: Callable[[], Sized]) -> bool:
    """Whether `checkpoint` is already at the run's last step (a run killed during its final save, which the Trainer
    would train one step past). `loader`: the training DataLoader, whose batches count an epoch when max_steps does
    not set the run's length."""
    state = TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE))
    batches = None if args.max_steps > 0 else len(loader())
    return state.global_step >= planned_steps(args, batches)
