"""The output folder and its checkpoints: which folders and checkpoints this tool wrote, which checkpoint a crashed
run resumes from, and which checkpoints rotation may delete.

* A folder is simcse-hn's when it holds `simcse_run.json` (RUN_MARKER), written when a run starts. It names the run
  family (a run and its resumes) by a random id: a fresh run into the folder writes a new id, a resume keeps it.
* Every checkpoint records that id as `run_id` in its `simcse_config.json`. Resume and rotation consider only the
  checkpoints of the folder's family: a `checkpoint-*` folder that another tool, run or person put there is neither
  loaded nor deleted.
* A checkpoint is one unit: it is whole once its manifest (CHECKPOINT_MANIFEST: every file's name, size and sha256)
  is written, and `CheckpointCommit`, registered after every callback that writes into a checkpoint, writes it last.
  The Trainer writes its own files first (save_model, optimizer, scheduler, RNG, trainer_state.json: in
  transformers 5.x `_save_checkpoint` runs before any callback's on_save), then the callbacks' parts (queue, topic
  clusters), then the manifest: a kill anywhere before leaves a checkpoint without one, which is never resumed from.
  Rotation runs after the manifest and never deletes the newest whole checkpoint; a checkpoint push runs after it.
* A checkpoint written before manifests (its simcse_config.json does not name CHECKPOINT_MANIFEST) is whole when
  its trainer_state.json parses, every weight and state file in it is whole (safetensors: the header parses and the
  file is as long as the header says; torch files: the zip archive ends) and every file its run needs is there.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import logging
import os
import shutil
import uuid
import zipfile
from collections.abc import Iterable
from typing import Protocol

import torch.distributed as dist
from transformers import TrainerCallback

from simcse_hn.data.topic_batches import TOPIC_CLUSTERS_FILE
from simcse_hn.errors import ConfigError
from simcse_hn.files import (
    RUN_MARKER,
    SIMCSE_CONFIG,
    checkpoint_step,
    checkpoints_by_step,
    file_sha256,
    read_json,
    safetensors_problem,
)
from simcse_hn.run_record import RunRecord
from simcse_hn.training.output_lock import LOCK_FILE

logger = logging.getLogger(__name__)

TRAINER_STATE = "trainer_state.json"
CHECKPOINT_MANIFEST = "checkpoint_manifest.json"  # written last: a checkpoint without it is not whole
QUEUE_FILE = "negative_queue.pt"  # a queue run's checkpoints: the queue, its position, the momentum encoder
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


def checkpoint_problem(checkpoint: str, run_id: str | None = None, verify_hashes: bool = True) -> str | None:
    """Why `checkpoint` cannot be resumed from (one phrase), or None when it is whole and of family `run_id` (any
    simcse-hn family when `run_id` is None). `verify_hashes` False: the manifest's sizes only (rotation's check)."""
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
    named = checkpoint_step(checkpoint)
    if named is not None and named != state["global_step"]:
        return f"its {TRAINER_STATE} is of step {state['global_step']}, not {named} (a copy or a rename)"
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
    config = _read_json(os.path.join(checkpoint, SIMCSE_CONFIG))
    if config.get("checkpoint_manifest") or CHECKPOINT_MANIFEST in names:
        return manifest_problem(checkpoint, verify_hashes)
    missing = [name for name in run_files(config) if not os.path.isfile(os.path.join(checkpoint, name))]
    if missing:  # written before manifests: whole when every file its run needs is there
        return f"no {missing[0]} (its run needs it; written before checkpoints had a {CHECKPOINT_MANIFEST})"
    return None


def run_files(config: dict) -> list[str]:
    """The files beyond the Trainer's that a checkpoint of the run recorded in `config` (its simcse_config.json)
    needs: the queue's and the topic clusters'."""
    method = RunRecord.from_json(config).method
    return [QUEUE_FILE] * bool(method.queue) + [TOPIC_CLUSTERS_FILE] * bool(method.topic_batches)


def _checkpoint_files(folder: str) -> list[str]:
    """Every file under `folder` (paths relative to it, '/'-separated), but the manifest and its temporary file."""
    found = []
    for root, _, names in os.walk(folder):
        found += [os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/") for name in names]
    return sorted(name for name in found if name not in (CHECKPOINT_MANIFEST, CHECKPOINT_MANIFEST + ".tmp"))


def write_checkpoint_manifest(folder: str, step: int | None = None) -> dict:
    """Commit `folder` as a whole checkpoint: CHECKPOINT_MANIFEST lists every file in it (name, size, sha256) and the
    optimizer `step`. Written to a temporary file, flushed to disk and renamed, so it is there whole or not at all.
    Call it once every part of the checkpoint is written (`CheckpointCommit` does). Returns the manifest."""
    files = {}
    for name in _checkpoint_files(folder):
        path = os.path.join(folder, name)
        files[name] = {"size": os.path.getsize(path), "sha256": file_sha256(path)}
    manifest = {"written_by": "simcse-hn", "step": step, "files": files}
    path = os.path.join(folder, CHECKPOINT_MANIFEST)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    return manifest


def manifest_problem(folder: str, verify_hashes: bool = True) -> str | None:
    """Why `folder` is not a whole checkpoint by its manifest (one phrase: no manifest, a listed file missing, of
    another size or, with `verify_hashes`, another sha256), or None when it is whole."""
    path = os.path.join(folder, CHECKPOINT_MANIFEST)
    if not os.path.isfile(path):
        return f"no {CHECKPOINT_MANIFEST} (the run stopped before the checkpoint was whole)"
    manifest = _read_json(path)
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        return f"{CHECKPOINT_MANIFEST} does not parse"
    state = _read_json(os.path.join(folder, TRAINER_STATE))
    step = state.get("global_step") if isinstance(state, dict) else None
    if step is not None and manifest.get("step") != step:
        return f"{CHECKPOINT_MANIFEST} is of step {manifest.get('step')}, its {TRAINER_STATE} of step {step}"
    for name, entry in sorted(files.items()):
        file = os.path.join(folder, name)
        if not os.path.isfile(file):
            return f"{name} is missing (listed in {CHECKPOINT_MANIFEST})"
        if os.path.getsize(file) != entry.get("size"):
            return f"{name} is {os.path.getsize(file)} bytes, {CHECKPOINT_MANIFEST} says {entry.get('size')}"
        if verify_hashes and file_sha256(file) != entry.get("sha256"):
            return f"{name} is not the file {CHECKPOINT_MANIFEST} lists (another sha256)"
    return None


class CheckpointPart(Protocol):
    """A part of each checkpoint beyond the Trainer's own files (a queue, a sampler's state): the file names it
    writes (relative to the checkpoint folder) and how it writes them."""

    def checkpoint_files(self) -> list[str]: ...

    def save_checkpoint(self, folder: str) -> None: ...


class CheckpointCommit(TrainerCallback):
    """Makes each checkpoint of any transformers Trainer one unit. At on_save (after the Trainer's own files: model,
    optimizer, scheduler, RNG, trainer_state.json) the parts (`CheckpointPart`s, given or `add_part`) write their
    files on the saving processes; every process then waits for the others (each writes its own RNG file); then, if
    every file the parts declare is there, the manifest (`write_checkpoint_manifest`) is written, last. Register it
    after every callback that writes into a checkpoint in its own on_save (better: make those parts), and before any
    callback that rotates or pushes checkpoints. `manifest_problem` says whether a checkpoint is whole."""

    def __init__(self, parts: Iterable[CheckpointPart] = ()):
        self.parts = list(parts)

    def add_part(self, part: CheckpointPart) -> None:
        self.parts.append(part)

    def on_save(self, args, state, control, **kwargs):
        folder = checkpoint_path(args.output_dir, state.global_step)
        if args.should_save:
            for part in self.parts:
                part.save_checkpoint(folder)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()
        if not args.should_save:
            return
        declared = [name for part in self.parts for name in part.checkpoint_files()]
        missing = [name for name in declared if not os.path.exists(os.path.join(folder, name))]
        if missing:
            logger.error("%s is not whole (no %s): it is not committed, and no resume reads it", folder,
                         ", ".join(missing))  # fmt: skip
            return
        write_checkpoint_manifest(folder, state.global_step)


def saved_config(record: RunRecord | None, run_id: str) -> dict:
    """simcse_config.json of a saved folder and of each checkpoint: the run's record (a trainer built without one: its
    run family alone), and the manifest that makes a checkpoint whole, written last."""
    config = record.to_json() if record is not None else {"run_id": run_id}
    return {**config, "checkpoint_manifest": CHECKPOINT_MANIFEST}


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


def last_complete_checkpoint(output_dir: str, run_id: str | None, warn_if_none: bool = True) -> str | None:
    """The newest complete checkpoint of family `run_id`; each newer one is skipped with a warning saying why (when
    none is complete, only with `warn_if_none`: a resume that starts again says it in one line of its own)."""
    skipped = []
    for _, path in reversed(checkpoints_by_step(output_dir)):
        problem = checkpoint_problem(path, run_id)
        if problem is None:
            break
        skipped.append((path, problem))
    else:
        path = None
    for name, problem in skipped if path is not None or warn_if_none else ():
        logger.warning("%s is skipped: %s", name, problem)
    return path


RESUME_LATEST = ("true", "latest", "last")  # --resume_from_checkpoint values that mean the newest whole checkpoint


def resume_requested(resume_from_checkpoint: str | None) -> bool:
    return resume_from_checkpoint is not None and resume_from_checkpoint.lower() not in ("false", "no", "")


def resolve_resume(resume_from_checkpoint: str | None, output_dir: str) -> str | None:
    """`true`/`latest` -> the newest complete checkpoint of output_dir's run (None: the run starts again from step 0,
    `start_again`); a path -> that checkpoint, checked. Call it holding the folder's lock (training.output_lock)."""
    if not resume_requested(resume_from_checkpoint):
        return None
    if resume_from_checkpoint.lower() in RESUME_LATEST:
        run_id = read_run_id(output_dir)
        if run_id is None and not folder_entries(output_dir):  # stopped before it began: nothing to lose
            logger.warning(
                "no checkpoint of this run in %s (it stopped before it began): starting it at step 0", output_dir
            )
            return None
        if run_id is None:
            raise ConfigError(
                f"resume_from_checkpoint: {output_dir} was not written by simcse-hn (no {RUN_MARKER}), "
                "so it holds no checkpoint of this run"
            )
        checkpoint = last_complete_checkpoint(output_dir, run_id, warn_if_none=False)
        if checkpoint is None:
            start_again(output_dir, run_id)
        return checkpoint
    if not os.path.isdir(resume_from_checkpoint):
        raise ConfigError(f"resume_from_checkpoint: no such folder: {resume_from_checkpoint}")
    problem = checkpoint_problem(resume_from_checkpoint)
    if problem is not None:
        raise ConfigError(f"resume_from_checkpoint: {resume_from_checkpoint} cannot be resumed from: {problem}")
    return resume_from_checkpoint


