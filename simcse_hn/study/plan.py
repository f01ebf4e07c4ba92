"""A study's plan: the YAML a researcher writes before the first run, read and checked against the real train.py and
eval/sts.py arguments, one line per problem.

    name: focal-vs-infonce
    base: {config: base.yaml, max_steps: 100}   # any train.py config; `config:` names a train.py YAML to start from
    arms:                                       # each arm: overrides of the base
      infonce: {}
      focal: {loss: focal.py:FocalLoss, loss_options: {gamma: 1.0}}
    baseline: infonce
    seeds: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    evaluation: {data_dir: sts}                 # eval/sts.py flags
    endpoint: average                           # or one task (STS-B, ...), alignment, uniformity
    test: sign_flip                             # exact, two-sided; the paired t beside it
    correction: holm
    alpha: 0.05
    smallest_effect: 0.3                        # endpoint points
    spread: 0.2                                 # assumed sd of the paired differences

Relative paths (the plan's own, and those train.py and eval/sts.py read) are relative to the plan's folder: every run
starts there. The study's files go to `output_dir` (default: a folder named as the plan, beside it)."""

from __future__ import annotations

import itertools
import json
import os
import tempfile
from dataclasses import asdict, dataclass

import yaml

from simcse_hn.configuration.parser import ARGUMENT_CLASSES, parse_args
from simcse_hn.data.sts import parse_tasks
from simcse_hn.errors import ConfigError, UserError
from simcse_hn.study.analysis import detectable_sd
from simcse_hn.study.files import working_dir
from simcse_hn.study.plan_file import problem_line, read_plan
from simcse_hn.study.plan_sections import (
    base_and_arms,
    evaluation_of,
    pilot_of,
    seeds_of,
    statistics_of,
)

TOP_KEYS = ("name", "base", "arms", "baseline", "seeds", "evaluation", "endpoint", "test", "correction", "alpha",
            "smallest_effect", "spread", "output_dir", "pilot", "family")  # fmt: skip



class PlanError(UserError):
    """Every problem of a plan, one per line."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Plan:
    path: str  # the plan file as given
    name: str
    base: dict  # train.py keys, `config:` merged in
    arms: dict[str, dict]
    baseline: str
    seeds: list[int]
    evaluation: dict
    endpoint: str
    test: str
    correction: str
    alpha: float
    smallest_effect: float
    spread: float | None
    output_dir: str  # the study's folder, relative to the plan's
    pilot: dict | None
    family: tuple[str, ...] = ()  # other plans whose comparisons join this one's Holm family (paths from its folder)
    family_comparisons: int = 0  # how many comparisons those plans make

    @property
    def folder(self) -> str:
        """The plan's folder: where every run starts and every relative path is read from."""
        return os.path.dirname(os.path.abspath(self.path))

    @property
    def study_dir(self) -> str:
        return os.path.normpath(os.path.join(self.folder, self.output_dir))

    @property
    def comparisons(self) -> list[str]:
        return [arm for arm in self.arms if arm != self.baseline]

    def config(self, arm: str, picks: dict | None = None) -> dict:
        """The train.py config of an arm: the base, the arm's overrides, then what the pilot picked for it."""
        return {**self.base, **self.arms[arm], **((picks or {}).get(arm) or {})}

    def pilot_config(self, arm: str, change: dict | None = None) -> dict:
        """The train.py config of one pilot run of an arm: the arm's config, a grid point of it, then the pilot's
        overrides."""
        return {**self.config(arm), **(change or {}), **((self.pilot or {}).get("overrides") or {})}

    def reference_config(self) -> dict:
        """The train.py config of the pilot's reference: the baseline's, the pilot's overrides, then `reference`."""
        pilot = self.pilot or {}
        return {**self.config(self.baseline), **(pilot.get("overrides") or {}), **(pilot.get("reference") or {})}

    def tasks(self) -> list[str]:
        return parse_tasks(str(self.evaluation.get("tasks", "all")))


def train_keys() -> set[str]:
    return {f.name for cls in ARGUMENT_CLASSES for f in cls.__dataclass_fields__.values() if f.init}


