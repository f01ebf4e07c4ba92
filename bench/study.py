"""The confirmatory study of issue 36, run as its preregistration says (bench/results/study/plan.md): six arms x seeds
42-51 in the memory-bank regime that pilot5 found, each run trained by train.py and scored by eval/sts.py through
bench/quality.py's machinery (its run records, provenance, kept results and resumable runs), with this study's own
results folder, recipe and seeds; the report reads the runs against the plan.

    python -m bench.study --resume --jobs 2          # every run the study still lacks, seed by seed; repeat until done
    python -m bench.study --resume --start_within 60 # start no run after an hour: the sitting ends at a run boundary
    python -m bench.study --report                   # rebuild bench/results/study/report.{json,md} from runs.json
    python -m bench.study --resume --dry_run         # list what is left

The tests are read only once all 60 runs are in; until then the report counts the runs.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import time
from pathlib import Path

import numpy as np

from bench import quality
from bench.common import RESULTS, ROOT, environment, shuffled_corpus, write_report
from simcse_hn.files import portable_name
from simcse_hn.study import analysis as comparison
from simcse_hn.study.report import mean_windows

OUT = RESULTS / "study"
BASELINE = "infonce"
SEEDS = tuple(range(42, 52))
CORPUS_LINES = 6400
# the regime (plan.md "Setting"): a memory bank of 4,096, the pilot's length, no evaluation during training
REGIME = ["--queue_size", "4096", "--momentum", "0", "--max_steps", "100", "--logging_steps", "10",
          "--eval_strategy", "no", "--save_steps", "50", "--load_best_model_at_end", "false"]  # fmt: skip
ARMS = {  # plan.md "Arms": the config's objective keys, then the settings pilot5 chose
    "infonce": ("infonce", []),
    "hcl": ("hcl", ["--hcl_beta", "0.2"]),
    "dcl": ("dcl", ["--dcl_tau_plus", "1e-5"]),
    "progcl": ("progcl", []),
    "progcl_mix": ("progcl_mix", []),
    "unremix": ("unremix", []),
}
FAMILY_ALPHA = 0.05
# plan.md "Smallest detectable effect": 10 pairs, two-sided paired t at 0.05 / 5, 80 % power -> 1.333 sd
DETECTABLE_SD = 1.333


def flags(arm: str) -> list[str]:
    config, changes = ARMS[arm]
    return quality.arm_flags(config) + changes + REGIME


def plan_runs(done: dict, seeds=SEEDS) -> list[tuple]:
    """The runs the study lacks, seed by seed, every arm within a seed. -> [(name, flags, seed, batch, cache)]"""
    return [(arm, flags(arm), seed, 64, None) for seed in seeds for arm in ARMS
            if quality.run_key(arm, seed, 64) not in done]  # fmt: skip


def task_scores(entry: dict) -> dict[str, float]:
    """A run's Spearman x 100 per STS task, from the results it kept."""
    results = json.loads((ROOT / entry["results"] / "results.json").read_text())
    return {task: v["spearman"] for task, v in results["tasks"].items()}


def diagnostics(runs: dict) -> dict:
    """Per arm, the mean over its seeds of each training diagnostic of the last logging window (secondary, no test):
    whether the regime held, run by run, as in the pilot."""
    out = {}
    for arm in ARMS:
        windows = [e["diagnostics"] for e in runs.values() if e["arm"] == arm and e.get("diagnostics")]
        keys = sorted({k for w in windows for k, v in w.items() if isinstance(v, (int, float))})
        out[arm] = mean_windows(windows, keys)
    return out


def per_task(runs: dict) -> dict:
    """Per arm against the baseline, the mean over the paired seeds of each task's difference (secondary, no test)."""
    tasks = {(e["arm"], e["seed"]): task_scores(e) for e in runs.values() if e["arm"] in ARMS and e["seed"] in SEEDS}
    return comparison.per_task({arm: [tasks[(arm, s)] for s in SEEDS] for arm in ARMS}, BASELINE)


def across_arms(runs: dict) -> list[str]:
    """The arms are paired by seed, so every run of the study trains on the same data with the same code (the plan's
    commit): one line per field that takes more than one value over the runs."""
    problems = []
    for field in ("train_data_sha256", "train_code_sha256"):
        seen = {(e.get("provenance") or {}).get(field) for e in runs.values()} - {None}
        if len(seen) > 1:
            problems.append(f"the study's {len(runs)} runs record {len(seen)} different {field}")
    return problems


