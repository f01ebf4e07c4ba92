"""The study's report, <study>/report.{json,md}: blind until every run of the plan is in (the runs counted and each
run's training diagnostics, no score and no arm mean), then the plan's tests (simcse_hn.study.analysis) with the
per-task differences and the diagnostics as secondary. Runs of other settings, code or data than the locked version
are refused by name and counted out. A plan with a `family` (other plans whose comparisons join its Holm family) is
blind until every run of every plan of the family is in; then Holm runs over all their comparisons as well. The page
is `markdown(record)`: it regenerates from the record alone."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from simcse_hn.study.analysis import MAX_INVERTED, compare, compare_family, per_task
from simcse_hn.study.files import read_json, write_atomic, write_json
from simcse_hn.study.lock import check_locked
from simcse_hn.study.plan import Plan, load_plan
from simcse_hn.study.runs import DIAGNOSTICS, endpoint_value, mismatch, record_path, run_key


def gather(plan: Plan, version: dict) -> tuple[dict[str, dict], dict[str, str]]:
    """-> (the plan's finished runs of this version {key: record}, refused runs {key: why})."""
    accepted, refused = {}, {}
    for seed in plan.seeds:
        for arm in plan.arms:
            key = run_key(arm, seed)
            if not os.path.isfile(record_path(plan, key)):
                continue
            record = read_json(record_path(plan, key))
            problem = mismatch(record, version, plan)
            if problem is None and record["trained"]["source_sha256"] != record["trained"]["scored_by_source_sha256"]:
                problem = "scored by other code than trained it"
            if problem:
                refused[key] = problem
            else:
                accepted[key] = record
    return accepted, refused


def endpoint_values(plan: Plan, runs: dict[str, dict]) -> dict[str, list[float]]:
    return {arm: [endpoint_value(runs[run_key(arm, s)], plan.endpoint) for s in plan.seeds] for arm in plan.arms}


def family_of(plan: Plan) -> list[tuple[Plan, dict[str, dict]]]:
    """The other plans of the family, each checked against its own lock, with its accepted runs."""
    members = []
    for other in plan.family:
        member = load_plan(os.path.join(plan.folder, other), check_arms=False, follow_family=False)
        members.append((member, gather(member, check_locked(member))[0]))
    return members


def analyse(plan: Plan, version: dict, runs: dict[str, dict], refused: dict[str, str],
            family: list[tuple[Plan, dict[str, dict]]] | None = None) -> dict:  # fmt: skip
    expected = len(plan.arms) * len(plan.seeds)
    out = {"study": plan.name, "plan_version": version["version"], "plan_sha256": version["plan_sha256"],
           "code_sha256": version["code"]["sha256"], "data_sha256": version["data"]["sha256"],
           "endpoint": plan.endpoint, "baseline": plan.baseline, "arms": list(plan.arms), "seeds": plan.seeds,
           "alpha": plan.alpha, "smallest_effect": plan.smallest_effect, "expected": expected, "in": len(runs),
           "complete": len(runs) == expected, "refused": refused,
           "counts": {arm: sum(r["arm"] == arm for r in runs.values()) for arm in plan.arms},
           "runs": [{"run": key, "diagnostics": r["diagnostics"]} for key, r in runs.items()]}  # fmt: skip
    if family:
        out["family"] = {member.name: {"in": len(done), "expected": len(member.arms) * len(member.seeds)}
                         for member, done in family}  # fmt: skip
    if not out["complete"] or any(f["in"] < f["expected"] for f in out.get("family", {}).values()):
        return out
    values = endpoint_values(plan, runs)
    out["values"] = values  # the endpoint by seed, in the plan's order: the paired data of every test
    out["summary"] = {arm: {"mean": float(np.mean(v)), "sd": float(np.std(v, ddof=1))} for arm, v in values.items()}
    out["comparison"] = compare(values, plan.baseline, plan.alpha, plan.smallest_effect)
    if family:
        groups = {plan.name: (values, plan.baseline)}
        groups |= {member.name: (endpoint_values(member, done), member.baseline) for member, done in family}
        out["family_comparison"] = compare_family(groups, plan.alpha, plan.smallest_effect)
    out["per_task"] = per_task({arm: [runs[run_key(arm, s)]["scores"]["tasks"] for s in plan.seeds]
                                for arm in plan.arms}, plan.baseline)  # fmt: skip
    out["diagnostics_by_arm"] = {arm: mean_windows([runs[run_key(arm, s)]["diagnostics"] for s in plan.seeds])
                                 for arm in plan.arms}  # fmt: skip
    return out


def mean_windows(windows: list[dict], keys: Sequence[str] = DIAGNOSTICS) -> dict[str, float]:
    """Each of `keys` averaged over the runs' last windows that hold it (an arm's seeds); a key none holds is left
    out."""
    return {k: float(np.mean([w[k] for w in windows if k in w])) for k in keys if any(k in w for w in windows)}


def write_report(plan: Plan) -> str:
    """Rebuild <study>/report.{json,md} from the run records; -> the page."""
    version = check_locked(plan)
    runs, refused = gather(plan, version)
    record = analyse(plan, version, runs, refused, family_of(plan) if plan.family else None)
    write_json(os.path.join(plan.study_dir, "report.json"), record)
    page = markdown(record)
    write_atomic(os.path.join(plan.study_dir, "report.md"), page)
    return page


def _cell(value: float | None, digits: str = ".4g") -> str:
    return "–" if value is None else format(value, digits)


def _row(name: str, v: dict, extra: str = "") -> str:
    """One comparison's row: difference, intervals, both tests raw and Holm-adjusted, spread, `extra`, reading."""
    s, floor = v["simultaneous"], " (floor)" if v["at_floor"] else ""
    return (f"| {name} | {v['difference']:+.3f} | [{v['low']:+.3f}, {v['high']:+.3f}] | [{s['low']:+.3f}, "
            f"{s['high']:+.3f}] | {v['p_sign_flip']:.4f}{floor} | {v['p_sign_flip_holm']:.4f} | {v['p_t']:.4f} | "
            f"{v['p_t_holm']:.4f} | {v['sd_of_differences']:.3f} | {extra}{v['reading']} |")


def by_seed(record: dict) -> list[str]:
    """The paired data of the tests: the baseline's endpoint on each seed and each arm's difference from it, and on
    how many seeds each arm is ahead and behind."""
    values, baseline = record["values"], record["baseline"]
    arms = [arm for arm in values if arm != baseline]
    lines = ["", f"## Each seed: {baseline}'s {record['endpoint']} and each arm's difference from it", "",
             f"| seed | {baseline} | " + " | ".join(f"{arm} - {baseline}" for arm in arms) + " |",
             "|---|---|" + "---|" * len(arms)]  # fmt: skip
    for i, seed in enumerate(record["seeds"]):
        base = values[baseline][i]
        lines.append(f"| {seed} | {base:.2f} | " + " | ".join(f"{values[a][i] - base:+.2f}" for a in arms) + " |")
    ahead = [sum(v > b for v, b in zip(values[a], values[baseline])) for a in arms]
    behind = [sum(v < b for v, b in zip(values[a], values[baseline])) for a in arms]
    lines.append("| ahead / behind | | " + " | ".join(f"{up} / {down}" for up, down in zip(ahead, behind)) + " |")
    return lines


def markdown(record: dict) -> str:
    lines = [f"# Study {record['study']}: report", "",
             f"Plan version {record['plan_version']} (plan {record['plan_sha256'][:12]}, code "
             f"{record['code_sha256'][:12]}, data {record['data_sha256'][:12]}). {record['in']} of "
             f"{record['expected']} runs in. Endpoint: {record['endpoint']}; baseline {record['baseline']}; exact "
             f"sign-flip test, two-sided, Holm at {record['alpha']:g}.", "",
             "| arm | runs in |", "|---|---|",
             *[f"| {arm} | {n} of {len(record['seeds'])} |" for arm, n in record["counts"].items()]]  # fmt: skip
    if record["refused"]:
        lines += ["", "Refused (not runs of this version; counted out):", "",
                  *[f"* {key}: {why}" for key, why in record["refused"].items()]]  # fmt: skip
    family = record.get("family") or {}
    if family:
        lines += ["", "Its Holm family: this plan and " + ", ".join(f"{name} ({f['in']} of {f['expected']} runs in)"
                                                                    for name, f in family.items()) + "."]  # fmt: skip
    if not record["complete"] or any(f["in"] < f["expected"] for f in family.values()):
        keys = [k for k in DIAGNOSTICS if any(k in r["diagnostics"] for r in record["runs"])]
        whole = "the plan" + " and of every plan of its family" * bool(family)
        lines += ["", f"Blind: no arm is compared and no score is shown before every run of {whole} is in. Each "
                  "run's last logging window of training:", "", "| run | " + " | ".join(keys) + " |",
                  "|---|" + "---|" * len(keys),
                  *[f"| {r['run']} | " + " | ".join(_cell(r["diagnostics"].get(k)) for k in keys) + " |"
                    for r in record["runs"]]]  # fmt: skip
        return "\n".join(lines) + "\n"
    c = record["comparison"]
    lines += ["", f"| arm | mean {record['endpoint']} | sd |", "|---|---|---|",
              *[f"| {arm} | {v['mean']:.2f} | {v['sd']:.2f} |" for arm, v in record["summary"].items()],
              "", f"## Against {record['baseline']} ({c['n']} paired seeds; Holm over {c['m']} comparisons, "
              f"family-wise {c['alpha']:g}; simultaneous intervals at {c['alpha']:g}/{c['m']} = {c['level']:.4g})",
              "", "| arm | difference | 95 % t-interval | simultaneous interval | sign-flip p | Holm | paired t p | "
              "Holm | sd of differences | detectable at that sd | reading |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    lines += [_row(arm, v, f"{c['detectable_at_observed_sd'][arm]:.3f} | ") for arm, v in c["tests"].items()]
    if "family_comparison" in record:
        f = record["family_comparison"]
        lines += ["", f"## The family: Holm over the {f['m']} comparisons of {', '.join(f['plans'])} (family-wise "
                  f"{f['alpha']:g}; simultaneous intervals at {f['alpha']:g}/{f['m']} = {f['level']:.4g})", "",
                  "The confirmatory reading of a plan with a family. Each plan's own table above adjusts over its own "
                  "comparisons only.", "",
                  "| comparison | difference | 95 % t-interval | simultaneous interval | sign-flip p | Holm | "
                  "paired t p | Holm | sd of differences | reading |", "|---|---|---|---|---|---|---|---|---|---|",
                  *[_row(name, v) for name, v in f["tests"].items()]]  # fmt: skip
    inverted = c["n"] <= MAX_INVERTED
    how = (f"invert the exact sign-flip test at {c['level']:.4g} (Bonferroni)" if inverted else
           f"are Bonferroni's paired-t intervals at {c['level']:.4g} ({c['n']} seeds: more than the exact inversion "
           f"takes, {MAX_INVERTED}); they can disagree with the exact test's verdict, which the reading follows")
    lines += ["", f"The simultaneous intervals {how}. With "
              f"{c['n']} seeds the test's smallest p is 2/{2 ** c['n']} = {c['floor']:.4g}" +
              ("; a p marked (floor) sits there: more seeds could show a smaller one." if any(
                  v["at_floor"] for v in c["tests"].values()) else ".")]  # fmt: skip
    if "values" in record:  # records written before it was kept show no seed table
        lines += by_seed(record)
    tasks = list(next(iter(record["per_task"].values())))
    lines += ["", f"## Per task (secondary, no test): mean difference against {record['baseline']}", "",
              "| arm | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks),
              *[f"| {arm} | " + " | ".join(f"{v[t]:+.2f}" for t in tasks) + " |"
                for arm, v in record["per_task"].items()]]  # fmt: skip
    by_arm = record["diagnostics_by_arm"]
    keys = [k for k in DIAGNOSTICS if any(k in v for v in by_arm.values())]
    if keys:
        lines += ["", "## Training, last logging window, mean over the arm's seeds (secondary, no test)", "",
                  "| arm | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys),
                  *[f"| {arm} | " + " | ".join(_cell(v.get(k)) for k in keys) + " |" for arm, v in by_arm.items()]]
    return "\n".join(lines) + "\n"
