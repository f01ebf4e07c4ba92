"""Contrastive objectives. `build_loss(name, temperature=..., **paper_symbols)` -> ContrastiveLoss."""

from __future__ import annotations

from simcse_hn.losses.base import ContrastiveLoss, LossOutput
from simcse_hn.losses.hcl import DCLLoss, HCLLoss
from simcse_hn.losses.infonce import InfoNCELoss
from simcse_hn.losses.progcl import ProGCLLoss
from simcse_hn.losses.unremix import UnReMixLoss
from simcse_hn.targets import ContrastiveTargets, LossContext, build_targets

LOSSES: dict[str, type[ContrastiveLoss]] = {
    "infonce": InfoNCELoss,
    "dcl": DCLLoss,
    "hcl": HCLLoss,
    "progcl": ProGCLLoss,
    "unremix": UnReMixLoss,
}


def build_loss(name: str, **kwargs) -> ContrastiveLoss:
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; choose one of {sorted(LOSSES)}")
    return LOSSES[name](**kwargs)


__all__ = [
    "LOSSES",
    "ContrastiveLoss",
    "ContrastiveTargets",
    "DCLLoss",
    "HCLLoss",
    "InfoNCELoss",
    "LossContext",
    "LossOutput",
    "ProGCLLoss",
    "UnReMixLoss",
    "build_loss",
    "build_targets",
]
