"""The pilot's tuning, read for what a reviewer should doubt: each tuned arm's pick (the best mean dev score over the
pilot's seeds), the picks at an edge of any grid (an objective's own `loss_options` grid included) or within their
seeds' noise, each arm's tuned dimensions side by side (an arm tuned in more dimensions than another is not tuned
alike), and how much of the dev set the endpoint's test files hold, sentence by sentence, case and punctuation
aside."""

from __future__ import annotations

import os
import unicodedata

import numpy as np

from simcse_hn.data.sts import STS_FILES, load_sts_pairs, read_sts_jsonl
from simcse_hn.study.plan import Plan, grid_points


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def dimensions(grid: dict) -> dict[str, list]:
    """The grid's dimensions, {option: its values}: each option with more than one value; a `loss_options` grid
    ({loss_options: [{k: 1}, {k: 2}]}) by each of its own options that takes more than one value."""
    out = {}
    for option, values in grid.items():
        if values and all(isinstance(v, dict) for v in values):
            for inner in dict.fromkeys(k for v in values for k in v):
                found = [v.get(inner) for v in values]
                if len({repr(x) for x in found}) > 1:
                    out[f"{option}.{inner}"] = found
        elif len({repr(v) for v in values}) > 1:
            out[option] = list(values)
    return out


def _picked(pick: dict, dimension: str):
    option, _, inner = dimension.partition(".")
    return (pick.get(option) or {}).get(inner) if inner else pick.get(option)


def choose(plan: Plan, runs: list[dict]) -> tuple[dict, float | None]:
    """Each tuned arm's grid point with the best mean dev score over the pilot seeds; the largest sd of paired dev
    differences against the baseline's pick (None below two seeds)."""
    picks = {}
    for arm, grid in ((plan.pilot or {}).get("tune") or {}).items():
        means = [
            (float(np.mean([r["dev"] for r in runs if r["arm"] == arm and r["change"] == change])), i, change)
            for i, change in enumerate(grid_points(grid))
        ]
        picks[arm] = max(means, key=lambda m: (m[0], -m[1]))[2]  # a tie: the first in the plan's grid
    seeds = (plan.pilot or {}).get("seeds") or plan.seeds[:1]
    if len(seeds) < 2 or not all(r["dev"] is not None for r in runs):
        return picks, None

    def dev(arm: str, seed: int) -> float:
        return next(
            r["dev"]
            for r in runs
            if r["arm"] == arm and r["seed"] == seed and r["change"] == picks.get(arm, r["change"])
        )

    spreads = [np.std([dev(a, s) - dev(plan.baseline, s) for s in seeds], ddof=1) for a in plan.comparisons]
    return picks, float(max(spreads))


def tuning(plan: Plan, runs: list[dict], picks: dict) -> dict[str, dict]:
    """Each tuned arm's grid as the pilot saw it: every point's mean dev score and sd over the pilot seeds, the
    dimensions whose picked value is the lowest or highest of numbers (the best may then lie beyond what was tried),
    and the pick's lead over the next best point."""
    out = {}
    for arm, grid in ((plan.pilot or {}).get("tune") or {}).items():
        points = []
        for change in grid_points(grid):
            dev = [r["dev"] for r in runs if r["arm"] == arm and r["change"] == change and r["dev"] is not None]
            points.append(
                {
                    "change": change,
                    "mean": float(np.mean(dev)) if dev else None,
                    "sd": float(np.std(dev, ddof=1)) if len(dev) > 1 else None,
                }
            )
        pick, edges = picks[arm], {}
        for dimension, values in dimensions(grid).items():
            picked = _picked(pick, dimension)
            if all(_number(v) for v in values) and _number(picked):
                edge = "lowest" if picked == min(values) else "highest" if picked == max(values) else None
                if edge:
                    edges[dimension] = edge
        means = sorted((p["mean"] for p in points if p["mean"] is not None), reverse=True)
        at_pick = next(p for p in points if p["change"] == pick)
        out[arm] = {
            "points": points,
            "pick": pick,
            "edges": edges,
            "lead": means[0] - means[1] if len(means) > 1 else None,
            "sd_at_pick": at_pick["sd"],
            "dimensions": {d: len(v) for d, v in dimensions(grid).items()},
        }
    return out


