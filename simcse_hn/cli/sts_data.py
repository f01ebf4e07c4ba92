"""Build the STS evaluation folder (STS12-16, STS-B, SICK-R as JSON Lines) from the public copies on the Hub.

    simcse-hn-sts-data --output data/sts [--tasks all|sts12,stsb,...]

Reads MTEB's copies (mteb/sts12-sts ... mteb/sts16-sts, mteb/sickr-sts, at the revisions MTEB's tasks pin) and
sentence-transformers/stsb through `datasets` (its cache, then the Hub), checks SentEval's pair counts (STS12 3,108,
STS13 1,500, STS14 3,750, STS15 3,000, STS16 1,186, STS-B 1,379 test and 1,500 dev, SICK-R 4,927 test) and writes
the folder that eval/sts.py --data_dir and train.py's eval_file (DIR/stsb.jsonl) read offline.
"""

from __future__ import annotations

import argparse
import sys

from simcse_hn.data.sts import parse_tasks
from simcse_hn.data.sts_folder import build_sts_folder, summary_lines
from simcse_hn.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="simcse-hn-sts-data",
        description=__doc__.split("\n")[0],
        epilog="Sub-file and split labels come back only where the copy's scores prove them (docs/evaluation.md).",
    )
    parser.add_argument("--output", required=True, help="The folder to write (never replacing a file of yours).")
    parser.add_argument("--tasks", default="all", help="'all' or a comma-separated list, e.g. sts12,stsb,sickr.")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        tasks = parse_tasks(args.tasks)
    except ValueError as e:
        print(f"error: --tasks: {e}", file=sys.stderr)
        return 2
    import datasets
    import huggingface_hub

    datasets.disable_progress_bars()  # a few MB per task: one line each at the end says what was written
    datasets.utils.logging.set_verbosity_error()
    huggingface_hub.utils.disable_progress_bars()
    try:
        record = build_sts_folder(args.output, tasks)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in summary_lines(args.output, record):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