def start_again(output_dir: str, run_id: str) -> None:
    """No whole checkpoint of run `run_id` in output_dir: when none of its checkpoints was ever committed (each names
    the manifest it lacks: the run was killed before or while writing its first), nothing whole is lost, so the run
    starts again from step 0, said in one warning; its incomplete checkpoints are removed, never read, and a
    checkpoint folder cut short before its record (no simcse_config.json) is set aside as `<name>.incomplete`.
    Otherwise (a checkpoint that was whole and is damaged, one written before manifests, or the finished model of
    this run) a ConfigError (one line): starting again would lose it."""
    ours = family_checkpoints(output_dir, run_id)
    for path in ours:
        config = _read_json(os.path.join(path, SIMCSE_CONFIG)) or {}
        if os.path.isfile(os.path.join(path, CHECKPOINT_MANIFEST)) or not config.get("checkpoint_manifest"):
            raise ConfigError(
                f"resume_from_checkpoint: no whole checkpoint of this run in {output_dir} "
                f"({os.path.basename(path)}: {checkpoint_problem(path, run_id)})"
            )
    finished = _read_json(os.path.join(output_dir, SIMCSE_CONFIG))
    steps = (finished.get("budget") or {}).get("steps", finished.get("steps")) if isinstance(finished, dict) else None
    if steps is not None and finished.get("run_id") == run_id:
        raise ConfigError(
            f"resume_from_checkpoint: {output_dir} holds this run's finished model ({steps} steps) and no "
            "checkpoint: there is nothing to resume"
        )
    folders = [path for _, path in checkpoints_by_step(output_dir)]
    unnamed = [path for path in folders if not os.path.exists(os.path.join(path, SIMCSE_CONFIG))]
    for path in ours:
        shutil.rmtree(path)
    for path in unnamed:
        os.replace(path, _free_name(path + ".incomplete"))
    cut = ", ".join(os.path.basename(path) for path in ours + unnamed)
    logger.warning(
        "no whole checkpoint of this run in %s (%s): starting it again from step 0",
        output_dir,
        f"{cut} cut short before its manifest" if cut else "killed before its first checkpoint",
    )