def eval_flags(evaluation: dict) -> list[str]:
    """The plan's `evaluation:` mapping as eval/sts.py flags (true: the flag alone; false: left out)."""
    flags = []
    for key, value in evaluation.items():
        if value is True:
            flags.append(f"--{key}")
        elif value is not False and value is not None:
            flags += [f"--{key}", str(value)]
    return flags


def load_plan(path: str, check_arms: bool = True, eval_options: set[str] | None = None,
              follow_family: bool = True) -> Plan:
    """The plan at `path`, checked; PlanError listing every problem (file:line: field: what). `check_arms` parses
    each arm as train.py would (the slow part: it imports the objectives); `eval_options`, eval/sts.py's flags (the
command line passes them: the study sits below the command-line layer); `follow_family`, whether the plans its
`family` names are loaded and checked (not for a member: plans of one family may name each other)."""
    raw, lines = read_plan(path)
    problems: list[str] = []

    def problem(where: tuple, message: str) -> None:
        problems.append(problem_line(path, lines, where, message))

    for key in raw:
        if key not in TOP_KEYS:
            problem((key,), f"unknown plan key; the keys are {', '.join(TOP_KEYS)}")
    known = train_keys()
    base, arms = base_and_arms(path, raw, known, problem)
    seeds = seeds_of(raw, problem)
    evaluation, endpoint = evaluation_of(path, raw, eval_options, problem)
    alpha, effect, spread = statistics_of(raw, problem)
    pilot = pilot_of(raw, known, problem)
    family, family_comparisons = _family(path, raw, follow_family, problem)
    stem = os.path.splitext(os.path.basename(path))[0]
    plan = Plan(path=path, name=str(raw.get("name", stem)), base=base, arms=arms, baseline=str(raw.get("baseline")),
                seeds=list(seeds), evaluation=evaluation, endpoint=str(endpoint), test="sign_flip",
                correction="holm", alpha=float(alpha) if isinstance(alpha, (int, float)) else 0.05,
                smallest_effect=float(effect) if isinstance(effect, (int, float)) else 0.0,
                spread=float(spread) if isinstance(spread, (int, float)) else None,
                output_dir=str(raw.get("output_dir", stem)), pilot=pilot, family=tuple(family),
                family_comparisons=family_comparisons)  # fmt: skip
    if check_arms and not problems:
        _check_parsed_arms(plan, problem)
    if problems:
        raise PlanError(problems)
    return plan


def _family(path: str, raw: dict, follow_family: bool, problem) -> tuple[list, int]:
    """The plans of its Holm family (loaded and checked unless this is a member) and their comparisons."""
    family, family_comparisons = raw.get("family") or [], 0
    names = {str(raw.get("name", os.path.splitext(os.path.basename(path))[0]))}  # the family's tables key by plan name
    if not isinstance(family, list) or not all(isinstance(f, str) for f in family):
        problem(("family",), "a list of plan files (relative to this one) whose comparisons join its Holm family")
        family = []
    for other in family if follow_family else []:  # a member's own family is not read: plans may name each other
        full = os.path.join(os.path.dirname(os.path.abspath(path)), other)
        if os.path.realpath(full) == os.path.realpath(path):
            problem(("family",), f"{other}: the plan itself; list the other plans of the family")
        elif not os.path.isfile(full):
            problem(("family",), f"{other}: no such plan file")
        else:
            try:
                member = load_plan(full, check_arms=False, follow_family=False)
            except UserError as e:
                problem(("family",), f"{other}: {str(e).splitlines()[0]}")
                continue
            if member.alpha != raw.get("alpha", 0.05):
                problem(("family",), f"{other}: alpha {member.alpha:g}; one family has one family-wise level")
            if member.name in names:
                problem(("family",), f"{other}: named {member.name!r} as another plan of the family; give each a name")
            names.add(member.name)
            family_comparisons += len(member.comparisons)
    return family, family_comparisons


