"""The plan's tests over paired seeds: each arm against the baseline by the exact sign-flip test (two-sided) with the
paired t beside it, Holm over the arms, the 95 % t-interval, the simultaneous interval at alpha / m (Bonferroni) by
inverting the same exact test, and with an equivalence margin the two one-sided exact tests (TOST) at alpha / m.

Every count of the exact test (its p, the interval's ends, TOST's two p) goes through one function,
`stats.sign_flip_counts`, with one tie tolerance set by the scores' scale (`stats.tie_tolerance`): a tie in exact
arithmetic that float64 splits counts as a tie everywhere. What each outcome earns is the plan's (verdicts.py)."""

from __future__ import annotations

import numpy as np
from scipy import optimize
from scipy import stats as sstats

from simcse_hn.evaluation import stats

MAX_INVERTED = 14  # subset means x 2^n sign patterns: beyond this, Bonferroni's t-interval
MAX_SEEDS = 20  # stats.sign_flip_test: every one of 2^n sign patterns


def sign_flip_interval(d: list[float], level: float, tolerance: float | None = None) -> tuple[float, float]:
    """The shifts delta that the exact two-sided sign-flip test of mean(d - delta) does not reject at `level` (its p
    at least `level`), as [low, high] (the hull). The p changes only where delta is the mean of a subset of d, so the
    test is read at those points and between them. (-inf, inf) where the test's floor 2 / 2^n is at or above
    `level`: beyond every subset mean the p sits at that floor, and no shift is rejected. The p at a subset mean
    counts its ties (`tolerance`, by default set by the differences' own scale): that is where the interval ends."""
    x = np.asarray(d, dtype=np.float64)
    n = len(x)
    tolerance = stats.tie_tolerance(n, float(np.abs(x).max())) if tolerance is None else tolerance
    if 2 / 2**n >= level:
        return float("-inf"), float("inf")
    sums, signs = stats.signed_sums(x)
    members = (signs + n) / 2  # the size of the subset each pattern's plus signs pick
    chosen = members > 0
    means = np.unique(((sums[chosen] + x.sum()) / 2) / members[chosen])
    candidates = np.unique(np.concatenate([means, (means[1:] + means[:-1]) / 2]))  # (K,)
    p = stats.sign_flip_counts(x, candidates, tolerance)
    kept = candidates[p >= level]
    return float(kept.min()), float(kept.max())


def simultaneous_interval(d: list[float], level: float, tolerance: float | None = None) -> dict:
    """The interval at `level` (alpha / m) by inverting the exact sign-flip test, or Bonferroni's t-interval for
    more than MAX_INVERTED pairs."""
    if len(d) <= MAX_INVERTED:
        low, high = sign_flip_interval(d, level, tolerance)
        return {"low": low, "high": high, "method": "exact sign-flip, inverted"}
    t = stats.t_interval(d, 1 - level)
    return {"low": t["low"], "high": t["high"], "method": "paired t (more seeds than the exact inversion takes)"}


def tost(d: list[float], margin: float, tolerance: float | None = None) -> dict:
    """The two one-sided exact sign-flip tests of equivalence within +-margin: H0 mean <= -margin (p_lower) and H0
    mean >= +margin (p_upper); equivalence is shown at a level when both p are below it. -> {"p_lower", "p_upper",
    "p"} (p: the larger, TOST's p)."""
    if tolerance is None:
        tolerance = stats.tie_tolerance(len(d), float(np.abs(np.asarray(d, dtype=np.float64)).max()))
    lower = float(stats.sign_flip_counts(d, [-margin], tolerance, side="greater")[0])
    upper = float(stats.sign_flip_counts(d, [margin], tolerance, side="less")[0])
    return {"p_lower": lower, "p_upper": upper, "p": max(lower, upper)}


def compare(values: dict[str, list[float]], baseline: str, alpha: float, margin: float | None = None) -> dict:
    """Each arm against `baseline`, values paired by position (seed). -> {"tests": {arm: {...}}, ...} with the raw
    and Holm p of both tests, the 95 % t-interval, the simultaneous interval at alpha / m, TOST's p against `margin`
    (when given), the floor and the effect detectable at each arm's observed sd."""
    m = len(values) - 1
    tests = arm_tests(values, baseline, alpha / m, margin)
    n = len(values[baseline])
    return {
        "n": n,
        "m": m,
        "alpha": alpha,
        "floor": 2 / 2**n,
        "level": alpha / m,
        "margin": margin,
        "tests": adjusted(tests, alpha),
        "detectable_at_observed_sd": {
            arm: v["sd_of_differences"] * detectable_sd(n, alpha / m) for arm, v in tests.items()
        },
    }


