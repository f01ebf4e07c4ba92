"""Training: SimCSETrainer and its step, callbacks, checkpoints of a run family, GradCache, ranks and the exit."""
