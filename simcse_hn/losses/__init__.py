"""Contrastive objectives. `build_loss(name, temperature=..., **options)` -> ContrastiveLoss.

An objective is one class in one file: its options (a dataclass, `options.py`), its texts and capabilities (class
attributes) and its math (`per_anchor`, or `log_weights` for one that reweights negatives).
docs/writing-an-objective.md shows one written outside the package.
"""

from __future__ import annotations

from simcse_hn.losses.base import (
    ContrastiveLoss,
    LossOutput,
    NegativeWeights,
    ObjectiveInput,
    ObjectiveOutput,
    PlainReductions,
    ReweightingLoss,
)
from simcse_hn.losses.hardness import HardnessLoss
from simcse_hn.losses.hcl import DCLLoss, HCLLoss
from simcse_hn.losses.infonce import InfoNCELoss
from simcse_hn.losses.options import ObjectiveOptions, option
from simcse_hn.losses.progcl import ProGCLLoss
from simcse_hn.losses.registry import (
    BASELINE,
    BUILTIN,
    ObjectiveError,
    benchmark_settings,
    build_loss,
    objective_class_path,
    resolve_objective,
)
from simcse_hn.losses.targets import ContrastiveTargets, LossContext, build_targets
from simcse_hn.losses.unremix import UnReMixLoss

LOSSES = BUILTIN  # the built-in objectives by name (the name simcse-hn 0.1 exported)

__all__ = [
    "BASELINE",
    "BUILTIN",
    "LOSSES",
    "ContrastiveLoss",
    "ContrastiveTargets",
    "DCLLoss",
    "HCLLoss",
    "HardnessLoss",
    "InfoNCELoss",
    "LossContext",
    "LossOutput",
    "NegativeWeights",
    "ObjectiveError",
    "ObjectiveInput",
    "ObjectiveOptions",
    "ObjectiveOutput",
    "PlainReductions",
    "ProGCLLoss",
    "ReweightingLoss",
    "UnReMixLoss",
    "benchmark_settings",
    "build_loss",
    "build_targets",
    "objective_class_path",
    "option",
    "resolve_objective",
]
