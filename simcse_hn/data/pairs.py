"""Paired training data: an anchor, a positive and zero or more explicit negatives per example, the collator of
their rows [a, p, n_1..n_k], and how train.py tells paired data from single sentences.

Columns follow sentence-transformers: by name (`anchor`, `positive`, `negative` or `negative_1..k`; SimCSE's NLI
file `sent0`, `sent1`, `hard_neg` too), else by order (first the anchor, then the positive, then the negatives;
`label`/`score` columns are not texts), or as the column flags say. Files are read by simcse_hn.data's readers, so a
mistake is the same one-line DataError naming the file, the line and the column.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

import torch
from torch import Tensor

from simcse_hn.choices import DATA_FORMATS
from simcse_hn.data.collator import SimCSECollator, text_id
from simcse_hn.data.sentences import (
    NAMED_PAIRS,
    handle_repeats,
    jsonl_records,
    load_hub_dataset,
    read_csv_table,
)
from simcse_hn.data.sts import short
from simcse_hn.errors import DataError, did_you_mean
from simcse_hn.losses.targets import RowLayout

logger = logging.getLogger(__name__)

LABEL_COLUMNS = ("label", "labels", "score", "scores")  # sentence-transformers' label columns: not texts
NO_NEGATIVES = "none"  # --negative_columns none: no explicit negatives even if the file has more columns
_NEGATIVE_NAME = re.compile(r"(negative|hard_neg)(?:_(\d+))?$")
TABLE_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")


@dataclass(frozen=True)
class PairColumns:
    """Which source columns hold the anchor, the positive and the explicit negatives (in order)."""

    anchor: str
    positive: str
    negatives: tuple[str, ...]

    @property
    def all(self) -> tuple[str, ...]:
        return (self.anchor, self.positive, *self.negatives)


def is_hub_source(path: str) -> bool:
    """As load_sentences: neither a file here nor a name with a file suffix is a Hub dataset id."""
    return not os.path.exists(path) and not os.path.splitext(path)[1]


def is_table(path: str) -> bool:
    return is_hub_source(path) or os.path.splitext(path)[1].lower() in TABLE_SUFFIXES


def table_columns(
    path: str, data_files: str | None = None, config_name: str | None = None, split: str = "train", dataset=None
) -> list[str]:
    """The column names of a table: a CSV/TSV header, the first JSON Lines record's fields (in their order), a Hub
    dataset's columns (with its `config_name`, `split` and `data_files`; `dataset`: that split, already loaded)."""
    if is_hub_source(path):
        dataset = dataset if dataset is not None else load_hub_dataset(path, data_files, split, config_name)
        return list(dataset.column_names)
    if path.lower().endswith((".csv", ".tsv")):
        return list(read_csv_table(path)[0] or [])
    for _, record in jsonl_records(path):
        if record is not None:
            return list(record)
    return []


def _named_negatives(columns: list[str]) -> list[str]:
    """The columns named as negatives (`negative`, `negative_2`, `hard_neg`, ...), in their numeric order."""
    named = [(c, _NEGATIVE_NAME.match(c)) for c in columns]
    return [c for c, m in sorted(((c, m) for c, m in named if m), key=lambda cm: int(cm[1].group(2) or 0))]


def pair_columns(
    columns: list[str],
    source: str,
    anchor: str | None = None,
    positive: str | None = None,
    negatives: list[str] | None = None,
) -> PairColumns:
    """The columns of a paired table, as sentence-transformers reads them (module docstring); flags win. A flag
    naming a missing column, or too few text columns, is a DataError naming `source`."""
    for flag, value in (("anchor_column", anchor), ("positive_column", positive)):
        if value is not None and value not in columns:
            raise DataError(f"{source}: no column {value!r}{did_you_mean(value, columns)} in {columns} (set --{flag})")
    for value in negatives or []:
        if value != NO_NEGATIVES and value not in columns:
            hint = did_you_mean(value, columns)
            raise DataError(f"{source}: no column {value!r}{hint} in {columns} (set --negative_columns)")
    texts = [c for c in columns if c.lower() not in LABEL_COLUMNS]
    named = next((pair for pair in NAMED_PAIRS if set(pair) <= set(columns)), None)
    if anchor is None:
        anchor = named[0] if named else next(iter(texts), None)
    if positive is None:
        positive = named[1] if named and anchor == named[0] else next((c for c in texts if c != anchor), None)
    if anchor is None or positive is None or anchor == positive:
        raise DataError(
            f"{source}: paired data needs an anchor and a positive column, got {columns} "
            "(set --anchor_column and --positive_column)"
        )
    if negatives is not None:
        chosen = [] if negatives == [NO_NEGATIVES] else list(negatives)
    else:
        rest = [c for c in texts if c not in (anchor, positive)]
        chosen = _named_negatives(rest) or ([] if named else rest)
    if {anchor, positive} & set(chosen) or len(set(chosen)) < len(chosen):
        raise DataError(f"{source}: a column is used twice: anchor {anchor!r}, positive {positive!r}, negatives "
                        f"{chosen} (set --negative_columns)")  # fmt: skip
    ignored = [c for c in texts if c not in (anchor, positive, *chosen)]
    if ignored:
        logger.warning("%s: columns %s are not used (anchor %r, positive %r, negatives %s)", source, ignored, anchor,
                       positive, chosen)  # fmt: skip
    return PairColumns(anchor, positive, tuple(chosen))


