"""Statistics for comparing runs: intervals over seeds, a paired t-test by seed, a paired bootstrap over STS pairs.

* `t_interval`: mean, standard deviation (ddof 1) and the Student t-interval mean +- t(1 - a/2, n-1) s / sqrt(n)
  over the seeds of one objective.
* `paired_t_test`: scipy.stats.ttest_rel of two objectives' scores paired by seed, with the t-interval of the mean
  difference.
* `holm`: Holm's step-down adjustment of the p-values of several groups tested against one baseline, so that a
  study of many objectives keeps its family-wise error at the level read (with six arms, a p of 0.012 is one of six
  chances at 0.05).
* `bootstrap_draws` / `bootstrap_scores` / `bootstrap_difference`: the test set resampled with replacement within
  each sub-file (B resamples, one seed), every run scored on the same resamples, so that differences are paired by
  pair and a mean over seeds uses one resample for all of them. A task's score on a resample follows its
  aggregation (pooled, or the mean / pair-weighted mean of the sub-files); the average is the mean over tasks.
  Percentile interval; two-sided p = 2 x the share of resamples at or beyond 0 on the far side, (k + 1) / (B + 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats
from scipy.stats import rankdata

from simcse_hn.data.sts import SENTEVAL_MULTI_FILE
from simcse_hn.errors import DataError

Predictions = dict[str, dict[str, np.ndarray]]  # {task: {"cosine", "gold", "subset"}}, as predictions.npz holds


def t_interval(values: Sequence[float], confidence: float = 0.95) -> dict:
    """-> {"mean", "std", "n", "low", "high"}; std and the interval are NaN for fewer than two values."""
    x = np.asarray(values, dtype=np.float64)
    n = len(x)
    mean = float(x.mean()) if n else float("nan")
    if n < 2:
        return {"mean": mean, "std": float("nan"), "n": n, "low": float("nan"), "high": float("nan")}
    std = float(x.std(ddof=1))
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * std / np.sqrt(n)
    return {"mean": mean, "std": std, "n": n, "low": mean - half, "high": mean + half}


def paired_t_test(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> dict:
    """a[i] and b[i] from the same seed. -> {"n", "difference" (mean of a - b), "low", "high", "t", "p"}"""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    interval = t_interval(a - b, confidence)
    out = {"n": len(a), "difference": interval["mean"], "low": interval["low"], "high": interval["high"]}
    if len(a) < 2:
        return out | {"t": float("nan"), "p": float("nan")}
    result = stats.ttest_rel(a, b)
    return out | {"t": float(result.statistic), "p": float(result.pvalue)}


# Two sums of paired differences closer than this share of n x the scores' scale are one value. Scores such as
# Spearman x 100 lie on a lattice (ranks are integers or halves; an STS average's distinct sign-flip sums sit 1e-6
# apart or more), while float64 puts an error of about 1e-14 on each: an exact tie split by rounding would otherwise
# count as two values and make the p too small.
TIE_SHARE = 2.0**-40


def tie_tolerance(n: int, scale: float) -> float:
    """How far two sums of n paired differences of scores of magnitude `scale` may lie and still be one value."""
    return n * max(float(scale), 1.0) * TIE_SHARE


def signed_sums(d: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """sum(s * d) and sum(s) for every one of the 2^n sign vectors s, the all-plus one first, each sum added in the
    same order. -> ((2^n,), (2^n,))"""
    sums, signs = np.zeros(1), np.zeros(1)
    for x in np.asarray(d, dtype=np.float64):
        sums, signs = np.concatenate([sums + x, sums - x]), np.concatenate([signs + 1, signs - 1])
    return sums, signs


def sign_flip_counts(
    d: Sequence[float], shifts: Sequence[float], tolerance: float, side: str = "two-sided", chunk: int = 256
) -> np.ndarray:
    """The share of the 2^n sign patterns at least as extreme as the observed one, for the differences shifted by each
    of `shifts`: the exact p of mean(d - shift) = 0. Sums within `tolerance` of the observed one count as ties (always
    in, as an exact count has them). side: "two-sided" (|sum|), "greater" (sum >= observed: H0 mean <= shift),
    "less" (sum <= observed: H0 mean >= shift). -> (len(shifts),)"""
    sums, signs = signed_sums(d)
    shifts = np.asarray(shifts, dtype=np.float64)
    out = np.empty(len(shifts))
    for start in range(0, len(shifts), chunk):  # memory: chunk x 2^n sums at a time
        shifted = sums[None, :] - shifts[start : start + chunk, None] * signs[None, :]  # (k, 2^n)
        observed = shifted[:, :1]
        if side == "two-sided":
            extreme = np.abs(shifted) >= np.abs(observed) - tolerance
        elif side == "greater":
            extreme = shifted >= observed - tolerance
        else:
            extreme = shifted <= observed + tolerance
        out[start : start + chunk] = extreme.mean(1)
    return out


def sign_flip_test(a: Sequence[float], b: Sequence[float]) -> dict:
    """The exact sign-flip (paired permutation) test of the mean of d = a - b, two-sided: under no difference each pair
    is as likely swapped, so the p-value is the share of all 2^n swaps whose mean difference is at least as far from 0
    as the observed one, ties counted in (within `tie_tolerance` of the scores' scale; p >= 2 / 2^n). No normality is
    assumed; n up to 20 (a million patterns). a[i] and b[i] from the same seed. -> {"n", "difference", "p"}"""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n = len(a)
    if n == 0 or n > 20:
        raise ValueError(f"the exact sign-flip test takes 1 to 20 pairs, got {n}")
    tolerance = tie_tolerance(n, max(np.abs(a).max(), np.abs(b).max()))
    p = float(sign_flip_counts(a - b, [0.0], tolerance)[0])
    return {"n": n, "difference": float((a - b).mean()), "p": p}


def holm(p_values: dict[str, float]) -> dict[str, float]:
    """Holm-Bonferroni adjusted p-values, {name: p} -> {name: adjusted p}, over the finite ones (the others are left
    out). The k-th smallest of m is multiplied by m - k + 1, kept monotone and capped at 1: an adjusted p below a is
    a rejection at family-wise level a, with no assumption on how the tests depend on each other."""
    finite = sorted((p, name) for name, p in p_values.items() if np.isfinite(p))
    adjusted, running = {}, 0.0
    for k, (p, name) in enumerate(finite):
        running = max(running, min(1.0, (len(finite) - k) * p))
        adjusted[name] = running
    return adjusted


def same_pairs(a: Predictions, b: Predictions) -> bool:
    """Whether two runs were scored on the same pairs (tasks, gold scores and sub-files, in the same order)."""
    return a.keys() == b.keys() and all(
        np.array_equal(a[t]["gold"], b[t]["gold"]) and np.array_equal(a[t]["subset"], b[t]["subset"]) for t in a
    )


def bootstrap_draws(predictions: Predictions, resamples: int = 1000, seed: int = 0) -> dict[str, list[np.ndarray]]:
    """Resampled pair positions for each task, one (B, n_s) array per sub-file (positions into the task's arrays),
    drawn task by task and sub-file by sub-file in order from numpy.random.default_rng(seed)."""
    rng = np.random.default_rng(seed)
    draws = {}
    for task, columns in predictions.items():
        subset = columns["subset"]
        draws[task] = []
        for name in dict.fromkeys(subset.tolist()):
            positions = np.flatnonzero(subset == name)  # (n_s,)
            draws[task].append(positions[rng.integers(0, len(positions), size=(resamples, len(positions)))])
    return draws


def _rows_spearman(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman x 100 of each row pair: Pearson of average ranks (SciPy's definition, ties included). (B, n) -> (B,)"""
    rx, ry = rankdata(x, axis=1), rankdata(y, axis=1)
    rx -= rx.mean(axis=1, keepdims=True)
    ry -= ry.mean(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return 100 * (rx * ry).sum(1) / np.sqrt((rx * rx).sum(1) * (ry * ry).sum(1))


def bootstrap_scores(
    predictions: Predictions, draws: dict[str, list[np.ndarray]], aggregation: str, chunk: int = 250
) -> dict[str, np.ndarray]:
    """One run's score on every resample. -> {task: (B,), "average": (B,)}; Spearman x 100."""
    scores = {}
    for task, blocks in draws.items():
        cosine, gold = predictions[task]["cosine"], predictions[task]["gold"]
        resamples = blocks[0].shape[0]
        pooled = aggregation == "all" or task not in SENTEVAL_MULTI_FILE
        out = np.empty(resamples)
        for start in range(0, resamples, chunk):  # bounded memory: chunk x n floats at a time
            rows = [block[start : start + chunk] for block in blocks]
            if pooled:
                positions = np.concatenate(rows, axis=1)  # (b, n)
                out[start : start + chunk] = _rows_spearman(cosine[positions], gold[positions])
            else:
                per_file = np.stack([_rows_spearman(cosine[p], gold[p]) for p in rows])  # (files, b)
                weights = [p.shape[1] for p in rows] if aggregation == "wmean" else None
                out[start : start + chunk] = np.average(per_file, axis=0, weights=weights)
        scores[task] = out
    scores["average"] = np.mean([scores[task] for task in draws], axis=0)
    return scores


def bootstrap_difference(differences: np.ndarray, observed: float, confidence: float = 0.95) -> dict:
    """Summary of resampled differences (B,). -> {"difference" (observed), "low", "high", "p", "resamples"}"""
    d = differences[np.isfinite(differences)]
    alpha = 1 - confidence
    low, high = np.quantile(d, [alpha / 2, 1 - alpha / 2]) if d.size else (np.nan, np.nan)
    below, above = (np.sum(d <= 0) + 1) / (d.size + 1), (np.sum(d >= 0) + 1) / (d.size + 1)
    return {
        "difference": float(observed),
        "low": float(low),
        "high": float(high),
        "p": float(min(1.0, 2 * min(below, above))),
        "resamples": int(d.size),
    }


def observed_scores(predictions: Predictions, aggregation: str) -> dict[str, float]:
    """The scores of the pairs as they are (what results.json reports), from the same code path. -> {task, average}"""
    identity = {}
    for task, columns in predictions.items():
        subset = columns["subset"]
        identity[task] = [np.flatnonzero(subset == name)[None] for name in dict.fromkeys(subset.tolist())]
    return {key: float(value[0]) for key, value in bootstrap_scores(predictions, identity, aggregation).items()}


def check_pairs(runs: Sequence[tuple[str, Predictions]]) -> None:
    for label, predictions in runs[1:]:
        if not same_pairs(runs[0][1], predictions):
            raise DataError(f"{label}: its predictions are not on the same pairs as {runs[0][0]}'s")