def analysis(runs: dict) -> dict:
    """Per arm: its seeds' STS averages and the last window's diagnostics; once every arm has all seeds, each arm
    against the baseline (sign-flip and paired t, Holm over the arms), the interval, the observed spread and the effect
    detectable at it, and the per-task differences."""
    scores = {arm: {e["seed"]: e["average"] for e in runs.values() if e["arm"] == arm} for arm in ARMS}
    out = {"arms": {arm: {"seeds": sorted(s), "mean": float(np.mean(list(s.values()))) if s else None,
                          "std": float(np.std(list(s.values()), ddof=1)) if len(s) > 1 else None}
                    for arm, s in scores.items()},
           "complete": all(set(scores[arm]) >= set(SEEDS) for arm in ARMS),
           "provenance_problems": quality.mixed_provenance(runs) + across_arms(runs),
           "diagnostics": diagnostics(runs)}  # fmt: skip
    if not out["complete"]:
        return out
    out["per_task"] = per_task(runs)
    # the tests are the product's (simcse_hn.study.analysis, what `simcse-hn-study report` reads), in this page's
    # fields; the detectable effect stays the plan's 1.333 sd (plan.md)
    compared = comparison.compare({arm: [scores[arm][s] for s in SEEDS] for arm in ARMS}, BASELINE, FAMILY_ALPHA,
                                  smallest_effect=0.0)["tests"]  # fmt: skip
    fields = ("difference", "low", "high", "t", "p_t", "p_sign_flip", "sd_of_differences")
    tests = {arm: {k: v[k] for k in fields} | {"detectable": DETECTABLE_SD * v["sd_of_differences"]}
             | {k: v[k] for k in ("p_sign_flip_holm", "p_t_holm", "differs")} for arm, v in compared.items()}
    out["tests"] = tests
    return out


