"""The plan's tests over paired seeds: each arm against the baseline by the exact sign-flip test (two-sided) with the
paired t beside it, Holm over the arms, the 95 % t-interval, and the simultaneous interval at alpha / m (Bonferroni)
by inverting the same exact test. The reading ("differs" or "no difference shown") comes from the Holm-adjusted
sign-flip p, and the interval it quotes from the same test at alpha / m: an interval that excludes 0 always goes with
"differs" (Holm's adjusted p is at most m times the raw one)."""

from __future__ import annotations

import itertools

import numpy as np
from scipy import optimize
from scipy import stats as sstats

from simcse_hn.evaluation import stats

MAX_INVERTED = 14  # 2^n sign patterns x 2^n candidate bounds: beyond this, Bonferroni's t-interval


def sign_patterns(n: int) -> np.ndarray:
    """Every one of the 2^n sign vectors, the all-plus one first. (2^n, n)"""
    return np.array(list(itertools.product((1.0, -1.0), repeat=n)))


def sign_flip_interval(d: list[float], level: float) -> tuple[float, float]:
    """The shifts delta that the exact two-sided sign-flip test of mean(d - delta) does not reject at `level` (its p
    at least `level`), as [low, high] (the hull). The p changes only where delta is the mean of a subset of d, so the
    test is read at those points and between them. (-inf, inf) where the test's floor 2 / 2^n is at or above
    `level`: beyond every subset mean the p sits at that floor, and no shift is rejected."""
    x = np.asarray(d, dtype=np.float64)
    if 2 / 2 ** len(x) >= level:
        return float("-inf"), float("inf")
    patterns = sign_patterns(len(x))
    members = patterns[:-1] > 0  # every non-empty subset (the last pattern, all minus, is the empty one)
    means = np.unique((members * x).sum(1) / members.sum(1))
    candidates = np.unique(np.concatenate([means, (means[1:] + means[:-1]) / 2]))  # (K,)
    shifted = (patterns @ x)[None, :] - candidates[:, None] * patterns.sum(1)[None, :]  # sum s (d - delta), (K, 2^n)
    observed = np.abs(shifted[:, :1])
    p = (np.abs(shifted) >= observed - 1e-9 * (1 + observed)).mean(1)
    kept = candidates[p >= level]
    return float(kept.min()), float(kept.max())


def simultaneous_interval(d: list[float], level: float) -> dict:
    """The interval at `level` (alpha / m) by inverting the exact sign-flip test, or Bonferroni's t-interval for
    more than MAX_INVERTED pairs."""
    if len(d) <= MAX_INVERTED:
        low, high = sign_flip_interval(d, level)
        return {"low": low, "high": high, "method": "exact sign-flip, inverted"}
    t = stats.t_interval(d, 1 - level)
    return {"low": t["low"], "high": t["high"], "method": "paired t (more seeds than the exact inversion takes)"}


def compare(values: dict[str, list[float]], baseline: str, alpha: float, smallest_effect: float) -> dict:
    """Each arm against `baseline`, values paired by position (seed). -> {arm: {...}} with the raw and Holm p of
    both tests, the 95 % t-interval, the simultaneous interval at alpha / m, the floor and the reading."""
    m = len(values) - 1
    tests = arm_tests(values, baseline, alpha / m)
    n = len(values[baseline])
    return {"n": n, "m": m, "alpha": alpha, "floor": 2 / 2**n, "level": alpha / m,
            "tests": adjusted(tests, alpha, smallest_effect),
            "detectable_at_observed_sd": {arm: v["sd_of_differences"] * detectable_sd(n, alpha / m)
                                          for arm, v in tests.items()}}  # fmt: skip


def compare_family(groups: dict[str, tuple[dict[str, list[float]], str]], alpha: float,
                   smallest_effect: float) -> dict:  # fmt: skip
    """Every comparison of several plans as one family: {plan: (values, baseline)} -> the tests of `compare`, keyed
    "plan: arm", with Holm over all of them and the simultaneous intervals at alpha / (all of them)."""
    m = sum(len(values) - 1 for values, _ in groups.values())
    tests = {f"{name}: {arm}": v for name, (values, baseline) in groups.items()
             for arm, v in arm_tests(values, baseline, alpha / m).items()}  # fmt: skip
    return {"plans": list(groups), "m": m, "alpha": alpha, "level": alpha / m,
            "tests": adjusted(tests, alpha, smallest_effect)}  # fmt: skip


