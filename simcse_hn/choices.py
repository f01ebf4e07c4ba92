"""The names that flags choose among (poolers, data formats, objectives), and the optional package a flag needs,
light on purpose (no torch): the argument dataclasses and the objectives' registry check them, and so can the front
of the command line before anything heavy is imported (simcse_hn.cli.front)."""

from __future__ import annotations

import importlib.metadata
import importlib.util

from simcse_hn.errors import ConfigError, did_you_mean

POOLERS = ("cls", "cls_before_pooler", "avg", "avg_first_last", "avg_top2", "last")  # SimCSEModel's poolers
DATA_FORMATS = ("auto", "pairs", "sentences")  # --data_format
GUIDE_SELF = "self"  # --guide_model self: the model being trained guards its own negatives
OBJECTIVE_ENTRY_POINTS = "simcse_hn.objectives"  # the entry-point group of the objectives packages declare


def require_peft(field: str = "lora_r") -> None:
    if importlib.util.find_spec("peft") is None:
        raise ConfigError(f"{field}: LoRA needs peft, which is not installed (pip install 'simcse-hn[lora]')")


def installed_objective_names() -> list[str]:
    """The objectives that installed packages declare (losses.registry loads them), by name, sorted."""
    return sorted(ep.name for ep in importlib.metadata.entry_points(group=OBJECTIVE_ENTRY_POINTS))


def unknown_objective(name: str, known: list[str]) -> str:
    """The one line for a `--loss` that names no objective: the closest of `known` (the built-in names, then the
    installed ones), and every choice."""
    choices = ", ".join(known)
    return (
        f"unknown loss {name!r}{did_you_mean(name, known)}; choose one of {choices}, or a class of yours as "
        "path/to/file.py:Class or package.module:Class"
    )
