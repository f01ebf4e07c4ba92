"""What the training data is, from the configuration alone (`declared_data`) or from the data's own columns
(`resolve_data`): the format ("sentences" or "pairs"), what decided it, and for pairs the columns. The resolved run
(simcse_hn.configuration.resolved) checks the combinations against it."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from simcse_hn.data.pairs import (
    LABEL_COLUMNS,
    NO_NEGATIVES,
    PairColumns,
    format_from_columns,
    is_hub_source,
    is_table,
    pair_columns,
    table_columns,
)
from simcse_hn.data.sentences import NAMED_PAIRS, no_text_field, stream_columns

logger = logging.getLogger(__name__)

COLUMN_FLAGS = ("anchor_column", "positive_column", "negative_columns")
TEXT_COLUMN = "text"  # --text_column's default: another value was given


@dataclass(frozen=True)
class ResolvedData:
    """What the training data is: `format` "sentences" or "pairs" (None: not known from the configuration alone),
    `evidence` what decided it (for messages), and for pairs the columns (`columns`, when found) or the explicit
    negatives per example (`negatives`, None when not known yet)."""

    format: str | None
    source: str | None
    evidence: str = ""
    columns: PairColumns | None = None
    negatives: int | None = None


def column_flags(data_args) -> list[str]:
    return [name for name in COLUMN_FLAGS if getattr(data_args, name, None) is not None]


def declared_data(data_args) -> ResolvedData:
    """The data as the configuration alone tells it: `data_format` given, a column flag (pairs), a .txt file
    (sentences), no training data (sentences, the default); a table or Hub dataset under `auto` is not known yet."""
    source, flags = data_args.train_source, column_flags(data_args)
    if data_args.data_format != "auto":
        format, evidence = data_args.data_format, f"data_format {data_args.data_format}"
    elif flags:
        format, evidence = "pairs", f"{', '.join(flags)} set"
    elif source is None:
        format, evidence = "sentences", "the default without training data"
    elif not is_table(source):
        format, evidence = "sentences", f"{source} holds one sentence per line"
    else:
        return ResolvedData(None, source)
    negatives = None
    if format == "pairs" and data_args.negative_columns is not None:
        negatives = 0 if data_args.negative_columns == [NO_NEGATIVES] else len(data_args.negative_columns)
    return ResolvedData(format, source, evidence, negatives=negatives)


def resolve_data(data_args, dataset=None) -> ResolvedData:
    """The data's format, decided by the same rule in memory and streamed (simcse_hn.data.pairs.format_from_columns):
    from a table's columns (a Hub dataset's: `dataset`, its split, already loaded), or from a stream's first record.
    Paired data also gets its columns. A DataError (one line) when the columns do not tell."""
    source = data_args.train_source
    hub = {"config_name": data_args.dataset_config_name, "split": data_args.dataset_split}
    if data_args.streaming:
        field = data_args.train_source_field
        columns = stream_columns(source, data_args.text_column, data_args.train_data_files, **hub, field=field)
        where = f"{source}: record 1 has the columns {columns}"
    elif is_table(source):
        columns = table_columns(source, data_args.train_data_files, dataset=dataset, **hub)
        where = f"{source}: columns {columns}"
    else:
        columns, where = None, f"{source} holds one sentence per line"
    flags = column_flags(data_args)
    format = format_from_columns(columns, source, data_args.data_format, data_args.text_column, bool(flags))
    if data_args.data_format != "auto":
        evidence = f"data_format {data_args.data_format}"
    else:
        evidence = f"{', '.join(flags)} set" if flags else where
    if format == "sentences":
        if columns is not None and data_args.text_column not in columns:  # as the reader would, before it reads
            first = f"{source}: record 1" if data_args.streaming or not is_hub_source(source) else source
            raise no_text_field(first, data_args.text_column, columns)
        pair = next((pair for pair in NAMED_PAIRS if set(pair) <= set(columns or ())), None)
        if pair is not None and data_args.text_column in columns:  # sentences of a paired table, as asked: said
            others = [c for c in columns if c != data_args.text_column and c.lower() not in LABEL_COLUMNS]
            logger.warning("%s: data_format sentences trains on the %r column only; the columns %s are not used",
                           source, data_args.text_column, others)  # fmt: skip
        return ResolvedData(format, source, evidence)
    if data_args.streaming:  # refused (ResolvedRun.check): a stream's columns are not read as pairs
        return ResolvedData(format, source, evidence)
    chosen = pair_columns(columns or [], source, data_args.anchor_column, data_args.positive_column,
                          data_args.negative_columns)  # fmt: skip
    return ResolvedData(format, source, evidence, chosen, len(chosen.negatives))
