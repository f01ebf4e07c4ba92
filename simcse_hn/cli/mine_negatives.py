"""Mine hard negatives for a pair dataset with an encoder, into a file train.py reads as paired data.

    python scripts/mine_negatives.py --train_file pairs.jsonl --model sentence-transformers/all-MiniLM-L6-v2 \
        --output mined.jsonl [--num_negatives 3] [--relative_margin 0.05 | --absolute_margin 0.1] \
        [--range_min 10 --range_max 50] [--max_score 0.9] [--sampling_strategy top|random] [--corpus more.txt]

The mining is sentence_transformers.util.mine_hard_negatives (the encoder embeds every anchor and every candidate;
candidates are the dataset's positives, plus --corpus): its positive-aware margins keep a candidate only when it is
further from the anchor than the positive by `absolute_margin` (s_neg <= s_pos - m) or by `relative_margin`
(s_neg <= s_pos - |s_pos| m), within ranks range_min..range_max and scores min_score..max_score; `top` takes the
hardest that remain, `random` samples among them. An anchor without enough such candidates is dropped (counted).
The input's pair columns are read as train.py reads them (--anchor_column, --positive_column); negative columns it
may already have are replaced. Output (.jsonl or .csv): anchor, positive, negative_1..k (n-tuple), or one row per
negative, anchor/positive/negative (triplet). User errors print one `error: ...` line and exit with status 2.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import sys

from simcse_hn.cli.answers import OneLineParser
from simcse_hn.errors import UserError

logger = logging.getLogger("simcse_hn.mine")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train_file", required=True, help="Pairs: .jsonl/.csv/.tsv or a Hub dataset id (as train.py).")
    p.add_argument("--train_data_files", help="With a Hub dataset id: the file inside the repo.")
    p.add_argument("--anchor_column", help="The anchor column (default: anchor, sent0, else the first).")
    p.add_argument("--positive_column", help="The positive column (default: positive, sent1, else the next).")
    p.add_argument("--model", required=True, help="The encoder: a sentence-transformers Hub id or folder.")
    p.add_argument("--output", required=True, help="Where to write the mined examples (.jsonl or .csv).")
    p.add_argument("--corpus", help="More candidate negatives: a .txt file, one text per line.")
    p.add_argument("--num_negatives", type=int, default=3)
    p.add_argument("--range_min", type=int, default=0, help="Skip the range_min most similar candidates.")
    p.add_argument("--range_max", type=int, help="Consider only the range_max most similar candidates.")
    p.add_argument("--absolute_margin", type=float, help="Keep a candidate only if s_neg <= s_pos - margin.")
    p.add_argument("--relative_margin", type=float, help="Keep a candidate only if s_neg <= s_pos - |s_pos| margin.")
    p.add_argument("--max_score", type=float, help="Skip candidates scored above this (near duplicates).")
    p.add_argument("--min_score", type=float, help="Skip candidates scored below this.")
    p.add_argument("--sampling_strategy", choices=("top", "random"), default="top")
    p.add_argument("--output_format", choices=("n-tuple", "triplet"), default="n-tuple")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--device", help="Where the encoder runs (default: sentence-transformers' choice).")
    p.add_argument("--seed", type=int, default=42, help="For --sampling_strategy random.")
    p.add_argument("--overwrite", action="store_true", help="Replace an existing --output file.")
    return p.parse_args(argv)


def _check(args: argparse.Namespace) -> None:
    from simcse_hn.errors import ConfigError

    if os.path.exists(args.output) and not args.overwrite:
        raise ConfigError(f"output: {args.output} exists (pass --overwrite to replace it)")
    if not args.output.lower().endswith((".jsonl", ".csv")):
        raise ConfigError(f"output: {args.output} must end in .jsonl or .csv (a file train.py reads)")
    if args.num_negatives < 1:
        raise ConfigError(f"num_negatives: must be >= 1, got {args.num_negatives}")
    for name in ("absolute_margin", "relative_margin"):
        value = getattr(args, name)
        if value is not None and not value >= 0:
            raise ConfigError(f"{name}: must be >= 0, got {value}")
    if args.range_max is not None and args.num_negatives > args.range_max - args.range_min:
        ranks = f"{args.range_min}..{args.range_max}"
        raise ConfigError(f"num_negatives: {args.num_negatives} do not fit in ranks {ranks} (raise range_max or "
                          "lower range_min)")  # fmt: skip
    if args.corpus is not None and not os.path.isfile(args.corpus):
        raise ConfigError(f"corpus: file not found: {args.corpus}")


def mine(args: argparse.Namespace):
    """-> the mined `datasets.Dataset` (columns anchor, positive, negative_1..k or negative)."""
    import random

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives

    from simcse_hn.data.pairs import NO_NEGATIVES, load_pairs
    from simcse_hn.data.sentences import load_sentences
    from simcse_hn.errors import ConfigError, DataError
    from simcse_hn.modeling.loading import load_encoder_config

    _check(args)
    load_encoder_config(args.model, field="model")  # a missing model is one line, before any data is read
    pairs = load_pairs(
        args.train_file, args.anchor_column, args.positive_column, [NO_NEGATIVES], args.train_data_files
    )
    corpus = load_sentences(args.corpus) if args.corpus else None
    model = SentenceTransformer(args.model, device=args.device)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    try:
        mined = mine_hard_negatives(
            pairs,
            model,
            anchor_column_name="anchor",
            positive_column_name="positive",
            corpus=corpus,
            range_min=args.range_min,
            range_max=args.range_max,
            max_score=args.max_score,
            min_score=args.min_score,
            absolute_margin=args.absolute_margin,
            relative_margin=args.relative_margin,
            num_negatives=args.num_negatives,
            sampling_strategy=args.sampling_strategy,
            output_format=args.output_format,
            batch_size=args.batch_size,
            verbose=True,
        )
    except ValueError as e:  # the mining settings do not fit the data (range_max, num_negatives)
        raise ConfigError(str(e).strip().splitlines()[0]) from None
    if len(mined) == 0:
        raise DataError(f"{args.train_file}: no anchor kept {args.num_negatives} negatives under these settings "
                        "(lower num_negatives or the margins, or raise range_max)")  # fmt: skip
    return mined


def write(dataset, path: str) -> None:
    """The mined examples as JSON Lines or CSV (the columns in their order)."""
    columns = dataset.column_names
    rows = zip(*(dataset[c] for c in columns))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        if path.lower().endswith(".csv"):
            writer = csv.writer(f)
            writer.writerow(columns)
            writer.writerows(rows)
        else:
            for row in rows:
                f.write(json.dumps(dict(zip(columns, row)), ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    args = parse_args(argv)
    try:
        mined = mine(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write(mined, args.output)
    logger.info("%d examples with %d columns written to %s", len(mined), len(mined.column_names), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
