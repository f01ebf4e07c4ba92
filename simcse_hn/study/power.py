"""What a plan can detect, said before its runs: at the spread it assumes, at the spread its pilot measured (before the
confirmatory lock), and whether the exact test can reach its level at all; and after them, what it could detect at the
spread its runs showed."""

from __future__ import annotations

from simcse_hn.study.analysis import MAX_SEEDS, detectable_sd, seeds_needed
from simcse_hn.study.plan import Plan


def level(plan: Plan) -> tuple[int, float]:
    """(m, alpha / m): the comparisons of the plan's Holm family and Holm's strictest step."""
    m = len(plan.comparisons) + plan.family_comparisons
    return m, plan.alpha / m


def power_lines(plan: Plan, measured: float | None = None) -> list[str]:
    """What the plan can detect: at the assumed spread, at the pilot's measured one when there is one (with the seeds
    that would reach the smallest effect), and the exact test's floor against alpha / m."""
    n = len(plan.seeds)
    m, at = level(plan)
    factor = detectable_sd(n, at)
    if plan.family:
        against = f"({len(plan.comparisons)} against {plan.baseline}, {plan.family_comparisons} in its family)"
    else:
        against = f"against {plan.baseline}"
    out = [
        f"{n} paired seeds, {m} comparison{'s' * (m > 1)} {against}, Holm at {plan.alpha:g}: a two-sided paired t at "
        f"{at:.4g} (Holm's strictest step) with 80 % power detects {factor:.3f} sd of the paired differences"
    ]
    for label, sd in (("assumed", plan.spread), ("pilot-measured", measured)):
        if sd is None:
            continue
        effect = factor * sd
        reached = effect <= plan.smallest_effect
        line = (
            f"at the {label} sd {sd:g}: {effect:.3f} points of {plan.endpoint}, "
            f"{'at or below' if reached else 'ABOVE'} the smallest effect of interest {plan.smallest_effect:g}"
        )
        if not reached:
            needed = seeds_needed(sd, plan.smallest_effect, at)
            line += f": the planned {n} seeds do not reach it; " + (
                f"{needed} seeds would" if needed else f"not even {MAX_SEEDS} seeds would"
            )
        out.append(line)
    floor = 2 / 2**n
    if floor >= at:
        out.append(
            f"warning: with {n} seeds the exact sign-flip test's smallest p is 2/{2**n} = {floor:.4g}, not below "
            f"alpha/m = {at:.4g}: no arm can be shown to differ, and no interval is bounded"
        )
    return out


def achieved(plan: Plan, comparison: dict) -> dict:
    """After the runs: the effect the study could detect at the largest sd of paired differences its comparisons
    showed (80 % power, Holm's strictest step), against the smallest effect of interest."""
    tests = comparison["tests"]
    arm = max(tests, key=lambda a: tests[a]["sd_of_differences"])
    sd = tests[arm]["sd_of_differences"]
    effect = detectable_sd(len(plan.seeds), level(plan)[1]) * sd
    reached = None if plan.smallest_effect is None else bool(effect <= plan.smallest_effect)
    return {"arm": arm, "sd": sd, "effect": effect, "reached": reached}
