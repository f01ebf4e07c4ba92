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
    verdicts:                                   # what each outcome earns, word for word (verdicts.py)
      margin: 0.2
      rules:
        - {when: {focal: better}, say: "Focal beats InfoNCE."}
        - {when: {focal: equivalent}, say: "Focal and InfoNCE are equivalent within 0.2 points."}
    starts: {untrained: builtin:all-MiniLM-L6-v2}  # encoders scored once, untrained, as rows of the report (starts.py)

Relative paths (the plan's own, and those train.py and eval/sts.py read) are relative to the plan's folder: every run
starts there. The study's files go to `output_dir` (default: a folder named as the plan, beside it)."""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, field

from simcse_hn.data.sts import parse_tasks
from simcse_hn.errors import ConfigError, UserError
from simcse_hn.study import plan_checks as checks
from simcse_hn.study import verdicts as rules
from simcse_hn.study.plan_file import problem_line, read_plan
from simcse_hn.study.resolved import missing_paths, resolve_config

TOP_KEYS = (
    "name",
    "base",
    "arms",
    "baseline",
    "seeds",
    "evaluation",
    "endpoint",
    "test",
    "correction",
    "alpha",
    "smallest_effect",
    "spread",
    "output_dir",
    "pilot",
    "family",
    "verdicts",
    "starts",
)


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
    smallest_effect: float | None  # None: a plan written before the study command required one (the lab's first)
    spread: float | None
    output_dir: str  # the study's folder, relative to the plan's
    pilot: dict | None
    family: tuple[str, ...] = ()  # other plans whose comparisons join this one's Holm family (paths from its folder)
    family_comparisons: int = 0  # how many comparisons those plans make
    verdicts: dict | None = None  # what each outcome earns (verdicts.py); None: the plan states no rules
    starts: dict[str, str] = field(default_factory=dict)  # {label: MODEL[:POOLER]}: the encoders scored untrained

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


def eval_flags(evaluation: dict) -> list[str]:
    """The plan's `evaluation:` mapping as eval/sts.py flags (true: the flag alone; false: left out)."""
    flags = []
    for key, value in evaluation.items():
        if value is True:
            flags.append(f"--{key}")
        elif value is not False and value is not None:
            flags += [f"--{key}", str(value)]
    return flags


def load_plan(
    path: str, check_arms: bool = True, eval_options: set[str] | None = None, follow_family: bool = True
) -> Plan:
    """The plan at `path`, checked; PlanError listing every problem (file:line: field: what). `check_arms` reads
    each arm as train.py would (the slow part: it imports the objectives) and refuses a local path that is not there;
    `eval_options`, eval/sts.py's flags (the command line passes them: the study sits below the command-line layer);
    `follow_family`, whether the plans its `family` names are loaded and checked (not for a member: plans of one
    family may name each other)."""
    raw, lines = read_plan(path)
    problems: list[str] = []

    def problem(where: tuple, message: str) -> None:
        problems.append(problem_line(path, lines, where, message))

    for key in raw:
        if key not in TOP_KEYS:
            problem((key,), f"unknown plan key; the keys are {', '.join(TOP_KEYS)}")
    base, arms = checks.configs(path, raw, problem)
    seeds = checks.seeds(raw.get("seeds"), problem)
    evaluation, tasks = checks.evaluation(path, raw, eval_options, problem)
    numbers = checks.numbers(raw, problem)
    starts = checks.starts(path, raw, arms, check_arms, problem)
    pilot = raw.get("pilot")
    if pilot is not None and not isinstance(pilot, dict):
        problem(("pilot",), "a mapping (see docs/studies.md)")
    checks.pilot_keys(pilot, problem)
    family, members = _family(path, raw, follow_family, problem)
    stem = os.path.splitext(os.path.basename(path))[0]
    name = str(raw.get("name", stem))
    comparisons = [arm for arm in arms if arm != raw.get("baseline")]
    if raw.get("verdicts") is not None:  # a member read for its family is not followed: its names go unchecked
        names = rules.comparisons(name, comparisons, members) if follow_family or not family else None
        rules.check(raw["verdicts"], names, problem)
    plan = Plan(
        path=path,
        name=name,
        base=base,
        arms=arms,
        baseline=str(raw.get("baseline")),
        seeds=seeds,
        evaluation=evaluation,
        endpoint=str(raw.get("endpoint", "average")),
        test="sign_flip",
        correction="holm",
        output_dir=str(raw.get("output_dir", stem)),
        pilot=pilot,
        family=tuple(family),
        family_comparisons=sum(len(v) for v in members.values()),
        verdicts=raw.get("verdicts"),
        starts=starts,
        **numbers,
    )
    if check_arms and not problems:
        _check_resolved(plan, problem)
    if problems:
        raise PlanError(problems)
    return plan


def _family(path: str, raw: dict, follow: bool, problem) -> tuple[list[str], dict[str, list[str]]]:
    """The other plans of the Holm family, checked: -> (their files, {their name: their comparisons})."""
    family = raw.get("family") or []
    names = {str(raw.get("name", os.path.splitext(os.path.basename(path))[0]))}  # the family's tables key by name
    if not isinstance(family, list) or not all(isinstance(f, str) for f in family):
        problem(("family",), "a list of plan files (relative to this one) whose comparisons join its Holm family")
        return [], {}
    members: dict[str, list[str]] = {}
    for other in family if follow else []:  # a member's own family is not read: plans may name each other
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
            members[member.name] = member.comparisons
    return family, members


def _check_resolved(plan: Plan, problem) -> None:
    """Every config a run will train, read as train.py reads it: a value it refuses, a local path that is not there,
    two arms that train alike (unless the pilot tunes one of them: its pick may part them)."""
    pilot = plan.pilot or {}
    own = {("base",): plan.base, **{("arms", arm): overrides for arm, overrides in plan.arms.items()}}
    own |= {("pilot", part): pilot[part] for part in ("overrides", "reference") if isinstance(pilot.get(part), dict)}
    missing = [(part, key, value) for part, config in own.items() for key, value in missing_paths(plan.folder, config)]
    for part, key, value in missing:
        problem((*part, key), f"{value}: no such file or folder (relative to the plan; a local path, not a Hub id)")
    if missing:  # train.py's reading would stop at the same paths
        return
    resolved, refused = {}, {}
    for arm in plan.arms:
        try:
            resolved[arm] = json.dumps(resolve_config(plan.folder, plan.config(arm)), sort_keys=True)
        except ConfigError as e:
            refused[arm] = str(e)
    first = next(iter(refused.values()), "")
    key = first.split(":")[0]
    if len(refused) == len(plan.arms) and set(refused.values()) == {first} and key in plan.base:
        problem(("base", key), first.removeprefix(f"{key}: "))  # the base's own value, refused in every arm: once
    else:
        for arm, message in refused.items():
            problem(("arms", arm), message)
    tuned = set(pilot["tune"]) if isinstance(pilot.get("tune"), dict) else set()
    seen: dict[str, str] = {}
    for arm, settings in resolved.items():
        if settings in seen and not {arm, seen[settings]} & tuned:
            problem(("arms", arm), f"trains exactly as arm {seen[settings]!r}: two names for one arm")
        seen.setdefault(settings, arm)
    for at, label, config in pilot_configs(plan):  # the pilot's runs too, before any of them starts
        try:
            resolve_config(plan.folder, config)
        except ConfigError as e:
            problem(at, f"{label}{e}")


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
