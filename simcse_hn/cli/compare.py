"""Several STS runs side by side, grouped by objective over seeds, with intervals and paired tests.

    python eval/compare.py reports/infonce-s42 reports/infonce-s43 reports/hcl-s42 reports/hcl-s43 \
        --output reports/compare --baseline infonce [--group infonce,infonce,hcl,hcl] [--seeds 42,43,42,43] \
        [--labels ...] [--bootstrap 1000] [--title ...]

Each input is a results.json (or sts_results.json) written by eval/sts.py, or a folder holding one, or an MTEB result
folder (an MTEB cache, its results/, a model's folder or one revision folder: each revision is one run, scored under
MTEB's protocol; one eval/sts.py wrote gets the training record of its report). Runs are grouped by the objective in
their "training" record (loss, contrast form, loss settings; eval/sts.py copies it from the model's
simcse_config.json), else each run is its own group; --group overrides. A group holds only runs scored alike (the same
protocol, tasks, data, pooler and input length: simcse_hn.evaluation.comparability): by default a mixed group is
split, with a note naming what differs; a mixed --group, a mixed baseline, or a group tested against a baseline it was
not scored alike with is refused. Runs of other protocols still sit side by side in the tables. Seeds come from the
same record (or --seeds). Per group, per task and on the average: mean, standard deviation and a 95% Student
t-interval over seeds, and the number of seeds. Against --baseline: a paired t-test by seed (scipy.stats.ttest_rel)
and a paired bootstrap over STS pairs (from predictions.npz beside each results.json), per seed and for the mean over
seeds. Writes comparison.md, comparison.json and comparison.png (plus comparison_delta.png with a baseline and
alignment_uniformity.png when the runs have it) into --output and prints the tables; a file there that no report wrote
is never replaced (files.ReportFolder: the run refuses in one line).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from simcse_hn.data.sts import STS_TASKS
from simcse_hn.errors import DataError
from simcse_hn.evaluation import mteb_results
from simcse_hn.evaluation.comparability import group_names, scored_alike, settings_notes
from simcse_hn.evaluation.comparison_plots import plot_deltas, plot_geometry, plot_groups
from simcse_hn.evaluation.reports import model_label, protocol, results_table, training_summary, unique_labels
from simcse_hn.evaluation.results import PREDICTIONS, load_predictions
from simcse_hn.files import ReportFolder, portable_name
from simcse_hn.run_record import RunRecord

RESULT_FILES = ("results.json", "sts_results.json")
REPORT_FILES = ("comparison.md", "comparison.json", "comparison.png", "comparison_delta.png",
                "alignment_uniformity.png")
METHOD = (
    "Mean and standard deviation (ddof 1) over seeds; 95% interval: Student t, mean +- t(0.975, n-1) s/sqrt(n). "
    "Paired t-test: scipy.stats.ttest_rel on the per-seed scores of the seeds both groups have. Paired bootstrap: "
    "{resamples} resamples of the STS pairs with replacement, within each sub-file (numpy seed 0), every run scored "
    "on the same resamples under the task's aggregation; percentile 95% interval of the difference, two-sided "
    "p = 2 x min share of resamples on either side of 0, (k + 1) / (B + 1). The mean over seeds uses one resample "
    "for all seeds. Holm: the average's t-test p-values, step-down adjusted over every group tested against the "
    "baseline (the k-th smallest of m times m - k + 1, monotone, at most 1), for a family-wise error rate."
)


def load_runs(path: str) -> list[tuple[str, dict, str]]:
    """One run per results file, or per revision folder of an MTEB result folder. -> [(label, results, path)], the
    path of a revision folder's first task file (no predictions.npz is beside it)."""
    if os.path.isdir(path) and not any(os.path.isfile(os.path.join(path, name)) for name in RESULT_FILES):
        folders = mteb_results.revision_folders(path)
        if not folders:
            raise DataError(f"{path}: no {' or '.join(RESULT_FILES)} in this folder, and no MTEB result files")
        runs = []
        for folder in folders:
            results = mteb_results.load_run(folder)
            first = next(f"{t.name}.json" for t in mteb_results.MTEB_TASKS.values()
                         if os.path.isfile(os.path.join(folder, f"{t.name}.json")))  # fmt: skip
            runs.append((results["label"], results, os.path.join(folder, first)))
        return runs
    return [load_run(path)]


