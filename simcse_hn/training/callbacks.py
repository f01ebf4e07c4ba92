"""SimCSETrainer's callbacks, each standing on its own (what it needs is given to it, not read from the trainer):
the loss diagnostics' clamp warning (docs/losses.md section 2), the non-finite gradient guard, checkpoint rotation
over this run's checkpoints only, and the progress bars, named. The training sampler's callback is
training.batches'."""

from __future__ import annotations

import logging
import math

import torch
from torch import Tensor
from transformers import ProgressCallback, TrainerCallback

from simcse_hn.losses.registry import flag_prefix
from simcse_hn.training import distributed
from simcse_hn.training.checkpoints import checkpoint_path, rotate_checkpoints

logger = logging.getLogger(__name__)


def debiasing_setting(args) -> str | None:
    """'loss NAME, NAME_tau_plus 0.001, temperature 0.05' (the prior named by its flag) for a debiased objective
    (one whose class prior, tau+, is > 0), else None. Options are named by their flags (a user's objective: by
    their loss_options keys)."""
    objective = getattr(args, "objective", None)
    if objective is None or objective.cls.class_prior is None:
        return None
    options = objective.options.as_dict()
    prior = objective.cls.class_prior
    if not options.get(prior, 0) > 0:
        return None
    prefix = flag_prefix(objective.cls)
    named = [(f"{prefix}_{key}" if prefix else key, options[key]) for key in (prior, *objective.cls.setting)]
    named.append(("temperature", args.temperature))
    return ", ".join([f"loss {args.loss}"] + [f"{name} {value:g}" for name, value in named])


def loss_setting(loss_fn) -> str:
    """'dcl, tau_plus 0.001, temperature 0.05': an objective's class prior and setting, named by its options (a
    sentence-transformers loss has no flags)."""
    options = loss_fn.options.as_dict()
    named = [(key, options[key]) for key in (loss_fn.class_prior, *loss_fn.setting) if key in options]
    named.append(("temperature", loss_fn.temperature))
    shown = [f"{key} {value:g}" if isinstance(value, float) else f"{key} {value}" for key, value in named]
    return ", ".join([loss_fn.name or type(loss_fn).__name__, *shown])


class ClampedBatches:
    """Counts the training batches in which the debiasing clamp of form (D) held for every anchor: no negative got a
    gradient and each positive at most n e^{-(1 + s_ip)/t} of one (s_ip its cosine), so the batch trained next to
    nothing (DCL's default prior on dropout pairs that the model already aligns). Warns once, at the first, naming
    the setting and what to change. `see` reads clamp_frac from the device once per batch, for a debiased setting
    only (prior > 0: without one the clamp cannot hold); SimCSETrainer and the sentence-transformers losses both
    count, and their logs carry the count as `clamped_batches`."""

    def __init__(self, setting: str | None):
        self.setting = setting  # None: nothing to count (no prior)
        self.count = 0
        self.last_key: object = None

    @classmethod
    def for_loss(cls, loss_fn, setting: str | None = None) -> ClampedBatches:
        """For objective `loss_fn`, its setting named by `setting` (the run's flags) or by its options."""
        return cls((setting or loss_setting(loss_fn)) if loss_fn.prior() > 0 else None)

    def see(self, metrics: dict[str, Tensor], step: int, key: object = None) -> None:
        """One training batch's diagnostics, at optimizer step `step` (1-based); `key` names the batch, so that a
        wrapper's several calls on one batch count it once."""
        if self.setting is None or "clamp_frac" not in metrics or (key is not None and key == self.last_key):
            return
        if float(metrics["clamp_frac"]) < 1.0:
            return
        self.last_key = key
        self.count += 1
        if self.count == 1 and distributed.rank() == 0:
            logger.warning(
                "step %d: the debiasing clamp held for every anchor of the batch (%s): no negative got a gradient and "
                "the positives next to none, so the batch trained nothing; lower the prior (tau_plus) or raise the "
                "temperature (docs/losses.md section 2). Such batches are counted as clamped_batches in the logs",
                step,
                self.setting,
            )


class ClampWarningCallback(TrainerCallback):
    """Warns once when the debiasing clamp of form (D) held for more than half of the anchors, on average over a
    logging window (`clamp_frac` in the logs, which SimCSETrainer averages over the window): those anchors' negatives
    get no gradient, so the objective has mostly stopped training. Only for a debiased setting (an objective whose
    class prior tau+ is > 0); the message names it. Register it with `trainer.add_callback(ClampWarningCallback())`.
    With `clamped` (the trainer's ClampedBatches) each training log also carries `clamped_batches`, the batches so
    far in which the clamp held for every anchor, and once that has warned (the same advice) this one stays quiet."""

    threshold = 0.5

    def __init__(self, clamped: ClampedBatches | None = None):
        self.warned = False
        self.clamped = clamped

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.clamped is not None and self.clamped.setting is not None and logs and "loss" in logs:
            logs["clamped_batches"] = self.clamped.count
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1]["clamped_batches"] = self.clamped.count
        if self.warned or not logs or "clamp_frac" not in logs:
            return
        if self.clamped is not None and self.clamped.count:  # its warning, stronger, already said what to change
            self.warned = True
            return
        setting = debiasing_setting(args)
        if setting is None or not logs["clamp_frac"] > self.threshold:
            return
        self.warned = True
        if state.is_world_process_zero:
            logger.warning(
                "step %d: the debiasing clamp held for %.0f%% of anchors over the last logging window (%s): their "
                "negatives get no gradient; lower the prior or raise the temperature (docs/losses.md section 2)",
                state.global_step,
                100 * logs["clamp_frac"],
                setting,
            )