def resolve_data_format(
    path: str,
    data_format: str = "auto",
    text_column: str = "text",
    column_flags: bool = False,
    data_files: str | None = None,
    config_name: str | None = None,
    split: str = "train",
    dataset=None,
) -> str:
    """"sentences" or "pairs" for the training data at `path`. `auto`: a text file holds sentences; column flags
    (`column_flags`) mean pairs; a table with `text_column` holds sentences, one with sentence-transformers' or
    SimCSE's pair columns (anchor/positive, sent0/sent1) pairs; anything else is a DataError asking for
    --data_format, never a guess."""
    if data_format not in DATA_FORMATS:
        raise DataError(f"data_format: must be one of {', '.join(DATA_FORMATS)}, got {data_format!r}")
    if not is_table(path):
        return format_from_columns(None, path, data_format, text_column, column_flags)
    if data_format != "auto" or column_flags:
        return format_from_columns([], path, data_format, text_column, column_flags)
    columns = table_columns(path, data_files, config_name, split, dataset)
    return format_from_columns(columns, path, data_format, text_column, column_flags)


def format_from_columns(
    columns: list[str] | None, source: str, data_format: str = "auto", text_column: str = "text",
    column_flags: bool = False,
) -> str:  # fmt: skip
    """resolve_data_format's rule on the data's columns (None: a text file, one sentence per line), for a table read
    into memory and for the first record of a stream alike."""
    if columns is None:
        if data_format == "pairs" or column_flags:
            raise DataError(f"{source}: one sentence per line; paired data needs columns (.jsonl, .csv, .tsv or a "
                            "Hub dataset)")  # fmt: skip
        return "sentences"
    if data_format != "auto":
        return data_format
    if column_flags:
        return "pairs"
    named = [pair for pair in NAMED_PAIRS if set(pair) <= set(columns)]
    if text_column in columns:
        if named:
            raise DataError(f"{source}: columns {columns} hold both a {text_column!r} column (sentences) and pair "
                            f"columns {named[0]}: set --data_format (pairs: the pairs; sentences: the {text_column!r} "
                            "column alone)")  # fmt: skip
        return "sentences"
    if named:
        return "pairs"
    raise DataError(
        f"{source}: cannot tell sentences from pairs by the columns {columns}: set --data_format sentences (with "
        "--text_column) or pairs (columns by order: anchor, positive, negatives; or --anchor_column, "
        "--positive_column, --negative_columns)"
    )


def _field(record: dict, column: str, where: str, flag: str) -> str:
    if column not in record:
        raise DataError(f"{where}: no field {column!r} (set --{flag})")
    value = record[column]
    if value is not None and not isinstance(value, str):
        raise DataError(f"{where}: field {column!r} is not a string: {short(value)}")
    return value or ""


def _read_rows(path: str, columns: PairColumns, data_files: str | None, config_name: str | None = None,
               split: str = "train", dataset=None) -> list[tuple[str, ...]]:  # fmt: skip
    """Each example's texts in the order of `columns.all`; a blank line is an example of empty texts."""
    flags = ["anchor_column", "positive_column"] + ["negative_columns"] * len(columns.negatives)
    if is_hub_source(path):
        dataset = dataset if dataset is not None else load_hub_dataset(path, data_files, split, config_name)
        values = [dataset[c] for c in columns.all]
        for c, column in zip(columns.all, values):
            bad = next((i for i, v in enumerate(column) if v is not None and not isinstance(v, str)), None)
            if bad is not None:
                raise DataError(f"{path}[{split}]:row {bad}: field {c!r} is not a string: {short(column[bad])}")
        return [tuple(v or "" for v in row) for row in zip(*values)]
    if path.lower().endswith((".csv", ".tsv")):
        header, records = read_csv_table(path)
        index = [header.index(c) for c in columns.all]
        return [tuple(row[i] for i in index) if row else ("",) * len(index) for _, row in records]
    rows = []
    for number, record in jsonl_records(path):
        if record is None:
            rows.append(("",) * len(flags))
            continue
        rows.append(tuple(_field(record, c, f"{path}:{number}", f) for c, f in zip(columns.all, flags)))
    return rows


