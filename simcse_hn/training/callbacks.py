"""Trainer callbacks that watch the loss diagnostics (docs/losses.md section 2)."""

from __future__ import annotations

import logging

from transformers import TrainerCallback

from simcse_hn.losses.registry import flag_prefix

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


class ClampWarningCallback(TrainerCallback):
    """Warns once when the debiasing clamp of form (D) held for more than half of the anchors, on average over a
    logging window (`clamp_frac` in the logs, which SimCSETrainer averages over the window): those anchors' negatives
    get no gradient, so the objective has mostly stopped training. Only for a debiased setting (an objective whose
    class prior tau+ is > 0); the message names it. Register it with `trainer.add_callback(ClampWarningCallback())`."""

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
