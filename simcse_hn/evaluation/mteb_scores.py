"""STS scores the way MTEB's STS evaluator computes them: Pearson and Spearman (fractions, 0-1) of the gold scores
against the cosine similarity, the negative Manhattan and Euclidean distances and the model's own similarity."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import pearsonr, spearmanr
from torch import Tensor

SCORE_KEYS = ("pearson", "spearman", "cosine_pearson", "cosine_spearman", "manhattan_pearson", "manhattan_spearman",
              "euclidean_pearson", "euclidean_spearman")  # fmt: skip
SIMILARITIES = ("cosine", "dot", "euclidean", "manhattan")


def paired_cosine(e1, e2) -> np.ndarray:
    """Each pair's cosine similarity as MTEB's STS evaluator computes it: scikit-learn's paired cosine distance on the
    float32 embeddings (rows normalised, then 1 - |u - v|^2 / 2, all in float32; the same formulas, in numpy).
    The STS report and the trainer's STS-B dev score take their cosines from here too, so that every number of a
    task is one number: float32's rounding makes cosines that are equal in exact arithmetic (a sentence with itself,
    a pair and its swap, two texts with the same tokens encoded in different batches) one value, where float64 ranks
    them by their last bits, which move with the batch a sentence was encoded in. e1, e2: (n, D) -> (n,) float64"""
    a, b = np.asarray(e1, dtype=np.float32), np.asarray(e2, dtype=np.float32)
    difference = a / _row_norms(a)[:, None] - b / _row_norms(b)[:, None]  # sklearn.preprocessing.normalize
    return (1 - 0.5 * np.einsum("ij,ij->i", difference, difference)).astype(np.float64)  # 1 - paired distance


def _row_norms(x: np.ndarray) -> np.ndarray:  # sklearn.utils.extmath.row_norms
    return np.sqrt(np.einsum("ij,ij->i", x, x))


def sts_scores(e1: np.ndarray, e2: np.ndarray, gold, similarity: str = "cosine") -> dict[str, float]:
    """MTEB's STS scores of one task (AnySTSEvaluator + AbsTaskSTS._calculate_scores): the pairs' embeddings e1, e2
    (n, D), the gold scores (n,). The similarities are computed as MTEB computes them, by scikit-learn's paired
    cosine, Manhattan and Euclidean distances on the float32 embeddings (`paired_cosine`; the same formulas, in
    numpy). MTEB normalises the gold scores to 0-1 first, which no correlation sees.
    `similarity`: the model's own function (its `pearson` and `spearman`), cosine for SimCSE models."""
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity must be one of {SIMILARITIES}, got {similarity!r}")
    a, b = np.asarray(e1, dtype=np.float32), np.asarray(e2, dtype=np.float32)
    gold = np.asarray(gold, dtype=np.float64)
    values = {
        "cosine": paired_cosine(a, b),
        "manhattan": -np.abs(a - b).sum(axis=1),
        "euclidean": -_row_norms(a - b),
    }
    values = {name: v.astype(np.float64) for name, v in values.items()}  # (n,), as MTEB's .tolist() gives them
    model = model_similarity(torch.from_numpy(a), torch.from_numpy(b), similarity).double().numpy()
    scores = {}
    for name in ("cosine", "manhattan", "euclidean"):
        scores[f"{name}_pearson"] = float(pearsonr(gold, values[name])[0])
        scores[f"{name}_spearman"] = float(spearmanr(gold, values[name])[0])
    scores["pearson"] = float(pearsonr(gold, model)[0])
    scores["spearman"] = float(spearmanr(gold, model)[0])
    return {key: scores[key] for key in SCORE_KEYS}


def model_similarity(a: Tensor, b: Tensor, similarity: str) -> Tensor:
    """The model's own similarity of each pair, as MTEB computes it for `pearson` and `spearman` (its
    similarity_functions.pairwise_*: torch, float32), not by scikit-learn as for `cosine_*`: the two round
    differently, and a tie one makes the other breaks (MiniLM's STS12 `spearman` and `cosine_spearman` differ by
    1.7e-5 in MTEB's own files). a, b: (n, D) float32 -> (n,)"""
    if similarity == "cosine":
        return (F.normalize(a, p=2, dim=1) * F.normalize(b, p=2, dim=1)).sum(dim=-1)
    if similarity == "dot":
        return (a * b).sum(dim=-1)
    if similarity == "euclidean":
        return -torch.sqrt(torch.sum((a - b) ** 2, dim=-1))
    return -torch.sum(torch.abs(a - b), dim=-1)  # manhattan