def load_run(path: str) -> tuple[str, dict, str]:
    """-> (default label: the model's name, results, the results file's path)"""
    if os.path.isdir(path):
        found = [os.path.join(path, name) for name in RESULT_FILES if os.path.isfile(os.path.join(path, name))]
        if not found:
            raise DataError(f"{path}: no {' or '.join(RESULT_FILES)} in this folder")
        path = found[0]
    if not os.path.isfile(path):
        raise DataError(f"{path}: file not found")
    try:
        with open(path, encoding="utf-8") as f:
            results = json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: malformed JSON ({e.msg})") from None
    for key in ("tasks", "average", "aggregation"):
        if not isinstance(results, dict) or key not in results:
            raise DataError(f"{path}: no {key!r} key; expected a results.json written by eval/sts.py")
    label = results.get("label") or model_label(str(results.get("model", os.path.dirname(os.path.abspath(path)))))
    return label, results, path


def split_list(value: str | None, count: int, flag: str) -> list[str] | None:
    if value is None:
        return None
    items = [item.strip() for item in value.split(",")]
    if len(items) != count:
        raise DataError(f"{flag}: {len(items)} values for {count} runs")
    return items


def scores_of(results: dict) -> dict[str, float]:
    return {task: results["tasks"][task]["spearman"] for task in results["tasks"]} | {"Avg.": results["average"]}


def compare(runs: list[dict], baseline: str | None, resamples: int) -> dict:
    """The statistics of comparison.json. runs: [{"label", "path", "results", "group", "seed", "predictions"}]"""
    from simcse_hn.evaluation import stats

    columns = [t for t in STS_TASKS if any(t in r["results"]["tasks"] for r in runs)] + ["Avg."]
    groups: dict[str, list[dict]] = {}
    for run in runs:
        groups.setdefault(run["group"], []).append(run)
    if baseline is not None and baseline not in groups:
        raise DataError(f"--baseline: no group {baseline!r}; groups: {', '.join(groups)}")
    if baseline is not None:  # the baseline first, in every table and chart
        groups = {baseline: groups[baseline]} | groups
    out = {"columns": columns, "groups": {}, "baseline": baseline, "tests": {}, "notes": []}
    for name, members in groups.items():
        replicates, seen = [], set()  # one run per seed: checkpoints of one run are not replicates
        for m in members:
            if m["seed"] is None or m["seed"] not in seen:
                replicates.append(m)
                seen.add(m["seed"])
        per_column = {c: [scores_of(m["results"]).get(c, np.nan) for m in replicates] for c in columns}
        out["groups"][name] = {
            "runs": [m["label"] for m in replicates],
            "seeds": [m["seed"] for m in replicates],
            "scores": {c: stats.t_interval([v for v in values if np.isfinite(v)]) for c, values in per_column.items()},
        }
        out["notes"] += settings_notes(name, members)
    if baseline is None:
        return out

    def by_seed(members):
        seen = {}
        for m in members:
            if m["seed"] is not None:
                seen.setdefault(str(m["seed"]), m)
        return seen

    base = by_seed(groups[baseline])
    draws = None
    with_predictions = [r for r in runs if r["predictions"] is not None]
    if resamples > 0 and with_predictions:
        reference = with_predictions[0]["predictions"]
        draws = stats.bootstrap_draws(reference, resamples, seed=0)
        for run in with_predictions:
            if not stats.same_pairs(reference, run["predictions"]):
                first = with_predictions[0]["label"]
                out["notes"].append(f"{run['label']}: predictions on other pairs than {first}'s; not bootstrapped")
                run["predictions"] = None
    aggregation = groups[baseline][0]["results"]["aggregation"]  # every tested group was scored as the baseline
    for name, members in groups.items():
        if name == baseline:
            continue
        mine = by_seed(members)
        seeds = [s for s in mine if s in base]
        test = {"seeds": seeds, "t_test": {}, "bootstrap": {}, "bootstrap_per_seed": {}}
        for c in columns:
            a = [scores_of(mine[s]["results"]).get(c, np.nan) for s in seeds]
            b = [scores_of(base[s]["results"]).get(c, np.nan) for s in seeds]
            test["t_test"][c] = stats.paired_t_test(a, b)
        paired = [s for s in seeds if mine[s]["predictions"] is not None and base[s]["predictions"] is not None]
        if draws is not None and paired:
            boot = {s: [stats.bootstrap_scores(m[s]["predictions"], draws, aggregation) for m in (mine, base)]
                    for s in paired}  # fmt: skip
            for c in columns:
                key = "average" if c == "Avg." else c
                if key not in draws and key != "average":
                    continue
                diffs = {s: boot[s][0][key] - boot[s][1][key] for s in paired}
                observed = {s: scores_of(mine[s]["results"])[c] - scores_of(base[s]["results"])[c] for s in paired}
                test["bootstrap_per_seed"][c] = {
                    s: stats.bootstrap_difference(diffs[s], observed[s]) for s in paired
                }
                test["bootstrap"][c] = stats.bootstrap_difference(
                    np.mean([diffs[s] for s in paired], axis=0), float(np.mean(list(observed.values())))
                ) | {"seeds": len(paired)}
        elif resamples > 0 and not paired:
            out["notes"].append(f"{name}: no seed with predictions.npz in both it and {baseline}; no bootstrap")
        out["tests"][name] = test
    # the average is the primary endpoint: its t-test p-values adjusted over every group tested against the baseline
    adjusted = stats.holm({name: test["t_test"]["Avg."]["p"] for name, test in out["tests"].items()})
    for name, p_holm in adjusted.items():
        out["tests"][name]["t_test"]["Avg."]["p_holm"] = p_holm
    return out


