"""Several STS runs side by side: a Markdown table in the SimCSE paper's layout and a grouped bar chart.

    python eval/compare.py runs/infonce runs/hcl/results.json models/unremix --output runs/compare \
        [--labels InfoNCE,HCL,UnReMix]

Each input is a results.json (or sts_results.json) written by eval/sts.py, or a folder holding one (an eval/sts.py
--output folder or a model folder). Writes comparison.md and comparison.png into --output and prints the table.
Runs scored under different protocols (aggregation, SICK-R pairs) get a Protocol column.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

try:
    import simcse_hn  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from simcse_hn.data import DataError
from simcse_hn.evaluation import plot_results, protocol, results_table

RESULT_FILES = ("results.json", "sts_results.json")


def load_run(path: str) -> tuple[str, dict]:
    """-> (default label: the folder's name, results)"""
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
    label = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return label, results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="results.json files or folders holding one.")
    parser.add_argument("--output", required=True, help="Folder for comparison.md and comparison.png.")
    parser.add_argument("--labels", default=None, help="Comma-separated row labels (default: folder names).")
    parser.add_argument("--title", default=None, help="Chart title.")
    args = parser.parse_args(argv)
    try:
        runs = [load_run(path) for path in args.runs]
        if args.labels is not None:
            labels = [label.strip() for label in args.labels.split(",")]
            if len(labels) != len(runs):
                raise DataError(f"--labels: {len(labels)} labels for {len(runs)} runs")
            runs = [(label, results) for label, (_, results) in zip(labels, runs)]
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    table = results_table(runs)
    lines = ["# STS comparison", "", table, "Spearman x 100 of cosine similarities."]
    if len({protocol(results) for _, results in runs}) == 1:
        lines[-1] += f" Protocol: {protocol(runs[0][1])}."
    lines += ["", "| Run | Model | Pooler | Date |", "|:---|:---|:---|:---|"]
    lines += [f"| {label} | {r['model']} | {r.get('pooler') or '–'} | {r.get('date', '–')} |" for label, r in runs]
    os.makedirs(args.output, exist_ok=True)
    with open(os.path.join(args.output, "comparison.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    plot_results(runs, os.path.join(args.output, "comparison.png"), title=args.title)
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