def _free_name(path: str) -> str:
    """`path`, or `path.1`, `path.2`, ...: the first that does not exist."""
    return next(name for k in itertools.count() if not os.path.exists(name := path + (f".{k}" if k else "")))


def folder_entries(output_dir: str) -> set[str]:
    """What output_dir holds but its lock (the first thing a run writes there); nothing for a missing folder."""
    return set(os.listdir(output_dir)) - {LOCK_FILE} if os.path.isdir(output_dir) else set()


def check_output_dir(output_dir: str, resuming: bool, overwrite: bool) -> None:
    """Refuse (ConfigError) a folder this run must not write into: not a folder, or not empty and not simcse-hn's
    (unless `overwrite` or `resuming`), or holding an earlier run's checkpoints when this run starts afresh."""
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ConfigError(f"output_dir: {output_dir} exists and is not a folder")
    if not folder_entries(output_dir) or overwrite or resuming:
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


def rotate_checkpoints(
    output_dir: str, run_id: str | None, limit: int | None, keep: set[str | None], keep_newest_whole: bool = True
) -> list[str]:
    """Delete the oldest checkpoints of family `run_id` beyond `limit`, never those in `keep` (the one just written,
    the best) nor, during training, the newest whole one (until the next is whole, it is the resume's); returns the
    deleted paths. Checkpoints of other families are not counted and not touched."""
    if limit is None or limit <= 0:
        return []
    ours = family_checkpoints(output_dir, run_id)
    whole = (path for path in reversed(ours) if checkpoint_problem(path, run_id, verify_hashes=False) is None)
    newest_whole = next(whole, None) if keep_newest_whole else None
    keep = {os.path.abspath(path) for path in (*keep, newest_whole) if path is not None}
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
