"""A guide model's false negatives taken out of the targets (GISTEmbed, Solatorio 2024, arXiv:2402.16829).

Candidates that the guide scores above the anchor's positive, minus a margin, are taken for false negatives and
removed from N(i) for the step: with guide similarities g, j leaves N(i) when g_ij > g_ip - margin. Guide scores
never carry gradient; only the negative mask changes. The guide itself (a frozen model, or `self`) and its
embeddings of a batch are simcse_hn.data.guide's; training.step calls `guide_targets` on the gathered candidates.
"""

from __future__ import annotations

import torch
from torch import Tensor

from simcse_hn.losses.base import cosine_similarities, positive_logits
from simcse_hn.losses.targets import ContrastiveTargets


def false_negatives(guide_candidates: Tensor, targets: ContrastiveTargets, margin: float = 0.0) -> Tensor:
    """(M, N) bool: the negatives of `targets` whose guide similarity to the anchor exceeds the guide similarity of
    the anchor's positive minus `margin`. guide_candidates (N, E): the guide's embeddings of the candidates (the
    anchors are its rows targets.anchor_index). No gradient, no host synchronisation."""
    if targets.anchor_index is None:
        raise ValueError("a guide needs targets whose anchors are candidates (anchor_index)")
    with torch.no_grad():
        guide_candidates = guide_candidates.detach()
        sim = cosine_similarities(guide_candidates[targets.anchor_index], guide_candidates)  # (M, N)
        threshold = positive_logits(sim, targets.positive_index) - margin  # (M,)
        return targets.negative_mask & (sim > threshold[:, None])


def guide_targets(
    guide_candidates: Tensor, targets: ContrastiveTargets, margin: float = 0.0
) -> tuple[ContrastiveTargets, dict[str, Tensor]]:
    """`targets` without the guide's false negatives, and what was removed: `guide_removed` (negatives removed per
    anchor, mean) and `guide_removed_frac` (their share of all negatives)."""
    removed = false_negatives(guide_candidates, targets, margin)  # (M, N)
    counts = removed.sum(dim=1).float()  # (M,)
    metrics = {
        "guide_removed": counts.mean(),
        "guide_removed_frac": counts.sum() / targets.negative_mask.sum().clamp_min(1),
    }
    return targets.restrict_negatives(~removed), metrics
