"""Issue 37's measurement in the regime where the objectives act: InfoNCE and HCL (beta 0.2) with the memory bank of
4,096 (the confirmatory study's runs, bench/results/study/) beside the same objectives without it, one seed each, at
the study's recipe otherwise (bench/results/study/plan.md: all-MiniLM-L6-v2, 100 steps of 64 sentences, lr 3e-5). The
runs without the queue were trained and scored by the lab's earlier runner into bench/results/queue_effect/; the
runs with it are the study's records.

    python -m bench.queue_effect   # queue_effect/report.{json,md} from those records
"""

from __future__ import annotations

import json

from bench.common import RESULTS, environment, environment_line, write_report

OUT = RESULTS / "queue_effect"
ARMS = ("infonce", "hcl")
SEED = 42
KEYS = ("loss", "neg_sim", "top1pct_weight_share", "neg_weight_max")


def entries() -> list[dict]:
    without = json.loads((OUT / "runs.json").read_text())["runs"]
    with_queue = json.loads((RESULTS / "study" / "runs.json").read_text())["runs"]
    rows = []
    for arm in ARMS:
        for queue, runs in ((4096, with_queue), (0, without)):
            entry = runs.get(f"{arm}-b64-s{SEED}")
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
    record = {"environment": environment(), "rows": entries()}
    print(write_report(OUT / "report", record, markdown), flush=True)
    print(json.dumps([(r["arm"], r["queue_size"], r["average"]) for r in record["rows"]]))


if __name__ == "__main__":
    main()
