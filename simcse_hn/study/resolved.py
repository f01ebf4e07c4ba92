"""What a study's runs will actually run, as train.py resolves it: each config read by train.py's own parser (every
default filled in, a `config:` file merged), the objective's source files as its import loads them, and the local paths
a config names. The plan's checks and the lock read these; none of them looks at a plan's text."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import asdict

import yaml

from simcse_hn.configuration.parser import parse_args
from simcse_hn.data.guide import SELF
from simcse_hn.errors import ConfigError, UserError
from simcse_hn.files import file_sha256, is_hub_id
from simcse_hn.losses.registry import portable_loss_name
from simcse_hn.provenance import PACKAGE_DIR
from simcse_hn.study.files import working_dir

# where a run's own files go, and the seed the study sets for each run: not how an arm trains
PER_RUN = ("output_dir", "logging_dir", "seed")
# train.py keys that name a local file whatever the name looks like, and keys that name a model or a file
FILE_KEYS = ("train_file", "eval_file")
MODEL_KEYS = ("model_name_or_path", "tokenizer_name_or_path", "guide_model", "topic_encoder")


def resolve_config(folder: str, config: dict) -> dict:
    """train.py's own reading of a config (run from `folder`, where the study runs it): every argument with its value,
    defaults filled in, as one flat JSON-ready mapping. A ConfigError names the first bad value."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "arm.yaml")
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(config, f)
        with working_dir(folder), importable(folder):
            try:
                model, data, training = parse_args(["--config", path, "--output_dir", os.path.join(tmp, "out")])
            except ConfigError as e:  # its file is this function's own, gone when the message is read
                raise ConfigError(str(e).replace(f" (in {path})", "").replace(path, "the arm's config")) from None
    flat = {**asdict(model), **asdict(data), **training.to_dict()}
    flat = {k: v for k, v in sorted(flat.items()) if k not in PER_RUN}
    # as a trained folder records its objective (simcse_config.json), to compare a run's folder with its arm
    flat["objective"] = {"loss": portable_loss_name(training.loss), "loss_kwargs": training.loss_kwargs()}
    return json.loads(json.dumps(flat, default=str))


@contextlib.contextmanager
def importable(folder: str) -> Iterator[None]:
    """The folder first on sys.path, as `python -m` puts a run's folder: its objective's own modules import."""
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.path.remove(folder)


def settings_sha256(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def missing_paths(folder: str, config: dict) -> list[tuple[str, str]]:
    """(key, value) of each local path a config names that is not there, read from `folder`: a data file
    (train_file, eval_file) always is one; a model name is one unless it is a Hub id or a builtin."""
    out = []
    with working_dir(folder):
        for key in (*FILE_KEYS, *MODEL_KEYS):
            value = config.get(key)
            if not isinstance(value, str) or not value or value == SELF or value.startswith("builtin:"):
                continue
            if key in MODEL_KEYS and is_hub_id(value):
                continue
            if not os.path.exists(value):
                out.append((key, value))
    return out


# A fresh interpreter imports each objective the way train.py does (from the plan's folder, which is on sys.path as
# `python -m` puts it) and lists every module file the import loaded beyond what simcse_hn's own import loads.
_TRACE = """
import json, sys
from simcse_hn.losses.registry import resolve_objective
before = set(sys.modules)
for name in json.loads(sys.argv[1]):
    resolve_objective(name)
files = {getattr(sys.modules[m], "__file__", None) for m in set(sys.modules) - before}
print(json.dumps(sorted(f for f in files if f)))
"""


def _installed(path: str) -> bool:
    """A file of the interpreter's own library or of an installed package (site-packages), or simcse-hn's (hashed with
    its sources apart)."""
    real = os.path.realpath(path)
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots.add(PACKAGE_DIR)
    parts = real.split(os.sep)
    return any(real.startswith(os.path.realpath(r) + os.sep) for r in roots) or bool(
        {"site-packages", "dist-packages"} & set(parts)
    )


def objective_sources(folder: str, losses: list[str]) -> dict[str, str]:
    """{path relative to `folder`: sha256} of every file the import of these objectives loads from outside the
    interpreter's library and installed packages: `file.py:Class`, `package.module:Class` and every helper module
    they import, however named. A built-in objective loads none."""
    names = sorted({name for name in losses if ":" in name})
    if not names:
        return {}
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([os.path.dirname(PACKAGE_DIR), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", _TRACE, json.dumps(names)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"the objective{'s' * (len(names) > 1)} {', '.join(names)} would not import: {last}")
    files = [f for f in json.loads(done.stdout.strip().splitlines()[-1]) if not _installed(f)]
    return {os.path.relpath(f, folder).replace(os.sep, "/"): file_sha256(f) for f in sorted(files)}
