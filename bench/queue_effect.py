"""Issue 37's measurement in the regime where the objectives act: InfoNCE and HCL (beta 0.2) with the memory bank of
4,096 (the confirmatory study's runs, bench/results/study/) beside the same objectives without it, one seed each, at
the study's recipe otherwise (bench/study.py: all-MiniLM-L6-v2, 100 steps of 64 sentences, lr 3e-5). The runs
without the queue are trained and scored here through bench/quality's machinery into bench/results/queue_effect/;
the runs with it are read from the study's records (run by bench.study, never here).

    python -m bench.queue_effect            # trains what is missing, then writes queue_effect/report.{json,md}
    python -m bench.queue_effect --report   # the report from what is there
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
from pathlib import Path

from bench import quality, study
from bench.common import RESULTS, ROOT, environment, environment_line, write_report

OUT = RESULTS / "queue_effect"
ARMS = ("infonce", "hcl")
SEED = 42
KEYS = ("loss", "neg_sim", "top1pct_weight_share", "neg_weight_max")


def without_queue(arm: str) -> list[str]:
    return study.flags(arm) + ["--queue_size", "0"]  # the last value of a flag wins


def entries() -> list[dict]:
    quality.OUT = OUT
    without = quality.load_index()["runs"]
    quality.OUT = study.OUT
    with_queue = quality.load_index()["runs"]
    rows = []
    for arm in ARMS:
        for queue, runs in ((4096, with_queue), (0, without)):
            entry = runs.get(quality.run_key(arm, SEED, 64))
            rows.append({"arm": arm, "queue_size": queue, "seed": SEED,
                         "average": None if entry is None else entry["average"],
                         "diagnostics": {} if entry is None else entry.get("diagnostics", {}),
                         "provenance": None if entry is None else entry.get("provenance")})  # fmt: skip
    return rows


def markdown(record: dict) -> str:
    lines = ["# Issue 37: InfoNCE and HCL with the memory bank beside the same objectives without it", "",
             f"{environment_line(record['environment'], load=False)} The study's recipe "
             "(bench/results/study/plan.md: all-MiniLM-L6-v2, 100 steps of 64 sentences of the shuffled wiki slice, "
             f"lr 3e-5, HCL beta 0.2), seed {SEED} only: one run per cell, no test; the runs with the queue are the "
             "study's.", "",
             "| arm | queue | STS average | " + " | ".join(KEYS) + " |",
             "|---|---|---|" + "---|" * len(KEYS)]  # fmt: skip
    for row in record["rows"]:
        average = "not run yet" if row["average"] is None else f"{row['average']:.2f}"
        diagnostics = " | ".join("–" if key not in row["diagnostics"] else f"{row['diagnostics'][key]:.4g}"
                                 for key in KEYS)  # fmt: skip
        lines.append(f"| {row['arm']} | {row['queue_size'] or 'none'} | {average} | {diagnostics} |")
    lines += ["", "The diagnostics are the last logging window's (steps 91-100)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", action="store_true", help="only rebuild the report")
    parser.add_argument("--work_dir", default=str(ROOT / "outputs" / "queue_effect"))
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    if not args.report:
        quality.OUT = OUT
        work = Path(args.work_dir)
        work.mkdir(parents=True, exist_ok=True)
        corpus = work / f"wiki_shuffled_{study.CORPUS_LINES}.txt"
        if not corpus.is_file():
            from bench.common import shuffled_corpus

            lines = shuffled_corpus(work / "wiki_shuffled.txt").read_text(encoding="utf-8").splitlines()
            corpus.write_text("\n".join(lines[: study.CORPUS_LINES]) + "\n", encoding="utf-8")
        threads = max(1, (os.cpu_count() or 1) // args.jobs) if args.jobs > 1 else None
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(quality.train_and_score, arm, without_queue(arm), SEED, 64, None, work, corpus,
                                   threads, args.jobs) for arm in ARMS]  # fmt: skip
            for future in futures:
                future.result()
    record = {"environment": environment(), "rows": entries()}
    print(write_report(OUT / "report", record, markdown), flush=True)
    print(json.dumps([(r["arm"], r["queue_size"], r["average"]) for r in record["rows"]]))


if __name__ == "__main__":
    main()
