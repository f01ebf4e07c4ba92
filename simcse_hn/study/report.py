"""The study's report, <study>/report.{json,md}: blind until every run of the plan is in (the runs counted and each
run's training diagnostics, no score and no arm mean), then the plan's tests (analysis.py), the verdicts its rules
earn, word for word (verdicts.py), and below a heading that says so, the exploratory rest: the figures, the effect
the study could detect, the per-task differences and the diagnostics. Every record is checked first (records.py: the
run its name says, of the locked version, its hashes those of its files, its numbers those its predictions give, no
copy): one that fails is refused in one line and counted out. A plan with a `family` is blind until every run of every
plan of the family is in; then Holm runs over all their comparisons, and the verdicts read that family. A plan with
`starts` is blind until each start's record is in too (checked: starts.py); then the exploratory part adds the starts
as rows of scores and each arm's difference from each start. The page is `report_page.markdown(record)`: it
regenerates from the record alone."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import yaml

from simcse_hn.study import verdicts as rules
from simcse_hn.study.analysis import against_starts, compare, compare_family, per_task
from simcse_hn.study.files import write_atomic, write_json
from simcse_hn.study.lock import check_locked, locked_plan, versions
from simcse_hn.study.plan import Plan, PlanError, load_plan
from simcse_hn.study.power import achieved
from simcse_hn.study.records import Checker, run_key
from simcse_hn.study.report_page import is_blind, markdown
from simcse_hn.study.runs import DIAGNOSTICS, endpoint_value
from simcse_hn.study.starts import StartChecker, endpoint_of


def endpoint_values(plan: Plan, runs: dict[str, dict]) -> dict[str, list[float]]:
    return {arm: [endpoint_value(runs[run_key(arm, s)], plan.endpoint) for s in plan.seeds] for arm in plan.arms}


def family_of(plan: Plan) -> list[tuple[Plan, dict[str, dict], dict[str, str]]]:
    """The other plans of the family, each checked against its own lock, with its taken and refused runs."""
    members = []
    for other in plan.family:
        member = load_plan(os.path.join(plan.folder, other), check_arms=False, follow_family=False)
        members.append((member, *Checker(member, check_locked(member, scope="report")).gather()))
    return members


def rules_of(plan: Plan, given: str | None) -> dict | None:
    """The verdict rules the report applies: the plan's, locked with it; or, for a plan locked without any, those of
    a file given to `report` (`verdicts:` and `source:`, what the rules were written from), said to be given after the
    runs. None: no rules, no verdict."""
    if plan.verdicts is not None:
        if given is not None:
            raise PlanError([f"--verdicts {given}: {plan.path} locks its own verdict rules; they are the only ones"])
        return {"source": "plan", "note": "locked with it", "rules": plan.verdicts}
    if given is None:
        return None
    if not os.path.isfile(given):
        raise PlanError([f"--verdicts {given}: no such file"])
    raw = yaml.safe_load(open(given, encoding="utf-8")) or {}
    problems: list[str] = []
    members = {m.name: m.comparisons for m, *_ in family_of(plan)} if plan.family else {}
    names = rules.comparisons(plan.name, plan.comparisons, members)
    if not isinstance(raw, dict) or set(raw) != {"verdicts", "source"}:
        problems.append(f"{given}: a mapping of verdicts (as a plan's) and source (what they were written from)")
    else:
        rules.check(
            raw["verdicts"], names, lambda where, m: problems.append(f"{given}: {'.'.join(map(str, where))}: {m}")
        )
    if problems:
        raise PlanError(problems)
    return {"source": os.path.relpath(given, plan.folder), "note": str(raw["source"]), "rules": raw["verdicts"]}


def locked_when(plan: Plan, rules_record: dict | None) -> str | None:
    """When the verdict rules in force were first locked (the earliest version whose plan holds them), or None."""
    if rules_record is None or rules_record["source"] != "plan":
        return None
    for version in versions(plan):
        held = locked_plan(plan, version) or {}
        found = held["plan"].get("verdicts") if "plan" in held else (held.get("raw") or {}).get("verdicts")
        if found == plan.verdicts:
            return version.get("locked_at")
    return None


def analyse(
    plan: Plan,
    version: dict,
    runs: dict[str, dict],
    refused: dict[str, str],
    family: list | None = None,
    rules_record: dict | None = None,
    starts: tuple[dict[str, dict], dict[str, str]] | None = None,
) -> dict:
    """report.json's record. `starts`: the plan's start records (taken, refused), for a plan that names starts."""
    expected = len(plan.arms) * len(plan.seeds)
    out = {
        "study": plan.name,
        "plan_version": version["version"],
        "plan_sha256": version["plan_sha256"],
        "code_sha256": version["code"]["sha256"],
        "data_sha256": version["data"]["sha256"],
        "endpoint": plan.endpoint,
        "baseline": plan.baseline,
        "arms": list(plan.arms),
        "seeds": plan.seeds,
        "alpha": plan.alpha,
        "smallest_effect": plan.smallest_effect,
        "expected": expected,
        "in": len(runs),
        "complete": len(runs) == expected,
        "refused": refused,
        "bound": sum("bound" in r for r in runs.values()),
        "counts": {arm: sum(r["arm"] == arm for r in runs.values()) for arm in plan.arms},
        "runs": [{"run": key, "diagnostics": r["diagnostics"]} for key, r in runs.items()],
        "verdict_rules": rules_record,
    }
    if rules_record is not None:
        out["verdict_rules"] = {
            **rules_record,
            "locked_at": locked_when(plan, rules_record),
            "first_run_started": min((r.get("times") or {}).get("started") or "~" for r in runs.values())
            if runs
            else None,
        }
    if family:
        out["family"] = {
            member.name: {"in": len(done), "expected": len(member.arms) * len(member.seeds), "refused": gone}
            for member, done, gone in family
        }
    if starts is not None:
        out["starts"] = {"expected": len(plan.starts), "in": len(starts[0]), "refused": starts[1]}
    if is_blind(out):
        return out
    margin = (rules_record or {}).get("rules", {}).get("margin")
    values = endpoint_values(plan, runs)
    out["values"] = values  # the endpoint by seed, in the plan's order: the paired data of every test
    out["summary"] = {arm: {"mean": float(np.mean(v)), "sd": float(np.std(v, ddof=1))} for arm, v in values.items()}
    out["comparison"] = compare(values, plan.baseline, plan.alpha, margin)
    if family:
        groups = {plan.name: (values, plan.baseline)}
        groups |= {member.name: (endpoint_values(member, done), member.baseline) for member, done, _ in family}
        out["family_comparison"] = compare_family(groups, plan.alpha, margin)
    out["achieved"] = achieved(plan, out.get("family_comparison") or out["comparison"])
    if rules_record is not None:
        table = out.get("family_comparison") or out["comparison"]
        out["verdicts"] = rules.read(rules_record["rules"], plan.name, table, bool(family))
    out["per_task"] = per_task(
        {arm: [runs[run_key(arm, s)]["scores"]["tasks"] for s in plan.seeds] for arm in plan.arms}, plan.baseline
    )
    out["diagnostics_by_arm"] = {
        arm: mean_windows([runs[run_key(arm, s)]["diagnostics"] for s in plan.seeds]) for arm in plan.arms
    }
    if starts is not None:
        out["starts"] |= start_rows(plan, values, runs, starts[0])
    return out


def start_rows(plan: Plan, values: dict[str, list[float]], runs: dict[str, dict], taken: dict[str, dict]) -> dict:
    """The starts' part of a complete report: a row of scores each (the endpoint, the average and each task) beside
    each arm's mean over its seeds, and each arm's difference from each start over the seeds (exploratory: the plan's
    tests and verdicts are about the arms)."""
    tasks = list(runs[run_key(plan.baseline, plan.seeds[0])]["scores"]["tasks"])
    columns = list(dict.fromkeys([plan.endpoint, "average", *tasks]))

    def row(scores: dict) -> dict[str, float]:
        return {c: scores[c] if c in scores else scores["tasks"][c] for c in columns}

    arms = {arm: [row(runs[run_key(arm, s)]["scores"]) for s in plan.seeds] for arm in plan.arms}
    return {
        "columns": columns,
        "scores": {label: {"model": r["model"], "scores": row(r["scores"])} for label, r in taken.items()},
        "arm_means": {arm: {c: float(np.mean([v[c] for v in rows])) for c in columns} for arm, rows in arms.items()},
        "from_starts": against_starts(values, {label: endpoint_of(r, plan.endpoint) for label, r in taken.items()}),
    }


def mean_windows(windows: list[dict], keys: Sequence[str] = DIAGNOSTICS) -> dict[str, float]:
    """Each of `keys` averaged over the runs' last windows that hold it (an arm's seeds); a key none holds is left
    out."""
    return {k: float(np.mean([w[k] for w in windows if k in w])) for k in keys if any(k in w for w in windows)}


def write_report(plan: Plan, verdicts_file: str | None = None) -> tuple[str, dict[str, str]]:
    """Rebuild <study>/report.{json,md} from the run records; -> (the page, the refused runs {key: why})."""
    version = check_locked(plan, scope="report")
    rules_record = rules_of(plan, verdicts_file)
    runs, refused = Checker(plan, version).gather()
    family = family_of(plan) if plan.family else None
    starts = StartChecker(plan, version).gather() if plan.starts else None
    record = analyse(plan, version, runs, refused, family, rules_record, starts)
    write_json(os.path.join(plan.study_dir, "report.json"), record)
    page = markdown(record)
    write_atomic(os.path.join(plan.study_dir, "report.md"), page)
    refused_all = dict(refused) | ((record.get("starts") or {}).get("refused") or {})
    for member, _, gone in family or []:
        refused_all |= {f"{member.name}: {key}": why for key, why in gone.items()}
    return page, refused_all
