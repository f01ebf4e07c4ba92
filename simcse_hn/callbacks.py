"""Trainer callbacks that watch the loss diagnostics (docs/losses.md section 2)."""

from __future__ import annotations

import logging

from transformers import TrainerCallback

logger = logging.getLogger(__name__)

# loss -> (its class prior field, fields that describe the setting besides the temperature)
DEBIASED = {
    "dcl": ("dcl_tau_plus", ()),
    "hcl": ("hcl_tau_plus", ("hcl_beta",)),
    "unremix": ("unremix_tau_plus", ("unremix_beta",)),
}


def debiasing_setting(args) -> str | None:
    """'loss dcl, dcl_tau_plus 0.001, temperature 0.05' for a debiased objective (tau+ > 0), else None."""
    loss = getattr(args, "loss", None)
    if loss not in DEBIASED:
        return None
    prior, others = DEBIASED[loss]
    if not getattr(args, prior, 0) > 0:
        return None
    fields = [prior, *others, "temperature"]
    return ", ".join([f"loss {loss}"] + [f"{name} {getattr(args, name):g}" for name in fields])


class ClampWarningCallback(TrainerCallback):
    """Warns once when the debiasing clamp of form (D) held for more than half of the anchors, on average over a
    logging window (`clamp_frac` in the logs, which SimCSETrainer averages over the window): those anchors' negatives
    get no gradient, so the objective has mostly stopped training. Only for a debiased setting (DCL, or HCL /
    UnReMix with tau+ > 0); the message names it. Register it with `trainer.add_callback(ClampWarningCallback())`."""

    threshold = 0.5

    def __init__(self):
        self.warned = False

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.warned or not logs or "clamp_frac" not in logs:
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
