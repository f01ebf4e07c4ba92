"""The report's page, written from report.json alone (`markdown(record)`): the runs counted and refused, the verdicts
the plan's rules earn (word for word, verdicts.section), and everything else under a heading that says it is
exploratory."""

from __future__ import annotations

from simcse_hn.study import verdicts
from simcse_hn.study.analysis import MAX_INVERTED
from simcse_hn.study.runs import DIAGNOSTICS

EXPLORATORY = "## Exploratory: descriptive figures, not verdicts of the plan"
CHECKED = "each checked against its files and its scores recomputed from its predictions"


def _cell(value: float | None, digits: str = ".4g") -> str:
    return "–" if value is None else format(value, digits)


def _row(name: str, v: dict, extra: str = "") -> str:
    """One comparison's row: difference, intervals, both tests raw and Holm-adjusted, TOST's p, spread, `extra`."""
    s, floor = v["simultaneous"], " (floor)" if v["at_floor"] else ""
    tost = f" {v['tost']['p']:.4f} |" if "tost" in v else ""
    return (
        f"| {name} | {v['difference']:+.3f} | [{v['low']:+.3f}, {v['high']:+.3f}] | [{s['low']:+.3f}, "
        f"{s['high']:+.3f}] | {v['p_sign_flip']:.4f}{floor} | {v['p_sign_flip_holm']:.4f} | {v['p_t']:.4f} | "
        f"{v['p_t_holm']:.4f} |{tost} {v['sd_of_differences']:.3f} |{extra}"
    )


def _header(table: dict, last: str) -> list[str]:
    tost = " TOST p (±{:g}) |".format(table["margin"]) if table.get("margin") is not None else ""
    columns = (
        "| difference | 95 % t-interval | simultaneous interval | sign-flip p | Holm | paired t p | Holm |"
        f"{tost} sd of differences |{last}"
    )
    return [columns, "|---" * columns.count("|") + "|"]


def by_seed(record: dict) -> list[str]:
    """The paired data of the tests: the baseline's endpoint on each seed and each arm's difference from it, and on
    how many seeds each arm is ahead and behind."""
    values, baseline = record["values"], record["baseline"]
    arms = [arm for arm in values if arm != baseline]
    lines = [
        "",
        f"### Each seed: {baseline}'s {record['endpoint']} and each arm's difference from it",
        "",
        f"| seed | {baseline} | " + " | ".join(f"{arm} - {baseline}" for arm in arms) + " |",
        "|---|---|" + "---|" * len(arms),
    ]
    for i, seed in enumerate(record["seeds"]):
        base = values[baseline][i]
        lines.append(f"| {seed} | {base:.2f} | " + " | ".join(f"{values[a][i] - base:+.2f}" for a in arms) + " |")
    ahead = [sum(v > b for v, b in zip(values[a], values[baseline])) for a in arms]
    behind = [sum(v < b for v, b in zip(values[a], values[baseline])) for a in arms]
    lines.append("| ahead / behind | | " + " | ".join(f"{up} / {down}" for up, down in zip(ahead, behind)) + " |")
    return lines


