"""No file of the house holds a merge's conflict markers (one once reached docs/architecture.md through a merge
commit, and no test read the page as text)."""

from __future__ import annotations

import re

from conftest import ROOT

MARKER = re.compile(r"^(<{7} |={7}$|>{7} )")
HOUSE = ("README.md", "pyproject.toml", "train.py", "docs", "simcse_hn", "tests", "bench", "configs", "eval", ".ci")
TEXT = (".py", ".md", ".json", ".yaml", ".yml", ".toml", ".txt", ".csv", ".sh", "run")


def test_no_file_holds_conflict_markers():
    found = []
    for entry in HOUSE:
        paths = [ROOT / entry] if (ROOT / entry).is_file() else (ROOT / entry).rglob("*")
        for path in paths:
            if not path.is_file() or not path.name.endswith(TEXT) or "old-st" in path.parts:
                continue
            text = path.read_bytes().decode("utf-8", errors="replace")
            found += [
                f"{path.relative_to(ROOT)}:{n}" for n, line in enumerate(text.splitlines(), 1) if MARKER.match(line)
            ]
    assert found == []
