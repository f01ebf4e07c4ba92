"""The quality study's pages (bench/results/quality/) from its records: runs.json and what each run kept under
runs/<run>/ (results.json, predictions.npz, curves.json); runs of another batch or learning rate compared apart, and a
comparison whose runs' results are on no disk here left as it is. The runs were made by the lab's earlier runner; a
study of today runs through `simcse-hn-study` (docs/studies.md). `python -m bench.quality` rewrites the pages.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import statistics
from collections.abc import Callable
from pathlib import Path

from bench.common import RESULTS, ROOT, SHARED_DATA
from simcse_hn.cli import compare as compare_command
from simcse_hn.cli import curves as curves_command
from simcse_hn.errors import DataError
from simcse_hn.evaluation.comparability import scored_alike
from simcse_hn.losses.progcl import FIT_PAIRS
from simcse_hn.study.report import mean_windows

BASELINE = "infonce"
OUT = RESULTS / "quality"
# The one-seed sensitivity sweep: (name, arm whose config it starts from, flags that change); DCL's points try a
# smaller prior and the paper's temperature (at t = 0.05 the seed-42 arm clamps 99 % of anchors: docs/losses.md)
SWEEP = [
    ("hcl-beta0.05", "hcl", ["--hcl_beta", "0.05"]),
    ("hcl-beta0.2", "hcl", ["--hcl_beta", "0.2"]),
    ("hcl-beta0.45", "hcl", ["--hcl_beta", "0.45"]),  # sentence-transformers' hardness_strength 9 at scale 20
    ("progcl-warmup0.5", "progcl", ["--progcl_warmup_ratio", "0.5"]),
    ("progcl-fitall", "progcl", ["--progcl_fit_pairs", "0"]),
    ("unremix-beta0.5", "unremix", ["--unremix_beta", "0.5"]),
    ("unremix-beta2", "unremix", ["--unremix_beta", "2.0"]),
    ("dcl-tau1e-6", "dcl", ["--dcl_tau_plus", "1e-6"]),
    ("dcl-t0.5-tau0.1", "dcl", ["--temperature", "0.5", "--dcl_tau_plus", "0.1"]),
    ("infonce-t0.5", "infonce", ["--temperature", "0.5"]),
]
DIAGNOSTICS = ("loss", "pos_sim", "neg_sim", "harder_than_positive", "top1pct_weight_share", "neg_weight_max",
               "clamp_frac", "est_false_neg_frac", "bmm_fallback", "nonfinite_fallback")  # fmt: skip


def arms() -> list[str]:
    names = sorted(p.name[len("unsup_bert_base_"):-len(".yaml")] for p in (ROOT / "configs").glob("unsup_bert_base_*"))
    return [BASELINE] + [name for name in names if name != BASELINE]


def load_index() -> dict:
    path = OUT / "runs.json"
    return json.loads(path.read_text()) if path.is_file() else {"runs": {}}


def run_key(name: str, seed: int, batch: int) -> str:
    return f"{name}-b{batch}-s{seed}"


SICK_LABELS = ("ENTAILMENT", "NEUTRAL", "CONTRADICTION")


@functools.lru_cache(maxsize=4)
def sick_test_rows(sick: Path) -> list[dict]:
    """SICK's test-split rows with their entailment labels (the package's STS reader keeps pairs and scores only)."""
    rows = [json.loads(line) for line in sick.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in rows if r.get("split") == "test"]


def sick_by_label(results: Path, sick: Path | None = None) -> dict | None:
    """SICK-R's test pairs by entailment label from a run's predictions.npz: each label's mean cosine and the AUC of
    telling entailment (a false negative to an unsupervised batch) from contradiction (a hard true negative) by
    cosine. None when the predictions or labels are missing or do not line up with the test split."""
    import numpy as np
    from scipy.stats import mannwhitneyu

    sick = SHARED_DATA / "sts" / "sickr.jsonl" if sick is None else sick
    if not (results / "predictions.npz").is_file() or not sick.is_file():
        return None
    rows = sick_test_rows(sick)
    with np.load(results / "predictions.npz") as predictions:
        if "SICK-R/cosine" not in predictions.files:
            return None
        cosine, gold = predictions["SICK-R/cosine"], predictions["SICK-R/gold"]
    if len(rows) != len(cosine) or not np.allclose(gold, [r["score"] for r in rows]):
        print(f"{results}: SICK-R predictions do not match {sick}'s test split; no label table", flush=True)
        return None
    labels = np.array([r.get("entailment") for r in rows])
    out = {f"cos_{label.lower()}": float(cosine[labels == label].mean()) for label in SICK_LABELS}
    entail, contra = cosine[labels == "ENTAILMENT"], cosine[labels == "CONTRADICTION"]
    out["auc_entailment_vs_contradiction"] = float(mannwhitneyu(entail, contra).statistic / (len(entail) *
                                                                                            len(contra)))  # fmt: skip
    return out


def learning_rate_suffix(arm: str) -> str:
    return arm[arm.rindex("-lr"):] if "-lr" in arm else ""


def baseline_of(arm: str) -> str:
    return BASELINE + learning_rate_suffix(arm)


def sick_label_table(runs: dict) -> list[str]:
    """The report's SICK-R-by-label section: one row per arm and batch (mean over its runs), the references first,
    with each arm's AUC paired over seeds against the baseline's at the same batch (a t-test over the shared seeds)."""
    from simcse_hn.evaluation.stats import paired_t_test

    groups: dict[tuple, dict] = {}  # (arm, batch) -> {seed: values}
    for _, entry in sorted(runs.items(), key=lambda kv: (kv[1].get("seed") is not None, kv[1]["arm"],
                                                         str(kv[1].get("batch_size")), kv[1].get("seed") or 0)):
        values = entry.get("sick_by_label") or sick_by_label(ROOT / entry["results"])
        group = groups.setdefault((entry["arm"], entry.get("batch_size", "–")), {})
        if values is not None:
            group[entry.get("seed")] = values
    if not groups:
        return []
    auc = "auc_entailment_vs_contradiction"
    names = [f"cos_{label.lower()}" for label in SICK_LABELS] + [auc]
    lines = ["", "## SICK-R test pairs by entailment label (mean over each arm's runs)", "",
             "Mean cosine of the 1,414 entailment, 2,793 neutral and 720 contradiction pairs, and the AUC of telling "
             "entailment (a paraphrase, which an unsupervised batch treats as a negative: a false negative) from "
             "contradiction (lexically close, opposite in meaning: a hard true negative) by cosine alone. The last "
             f"column pairs the AUC with {BASELINE}'s at the same batch (and learning rate) over the seeds both "
             "have. A row of 0 runs is absent: its runs' predictions were lost with an earlier machine (before "
             "bench/quality.py kept them beside runs.json), and the report copies no figure it cannot recompute.", "",
             "| arm | batch | runs | " + " | ".join(names) + " | AUC of each run, by seed | AUC vs baseline |",
             "|:--|--:|--:|" + "--:|" * len(names) + ":--|:--|"]  # fmt: skip
    for (arm, batch), members in groups.items():
        if not members:
            lines.append(f"| {arm} | {batch} | 0 | " + " | ".join("–" for _ in names) + " | absent | |")
            continue
        cells = " | ".join(f"{statistics.mean(m[n] for m in members.values()):.4f}" for n in names)
        each = ", ".join(f"{m[auc]:.4f}" for m in members.values())
        base = groups.get((baseline_of(arm), batch), {})
        shared = [seed for seed in members if seed is not None and seed in base]
        versus = ""
        if arm != baseline_of(arm) and shared:
            test = paired_t_test([members[seed][auc] for seed in shared], [base[seed][auc] for seed in shared])
            versus = f"{test['difference']:+.4f} ({len(shared)} seed{'s' * (len(shared) > 1)}"
            versus += f", p {test['p']:.2g})" if len(shared) > 1 else ")"
        lines.append(f"| {arm} | {batch} | {len(members)} | {cells} | {each} | {versus} |")
    return lines


def report(index: dict, out: Path | None = None) -> None:
    """eval/compare.py over the runs of batch 64 (the larger batches apart), runs.md, the curves; from the results
    and curves runs.json names, into `out` (default OUT, beside them)."""
    out = OUT if out is None else out
    runs = index["runs"]
    by_variant: dict[tuple[int, str], list[str]] = {}  # (batch, learning-rate suffix) -> runs, compared apart
    for key, entry in runs.items():
        if entry.get("seed") is not None:
            by_variant.setdefault((entry["batch_size"], learning_rate_suffix(entry["arm"])), []).append(key)
    for (batch, suffix), keys in sorted(by_variant.items()):
        baseline = BASELINE + suffix
        keys = sorted(keys, key=lambda k: (runs[k]["arm"] != baseline, runs[k]["arm"], runs[k]["seed"]))
        if batch == 64 and not suffix:
            keys = [k for k in ("before-cls", "before-avg") if k in runs] + keys
        folder = out / f"compare_b{batch}{suffix}"
        shown = folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder
        lost = [k for k in keys if not (ROOT / runs[k]["results"] / "results.json").is_file()]
        if lost:  # an earlier machine's runs without kept results: their comparison stays as last written
            print(f"{shown} kept as it is: {len(lost)} of its runs' results are on no disk here "
                  f"({', '.join(lost[:3])}{', ...' if len(lost) > 3 else ''})", flush=True)
            continue
        groups = [runs[k]["arm"] for k in keys]
        seeds = [str(runs[k]["seed"]) if runs[k]["seed"] is not None else "0" for k in keys]
        baseline = baseline if baseline in groups else groups[0]
        problem = scored_apart(keys, runs, groups, seeds, baseline)
        if problem:  # an arm's seeds scored otherwise are not replicates: no statistics over them
            print(f"{shown} not rewritten: {problem}", flush=True)
            continue
        title = f"Quality study, batch {batch}" + (f", learning rate {suffix[3:]}" if suffix else "")
        report_command(compare_command.main, [*[str(ROOT / runs[k]["results"]) for k in keys], "--group",
                                              ",".join(groups), "--seeds", ",".join(seeds), "--baseline", baseline,
                                              "--output", str(folder), "--title", title])  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "runs.md").write_text(runs_page(runs), encoding="utf-8")
    draw_curves(runs, by_variant, out)


def report_command(main: Callable[[list[str]], int], argv: list[str]) -> None:
    """A report command of the package (eval/compare.py, eval/curves.py) in this process, its page unprinted; a
    refusal (a file of someone else's in the way) is said in its one line, and the rest of the report goes on."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as said:
        failed = main(argv) != 0
    if failed:
        print(said.getvalue().strip(), flush=True)


def runs_page(runs: dict) -> str:
    """runs.md: every run's row, the diagnostics per arm and batch, the provenance, the sweep and SICK-R by label."""
    lines = ["# Quality study: the runs", "",
             "Each row is one run; diagnostics are the last logging window of training (1,600 sentences: 25 steps "
             "at batch 64). Times are wall "
             "seconds with the 1-minute load average before and after; jobs: trainings run at once (--jobs), with "
             "their torch threads.", "",
             "| run | STS avg | train s | eval s | load | jobs | " + " | ".join(DIAGNOSTICS) + " |",
             "|:--|--:|--:|--:|:--|:--|" + "--:|" * len(DIAGNOSTICS)]  # fmt: skip
    for key, entry in sorted(runs.items()):
        load = entry.get("load_average")
        load = f"{load['before'][0]:.1f} / {load['after'][0]:.1f}" if load else "–"
        diagnostics = entry.get("diagnostics", {})
        cells = " | ".join(f"{diagnostics[d]:.4g}" if d in diagnostics else "–" for d in DIAGNOSTICS)
        threads = entry.get("torch_threads") or "all"
        jobs = f"{entry.get('jobs', 1)} x {threads} threads" if "train_seconds" in entry else "–"
        lines.append(f"| {key} | {entry['average']:.2f} | {entry.get('train_seconds', '–')} | "
                     f"{entry.get('eval_seconds', '–')} | {load} | {jobs} | {cells} |")  # fmt: skip
    # one row per arm and batch size: a batch-512 run's loss is ten times a batch-64 run's, so they are not averaged
    arms_seen = sorted({(e["arm"], e["batch_size"]) for e in runs.values() if e.get("seed") is not None})
    lines += ["", "## Diagnostics per arm and batch size (mean over its runs)", "",
              "| arm | batch | runs | " + " | ".join(DIAGNOSTICS) + " |",
              "|:--|--:|--:|" + "--:|" * len(DIAGNOSTICS)]  # fmt: skip
    for arm, batch in arms_seen:
        members = [e for e in runs.values()
                   if e["arm"] == arm and e.get("batch_size") == batch and e.get("diagnostics")]  # fmt: skip
        means = mean_windows([e["diagnostics"] for e in members], DIAGNOSTICS)
        cells = " | ".join(f"{means[d]:.4g}" if d in means else "–" for d in DIAGNOSTICS)
        lines.append(f"| {arm} | {batch} | {len(members)} | {cells} |")
    # flagged, not hidden: an arm's means below may pool runs of different code or data
    unrecorded = sum(not (e.get("provenance") or {}).get("train_code_sha256") for e in runs.values())
    lines += ["", "## Provenance", "", f"{unrecorded} of {len(runs)} runs record no training code or data hash (run "
              "before train.py wrote them, or references without training).",
              *[f"* {problem}" for problem in mixed_provenance(runs)]]
    lines += sweep_table(runs)
    lines += sick_label_table(runs)
    return "\n".join(lines) + "\n"


def scored_apart(keys: list[str], runs: dict, groups: list[str], seeds: list[str], baseline: str) -> str | None:
    """Why the runs of one comparison cannot be its groups (simcse_hn.evaluation.comparability: an arm whose runs were
    scored under another protocol, tasks, data, pooler or input length; a baseline tested against an arm scored
    otherwise), or None when they can."""
    members = []
    for key, group, seed in zip(keys, groups, seeds):
        with open(ROOT / runs[key]["results"] / "results.json", encoding="utf-8") as f:
            members.append({"results": json.load(f), "group": group, "seed": seed})
    try:
        scored_alike(members, split=False, baseline=baseline)
    except DataError as e:
        return str(e)
    return None


def sweep_table(runs: dict) -> list[str]:
    """The sensitivity sweep against the seed-42 run of the arm each entry starts from, with that arm's seed-to-seed
    spread for scale: one seed shows a shape, not a difference."""
    rows = []
    for name, arm, changes in SWEEP:
        entry = runs.get(run_key(name, 42, 64))
        if entry is None:
            continue
        base = runs.get(run_key(arm, 42, 64))
        spread = [e["average"] for e in runs.values() if e["arm"] == arm and e.get("batch_size") == 64]
        versus = f"{base['average']:.2f} | {entry['average'] - base['average']:+.2f}" if base else "– | –"
        scale = f"{statistics.mean(spread):.2f} ± {statistics.stdev(spread):.2f} ({len(spread)})" if len(
            spread) > 1 else "–"  # fmt: skip
        note = sweep_no_op(arm, changes, 64) or ""
        rows.append(f"| {name} | {arm} | `{' '.join(changes)}` | {entry['average']:.2f} | {versus} | {scale} | "
                    f"{note} |")
    if not rows:
        return []
    return ["", "## Sensitivity sweep (one seed each, batch 64)", "",
            "Each entry changes one setting of the arm it starts from and trains seed 42 only: it shows the shape "
            "of the response, not a difference the study can test. For scale, the last column is the arm's own "
            "STS average over its seeds (mean ± standard deviation, runs). A point noted no-op cannot differ from its "
            "arm (its setting does not take effect at this batch): its difference is seed noise at most.", "",
            "| run | arm | changes | STS avg | arm, seed 42 | difference | arm over seeds | note |",
            "|:--|:--|:--|--:|--:|--:|--:|:--|", *rows]  # fmt: skip


def draw_curves(runs: dict, by_variant: dict, out: Path) -> None:
    """Training curves from each run's curves.json kept under OUT/runs/ (with or without its scores), into `out`: the
    first batch-64 seed of every arm (curves/), the sweep beside the baseline's seed 42 (curves_sweep/), and every run
    of another batch or learning rate (curves_b<batch>[-lr<rate>]/). A chart some of whose runs have no kept curves
    stays as last drawn."""
    first = {}
    for key, entry in sorted(runs.items(), key=lambda kv: kv[1].get("seed") or 0):
        if entry.get("seed") is not None and entry["batch_size"] == 64 and entry["arm"] not in first:
            first[entry["arm"]] = key
    sweep = [name for name, _, _ in SWEEP]
    charts = {"curves": [first[arm] for arm in arms() if arm in first],
              "curves_sweep": [first[name] for name in [BASELINE] + sweep if name in first]}
    for (batch, suffix), keys in sorted(by_variant.items()):
        if (batch, suffix) != (64, ""):
            charts[f"curves_b{batch}{suffix}"] = sorted(keys, key=lambda k: (runs[k]["arm"], runs[k]["seed"]))
    for chart, keys in charts.items():
        records = [OUT / "runs" / key / "curves.json" for key in keys]
        if len(keys) < 2 or not all(r.is_file() for r in records):
            continue
        report_command(curves_command.main, [*map(str, records), "--output", str(out / chart)])


def sweep_no_op(arm: str, changes: list[str], batch: int) -> str | None:
    """Why the sweep point (`changes` to `arm`'s config) is the arm itself at `batch`, or None when it can differ.
    ProGCL samples fit_pairs of a batch's 2N(2N-1)/2 pairs only when there are more: with no more, every fit already
    uses all pairs, so `--progcl_fit_pairs 0` (all) changes nothing."""
    if arm.startswith("progcl") and "--progcl_fit_pairs" in changes:
        pairs = 2 * batch * (2 * batch - 1) // 2
        fitted = int(changes[changes.index("--progcl_fit_pairs") + 1])
        if min(fitted or pairs, pairs) == min(FIT_PAIRS, pairs):
            return (f"no-op: a batch of {batch} has {pairs:,} pairs, no more than fit_pairs {FIT_PAIRS:,}, "
                    "so the arm's fit already uses every pair")  # fmt: skip
    return None


def mixed_provenance(runs: dict) -> list[str]:
    """One line per arm and batch whose runs record more than one training data hash or code hash, or whose
    evaluation ran other code than its training: such runs are not one arm's repeats."""
    groups: dict[tuple, list[dict]] = {}
    for entry in runs.values():
        groups.setdefault((entry["arm"], entry.get("batch_size")), []).append(entry.get("provenance") or {})
    problems = []
    for (arm, batch), records in sorted(groups.items(), key=str):
        for field in ("train_data_sha256", "train_code_sha256"):
            seen = {r.get(field) for r in records if r.get(field)}
            if len(seen) > 1:
                problems.append(f"{arm} at batch {batch}: {len(seen)} different {field} over its {len(records)} runs")
        mixed = [r for r in records if r.get("eval_code_sha256") and r.get("train_code_sha256")
                 and r["eval_code_sha256"] != r["train_code_sha256"]]  # fmt: skip
        if mixed:
            problems.append(f"{arm} at batch {batch}: {len(mixed)} runs evaluated by other code than trained them")
    return problems


def main() -> None:
    report(load_index())
    print(f"report: {OUT}", flush=True)


if __name__ == "__main__":
    main()