def head(record: dict) -> list[str]:
    """The plan version, the runs in (each arm's count), the refused runs and the family's counts."""
    bound = record.get("bound", 0)
    legacy = f", {record['in'] - bound} of them written before records were bound" if bound < record["in"] else ""
    legacy = "" if "checked" in record else legacy
    lines = [
        f"# Study {record['study']}: report",
        "",
        f"Plan version {record['plan_version']} (plan {record['plan_sha256'][:12]}, code "
        f"{record['code_sha256'][:12]}, data {record['data_sha256'][:12]}). {record['in']} of {record['expected']} "
        f"runs in, {record.get('checked', CHECKED)}{legacy}. Endpoint: "
        f"{record['endpoint']}; baseline {record['baseline']}; exact sign-flip test, two-sided, Holm at "
        f"{record['alpha']:g}.",
        "",
        "| arm | runs in |",
        "|---|---|",
        *[f"| {arm} | {n} of {len(record['seeds'])} |" for arm, n in record["counts"].items()],
    ]
    starts = record.get("starts")
    if starts:
        counted = f"{starts['in']} of {starts['expected']} in"
        lines += ["", f"Starts (the encoders the arms start from, scored untrained): {counted}."]
    refused = record["refused"] | ((starts or {}).get("refused") or {})
    if refused:
        lines += ["", "Refused (counted out):", "", *[f"* {key}: {why}" for key, why in refused.items()]]
    family = record.get("family") or {}
    if family:
        counts = ", ".join(f"{name} ({f['in']} of {f['expected']} runs in)" for name, f in family.items())
        lines += ["", f"Its Holm family: this plan and {counts}."]
        for name, f in family.items():
            lines += [f"* {name}: {key}: {why} (refused)" for key, why in (f.get("refused") or {}).items()]
    return lines


def blind(record: dict) -> list[str]:
    keys = [k for k in DIAGNOSTICS if any(k in r["diagnostics"] for r in record["runs"])]
    whole = "the plan" + " and of every plan of its family" * bool(record.get("family"))
    whole += " and every start" * bool(record.get("starts"))
    return [
        "",
        f"Blind: no arm is compared and no score is shown before every run of {whole} is in. Each run's last "
        "logging window of training:",
        "",
        "| run | " + " | ".join(keys) + " |",
        "|---|" + "---|" * len(keys),
        *[
            f"| {r['run']} | " + " | ".join(_cell(r["diagnostics"].get(k)) for k in keys) + " |"
            for r in record["runs"]
        ],
    ]


def when_locked(record: dict) -> list[str]:
    """Whether the plan's rules were locked before the first run started (preregistered) or not."""
    given = record.get("verdict_rules") or {}
    locked, first = given.get("locked_at"), given.get("first_run_started")
    if given.get("source") != "plan" or not locked or not first or first == "~" or locked <= first:
        return []
    return [
        "",
        f"These rules were locked at {locked}, after the first run started ({first}): they are not preregistered.",
    ]


def exploratory(record: dict) -> list[str]:
    c = record["comparison"]
    a = record["achieved"]
    lines = [
        "",
        EXPLORATORY,
        "",
        f"What the study could detect: at the largest sd of paired differences its comparisons showed ({a['sd']:.3f}, "
        f"{a['arm']}), {c['n']} seeds detect {a['effect']:.3f} points of {record['endpoint']} (two-sided paired t, "
        f"80 % power, Holm's strictest step), "
        + (
            "the plan states no smallest effect of interest."
            if a["reached"] is None
            else f"{'at or below' if a['reached'] else 'ABOVE'} the plan's smallest effect of interest "
            f"{record['smallest_effect']:g}."
        ),
        "",
        f"| arm | mean {record['endpoint']} | sd |",
        "|---|---|---|",
        *[f"| {arm} | {v['mean']:.2f} | {v['sd']:.2f} |" for arm, v in record["summary"].items()],
        "",
        f"### Against {record['baseline']} ({c['n']} paired seeds; Holm over {c['m']} comparison{'s' * (c['m'] > 1)}, "
        f"family-wise "
        f"{c['alpha']:g}; simultaneous intervals at {c['alpha']:g}/{c['m']} = {c['level']:.4g})",
        "",
    ]
    head_, rule = _header(c, " detectable at that sd |")
    lines += [f"| arm {head_}", rule]
    lines += [_row(arm, v, f" {c['detectable_at_observed_sd'][arm]:.3f} |") for arm, v in c["tests"].items()]
    if "family_comparison" in record:
        f = record["family_comparison"]
        head_, rule = _header(f, "")
        lines += [
            "",
            f"### The family: Holm over the {f['m']} comparisons of {', '.join(f['plans'])} (family-wise "
            f"{f['alpha']:g}; simultaneous intervals at {f['alpha']:g}/{f['m']} = {f['level']:.4g})",
            "",
            f"| comparison {head_}",
            rule,
            *[_row(name, v) for name, v in f["tests"].items()],
        ]
    if c["n"] <= MAX_INVERTED:
        how = f"invert the exact sign-flip test at {c['level']:.4g} (Bonferroni)"
    else:
        how = (
            f"are Bonferroni's paired-t intervals at {c['level']:.4g} ({c['n']} seeds: more than the exact inversion "
            f"takes, {MAX_INVERTED}); they can disagree with the exact test"
        )
    floor = any(v["at_floor"] for v in c["tests"].values())
    lines += [
        "",
        f"The simultaneous intervals {how}. With {c['n']} seeds the test's smallest p is 2/{2 ** c['n']} = "
        f"{c['floor']:.4g}"
        + ("; a p marked (floor) sits there: more seeds could show a smaller one." if floor else "."),
    ]
    return lines


