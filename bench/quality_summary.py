"""Combine quality studies that differ only in the seed: per-task means over seeds, the average per seed, and the
spread, so that a difference between objectives can be read against the seed-to-seed noise.

    python -m bench.quality_summary --steps 200     # reads bench/results/quality_200steps*.json
                                                    # writes bench/results/quality_200steps_summary.{json,md}
"""

from __future__ import annotations

import argparse
import json
import statistics

from bench.common import RESULTS, write_report
from simcse_hn.data.sts import STS_TASKS as TASKS


def load_studies(steps: int) -> list[dict]:
    paths = [RESULTS / f"quality_{steps}steps.json", *sorted(RESULTS.glob(f"quality_{steps}steps_seed*.json"))]
    studies = [json.loads(path.read_text()) for path in paths if path.is_file()]
    if not studies:
        raise SystemExit(f"error: no quality study with {steps} steps in {RESULTS}")
    return studies


def summarise(studies: list[dict]) -> dict:
    """Runs present in every study; for each, the per-task mean over seeds and every seed's average."""
    common = [name for name in studies[0]["runs"] if all(name in s["runs"] for s in studies)]
    runs = {}
    for name in common:
        entries = [s["runs"][name] for s in studies]
        averages = [e["average"] for e in entries]
        runs[name] = {
            "tasks": {t: statistics.fmean(e["tasks"][t] for e in entries) for t in TASKS},
            "average": statistics.fmean(averages),
            "average_per_seed": averages,
        }
    return {"steps": studies[0]["steps"], "seeds": [s["seed"] for s in studies], "runs": runs}


def markdown(summary: dict) -> str:
    seeds = summary["seeds"]
    lines = [
        f"# Quality study, {summary['steps']} steps: mean over seeds {', '.join(map(str, seeds))}",
        "",
        "Per-task Spearman x 100 averaged over the seeds; 'Avg. per seed' lists each seed's 7-task average in the "
        "order of the seeds. The settings are those of the per-seed files (quality_<steps>steps[_seed<seed>].md).",
        "",
        "| run | " + " | ".join(TASKS) + " | Avg. | Avg. per seed |",
        "|---|" + "---|" * (len(TASKS) + 2),
    ]
    for name in sorted(summary["runs"], key=lambda name: not name.startswith("before")):  # references first
        entry = summary["runs"][name]
        cells = " | ".join(f"{entry['tasks'][t]:.2f}" for t in TASKS)
        per_seed = " / ".join(f"{a:.2f}" for a in entry["average_per_seed"])
        lines.append(f"| {name} | {cells} | {entry['average']:.2f} | {per_seed} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args()
    summary = summarise(load_studies(args.steps))
    stem = f"quality_{args.steps}steps_summary"
    write_report(RESULTS / stem, summary, markdown, echo=True)


if __name__ == "__main__":
    main()