def compare_family(
    groups: dict[str, tuple[dict[str, list[float]], str]], alpha: float, margin: float | None = None
) -> dict:
    """Every comparison of several plans as one family: {plan: (values, baseline)} -> the tests of `compare`, keyed
    "plan: arm", with Holm over all of them, the simultaneous intervals and TOST at alpha / (all of them)."""
    m = sum(len(values) - 1 for values, _ in groups.values())
    tests = {
        f"{name}: {arm}": v
        for name, (values, baseline) in groups.items()
        for arm, v in arm_tests(values, baseline, alpha / m, margin).items()
    }
    return {
        "plans": list(groups),
        "m": m,
        "alpha": alpha,
        "level": alpha / m,
        "margin": margin,
        "tests": adjusted(tests, alpha),
    }


def arm_tests(
    values: dict[str, list[float]], baseline: str, level: float, margin: float | None = None
) -> dict[str, dict]:
    """Each arm against `baseline` before any adjustment: both tests' raw p, the 95 % t-interval, the simultaneous
    interval at `level` and TOST's p, every exact count with one tie tolerance (the scores' scale)."""
    base = values[baseline]
    n = len(base)
    tests = {}
    for arm in (arm for arm in values if arm != baseline):
        d = list(np.subtract(values[arm], base))
        tolerance = stats.tie_tolerance(n, float(np.max(np.abs([*values[arm], *base]))))
        t = stats.paired_t_test(values[arm], base)
        p = float(stats.sign_flip_counts(d, [0.0], tolerance)[0])
        tests[arm] = {
            "difference": t["difference"],
            "low": t["low"],
            "high": t["high"],
            "t": t["t"],
            "p_t": t["p"],
            "p_sign_flip": p,
            "at_floor": bool(p <= 2 / 2**n * (1 + 1e-9)),
            "sd_of_differences": float(np.std(d, ddof=1)),
            "tie_tolerance": tolerance,
            "simultaneous": simultaneous_interval(d, level, tolerance),
        }
        if margin is not None:
            tests[arm]["tost"] = tost(d, margin, tolerance)
    return tests


def adjusted(tests: dict[str, dict], alpha: float) -> dict[str, dict]:
    """Holm over every test of the family (both tests' p), and whether the Holm-adjusted sign-flip p rejects, in
    place."""
    for key in ("p_sign_flip", "p_t"):  # Holm leaves out a p that is not finite (a t-test of equal differences)
        holm = stats.holm({name: v[key] for name, v in tests.items()})
        for name, v in tests.items():
            v[f"{key}_holm"] = holm.get(name, float("nan"))
    for v in tests.values():
        v["differs"] = bool(v["p_sign_flip_holm"] < alpha)
    return tests


def against_starts(values: dict[str, list[float]], starts: dict[str, float]) -> dict[str, dict[str, dict]]:
    """Each arm's seeds against each start's one score (no test of the plan): {arm: {start: {"difference" (the mean
    over the seeds), "low", "high" (its 95 % t-interval), "above" (seeds above the start), "n"}}}."""
    out: dict[str, dict[str, dict]] = {}
    for arm, seeds in values.items():
        out[arm] = {}
        for label, start in starts.items():
            interval = stats.t_interval(np.subtract(seeds, start))
            out[arm][label] = {
                "difference": interval["mean"],
                "low": interval["low"],
                "high": interval["high"],
                "above": int(sum(v > start for v in seeds)),
                "n": len(seeds),
            }
    return out


def per_task(tasks: dict[str, list[dict[str, float]]], baseline: str) -> dict[str, dict[str, float]]:
    """Each arm against `baseline`, {arm: its seeds' {task: score}} paired by position: the mean over the pairs of
    each task's difference (secondary, no test), the tasks in the baseline's first run's order."""
    names = list(tasks[baseline][0])
    return {
        arm: {t: float(np.mean([a[t] - b[t] for a, b in zip(runs, tasks[baseline])])) for t in names}
        for arm, runs in tasks.items()
        if arm != baseline
    }


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


def seeds_needed(sd: float, effect: float, alpha: float, most: int = MAX_SEEDS) -> int | None:
    """The fewest paired seeds (2 to `most`) whose detectable effect at `alpha` and sd `sd` is at most `effect`, and
    whose exact test can reach `alpha` at all (2 / 2^n below it); None when even `most` do not."""
    for n in range(2, most + 1):
        if 2 / 2**n < alpha and detectable_sd(n, alpha) * sd <= effect:
            return n
    return None