class NonFiniteGradientGuard(TrainerCallback):
    """Skips the optimizer step when any gradient is NaN/inf (e.g. an fp16 overflow in the encoder): gradients are
    dropped (`grad = None`, so the optimizer leaves those weights and their moments alone) and the skip is counted
    (`skipped_steps`). Under DDP gradients are already all-reduced, so every process takes the same decision; under
    FSDP (`sharded`) the processes agree through one all-reduce of the verdict. With fp16's GradScaler
    (`scaler_skips`) the scaler already skips non-finite steps, and needs the gradients: the guard stands aside.

    `total_norm`: the step's total gradient norm when whoever runs the step has it (SimCSETrainer hands over the
    Trainer's, computed anyway for clipping and logging); each step consumes it. A finite one spares the guard its
    pass over every gradient (1 % of a MiniLM step on a CPU, bench/results/step_profile.md)."""

    def __init__(self, sharded: bool = False, scaler_skips: bool = False):
        self.sharded, self.scaler_skips = sharded, scaler_skips
        self.skipped_steps = 0
        self.total_norm: Tensor | float | None = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        norm, self.total_norm = self.total_norm, None
        if self.scaler_skips:
            return
        # under FSDP each process holds a shard of every gradient (a DTensor's local part, or a flat shard): the
        # processes decide together. Under DeepSpeed the gradients live in its optimizer (p.grad is None): its own.
        if norm is not None and not self.sharded and math.isfinite(float(norm)):
            return  # the step's total 2-norm is finite, so is every gradient: a NaN/inf anywhere makes it NaN/inf
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        grads = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
        if not grads and not self.sharded:
            return
        # no total norm, a sharded one, or a non-finite one (NaN/inf, or a finite gradient whose square overflows):
        # each gradient decides. It holds a NaN/inf iff its largest magnitude is NaN/inf: one reduction per gradient
        # (isfinite + any per gradient took 3-4 % of a MiniLM step on a CPU, bench/results/step_profile.md)
        largest = torch.stack(torch._foreach_norm(grads, math.inf)) if grads else torch.zeros(0)
        bad = ~torch.isfinite(largest).all()
        if self.sharded:
            bad = distributed.all_reduce_sum(bad.float().to(args.device)) > 0
        if bool(bad):  # one host synchronisation per optimizer step, outside the loss
            for p in model.parameters():
                p.grad = None
            self.skipped_steps += 1
            logger.warning("step %d: non-finite gradients, optimizer step skipped (%d so far)",
                           state.global_step + 1, self.skipped_steps)  # fmt: skip


class RotateCheckpoints(TrainerCallback):
    """`save_total_limit` (`limit`) over the checkpoints of run family `run_id` only (simcse_hn.training.checkpoints).
    transformers' own rotation deletes any `checkpoint-*` folder of output_dir, whoever wrote it: SimCSETrainer keeps
    the limit from the Trainer and gives it to this callback. After each save, the oldest checkpoints of the family
    beyond the limit go, never the one just written, the best, nor the newest whole one. Registered after
    CheckpointCommit, it rotates once the new checkpoint's manifest is written. At the end of training, as
    transformers does, a limit of 1 keeps the best checkpoint only."""

    def __init__(self, limit: int | None, run_id: str):
        self.limit, self.run_id = limit, run_id

    def on_save(self, args, state, control, **kwargs):
        if args.should_save:
            written = checkpoint_path(args.output_dir, state.global_step)
            rotate_checkpoints(args.output_dir, self.run_id, self.limit, {written, state.best_model_checkpoint})

    def on_train_end(self, args, state, control, **kwargs):
        self.keep_only_the_best(args, state)

    def keep_only_the_best(self, args, state) -> None:
        if args.should_save and self.limit == 1 and state.best_model_checkpoint is not None:
            # training is over: the best (whole, as every checkpoint it names) is what a resume finishes from
            rotate_checkpoints(args.output_dir, self.run_id, 1, {state.best_model_checkpoint}, keep_newest_whole=False)


class NamedProgress(ProgressCallback):
    """The Trainer's progress bars, each named for what it waits on: `training`, and inside it `evaluating`."""

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        if self.training_bar is not None:
            self.training_bar.set_description("training")

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        new = self.prediction_bar is None
        super().on_prediction_step(args, state, control, eval_dataloader=eval_dataloader, **kwargs)
        if new and self.prediction_bar is not None:
            self.prediction_bar.set_description("evaluating")


def name_progress_bars(trainer) -> None:
    """The Trainer's bars named (NamedProgress); none when `disable_tqdm` (then its PrinterCallback prints each log
    as a line, as in a log file: configuration.training_arguments)."""
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(NamedProgress)


class SavingNow(TrainerCallback):
    """Which folder a save is writing (`folder`): set when it begins (SimCSETrainer.save_model writes a checkpoint's
    first files), cleared once the checkpoint is committed (registered after CheckpointCommit and rotation). A disk
    error in between names it."""

    def __init__(self):
        self.folder: str | None = None

    def on_save(self, args, state, control, **kwargs):
        self.folder = None
