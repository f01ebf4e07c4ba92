"""Training curves of one run or several side by side: loss, STS-B dev, alignment / uniformity and the loss
diagnostics over steps, from what the Trainer wrote.

    python eval/curves.py outputs/unsup-bert-base-infonce outputs/unsup-bert-base-hcl --output reports/curves \
        [--labels InfoNCE,HCL] [--keys loss,eval_stsb_spearman,pos_sim]

Each RUN is a training output folder (or one checkpoint-N folder): its trainer_state.json, else the newest
complete checkpoint's, and the TensorBoard event files under runs/ when the run used `--report_to tensorboard`;
or a curves.json this script wrote, whose runs come back under their recorded names (curves kept after the training
folders are gone).
Writes curves.md (a summary table), curves.json (every series), curves.png (all metrics), curve_<metric>.png (one
per metric, one paper column wide) and, when the runs logged eval_alignment and eval_uniformity,
alignment_uniformity.png (the SimCSE chart, one point per evaluation). Metrics that never changed (no fallback,
no skipped step) are listed in curves.md instead of drawn, unless named in --keys. A file in --output that no report
wrote is never replaced (files.ReportFolder: the run refuses in one line).
"""

from __future__ import annotations

import argparse
import os
import sys

from simcse_hn.errors import DataError
from simcse_hn.evaluation.curves import load_curves, load_record, write_curves
from simcse_hn.evaluation.reports import model_label, unique_labels
from simcse_hn.files import ReportFolder


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "runs", nargs="+", help="Training output folders (or checkpoint folders), or curves.json files it wrote."
    )
    parser.add_argument("--output", required=True, help="Folder for curves.md, curves.json and the PNG charts.")
    parser.add_argument(
        "--labels", default=None, help="Comma-separated labels of the run folders (default: their names)."
    )
    parser.add_argument("--keys", default=None, help="Comma-separated metrics to draw (default: every one logged).")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        ReportFolder(args.output).check(("curves.md", "curves.json", "curves.png"))  # before any run is read
        folders = [run for run in args.runs if not (run.endswith(".json") and os.path.isfile(run))]
        labels = [label.strip() for label in args.labels.split(",")] if args.labels else None
        if labels is not None and len(labels) != len(folders):
            raise DataError(f"--labels: {len(labels)} labels for {len(folders)} run folders")
        labels = iter(labels or unique_labels([model_label(run) for run in folders], [
            os.path.join(run, "x") for run in folders]))  # fmt: skip
        runs = []
        for run in args.runs:
            runs += load_record(run) if run not in folders else [load_curves(run, name=next(labels))]
        keys = [key.strip() for key in args.keys.split(",")] if args.keys else None
        with ReportFolder(args.output) as report:
            written = write_curves(runs, report.path(), keys)
            with open(report.path("curves.md"), encoding="utf-8") as f:
                text = f.read()
            report.commit()
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text, end="")
    print(f"wrote {', '.join(written)} to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
