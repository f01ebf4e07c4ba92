"""Encoding and STS scoring, shared by the trainer (STS-B dev) and eval/sts.py (the full suite)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from scipy.stats import spearmanr
from torch import Tensor

EncodeFn = Callable[[list[str]], Tensor]


def encode_unique(encode: EncodeFn, sentences: list[str]) -> dict[str, Tensor]:
    """Encode each distinct sentence once. -> {sentence: (D,) embedding}"""
    unique = list(dict.fromkeys(sentences))
    embeddings = encode(unique)  # (U, D)
    return dict(zip(unique, embeddings))


def cosine_scores(lookup: dict[str, Tensor], sentence1: list[str], sentence2: list[str]) -> Tensor:
    a = torch.stack([lookup[s] for s in sentence1]).double()
    b = torch.stack([lookup[s] for s in sentence2]).double()
    return F.cosine_similarity(a, b, dim=-1, eps=1e-12)


def spearman_x100(predictions, gold) -> float:
    return float(spearmanr(predictions, gold).statistic) * 100


def sts_spearman(encode: EncodeFn, sentence1: list[str], sentence2: list[str], scores: list[float]) -> float:
    """Spearman x 100 between gold scores and the cosine similarity of the two sentences' embeddings."""
    lookup = encode_unique(encode, sentence1 + sentence2)
    return spearman_x100(cosine_scores(lookup, sentence1, sentence2).numpy(), scores)
