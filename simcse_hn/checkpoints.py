"""Which checkpoint a crashed run resumes from.

The Trainer writes `trainer_state.json` last, after the model, optimizer, scheduler and RNG states, so a
checkpoint folder without it was interrupted while being written. Resuming skips such folders instead of failing
half-way through loading one; the previous complete checkpoint is still there because rotation deletes old
checkpoints only after the new one is complete.
"""

from __future__ import annotations

import logging
import os
import re

from simcse_hn.config import ConfigError

logger = logging.getLogger(__name__)

TRAINER_STATE = "trainer_state.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def is_complete(checkpoint: str) -> bool:
    return os.path.isfile(os.path.join(checkpoint, TRAINER_STATE))


def last_complete_checkpoint(output_dir: str) -> str | None:
    if not os.path.isdir(output_dir):
        return None
    steps = sorted(
        (int(m.group(1)), name) for name in os.listdir(output_dir) if (m := _CHECKPOINT.match(name))
    )
    for _, name in reversed(steps):
        path = os.path.join(output_dir, name)
        if is_complete(path):
            return path
        logger.warning("%s is incomplete (no %s): the run stopped while writing it; skipping", path, TRAINER_STATE)
    return None


def resolve_resume(resume_from_checkpoint: str | None, output_dir: str) -> str | None:
    """`true`/`latest` -> the newest complete checkpoint in output_dir; a path -> that path, checked."""
    if resume_from_checkpoint is None or resume_from_checkpoint.lower() in ("false", "no", ""):
        return None
    if resume_from_checkpoint.lower() in ("true", "latest", "last"):
        checkpoint = last_complete_checkpoint(output_dir)
        if checkpoint is None:
            raise ConfigError(f"resume_from_checkpoint: no complete checkpoint in {output_dir}")
        return checkpoint
    if not os.path.isdir(resume_from_checkpoint):
        raise ConfigError(f"resume_from_checkpoint: no such folder: {resume_from_checkpoint}")
    if not is_complete(resume_from_checkpoint):
        raise ConfigError(
            f"resume_from_checkpoint: {resume_from_checkpoint} is incomplete (no {TRAINER_STATE}); "
            f"the newest complete one is {last_complete_checkpoint(os.path.dirname(resume_from_checkpoint) or '.')}"
        )
    return resume_from_checkpoint
