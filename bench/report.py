"""Write a bench's Markdown page again from its JSON record, without rerunning the bench.

    python -m bench.report bench/results/loss_overhead.json [more.json ...]   # rewrites each .md beside its .json
    python -m bench.report --check bench/results/*.json bench/results/*/*.json  # which pages their records give

The page is the bench's own `markdown(record)`, the function each bench ends with (bench.common.write_report), so a
page and its record cannot disagree. The bench is the longest bench module name that begins the file's stem
(eval_speed_593ac27.json: bench.eval_speed; pilot/pilot.json: bench.pilot), or the one WRITERS names.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import re
import sys
from pathlib import Path

import bench

# Stems no bench module's name begins: the bench that writes them.
WRITERS = {r"train_compile_tiny": "train_throughput", r"quality_\d+steps_summary": "quality_summary",
           r"pilot\d+(_\w+)?": "pilot"}


def bench_names() -> list[str]:
    return sorted((m.name for m in pkgutil.iter_modules(bench.__path__)), key=len, reverse=True)


def writer(path: Path) -> str | None:
    """The bench module that writes `path`'s page, or None (a record no bench here writes: a retired bench's)."""
    stem = path.stem
    for pattern, name in WRITERS.items():
        if re.fullmatch(pattern, stem):
            return name
    return next((name for name in bench_names() if stem == name or stem.startswith(name + "_")), None)


def page(path: Path, name: str | None = None) -> str:
    """The Markdown page of the record at `path`, as its bench writes it."""
    name = name or writer(path)
    if name is None:
        raise LookupError(f"{path}: no bench writes it (name one with --bench)")
    module = importlib.import_module(f"bench.{name}")
    if not hasattr(module, "markdown"):
        raise LookupError(f"{path}: bench.{name} writes no page from a record")
    return module.markdown(json.loads(path.read_text(encoding="utf-8")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("records", nargs="+", type=Path, help="JSON records a bench wrote (bench/results/*.json)")
    parser.add_argument("--bench", help="the bench module that wrote them, when their names do not say")
    parser.add_argument("--check", action="store_true", help="write nothing: say which pages their records give")
    args = parser.parse_args(argv)
    differing = 0
    for path in args.records:
        try:
            text = page(path, args.bench)
        except LookupError as e:
            print(f"skipped {e}", file=sys.stderr)
            continue
        target = path.with_suffix(".md")
        if args.check:
            same = target.is_file() and target.read_text(encoding="utf-8") == text
            differing += not same
            print(f"{'same' if same else 'differs'}: {target}")
        else:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