def finite(value):
    """NaN and infinities as null, so that comparison.json is strict JSON."""
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if np.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def fmt(value: float, digits: int = 2) -> str:
    return "–" if value is None or not np.isfinite(value) else f"{value:.{digits}f}"


def p_value(p: float) -> str:
    return "–" if not np.isfinite(p) else ("< 0.001" if p < 0.001 else f"{p:.3f}")


def markdown(runs: list[dict], comparison: dict, resamples: int) -> str:
    pairs = [(r["label"], r["results"]) for r in runs]
    protocols = {protocol(results) for _, results in pairs}
    lines = ["# STS comparison", "", "## Runs", "", results_table(pairs)]
    lines.append("Spearman x 100 of cosine similarities." + (f" Protocol: {protocols.pop()}." if len(protocols) == 1
                                                              else ""))  # fmt: skip
    lines += ["", "| Run | Group | Seed | Model | Pooler | Training | Date |", "|:---|:---|---:|:---|:---|:---|:---|"]
    for r in runs:
        training = training_summary(r["results"].get("training")) or "–"
        lines.append(f"| {r['label']} | {r['group']} | {r['seed'] if r['seed'] is not None else '–'} | "
                     f"{r['results'].get('model', '–')} | {r['results'].get('pooler') or '–'} | {training} | "
                     f"{r['results'].get('date', '–')} |")  # fmt: skip
    if comparison["baseline"] is None and all(len(g["runs"]) == 1 for g in comparison["groups"].values()):
        lines += ["", "One seed per group (or no objective recorded): no statistics over seeds."]
        return "\n".join(lines) + "\n"
    columns = comparison["columns"]
    header = "| Group | Seeds | " + " | ".join(columns) + " |"
    rule = "|:---|---:|" + "---:|" * len(columns)
    lines += ["", "## Groups over seeds", "", "Mean ± standard deviation:", "", header, rule]
    for name, group in comparison["groups"].items():
        cells = [f"{fmt(s['mean'])} ± {fmt(s['std'])}" if s["n"] > 1 else fmt(s["mean"])
                 for s in group["scores"].values()]  # fmt: skip
        lines.append(f"| {name} | {len(group['runs'])} | " + " | ".join(cells) + " |")
    lines += ["", "95% t-interval over seeds:", "", header, rule]
    for name, group in comparison["groups"].items():
        cells = [f"[{fmt(s['low'])}, {fmt(s['high'])}]" for s in group["scores"].values()]
        lines.append(f"| {name} | {len(group['runs'])} | " + " | ".join(cells) + " |")
    if comparison["baseline"] is not None:
        baseline = comparison["baseline"]
        lines += ["", f"## Against {baseline}", "", "Differences are group - baseline, Spearman x 100.", ""]
        lines += ["| Group | Task | Seeds | Δ mean | 95% CI (t) | t | p (t-test) | Δ 95% CI (bootstrap) | "
                  "p (bootstrap) |", "|:---|:---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for name, test in comparison["tests"].items():
            for c in columns:
                t = test["t_test"][c]
                b = test["bootstrap"].get(c)
                boot = (f"[{fmt(b['low'])}, {fmt(b['high'])}] | {p_value(b['p'])}" if b else "– | –")
                lines.append(f"| {name} | {c} | {t['n']} | {fmt(t['difference'])} | [{fmt(t['low'])}, "
                             f"{fmt(t['high'])}] | {fmt(t['t'])} | {p_value(t['p'])} | {boot} |")  # fmt: skip
        family = [(name, test["t_test"]["Avg."]) for name, test in comparison["tests"].items()
                  if "p_holm" in test["t_test"]["Avg."]]  # fmt: skip
        if family:
            lines += ["", f"Average over tasks, the primary endpoint: the t-test's p adjusted by Holm over the "
                      f"{len(family)} group{'s' * (len(family) > 1)} tested against {baseline} (family-wise).", "",
                      "| Group | Seeds | Δ Avg. | p (t-test) | p (Holm) |", "|:---|---:|---:|---:|---:|"]  # fmt: skip
            lines += [f"| {name} | {t['n']} | {fmt(t['difference'])} | {p_value(t['p'])} | {p_value(t['p_holm'])} |"
                      for name, t in family]  # fmt: skip
        per_seed = [(name, s, b) for name, test in comparison["tests"].items()
                    for s, b in test["bootstrap_per_seed"].get("Avg.", {}).items()]  # fmt: skip
        if per_seed:
            lines += ["", "Paired bootstrap of the average, per seed:", "",
                      "| Group | Seed | Δ Avg. | 95% CI | p |", "|:---|---:|---:|---:|---:|"]  # fmt: skip
            lines += [f"| {name} | {s} | {fmt(b['difference'])} | [{fmt(b['low'])}, {fmt(b['high'])}] | "
                      f"{p_value(b['p'])} |" for name, s, b in per_seed]  # fmt: skip
    lines += ["", "Method: " + METHOD.format(resamples=resamples)]
    if comparison["notes"]:
        lines += ["", "Notes:", ""] + [f"* {note}" for note in comparison["notes"]]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="results.json files or folders holding one.")
    parser.add_argument("--output", required=True, help="Folder for comparison.md, comparison.json and the charts.")
    parser.add_argument("--labels", default=None, help="Comma-separated run labels (default: the models' names).")
    parser.add_argument("--group", default=None, help="Comma-separated group per run (default: by objective).")
    parser.add_argument("--seeds", default=None, help="Comma-separated seed per run (default: from 'training').")
    parser.add_argument("--baseline", default=None, help="Group every other group is tested against.")
    parser.add_argument("--bootstrap", type=int, default=1000, help="Paired bootstrap resamples (0: none).")
    parser.add_argument("--title", default=None, help="Chart title.")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        ReportFolder(args.output).check(REPORT_FILES)  # a user's file in the way: refused before any work
        if args.bootstrap < 0:
            raise DataError(f"--bootstrap must be >= 0, got {args.bootstrap}")
        loaded = [run for path in args.runs for run in load_runs(path)]
        labels = split_list(args.labels, len(loaded), "--labels") or unique_labels(
            [label for label, _, _ in loaded], [p for _, _, p in loaded]
        )
        runs = []
        for label, (_, results, path) in zip(labels, loaded):
            npz = os.path.join(os.path.dirname(path), PREDICTIONS)
            training = results.get("training")
            seed = RunRecord.from_json(training).optimisation.seed if training else None
            runs.append({"label": label, "path": path, "results": results, "seed": seed,
                         "predictions": load_predictions(npz) if os.path.isfile(npz) else None})  # fmt: skip
        for run, group in zip(runs, split_list(args.group, len(runs), "--group") or group_names(runs)):
            run["group"] = group
        for run, seed in zip(runs, split_list(args.seeds, len(runs), "--seeds") or [r["seed"] for r in runs]):
            run["seed"] = seed
        notes = scored_alike(runs, split=args.group is None, baseline=args.baseline)
        comparison = compare(runs, args.baseline, args.bootstrap)
        comparison["notes"] = notes + comparison["notes"]
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    text = markdown(runs, comparison, args.bootstrap)
    try:
        with ReportFolder(args.output) as report:
            write_report(report, text, runs, comparison, args)
            report.commit()
    except DataError as e:  # a file of the user's in the way
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text, end="")
    return 0


def write_report(report: ReportFolder, text: str, runs: list[dict], comparison: dict, args) -> None:
    """comparison.md, comparison.json and the charts, into the report's staging folder."""
    with open(report.path("comparison.md"), "w", encoding="utf-8") as f:
        f.write(text)
    record = {
        "method": METHOD.format(resamples=args.bootstrap),
        "protocol": sorted({protocol(r["results"]) for r in runs}),
        "runs": [{k: r[k] for k in ("label", "group", "seed")} | {"path": portable_name(r["path"]),
                                                              "model": portable_name(r["results"].get("model"))}
                 for r in runs],  # fmt: skip
        **comparison,
    }
    with open(report.path("comparison.json"), "w", encoding="utf-8") as f:
        json.dump(finite(record), f, indent=2, allow_nan=False)
        f.write("\n")
    plot_groups(runs, comparison, report.path("comparison.png"), args.title)
    if comparison["baseline"] is not None and comparison["tests"]:
        plot_deltas(comparison, report.path("comparison_delta.png"))
    plot_geometry(runs, report.path("alignment_uniformity.png"))


if __name__ == "__main__":
    sys.exit(main())