def is_blind(record: dict) -> bool:
    """Whether a report is blind: a run of the plan or of its family, or a start, is not in."""
    starts = record.get("starts") or {"in": 0, "expected": 0}
    family = (record.get("family") or {}).values()
    return not record["complete"] or any(f["in"] < f["expected"] for f in family) or starts["in"] < starts["expected"]


def markdown(record: dict) -> str:
    lines = head(record)
    if is_blind(record):
        return "\n".join([*lines, *blind(record)]) + "\n"
    lines += verdicts.section(record) + when_locked(record) + exploratory(record) + by_seed(record)
    lines += starts_section(record)
    tasks = list(next(iter(record["per_task"].values())))
    lines += [
        "",
        f"### Per task (no test): mean difference against {record['baseline']}",
        "",
        "| arm | " + " | ".join(tasks) + " |",
        "|---|" + "---|" * len(tasks),
        *[f"| {arm} | " + " | ".join(f"{v[t]:+.2f}" for t in tasks) + " |" for arm, v in record["per_task"].items()],
    ]
    by_arm = record["diagnostics_by_arm"]
    keys = [k for k in DIAGNOSTICS if any(k in v for v in by_arm.values())]
    if keys:
        lines += [
            "",
            "### Training, last logging window, mean over the arm's seeds (no test)",
            "",
            "| arm | " + " | ".join(keys) + " |",
            "|---|" + "---|" * len(keys),
            *[f"| {arm} | " + " | ".join(_cell(v.get(k)) for k in keys) + " |" for arm, v in by_arm.items()],
        ]
    return "\n".join(lines) + "\n"


def starts_section(record: dict) -> list[str]:
    """The starts as rows of a score table beside each arm's mean, and each arm's difference from each start."""
    starts = record.get("starts")
    if not starts:
        return []
    columns, n = starts["columns"], len(record["seeds"])
    lines = [
        "",
        f"### Scores: each arm's mean over its {n} seeds, and each start scored once, untrained (no test)",
        "",
        "| row | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
        *[f"| {arm} | " + " | ".join(f"{v[c]:.2f}" for c in columns) + " |" for arm, v in starts["arm_means"].items()],
        *[
            f"| start {label} ({s['model']}) | " + " | ".join(f"{s['scores'][c]:.2f}" for c in columns) + " |"
            for label, s in starts["scores"].items()
        ],
        "",
        f"### Against each start (exploratory, not a test of the plan): the mean difference in {record['endpoint']} "
        f"over the {n} seeds, its 95 % t-interval, and the seeds above the start",
        "",
        "| arm | start | difference | 95 % t-interval | seeds above |",
        "|---|---|---|---|---|",
    ]
    for arm, by_start in starts["from_starts"].items():
        lines += [
            f"| {arm} | {label} | {v['difference']:+.3f} | [{v['low']:+.3f}, {v['high']:+.3f}] | {v['above']} of "
            f"{v['n']} |"
            for label, v in by_start.items()
        ]
    return lines
