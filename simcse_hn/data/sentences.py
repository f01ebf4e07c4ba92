"""Training sentences: text, JSON Lines and CSV files, Hub datasets, read into memory (`load_sentences`) or streamed
(`load_sentence_stream`).

With data/sts.py and data/pairs.py, the only modules that know the input file formats. User mistakes raise
`DataError` with one line naming the file and the line or field."""

from __future__ import annotations

import codecs
import csv
import functools
import io
import itertools
import json
import logging
import os
from collections.abc import Iterator

from simcse_hn.errors import DataError, did_you_mean

logger = logging.getLogger(__name__)


NAMED_PAIRS = (("anchor", "positive"), ("sent0", "sent1"))  # sentence-transformers', SimCSE's NLI file's pair columns


def no_text_field(where: str, column: str, columns) -> DataError:
    """A record or header without the sentence column. When it holds pair columns, the hint is not --text_column
    (that would train on one column and drop the rest): it says the data is paired."""
    pair = next((pair for pair in NAMED_PAIRS if set(pair) <= set(columns or ())), None)
    if pair is None:
        return DataError(f"{where}: no field {column!r} (set --text_column)")
    return DataError(
        f"{where}: no field {column!r}, and its columns {list(columns)} are paired data ({pair[0]!r}, "
        f"{pair[1]!r}): train on them with --data_format pairs, read into memory (not with streaming)"
    )


