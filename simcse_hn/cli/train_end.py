"""What a finished training run reports: how much training it had, and the STS-B dev score of the model as saved
(simcse_hn/cli/train.py)."""

from __future__ import annotations

import datasets

from simcse_hn.training.trainer import SimCSETrainer


def training_budget(trainer: SimCSETrainer) -> dict:
    """Steps, epochs and sentences seen by the finished run (resumed runs included)."""
    args, state = trainer.args, trainer.state
    per_step = args.per_device_train_batch_size * args.world_size * args.gradient_accumulation_steps
    steps = state.global_step
    # a stream has no length: the Trainer's epoch count would be steps / max_steps, not passes over the corpus
    epochs = None if isinstance(trainer.train_dataset, datasets.IterableDataset) else round(state.epoch or 0.0, 4)
    return {"steps": steps, "epochs": epochs, "sentences_seen": steps * per_step}


def final_dev_score(trainer: SimCSETrainer) -> float:
    """The STS-B dev score of the model as saved: the best checkpoint's when it was reloaded, else the last
    evaluation's when it was at the last step; evaluated once more only when neither exists (no second score is
    logged for a step that already has one)."""
    state = trainer.state
    if trainer.args.load_best_model_at_end and state.best_metric is not None:
        return state.best_metric
    evals = [entry for entry in state.log_history if "eval_stsb_spearman" in entry]
    if evals and evals[-1].get("step") == state.global_step:
        return evals[-1]["eval_stsb_spearman"]
    return trainer.evaluate()["eval_stsb_spearman"]
