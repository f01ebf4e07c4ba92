"""The checks of a plan's pilot section, one line each naming the file, the line and the key, before any run (`plan`
and `pilot` run them; the pilot's keys are in pilot.py's docstring)."""

from __future__ import annotations

import math
import os

from simcse_hn.data.sts import STS_DATA_HINT
from simcse_hn.study.plan import Plan
from simcse_hn.study.plan_file import problem_line, read_plan

PILOT_KEYS = ("overrides", "seeds", "reference", "criteria", "dev", "tune", "untuned", "unequal_budget")
# what the plan states of its dev set, counted again by the pilot (tuning.overlap)
DEV_COUNTS = {
    "shares_with_test": "of the dev set's pairs are test pairs of the endpoint (either order)",
    "shares_sentences_with_test": "of the dev set's pairs have a sentence a test file of the endpoint holds",
}
CRITERIA = {"loss_ratio": (), "weight_share": ("arms", "ratio"), "clamp": ("arms", "below")}


def check(plan: Plan) -> list[str]:
    """The pilot section's problems, one line each (file:line: pilot.key: what), before any run."""
    _, lines = read_plan(plan.path)
    pilot, out = plan.pilot or {}, []

    def problem(where: tuple, message: str) -> None:
        out.append(problem_line(plan.path, lines, ("pilot", *where), message))

    for key in pilot:
        if key not in PILOT_KEYS:
            problem((key,), f"unknown key; the keys are {', '.join(PILOT_KEYS)}")
    seeds = pilot.get("seeds")
    if seeds is not None and (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
    ):
        problem(("seeds",), f"a list of integer seeds, got {seeds!r}")
    for part in ("overrides", "reference"):
        if pilot.get(part) is not None and not isinstance(pilot[part], dict):
            problem((part,), "a mapping of train.py keys")
    problem_criteria(plan, pilot, problem)
    tune, untuned = pilot.get("tune") or {}, pilot.get("untuned") or {}
    sizes = {}
    for arm, grid in tune.items():
        if arm not in plan.arms:
            problem(("tune", arm), "not an arm of the plan")
        elif not isinstance(grid, dict) or not grid or not all(isinstance(v, list) and v for v in grid.values()):
            problem(
                ("tune", arm),
                "options and their grids, e.g. {temperature: [0.04, 0.05]} (several options: "
                "every combination is a grid point)",
            )
        else:
            sizes[arm] = math.prod(len(v) for v in grid.values())
    if len(set(sizes.values())) > 1 and not pilot.get("unequal_budget"):
        listed = ", ".join(f"{a} {n}" for a, n in sizes.items())
        problem(
            ("tune",),
            f"grids of unequal size ({listed}); every arm gets the same tuning budget, or say why "
            "not in pilot.unequal_budget",
        )
    for arm in untuned:
        if arm not in plan.arms:
            problem(("untuned", arm), "not an arm of the plan")
        elif arm in tune:
            problem(("untuned", arm), "also in pilot.tune; an arm is tuned or left as it is")
    if tune:
        for arm in plan.arms:
            if arm not in tune and arm not in untuned:
                problem(("tune",), f"arm {arm} is neither tuned nor in pilot.untuned with a reason")
    dev = pilot.get("dev") or {}
    if tune and not dev.get("file"):
        problem(("dev", "file"), "tuning picks on a dev set; name it (never the endpoint's test data)")
    if dev.get("file") and not os.path.isfile(os.path.join(plan.folder, str(dev["file"]))):
        problem(("dev", "file"), f"{dev['file']}: no such file (relative to the plan; {STS_DATA_HINT})")
    for key, what in DEV_COUNTS.items():
        if dev.get("file") and (not isinstance(dev.get(key), int) or isinstance(dev.get(key), bool)):
            problem(("dev", key), f"state how many {what} (case, punctuation and spacing aside; 0 for none)")
    return out


def problem_criteria(plan: Plan, pilot: dict, problem) -> None:
    """pilot.criteria's problems: a criterion the pilot does not know (a misspelt one would pass by never being
    read), an arm that is not the plan's, a threshold that is not a positive number."""
    criteria = pilot.get("criteria") or {}
    if not isinstance(criteria, dict):
        problem(("criteria",), f"a mapping of go criteria ({', '.join(CRITERIA)})")
        return

    def positive(where: tuple, value) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            problem(where, f"a number > 0, got {value!r}")

    for name, value in criteria.items():
        if name not in CRITERIA:
            problem(("criteria", name), f"unknown criterion; the criteria are {', '.join(CRITERIA)}")
        elif name == "loss_ratio":
            positive(("criteria", name), value)
            if pilot.get("reference") is None:
                problem(
                    ("criteria", name),
                    "compares the baseline with the reference run; add pilot.reference (e.g. {queue_size: 0})",
                )
        elif not isinstance(value, dict):
            problem(("criteria", name), f"a mapping with the keys {', '.join(CRITERIA[name])}")
        else:
            for key in value:
                if key not in CRITERIA[name]:
                    problem(("criteria", name, key), f"unknown key; the keys are {', '.join(CRITERIA[name])}")
            arms = value.get("arms")
            if not isinstance(arms, list) or not arms:
                problem(("criteria", name, "arms"), "a list of the arms it reads")
            else:
                for arm in arms:
                    if arm not in plan.arms:
                        problem(("criteria", name, "arms"), f"{arm!r} is not an arm of the plan")
            threshold = CRITERIA[name][1]
            if threshold in value:
                positive(("criteria", name, threshold), value[threshold])