def _check_parsed_arms(plan: Plan, problem) -> None:
    """Each arm, and each pilot run, parsed as train.py would; two arms that train alike are one arm twice."""
    parsed = {}
    for arm in plan.arms:
        try:
            parsed[arm] = parse_arm(plan, plan.config(arm))
        except ConfigError as e:
            problem(("arms", arm), str(e))
    seen: dict[str, str] = {}
    for arm, settings in parsed.items():
        if settings in seen:
            problem(("arms", arm), f"trains exactly as arm {seen[settings]!r}: two names for one arm")
        seen.setdefault(settings, arm)
    for where, label, config in pilot_configs(plan):  # the pilot's runs too, before any of them starts
        try:
            parse_arm(plan, config)
        except ConfigError as e:
            problem(where, f"{label}{e}")


def grid_points(grid: dict) -> list[dict]:
    """{key: [v1, v2, ...], ...} -> every combination of the options' values, the first option's outermost:
    [{key: v1, ...}, {key: v2, ...}, ...] (one option: one point a value)."""
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def pilot_configs(plan: Plan) -> list[tuple[tuple, str, dict]]:
    """The configs the pilot trains, as (where in the plan, a label, config): the reference, then each tuned arm's
    grid points. A grid not made of lists is left to the pilot's check."""
    pilot = plan.pilot or {}
    out = []
    if isinstance(pilot.get("reference"), dict) and plan.baseline in plan.arms:
        out.append((("pilot", "reference"), "", plan.reference_config()))
    tune = pilot.get("tune") if isinstance(pilot.get("tune"), dict) else {}
    for arm, grid in tune.items():
        if arm not in plan.arms or not isinstance(grid, dict) or not all(isinstance(v, list) for v in grid.values()):
            continue
        for change in grid_points(grid):
            label = ", ".join(f"{k} {json.dumps(v)}" for k, v in change.items()) + ": "
            out.append((("pilot", "tune", arm), label, plan.pilot_config(arm, change)))
    return out


def parse_arm(plan: Plan, config: dict) -> str:
    """train.py's own reading of an arm's config (from the plan's folder, where it will run), as a canonical string:
    a ConfigError names the first bad value; two arms with the same string train the same."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "arm.yaml")
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(config, f)
        with working_dir(plan.folder):
            try:
                model, data, training = parse_args(["--config", path, "--output_dir", os.path.join(tmp, "out")])
            except ConfigError as e:  # its file is this function's own, gone when the message is read
                raise ConfigError(str(e).replace(f" (in {path})", "").replace(path, "the arm's config")) from None
    settings = [asdict(model), asdict(data), training.to_dict()]
    for part in settings:  # where the run's files go is not how it trains
        for key in ("output_dir", "logging_dir"):
            part.pop(key, None)
    return json.dumps(settings, sort_keys=True, default=str)


def power_lines(plan: Plan, measured: float | None = None) -> list[str]:
    """What the plan can detect: at the assumed spread, and at the pilot's measured one when there is one; and the
    exact test's floor against alpha / m."""
    n, m = len(plan.seeds), len(plan.comparisons) + plan.family_comparisons
    level = plan.alpha / m
    factor = detectable_sd(n, level)
    against = f"against {plan.baseline}" if not plan.family else (
        f"({len(plan.comparisons)} against {plan.baseline}, {plan.family_comparisons} in its family)")
    out = [f"{n} paired seeds, {m} comparison{'s' * (m > 1)} {against}, Holm at {plan.alpha:g}: a "
           f"two-sided paired t at {level:.4g} (Holm's strictest step) with 80 % power detects {factor:.3f} sd of "
           "the paired differences"]  # fmt: skip
    for label, sd in (("assumed", plan.spread), ("pilot-measured", measured)):
        if sd is not None:
            effect = factor * sd
            verdict = "at or below" if effect <= plan.smallest_effect else "ABOVE"
            out.append(f"at the {label} sd {sd:g}: {effect:.3f} points of {plan.endpoint}, {verdict} the smallest "
                       f"effect of interest {plan.smallest_effect:g}")  # fmt: skip
    floor = 2 / 2**n
    if floor >= level:
        out.append(f"warning: with {n} seeds the exact sign-flip test's smallest p is 2/{2**n} = {floor:.4g}, not "
                   f"below alpha/m = {level:.4g}: no arm can be shown to differ, and no interval is bounded")
    return out
