"""The code of docs/writing-an-objective.md, extracted as a user would copy it: the objective's file and the
commands that train with it."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "writing-an-objective.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def write_objective(folder: str | os.PathLike) -> Path:
    """The doc's first Python block as focal.py in `folder` (written atomically: two processes may write it)."""
    path = Path(folder) / "focal.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text(encoding="utf-8") != blocks("python")[0]:
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(blocks("python")[0])
        os.replace(tmp, path)
    return path


def shared_objective() -> str:
    """The doc's objective as a `--loss` value, from a folder outside the repository that every process agrees on."""
    return f"{write_objective(Path(tempfile.gettempdir()) / 'simcse-hn-doc-objective')}:FocalLoss"


def commands() -> list[str]:
    """The doc's training commands, one per line."""
    return [line for line in blocks("bash")[0].splitlines() if line.strip()]