def markdown(record: dict) -> str:
    a = record["analysis"]
    lines = ["# The confirmatory study in the memory-bank regime", "",
             f"Plan: bench/results/study/plan.md (committed before the first run). {record['runs']} of "
             f"{len(ARMS) * len(SEEDS)} runs in; report written {record['environment']['date']} at commit "
             f"{record['environment']['commit']}.", "",
             "| arm | seeds in | mean STS average | sd |", "|---|---|---|---|"]  # fmt: skip
    for arm, v in a["arms"].items():
        mean = "–" if v["mean"] is None else f"{v['mean']:.2f}"
        sd = "–" if v["std"] is None else f"{v['std']:.2f}"
        lines.append(f"| {arm} | {len(v['seeds'])} | {mean} | {sd} |")
    if a["provenance_problems"]:
        lines += ["", "Provenance problems (these runs are not one arm's repeats):", "",
                  *[f"* {p}" for p in a["provenance_problems"]]]  # fmt: skip
    lines += diagnostics_table(a["diagnostics"])
    if not a["complete"]:
        lines += ["", "The tests are read once every arm has all 10 seeds (the plan); until then this page counts "
                  "the runs only."]  # fmt: skip
        return "\n".join(lines) + "\n"
    lines += ["", f"## Against {BASELINE} (10 paired seeds; Holm over the five arms, family-wise 0.05)", "",
              "| arm | difference | 95 % interval | sign-flip p | Holm | paired t p | Holm | sd of differences | "
              "detectable at that sd | reading |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for arm, v in a["tests"].items():
        reading = (f"differs: {v['difference']:+.2f}" if v["differs"] else
                   f"no difference shown; the interval excludes effects above {v['high']:+.3f} and below "
                   f"{v['low']:+.3f}")  # fmt: skip
        lines.append(f"| {arm} | {v['difference']:+.3f} | [{v['low']:+.3f}, {v['high']:+.3f}] | "
                     f"{v['p_sign_flip']:.4f} | {v['p_sign_flip_holm']:.4f} | {v['p_t']:.4f} | {v['p_t_holm']:.4f} "
                     f"| {v['sd_of_differences']:.3f} | {v['detectable']:.3f} | {reading} |")  # fmt: skip
    tasks = list(next(iter(a["per_task"].values())))
    lines += ["", f"## Per task (secondary, no test): mean difference against {BASELINE} over the 10 paired seeds", "",
              "| arm | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]  # fmt: skip
    for arm, v in a["per_task"].items():
        lines.append(f"| {arm} | " + " | ".join(f"{v[t]:+.2f}" for t in tasks) + " |")
    return "\n".join(lines) + "\n"


DIAGNOSTICS = {"loss": "loss", "neg_sim": "mean negative cosine", "top1pct_weight_share": "weight on the nearest 1 %",
               "neg_weight_max": "largest weight", "clamp_frac": "anchors clamped"}  # fmt: skip


def diagnostics_table(by_arm: dict) -> list[str]:
    """The last logging window of training, averaged over each arm's seeds: whether the pilot's regime held."""
    keys = [k for k in DIAGNOSTICS if any(k in v for v in by_arm.values())]
    if not keys:
        return []
    lines = ["", "Training, last logging window, mean over the arm's seeds (secondary, no test; uniform weight on the "
             "nearest 1 % is 0.01):", "", "| arm | " + " | ".join(DIAGNOSTICS[k] for k in keys) + " |",
             "|---|" + "---|" * len(keys)]  # fmt: skip
    for arm, v in by_arm.items():
        lines.append(f"| {arm} | " + " | ".join("–" if k not in v else f"{v[k]:.4g}" for k in keys) + " |")
    return lines


def write_study_report() -> str:
    runs = quality.load_index()["runs"]
    record = {"environment": environment(), "plan": "plan.md", "runs": len(runs), "analysis": analysis(runs),
              "seeds": list(SEEDS), "arms": {arm: flags(arm) for arm in ARMS}}  # fmt: skip
    return write_report(OUT / "report", record, markdown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resume", action="store_true", help="every run the study still lacks")
    parser.add_argument("--report", action="store_true", help="only rebuild the report")
    parser.add_argument("--dry_run", action="store_true", help="list the runs left, and stop")
    parser.add_argument("--jobs", type=int, default=1, help="trainings at once, cores / jobs torch threads each")
    parser.add_argument("--start_within", type=float, default=None, metavar="MINUTES",
                        help="start no run later than this many minutes into the sitting")  # fmt: skip
    parser.add_argument("--work_dir", default=str(ROOT / "outputs" / "study"))
    parser.add_argument("--results_dir", default=None, help=f"default {OUT.relative_to(ROOT)} (smoke runs: another)")
    parser.add_argument("--model", default=None, help="smoke runs only: another model than the plan's")
    parser.add_argument("--max_steps", type=int, default=None, help="smoke runs only: stop every run early")
    parser.add_argument("--seeds", default=None, help="smoke runs only: some of the plan's seeds (comma-separated)")
    args = parser.parse_args()
    globals()["OUT"] = Path(args.results_dir) if args.results_dir else OUT
    quality.OUT = OUT  # the run records, kept results and locks of this study, not the quality study's
    if args.model:
        quality.RECIPE[quality.RECIPE.index("--model_name_or_path") + 1] = args.model
    if args.max_steps:
        REGIME[REGIME.index("--max_steps") + 1] = str(args.max_steps)
    if not args.report:
        seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else SEEDS
        todo = plan_runs(quality.load_index()["runs"], seeds) if args.resume else []
        print(f"runs to do: {len(todo)}", flush=True)
        if args.dry_run:
            for name, _, seed, batch, _ in todo:
                print(f"  {quality.run_key(name, seed, batch)}", flush=True)
            return
        work = Path(args.work_dir)
        work.mkdir(parents=True, exist_ok=True)
        corpus = work / f"wiki_shuffled_{CORPUS_LINES}.txt"
        if not corpus.is_file():
            lines = shuffled_corpus(work / "wiki_shuffled.txt").read_text(encoding="utf-8").splitlines()
            corpus.write_text("\n".join(lines[:CORPUS_LINES]) + "\n", encoding="utf-8")
        threads = max(1, (os.cpu_count() or 1) // args.jobs) if args.jobs > 1 else None
        deadline = time.time() + 60 * args.start_within if args.start_within is not None else None
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(quality.train_and_score, *run_args, work, corpus, threads, args.jobs, deadline)
                       for run_args in todo]  # fmt: skip
            failed = [(r[0], r[2], f.exception()) for r, f in zip(todo, futures) if f.exception() is not None]
        for arm, seed, error in failed:
            print(f"{arm} seed {seed} failed: {error}", flush=True)
        with quality.locked_index() as index:
            index["work_dir"] = portable_name(args.work_dir)
        if failed:
            raise SystemExit(f"{len(failed)} run(s) failed; their logs are under {work}")
    print(write_study_report(), flush=True)


if __name__ == "__main__":
    main()
