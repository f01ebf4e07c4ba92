"""A false-negative guard with a guide model (GISTEmbed, Solatorio 2024, arXiv:2402.16829).

Candidates that the guide scores above the anchor's positive, minus a margin, are taken for false negatives and
removed from N(i) for the step: with guide similarities g, j leaves N(i) when g_ij > g_ip - margin. The guide is a
frozen sentence-transformers model, or the model being trained (`self`: its own embeddings of the step, detached,
so no second forward). Guide scores never carry gradient; only the negative mask changes.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor, nn

from simcse_hn.data.collator import GUIDE_PREFIX
from simcse_hn.errors import ConfigError
from simcse_hn.losses.base import cosine_similarities, positive_logits
from simcse_hn.losses.targets import ContrastiveTargets

logger = logging.getLogger(__name__)

SELF = "self"


def false_negatives(guide_candidates: Tensor, targets: ContrastiveTargets, margin: float = 0.0) -> Tensor:
    """(M, N) bool: the negatives of `targets` whose guide similarity to the anchor exceeds the guide similarity of
    the anchor's positive minus `margin`. guide_candidates (N, E): the guide's embeddings of the candidates (the
    anchors are its rows targets.anchor_index). No gradient, no host synchronisation."""
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


class Guide(nn.Module):
    """A frozen sentence-transformers model as the guide: `forward(features)` -> (b, E) embeddings without gradient,
    `tokenize(texts)` -> its own features (tensors) for the collator (its tokenizer and max_seq_length, not the trained
    model's)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model.eval().requires_grad_(False)

    def tokenize(self, texts: list[str]) -> dict[str, Tensor]:
        features = self.model.preprocess(texts)
        return {key: value for key, value in features.items() if isinstance(value, Tensor)}

    def train(self, mode: bool = True) -> Guide:  # always in eval mode: the guide's scores are deterministic
        return super().train(False)

    @torch.no_grad()
    def forward(self, features: dict[str, Tensor]) -> Tensor:
        return self.model(dict(features))["sentence_embedding"]


def guide_row_embeddings(guide: nn.Module, batch: dict[str, Tensor], rows: int) -> Tensor:
    """The guide's embeddings (R, E) of a batch's `rows`, without gradient: the collator tokenised each text once for
    the guide (the batch's `guide_*` keys), and single-sentence rows [a, a', ...] repeat each text twice."""
    features = {key[len(GUIDE_PREFIX) :]: value for key, value in batch.items() if key.startswith(GUIDE_PREFIX)}
    if not features:
        raise ValueError("guide_model: the batch has no guide_* features; give the collator guide_tokenize")
    embeddings = guide(features)  # (texts, E)
    return embeddings if embeddings.shape[0] == rows else embeddings.repeat_interleave(2, dim=0)


def load_guide(name_or_path: str) -> Guide:
    """The guide model of `--guide_model` (a Hub id or a local folder that sentence-transformers loads, e.g. a
    simcse-hn output folder)."""
    # a slow import: only where its models are used
    from sentence_transformers import SentenceTransformer

    try:
        model = SentenceTransformer(name_or_path, device="cpu")
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"guide_model: cannot load {name_or_path} with sentence-transformers ({first})") from None
    logger.info("guide model %s (max_seq_length %s)", name_or_path, model.max_seq_length)
    return Guide(model)
