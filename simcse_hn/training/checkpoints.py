"""The output folder and its checkpoints: which folders and checkpoints this tool wrote, which checkpoint a crashed
run resumes from, and which checkpoints rotation may delete.

* A folder is simcse-hn's when it holds `simcse_run.json` (RUN_MARKER), written when a run starts. It names the run
  family (a run and its resumes) by a random id: a fresh run into the folder writes a new id, a resume keeps it.
* Every checkpoint records that id as `run_id` in its `simcse_config.json`. Resume and rotation consider only the
  checkpoints of the folder's family: a `checkpoint-*` folder that another tool, run or person put there is neither
  loaded nor deleted.
* A checkpoint is complete when its `trainer_state.json` parses and every weight and state file in it is whole
  (safetensors: the header parses and the file is as long as the header says; torch files: the zip archive ends).
  The Trainer writes `trainer_state.json` last, so a kill while saving leaves a checkpoint without it; rotation
  deletes old checkpoints only after a new one is complete, so the previous complete one is still there.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import shutil
import uuid
import zipfile

from simcse_hn.errors import ConfigError
from simcse_hn.files import RUN_MARKER, SIMCSE_CONFIG, checkpoints_by_step, read_json, safetensors_problem
from simcse_hn.losses.registry import portable_loss_name

logger = logging.getLogger(__name__)

TRAINER_STATE = "trainer_state.json"
_TORCH_FILES = (".pt", ".pth", ".bin")  # torch.save's zip archives: optimizer, scheduler, RNG, training arguments


def _read_json(path: str):
    """The parsed file, or None when it is missing or does not parse (a checkpoint cut short, someone else's file)."""
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def read_run_id(output_dir: str) -> str | None:
    """The run family of a folder simcse-hn wrote, None for any other folder."""
    marker = _read_json(os.path.join(output_dir, RUN_MARKER))
    return marker.get("run_id") if isinstance(marker, dict) else None


def new_run_id() -> str:
    return uuid.uuid4().hex


def checkpoint_run_id(checkpoint: str) -> str | None:
    """The run family recorded in a checkpoint, None when simcse-hn did not write it."""
    config = _read_json(os.path.join(checkpoint, SIMCSE_CONFIG))
    return config.get("run_id") if isinstance(config, dict) else None


def check_resumed_objective(checkpoint: str, loss: str) -> None:
    """A checkpoint resumes only under the objective it was trained with, named again (`--loss`): a user's objective
    is code the checkpoint never imports. Raises ConfigError (one line)."""
    config = _read_json(os.path.join(checkpoint, SIMCSE_CONFIG))
    trained = config.get("loss") if isinstance(config, dict) else None
    if trained is not None and trained != portable_loss_name(loss):
        raise ConfigError(f"loss: {os.path.basename(checkpoint)} was trained with --loss {trained}; name it again "
                          f"to resume (this run names --loss {loss})")  # fmt: skip


def checkpoint_problem(checkpoint: str, run_id: str | None = None) -> str | None:
    """Why `checkpoint` cannot be resumed from (one phrase), or None when it is complete and of family `run_id`
    (any simcse-hn family when `run_id` is None)."""
    if not os.path.isfile(os.path.join(checkpoint, TRAINER_STATE)):
        return f"no {TRAINER_STATE} (the run stopped while writing it)"
    family = checkpoint_run_id(checkpoint)
    if family is None:
        return f"not written by simcse-hn (no run_id in {SIMCSE_CONFIG})"
    if run_id is not None and family != run_id:
        return f"written by another run (run_id {family}, this folder's run is {run_id})"
    state = _read_json(os.path.join(checkpoint, TRAINER_STATE))
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
        return f"{TRAINER_STATE} does not parse"
    names = sorted(os.listdir(checkpoint))
    if not any(name.endswith(".safetensors") for name in names):
        return "no weights (*.safetensors)"
    for name in names:
        path = os.path.join(checkpoint, name)
        if name.endswith(".safetensors"):
            problem = safetensors_problem(path)
            if problem:
                return problem
        elif name.endswith(_TORCH_FILES) and not zipfile.is_zipfile(path):
            return f"{name} is truncated (not a whole torch archive)"
    return None


def checkpoint_path(output_dir: str, step: int) -> str:
    """The folder the Trainer writes the checkpoint of optimizer step `step` into."""
    return os.path.join(output_dir, f"checkpoint-{step}")


def args_for_disk(args, save_total_limit: int | None):
    """The training arguments as a saved folder's training_args.bin holds them: never a token (train.py keeps the Hub
    token from the Trainer; this covers a Trainer built elsewhere), and the configured `save_total_limit`, which the
    Trainer's own copy does not hold (SimCSETrainer rotates this run's checkpoints itself)."""
    args = copy.copy(args)
    args.save_total_limit = save_total_limit
    for name in [f.name for f in dataclasses.fields(args) if f.name.endswith("_token")]:
        setattr(args, name, None)
    return args


def family_checkpoints(output_dir: str, run_id: str | None) -> list[str]:
    """The checkpoints of family `run_id` in output_dir, oldest first, complete or not."""
    return [path for _, path in checkpoints_by_step(output_dir) if checkpoint_run_id(path) == run_id]


def last_complete_checkpoint(output_dir: str, run_id: str | None) -> str | None:
    """The newest complete checkpoint of family `run_id`; each newer one is skipped with a warning saying why."""
    for _, path in reversed(checkpoints_by_step(output_dir)):
        problem = checkpoint_problem(path, run_id)
        if problem is None:
            return path
        logger.warning("%s is skipped: %s", path, problem)
    return None


def resolve_resume(resume_from_checkpoint: str | None, output_dir: str) -> str | None:
    """`true`/`latest` -> the newest complete checkpoint of output_dir's run; a path -> that checkpoint, checked."""
    if resume_from_checkpoint is None or resume_from_checkpoint.lower() in ("false", "no", ""):
        return None
    if resume_from_checkpoint.lower() in ("true", "latest", "last"):
        run_id = read_run_id(output_dir)
        if run_id is None:
            raise ConfigError(
                f"resume_from_checkpoint: {output_dir} was not written by simcse-hn (no {RUN_MARKER}), "
                "so it holds no checkpoint of this run"
            )
        checkpoint = last_complete_checkpoint(output_dir, run_id)
        if checkpoint is None:
            raise ConfigError(f"resume_from_checkpoint: no complete checkpoint of this run in {output_dir}")
        return checkpoint
    if not os.path.isdir(resume_from_checkpoint):
        raise ConfigError(f"resume_from_checkpoint: no such folder: {resume_from_checkpoint}")
    problem = checkpoint_problem(resume_from_checkpoint)
    if problem is not None:
        raise ConfigError(f"resume_from_checkpoint: {resume_from_checkpoint} cannot be resumed from: {problem}")
    return resume_from_checkpoint


def check_output_dir(output_dir: str, resuming: bool, overwrite: bool) -> None:
    """Refuse (ConfigError) a folder this run must not write into: not a folder, or not empty and not simcse-hn's
    (unless `overwrite` or `resuming`), or holding an earlier run's checkpoints when this run starts afresh."""
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ConfigError(f"output_dir: {output_dir} exists and is not a folder")
    if not os.path.isdir(output_dir) or not os.listdir(output_dir) or overwrite or resuming:
        return
    run_id = read_run_id(output_dir)
    if run_id is None:
        raise ConfigError(
            f"output_dir: {output_dir} is not empty and was not written by simcse-hn (no {RUN_MARKER}); "
            "choose a new folder, or pass --overwrite_output_dir true to write into it"
        )
    earlier = family_checkpoints(output_dir, run_id)
    if earlier:
        raise ConfigError(
            f"output_dir: {output_dir} holds checkpoints of an earlier run ({os.path.basename(earlier[-1])}); pass "
            "--resume_from_checkpoint true to continue it, or --overwrite_output_dir true to start a new run there"
        )


def claim_output_dir(output_dir: str, run_id: str) -> None:
    """Create output_dir and mark it as run family `run_id`'s. An unwritable folder is a ConfigError."""
    marker = os.path.join(output_dir, RUN_MARKER)
    try:
        os.makedirs(output_dir, exist_ok=True)
        with open(marker + ".tmp", "w", encoding="utf-8") as f:
            json.dump({"written_by": "simcse-hn", "run_id": run_id}, f)
        os.replace(marker + ".tmp", marker)
    except OSError as e:
        raise ConfigError(f"output_dir: cannot write {output_dir} ({type(e).__name__}: {e.strerror or e})") from None


def rotate_checkpoints(output_dir: str, run_id: str | None, limit: int | None, keep: set[str | None]) -> list[str]:
    """Delete the oldest checkpoints of family `run_id` beyond `limit`, never those in `keep` (the one just written,
    the best); returns the deleted paths. Checkpoints of other families are not counted and not touched."""
    if limit is None or limit <= 0:
        return []
    keep = {os.path.abspath(path) for path in keep if path is not None}
    ours = family_checkpoints(output_dir, run_id)
    kept = max(limit, sum(os.path.abspath(path) in keep for path in ours))
    deleted = []
    for path in ours:
        if len(ours) - len(deleted) <= kept:
            break
        if os.path.abspath(path) not in keep:
            logger.info("deleting %s (save_total_limit %d)", path, limit)
            shutil.rmtree(path, ignore_errors=True)
            deleted.append(path)
    return deleted