def short(value, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _read_text(path: str) -> str:
    """The whole file decoded as UTF-8, a leading byte-order mark dropped (every reader goes through here). Bytes
    that are not UTF-8 and NUL bytes (a binary or UTF-16 file) are a DataError naming the line."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: file not found")
    with open(path, "rb") as f:
        raw = f.read()
    if raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8) :]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line_start = raw.rfind(b"\n", 0, e.start) + 1
        line = raw.count(b"\n", 0, e.start) + 1
        raise DataError(f"{path}:{line}: not valid UTF-8 (byte {e.start - line_start + 1} of the line)") from None
    nul = text.find("\0")
    if nul >= 0:
        raise DataError(f"{path}:{text.count(chr(10), 0, nul) + 1}: NUL byte (a binary file, or UTF-16 text?)")
    return text


def read_lines(path: str) -> list[str]:
    lines = _read_text(path).split("\n")  # not splitlines(): form feeds and U+2028 stay inside a sentence
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def jsonl_records(path: str) -> Iterator[tuple[int, dict | None]]:
    """(line, record) of a JSON Lines file; None for a blank line. Malformed JSON or a non-object is a DataError."""
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            yield number, None
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{number}: malformed JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise DataError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        yield number, record


def _read_jsonl_column(path: str, column: str) -> list[str]:
    texts = []
    for number, record in jsonl_records(path):
        if record is None:
            texts.append("")
            continue
        if column not in record:
            raise no_text_field(f"{path}:{number}", column, record)
        value = record[column]
        if value is not None and not isinstance(value, str):
            raise DataError(f"{path}:{number}: field {column!r} is not a string: {short(value)}")
        texts.append(value or "")  # null: an empty sentence, dropped and counted with the blank lines
    return texts


def _read_csv_column(path: str, column: str) -> list[str]:
    """`column` of a CSV (TSV for .tsv) file, parsed by the csv module on the whole text: a quoted field may hold
    delimiters and line breaks. A record whose field count differs from the header's is a DataError."""
    header, records = read_csv_table(path)
    if header is None or column not in header:
        if header and any(set(pair) <= set(header) for pair in NAMED_PAIRS):
            raise no_text_field(f"{path}:1", column, header)
        hint = did_you_mean(column, header)
        raise DataError(f"{path}:1: no column {column!r}{hint} in header {header} (set --text_column)")
    index = header.index(column)
    return [row[index] if row else "" for _, row in records]


def read_csv_table(path: str) -> tuple[list[str] | None, Iterator[tuple[int, list[str]]]]:
    """The header (None for an empty file) and an iterator over the records of a CSV (TSV for .tsv) file, each with
    the line it starts on; a blank line is an empty record. Malformed quoting, or a record whose field count differs
    from the header's, is a DataError naming the line (raised when that record is reached)."""
    kind = "TSV" if path.lower().endswith(".tsv") else "CSV"
    delimiter = "\t" if kind == "TSV" else ","
    reader = csv.reader(io.StringIO(_read_text(path), newline=""), delimiter=delimiter, strict=True)

    def malformed(line: int, e: csv.Error) -> DataError:
        reason = str(e).replace("\t", "\\t")  # csv names the delimiter it expected: a TSV's is a tab
        return DataError(f"{path}:{line}: malformed {kind} ({reason})")

    try:
        header = next(reader, None)
    except csv.Error as e:
        raise malformed(1, e) from None

    def records() -> Iterator[tuple[int, list[str]]]:
        line = reader.line_num + 1  # where the record being read starts
        try:
            for row in reader:
                if row and len(row) != len(header):
                    raise DataError(
                        f"{path}:{line}: {len(row)} fields, the header has {len(header)} (unquoted {kind}?)"
                    )
                yield line, row
                line = reader.line_num + 1
        except csv.Error as e:
            raise malformed(line, e) from None

    return header, records()


def load_hub_dataset(
    name: str, data_files: str | None = None, split: str = "train", config_name: str | None = None, field: str = ""
):
    """A Hub dataset's `split` (with its `config_name` and `data_files`) through `datasets`; a failure is one line,
    naming `field` when given (train_file: a name that is no file here was taken for a Hub id)."""
    import datasets  # a slow import: only where a Hub dataset or Arrow is used

    try:
        config = {"name": config_name} if config_name else {}  # the dataset's configuration (subset)
        return datasets.load_dataset(name, data_files=data_files, split=split, **config)
    except Exception as e:  # network, missing repo, missing file: all user-facing
        raise _not_loaded(name, field, "could not load dataset", e, hub=True) from None


def _not_loaded(name: str, field: str, failed: str, error: Exception, hub: bool) -> DataError:
    """One line for a corpus `datasets` could not open: a train_file taken for a Hub id (`hub`) says it is neither;
    anything else is `failed`, with the flag that named it when known."""
    reason = f"{type(error).__name__}: {str(error).splitlines()[0]}"
    if hub and field == "train_file":
        return DataError(f"train_file: {name} is neither a file here nor a Hub dataset that loads ({reason})")
    return DataError(f"{field + ': ' if field else ''}{name}: {failed} ({reason})")


def _read_hub_column(
    name: str, column: str, data_files: str | None, split: str = "train", config_name: str | None = None, dataset=None
) -> list[str]:
    dataset = load_hub_dataset(name, data_files, split, config_name) if dataset is None else dataset
    if column not in dataset.column_names:
        if any(set(pair) <= set(dataset.column_names) for pair in NAMED_PAIRS):
            raise no_text_field(name, column, dataset.column_names)
        hint = did_you_mean(column, dataset.column_names)
        raise DataError(f"{name}: no column {column!r}{hint} in {dataset.column_names} (set --text_column)")
    return [t or "" for t in dataset[column]]


def handle_repeats(items: list, path: str, drop_duplicates: bool, what: str) -> list:
    """`items` with its repeats dropped (the first of each kept) when `drop_duplicates`, else as they are; either
    way a warning counts them (`what`: how the log names them)."""
    unique = list(dict.fromkeys(items))
    if len(unique) == len(items):
        return items
    action = "dropped" if drop_duplicates else "kept (set drop_duplicates to remove them)"
    logger.warning("%s: %d %s %s", path, len(items) - len(unique), what, action)
    return unique if drop_duplicates else items


def load_sentences(
    path: str,
    text_column: str = "text",
    data_files: str | None = None,
    max_samples: int | None = None,
    drop_duplicates: bool = False,
    config_name: str | None = None,
    split: str = "train",
    dataset=None,
) -> list[str]:
    """Sentences from a .txt (one per line), .jsonl/.csv/.tsv (`text_column`) file or a Hub dataset id (with its
    `config_name`, `split` and `data_files`; `dataset`: that split when already loaded).

    Strips white space, drops empty lines and reports how many; counts duplicates and drops them on request.
    """
    suffix = os.path.splitext(path)[1].lower()
    if os.path.exists(path) or suffix:
        if suffix == ".jsonl" or suffix == ".json":
            raw = _read_jsonl_column(path, text_column)
        elif suffix in (".csv", ".tsv"):
            raw = _read_csv_column(path, text_column)
        else:
            raw = read_lines(path)
    else:
        raw = _read_hub_column(path, text_column, data_files, split, config_name, dataset)

    sentences = [s.strip() for s in raw]
    sentences = [s for s in sentences if s]
    if len(sentences) < len(raw):
        logger.warning("%s: dropped %d empty lines of %d", path, len(raw) - len(sentences), len(raw))
    if not sentences:
        raise DataError(f"{path}: no sentences (the file is empty or only blank lines)")
    sentences = handle_repeats(sentences, path, drop_duplicates, "duplicated sentences")
    if max_samples is not None:
        sentences = sentences[:max_samples]
    return sentences


# --- streamed training sentences (datasets' streaming): memory stays flat whatever the corpus size ---


def _open_stream(path: str, column: str, data_files: str | None, config_name: str | None, split: str, field: str = ""):
    """-> (the raw records of `path` as a datasets.IterableDataset, "text" | "json" | "csv" | "hub"). Local files go
    through datasets' own text/json/csv readers in streaming mode; a Hub id through load_dataset(streaming=True).
    What the reader rejects up front (a missing file, a JSON schema it cannot infer) is a DataError, naming `field`
    when given (train_file: a name that is no file here was taken for a Hub id)."""
    import datasets  # a slow import: only where a Hub dataset or Arrow is used

    suffix = os.path.splitext(path)[1].lower()
    if os.path.exists(path) or suffix:
        if not os.path.isfile(path):
            raise DataError(f"{path}: file not found")
        if suffix in (".jsonl", ".json"):
            kind, builder, kwargs = "json", "json", {}
        elif suffix in (".csv", ".tsv"):  # the text field as a string even when it looks like a number
            kind, builder = "csv", "csv"
            kwargs = {"delimiter": "\t" if suffix == ".tsv" else ",", "converters": {column: str}}
        else:  # undecodable bytes become U+FFFD, which the cleaning step reports with the line
            kind, builder, kwargs = "text", "text", {"encoding_errors": "replace"}
        source = {"path": builder, "data_files": path, **kwargs}
    else:
        kind, source = "hub", {"path": path, "data_files": data_files, "split": split}
        if config_name:
            source["name"] = config_name  # the dataset's configuration (subset)
    try:
        return datasets.load_dataset(**{"split": "train", **source}, streaming=True), kind
    except Exception as e:  # network, missing repo or file, unreadable first block: all user-facing
        raise _not_loaded(path, field, "could not stream the corpus", e, hub=kind == "hub") from None


def stream_columns(
    path: str,
    text_column: str = "text",
    data_files: str | None = None,
    config_name: str | None = None,
    split: str = "train",
    field: str = "",
) -> list[str] | None:
    """The columns of a streamed corpus's first record (only that record is read): what decides its data format, as a
    table's columns do in memory. None for a text file (one sentence per line). `field`: the flag that named `path`,
    for the error."""
    raw, kind = _open_stream(path, text_column, data_files, config_name, split, field)
    if kind == "text":
        return None
    try:
        first = next(iter(raw), None)
    except Exception as e:  # datasets' reader on a malformed first block: user-facing
        reason = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        raise DataError(f"{path}: could not stream the corpus ({reason})") from None
    return list(first) if first is not None else []


def _clean_record(record: dict, index: int, *, path: str, column: str, kind: str) -> dict:
    """One streamed record -> {"text": the stripped sentence, "" for a blank one}; the checks of the in-memory readers
    that a single record allows, as DataErrors naming the line (text) or record (json, csv, hub)."""
    where = f"{path}:{index + 1}" if kind == "text" else f"{path}: record {index + 1}"
    if column not in record:
        raise no_text_field(where, column, record)
    value = record[column]
    if value is not None and not isinstance(value, str):
        raise DataError(f"{where}: field {column!r} is not a string: {short(value)}")
    text = value or ""  # null: an empty sentence, dropped
    if "\0" in text:
        raise DataError(f"{where}: NUL byte (a binary file, or UTF-16 text?)")
    if kind == "text" and "\ufffd" in text:
        raise DataError(f"{where}: not valid UTF-8 (or a U+FFFD replacement character)")
    return {"text": text.lstrip("\ufeff").strip()}


def _has_text(row: dict) -> bool:
    return bool(row["text"])


def load_sentence_stream(
    path: str,
    text_column: str = "text",
    data_files: str | None = None,
    max_samples: int | None = None,
    config_name: str | None = None,
    split: str = "train",
    *,
    shuffle_buffer: int = 10_000,
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
    min_sentences: int = 1,
):
    """Training sentences of a .txt / .jsonl / .csv / .tsv file or a Hub dataset id (with its `config_name`, `split`
    and `data_files`), streamed: a
    datasets.IterableDataset of {"text"} rows for process `rank` of `world_size`, with the checks of `load_sentences`
    that a stream allows (white space stripped, blank lines and nulls dropped, non-string fields, NUL bytes and bad
    UTF-8 as DataErrors naming the line, raised when the line is read; a JSON record without the field counts as
    null, datasets' reader cannot tell them apart).

    * `max_samples`: the first N sentences only. The corpus must hold at least `min_sentences` (one global batch):
      its first sentences are read now to check that.
    * Split across processes with datasets' `split_dataset_by_node`: whole files per process when their number is
      a multiple of world_size (files of similar size, e.g. a Hub dataset's parquet shards), else every process reads
      the stream and keeps every world_size-th sentence.
    * Endless: the stream repeats (the Trainer runs max_steps steps; no process runs out before another) and is
      shuffled through a buffer of `shuffle_buffer` sentences (0: the corpus's order), seeded by `seed`, the same on
      every process (datasets splits the shuffled stream when it is read: disjoint shares).
      The order is a function of the seed alone, so a resumed run that skips the batches already trained on (the
      Trainer does) continues with the sentences an uninterrupted run would see next.
    """
    # a slow import: only where a Hub dataset or Arrow is used
    from datasets.distributed import split_dataset_by_node

    raw, kind = _open_stream(path, text_column, data_files, config_name, split)
    clean = functools.partial(_clean_record, path=path, column="text" if kind == "text" else text_column, kind=kind)
    stream = raw.map(clean, with_indices=True).select_columns(["text"]).filter(_has_text)
    if max_samples is not None:
        stream = stream.take(max_samples)
    found = sum(1 for _ in itertools.islice(stream, min_sentences))
    if found == 0:
        raise DataError(f"{path}: no sentences (the file is empty or only blank lines)")
    if found < min_sentences:
        raise DataError(f"{path}: {found} sentences, fewer than one batch ({min_sentences} across processes)")
    if world_size > 1:
        by_file = stream.n_shards % world_size == 0
        logger.info(
            "%s: %d file(s) streamed by %d processes, split by %s",
            path,
            stream.n_shards,
            world_size,
            "file" if by_file else "sentence (every process reads the whole stream)",
        )
        stream = split_dataset_by_node(stream, rank=rank, world_size=world_size)
    stream = stream.repeat(None)
    if shuffle_buffer:
        stream = stream.shuffle(seed=seed, buffer_size=shuffle_buffer)
    return stream