def show(value) -> str:
    return "–" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def tuning_notes(tuned: dict[str, dict]) -> list[str]:
    """One line per doubt a reader should have of a pick: a dimension at the edge of its grid, a lead over the next
    best point smaller than the seeds' spread, a pick whose noise one seed cannot show."""
    notes = []
    for arm, t in tuned.items():
        for dimension, edge in t["edges"].items():
            beyond = "below" if edge == "lowest" else "above"
            notes.append(
                f"{arm}: the pick, {dimension} {show(_picked(t['pick'], dimension))}, is the {edge} value of its "
                f"grid: the best may lie {beyond} it, which this pilot did not try."
            )
        if t["lead"] is not None and t["sd_at_pick"] is not None and t["lead"] < t["sd_at_pick"]:
            notes.append(
                f"{arm}: the pick leads the next best point by {t['lead']:.3g}, less than the sd of its dev score "
                f"over the seeds ({t['sd_at_pick']:.3g}): within the seeds' noise."
            )
        elif t["lead"] is not None and t["sd_at_pick"] is None:
            notes.append(
                f"{arm}: one pilot seed: whether the pick's lead ({t['lead']:.3g}) is more than noise is unknown."
            )
    return notes


def dimension_rows(plan: Plan) -> list[dict]:
    """Each arm's tuning side by side: {arm, dimensions {name: values}, points, why (an untuned arm's reason)}."""
    pilot = plan.pilot or {}
    tune, untuned = pilot.get("tune") or {}, pilot.get("untuned") or {}
    rows = []
    for arm in plan.arms:
        if arm in tune:
            rows.append({"arm": arm, "dimensions": {d: len(v) for d, v in dimensions(tune[arm]).items()},
                         "points": len(grid_points(tune[arm])), "why": None})  # fmt: skip
        elif tune:
            rows.append({"arm": arm, "dimensions": {}, "points": 1, "why": str(untuned.get(arm, "not tuned"))})
    return rows


def dimension_notes(rows: list[dict]) -> list[str]:
    """A warning when the arms are tuned in different numbers of dimensions: the one tuned in more had more chances
    to find a good point, whatever the budget."""
    counts = {len(r["dimensions"]) for r in rows}
    if len(counts) < 2:
        return []
    said = "; ".join(
        f"{r['arm']} in {len(r['dimensions'])}" + (f" ({', '.join(r['dimensions'])})" if r["dimensions"] else "")
        for r in sorted(rows, key=lambda r: -len(r["dimensions"]))
    )
    return [
        f"warning: the arms are not tuned alike: {said} dimension(s); an arm tuned in more had more to choose from."
    ]


def normal(sentence: str) -> str:
    """A sentence as the dev-test overlap compares it: case, punctuation and spacing aside."""
    kept = "".join(" " if unicodedata.category(c).startswith("P") else c for c in sentence.lower())
    return " ".join(kept.split())


def overlap(plan: Plan) -> dict | None:
    """What the pilot's dev set shares with the test pairs of every task the evaluation scores, sentence by sentence
    (case, punctuation and spacing aside): {"pairs" (dev pairs that are test pairs, either order), "with_sentence" (dev
    pairs with a sentence of a test file), "sentences" (distinct dev sentences in a test file), "of" (dev pairs)}. None
    with the evaluation data on the Hub (no data_dir): not counted."""
    if not plan.evaluation.get("data_dir"):
        return None
    pairs, sentences = set(), set()
    for task in plan.tasks():
        path = os.path.join(plan.folder, str(plan.evaluation["data_dir"]), STS_FILES[task])
        if os.path.isfile(path):
            for r in (r for r in read_sts_jsonl(path) if r.get("split") in (None, "test")):
                a, b = normal(r["sentence1"]), normal(r["sentence2"])
                pairs.add(frozenset((a, b)))
                sentences |= {a, b}
    dev = plan.pilot["dev"]
    found = load_sts_pairs(os.path.join(plan.folder, dev["file"]), dev.get("split"))
    dev_pairs = [(normal(a), normal(b)) for a, b in zip(found.sentence1, found.sentence2)]
    return {
        "pairs": sum(frozenset(p) in pairs for p in dev_pairs),
        "with_sentence": sum(a in sentences or b in sentences for a, b in dev_pairs),
        "sentences": len({s for p in dev_pairs for s in p} & sentences),
        "of": len(dev_pairs),
    }