def arm_tests(values: dict[str, list[float]], baseline: str, level: float) -> dict[str, dict]:
    """Each arm against `baseline` before any adjustment: both tests' raw p, the 95 % t-interval and the
    simultaneous interval at `level`."""
    base = values[baseline]
    floor = 2 / 2 ** len(base)
    tests = {}
    for arm in (arm for arm in values if arm != baseline):
        d = list(np.subtract(values[arm], base))
        t = stats.paired_t_test(values[arm], base)
        flip = stats.sign_flip_test(values[arm], base)
        spread = float(np.std(d, ddof=1))
        tests[arm] = {"difference": t["difference"], "low": t["low"], "high": t["high"], "t": t["t"], "p_t": t["p"],
                      "p_sign_flip": flip["p"], "at_floor": bool(flip["p"] <= floor * (1 + 1e-9)),
                      "sd_of_differences": spread,
                      "simultaneous": simultaneous_interval(d, level)}  # fmt: skip
    return tests


def adjusted(tests: dict[str, dict], alpha: float, smallest_effect: float) -> dict[str, dict]:
    """Holm over every test of the family (both tests' p), the verdict and its reading, in place."""
    for key in ("p_sign_flip", "p_t"):  # Holm leaves out a p that is not finite (a t-test of equal differences)
        holm = stats.holm({name: v[key] for name, v in tests.items()})
        for name, v in tests.items():
            v[f"{key}_holm"] = holm.get(name, float("nan"))
    for v in tests.values():
        v["differs"] = bool(v["p_sign_flip_holm"] < alpha)
        v["reading"] = reading(v, smallest_effect)
    return tests


def per_task(tasks: dict[str, list[dict[str, float]]], baseline: str) -> dict[str, dict[str, float]]:
    """Each arm against `baseline`, {arm: its seeds' {task: score}} paired by position: the mean over the pairs of
    each task's difference (secondary, no test), the tasks in the baseline's first run's order."""
    names = list(tasks[baseline][0])
    return {arm: {t: float(np.mean([a[t] - b[t] for a, b in zip(runs, tasks[baseline])])) for t in names}
            for arm, runs in tasks.items() if arm != baseline}  # fmt: skip


def detectable_sd(n: int, alpha: float, power: float = 0.8) -> float:
    """The smallest mean difference, in sd of the paired differences, that a two-sided paired t-test at `alpha`
    detects with `power` over n pairs (the noncentral t, solved exactly)."""
    critical = sstats.t.ppf(1 - alpha / 2, n - 1)

    def shortfall(effect: float) -> float:
        shift = effect * n**0.5
        lower = np.nan_to_num(sstats.nct.cdf(-critical, n - 1, shift))  # NaN far in the tail: 0
        return float(sstats.nct.sf(critical, n - 1, shift) + lower - power)

    high = 1.0
    while shortfall(high) < 0:  # a bracket: the power grows with the effect
        high *= 2
    return float(optimize.brentq(shortfall, 1e-6, high))


def reading(v: dict, smallest_effect: float) -> str:
    """The verdict in the plan's words, from the Holm-adjusted sign-flip p, with the simultaneous interval."""
    low, high = v["simultaneous"]["low"], v["simultaneous"]["high"]
    interval = f"[{low:+.3f}, {high:+.3f}]"
    if v["differs"]:
        text = f"differs: {v['difference']:+.2f}, simultaneous interval {interval}"
        if low <= 0 <= high:  # Holm's later steps are less strict than Bonferroni's alpha / m
            text += " (Holm's step rejects; Bonferroni's interval, stricter, does not exclude 0)"
        return text
    if not np.isfinite(low) or not np.isfinite(high):
        return "no difference shown; at this many seeds the exact test cannot reach alpha / m, so nothing is bounded"
    if low > 0 or high < 0:  # only Bonferroni's paired t (more seeds than the exact inversion takes) can do this
        return (f"no difference shown by the exact test; Bonferroni's paired-t interval {interval}, which stands in "
                f"for the exact one at {MAX_INVERTED + 1} seeds or more, excludes 0: the two tests disagree")
    text = f"no difference shown; the simultaneous interval bounds it to {interval}"
    if -smallest_effect < low and high < smallest_effect:
        text += f", inside the smallest effect of interest ±{smallest_effect:g}"
    return text