def load_pairs(
    path: str,
    anchor_column: str | None = None,
    positive_column: str | None = None,
    negative_columns: list[str] | None = None,
    data_files: str | None = None,
    max_samples: int | None = None,
    drop_duplicates: bool = False,
    config_name: str | None = None,
    split: str = "train",
    dataset=None,
    columns: PairColumns | None = None,
):
    """Paired examples from a .jsonl/.csv/.tsv file or a Hub dataset id (with its `config_name`, `split` and
    `data_files`; `dataset`: that split, already loaded; `columns`: the pair columns, already found) -> a
    `datasets.Dataset` with columns
    `anchor`, `positive`, `negative_1..k` (k fixed by the columns).

    Texts are stripped; an example with an empty text (a blank line, a null) is dropped and counted; repeated
    examples are counted and dropped on request (`drop_duplicates`)."""
    import datasets  # a slow import: only where a Hub dataset or Arrow is used

    if not is_table(path):
        raise DataError(f"{path}: one sentence per line; paired data needs columns (.jsonl, .csv, .tsv or a Hub "
                        "dataset)")  # fmt: skip
    if columns is None:
        found = table_columns(path, data_files, config_name, split, dataset)
        columns = pair_columns(found, path, anchor_column, positive_column, negative_columns)
    raw = _read_rows(path, columns, data_files, config_name, split, dataset)
    rows = [tuple(t.strip() for t in row) for row in raw]
    rows = [row for row in rows if all(row)]
    if len(rows) < len(raw):
        logger.warning("%s: dropped %d of %d examples with an empty text (or blank lines)", path, len(raw) - len(rows),
                       len(raw))  # fmt: skip
    if not rows:
        raise DataError(f"{path}: no examples (the file is empty or every example has an empty text)")
    rows = handle_repeats(rows, path, drop_duplicates, "repeated examples")
    if max_samples is not None:
        rows = rows[:max_samples]
    logger.info("%s: %d examples; anchor %r, positive %r, negatives %s", path, len(rows), columns.anchor,
                columns.positive, list(columns.negatives))  # fmt: skip
    names = ["anchor", "positive"] + [f"negative_{i}" for i in range(1, len(columns.negatives) + 1)]
    return datasets.Dataset.from_dict({name: [row[i] for row in rows] for i, name in enumerate(names)})


def num_negatives(dataset) -> int:
    """Explicit negatives per example of a `load_pairs` dataset."""
    return sum(name.startswith("negative_") for name in dataset.column_names)


class PairCollator(SimCSECollator):
    """Tokenises each text of B examples once and emits B * group_size rows, [a, p, n_1..n_k] per example
    (group_size = 2 + k): one forward pass in train mode, dropout on every row as in SimCSE's supervised training.
    `guide_tokenize`: also the guide model's features of every row, under `guide_*` keys (B * group_size rows).
    Truncated texts are counted, and each row's text id given, as in SimCSECollator (`num_truncated`, `text_ids`)."""

    def __init__(self, tokenizer, max_length: int = 32, negatives: int = 0, guide_tokenize=None):
        super().__init__(tokenizer, max_length, guide_tokenize=guide_tokenize)
        self.columns = ("anchor", "positive") + tuple(f"negative_{i}" for i in range(1, negatives + 1))

    @property
    def group_size(self) -> int:
        return len(self.columns)

    @property
    def layout(self) -> RowLayout:
        return RowLayout(self.group_size)

    def __call__(self, features: list[dict]) -> dict[str, Tensor]:
        if len(features) < 2:
            raise ValueError(f"a batch needs at least 2 examples to have in-batch negatives, got {len(features)}")
        texts = [f[column] for f in features for column in self.columns]  # [a, p, n_1..n_k] per example
        batch, truncated = self.tokenize(texts)  # each (B * group_size, T)
        ids = torch.tensor([text_id(t) for t in texts])  # (B * group_size,): the duplicate diagnostics' text ids
        return {**batch, **self.guide_features(texts), "num_truncated": truncated, "text_ids": ids}
