"""Training sentences, STS pairs, the [a, a', b, b', ...] collator and the contrastive targets.

The only module that knows file formats of the inputs. User mistakes raise `DataError` with one line naming the
file and the line or field.
"""

from __future__ import annotations

import codecs
import csv
import functools
import hashlib
import io
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from simcse_hn.errors import DataError  # noqa: F401  (raised here, imported from here by callers)
from simcse_hn.targets import contrastive_targets  # noqa: F401  (public API: simcse_hn.data.contrastive_targets)

logger = logging.getLogger(__name__)

GUIDE_PREFIX = "guide_"  # the batch keys of a guide model's own tokenisation (simcse_hn.guide)


NAMED_PAIRS = (("anchor", "positive"), ("sent0", "sent1"))  # sentence-transformers', SimCSE's NLI file's pair columns


def no_text_field(where: str, column: str, columns) -> DataError:
    """A record or header without the sentence column. When it holds pair columns, the hint is not --text_column
    (that would train on one column and drop the rest): it says the data is paired."""
    pair = next((pair for pair in NAMED_PAIRS if set(pair) <= set(columns or ())), None)
    if pair is None:
        return DataError(f"{where}: no field {column!r} (set --text_column)")
    return DataError(f"{where}: no field {column!r}, and its columns {list(columns)} are paired data ({pair[0]!r}, "
                     f"{pair[1]!r}): train on them with --data_format pairs, read into memory (not with streaming)")


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


def _read_lines(path: str) -> list[str]:
    lines = _read_text(path).split("\n")  # not splitlines(): form feeds and U+2028 stay inside a sentence
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _read_jsonl_column(path: str, column: str) -> list[str]:
    texts = []
    for number, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            texts.append("")
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{number}: malformed JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise DataError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        if column not in record:
            raise no_text_field(f"{path}:{number}", column, record)
        value = record[column]
        if value is not None and not isinstance(value, str):
            raise DataError(f"{path}:{number}: field {column!r} is not a string: {_short(value)}")
        texts.append(value or "")  # null: an empty sentence, dropped and counted with the blank lines
    return texts


def _read_csv_column(path: str, column: str) -> list[str]:
    """`column` of a CSV (TSV for .tsv) file, parsed by the csv module on the whole text: a quoted field may hold
    delimiters and line breaks. A record whose field count differs from the header's is a DataError."""
    header, records = read_csv_table(path)
    if header is None or column not in header:
        if header and any(set(pair) <= set(header) for pair in NAMED_PAIRS):
            raise no_text_field(f"{path}:1", column, header)
        raise DataError(f"{path}:1: no column {column!r} in header {header} (set --text_column)")
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


def load_hub_dataset(name: str, data_files: str | None = None, split: str = "train", config_name: str | None = None):
    """A Hub dataset's `split` (with its `config_name` and `data_files`) through `datasets`; a failure is one line."""
    import datasets

    try:
        config = {"name": config_name} if config_name else {}  # the dataset's configuration (subset)
        return datasets.load_dataset(name, data_files=data_files, split=split, **config)
    except Exception as e:  # network, missing repo, missing file: all user-facing
        raise DataError(f"{name}: could not load dataset ({type(e).__name__}: {str(e).splitlines()[0]})") from None


def _read_hub_column(
    name: str, column: str, data_files: str | None, split: str = "train", config_name: str | None = None, dataset=None
) -> list[str]:
    dataset = load_hub_dataset(name, data_files, split, config_name) if dataset is None else dataset
    if column not in dataset.column_names:
        if any(set(pair) <= set(dataset.column_names) for pair in NAMED_PAIRS):
            raise no_text_field(name, column, dataset.column_names)
        raise DataError(f"{name}: no column {column!r} in {dataset.column_names} (set --text_column)")
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
            raw = _read_lines(path)
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


def _open_stream(path: str, column: str, data_files: str | None, config_name: str | None, split: str):
    """-> (the raw records of `path` as a datasets.IterableDataset, "text" | "json" | "csv" | "hub"). Local files go
    through datasets' own text/json/csv readers in streaming mode; a Hub id through load_dataset(streaming=True).
    What the reader rejects up front (a missing file, a JSON schema it cannot infer) is a DataError."""
    import datasets

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
        reason = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        raise DataError(f"{path}: could not stream the corpus ({reason})") from None


def stream_columns(path: str, text_column: str = "text", data_files: str | None = None,
                   config_name: str | None = None, split: str = "train") -> list[str] | None:  # fmt: skip
    """The columns of a streamed corpus's first record (only that record is read): what decides its data format, as a
    table's columns do in memory. None for a text file (one sentence per line)."""
    raw, kind = _open_stream(path, text_column, data_files, config_name, split)
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
        raise DataError(f"{where}: field {column!r} is not a string: {_short(value)}")
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
    import itertools

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
        logger.info("%s: %d file(s) streamed by %d processes, split by %s", path, stream.n_shards, world_size,
                    "file" if by_file else "sentence (every process reads the whole stream)")
        stream = split_dataset_by_node(stream, rank=rank, world_size=world_size)
    stream = stream.repeat(None)
    if shuffle_buffer:
        stream = stream.shuffle(seed=seed, buffer_size=shuffle_buffer)
    return stream


@dataclass
class STSPairs:
    sentence1: list[str]
    sentence2: list[str]
    scores: list[float]


def load_sts_pairs(path: str, split: str | None = None) -> STSPairs:
    """STS pairs from JSON Lines (sentence1, sentence2, score, optional split) or a Hub dataset id.

    Local rows whose `split` differs from `split` are skipped; rows without a `split` field are kept.
    """
    if not os.path.exists(path) and not os.path.splitext(path)[1]:
        import datasets

        try:
            dataset = datasets.load_dataset(path, split=split or "validation")
        except Exception as e:
            raise DataError(f"{path}: could not load dataset ({type(e).__name__}: {str(e).splitlines()[0]})") from None
        pairs = STSPairs(list(dataset["sentence1"]), list(dataset["sentence2"]), [float(s) for s in dataset["score"]])
        warn_out_of_scale(path, pairs.scores, "STS-B")
        return pairs

    rows = [row for row in read_sts_jsonl(path) if split is None or row["split"] in (None, split)]
    pairs = STSPairs([r["sentence1"] for r in rows], [r["sentence2"] for r in rows], [r["score"] for r in rows])
    if not pairs.scores:
        raise DataError(f"{path}: no pairs" + (f" with split {split!r}" if split else ""))
    warn_out_of_scale(path, pairs.scores, "STS-B")
    return pairs


def text_id(text: str) -> int:
    """A 63-bit id of a sentence's text, the same in every process (Python's own hash is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little") >> 1


BOOKKEEPING = ("num_truncated", "text_ids")  # collator outputs that are not model inputs (the trainer pops them)


def model_inputs(batch: dict) -> dict:
    """A collator's batch (SimCSECollator, simcse_hn.pairs.PairCollator) as `SimCSEModel(**...)` takes it: without
    its bookkeeping (`BOOKKEEPING`) and a guide model's `guide_*` features, which the trainer pops before the
    forward. For code that runs the encoder on a batch outside the trainer (benches, eval/negatives.py)."""
    return {key: value for key, value in batch.items() if key not in BOOKKEEPING and not key.startswith(GUIDE_PREFIX)}


class SimCSECollator:
    """Tokenises each sentence once and emits 2B rows [a, a', b, b', ...]: one forward pass in train mode then
    gives two dropout views of every sentence.

    Sentences longer than `max_length` tokens are truncated: the batch says how many (`num_truncated`, an int, not a
    model input: the trainer pops it and counts the batches it trains on; the data loader collates one batch ahead,
    so a count kept here would include a batch never trained on), and a warning is logged the first time. The batch
    also holds `text_ids` (2B,), each row's `text_id` (not a model input either: the duplicate diagnostics use it).
    `guide_tokenize` (simcse_hn.guide.Guide.tokenize): the batch also carries the guide model's own features of each
    sentence, under `guide_*` keys (B rows)."""

    def __init__(self, tokenizer, max_length: int = 32, text_column: str = "text", guide_tokenize=None):
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.text_column = text_column
        self.guide_tokenize = guide_tokenize
        self.warned = False

    def __call__(self, features: list) -> dict[str, Tensor]:
        texts = [f[self.text_column] if isinstance(f, dict) else f for f in features]
        if len(texts) < 2:
            raise ValueError(f"a batch needs at least 2 sentences to have negatives, got {len(texts)}")
        batch, truncated = self.tokenize(texts)
        rows = {key: value.repeat_interleave(2, dim=0) for key, value in batch.items()}  # each (2B, T)
        ids = torch.tensor([text_id(t) for t in texts]).repeat_interleave(2)  # (2B,) the same text, the same id
        return {**rows, **self.guide_features(texts), "num_truncated": truncated, "text_ids": ids}

    def tokenize(self, texts: list[str]) -> tuple[dict[str, Tensor], int]:
        """texts -> padded token tensors, each (len(texts), T), every text cut to its first `max_length` tokens, and
        how many were cut."""
        batch = self.tokenizer(
            texts, max_length=self.max_length, truncation=True, padding=True, return_tensors="pt",
            return_overflowing_tokens=True,
        )  # each (B + overflow rows, T)
        sample = batch.pop("overflow_to_sample_mapping", None)
        truncated = 0
        if sample is not None and len(sample) > len(texts):  # keep each sentence's first window
            first = torch.ones_like(sample, dtype=torch.bool)
            first[1:] = sample[1:] != sample[:-1]
            batch = {key: value[first] for key, value in batch.items()}
            truncated = int(sample[~first].unique().numel())
            if not self.warned:
                logger.warning("sentences longer than %d tokens are truncated (%d in this batch of %d)",
                               self.max_length, truncated, len(texts))
                self.warned = True
        return dict(batch), truncated

    def guide_features(self, texts: list[str]) -> dict[str, Tensor]:
        """The guide model's features of `texts` under `guide_*` keys (none without a guide)."""
        if self.guide_tokenize is None:
            return {}
        return {f"{GUIDE_PREFIX}{key}": value for key, value in self.guide_tokenize(texts).items()}


# --- the STS evaluation suite: files in the layout of shared/data/sts, or the public copies on the Hub ---

STS_TASKS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R")
STS_FILES = {
    "STS12": "sts12.jsonl",
    "STS13": "sts13.jsonl",
    "STS14": "sts14.jsonl",
    "STS15": "sts15.jsonl",
    "STS16": "sts16.jsonl",
    "STS-B": "stsb.jsonl",
    "SICK-R": "sickr.jsonl",
}
# MTEB's copies carry no sub-file labels (only `all` aggregation), and its SICK-R test split holds all 9,927 pairs.
STS_HUB = {
    "STS12": "mteb/sts12-sts",
    "STS13": "mteb/sts13-sts",
    "STS14": "mteb/sts14-sts",
    "STS15": "mteb/sts15-sts",
    "STS16": "mteb/sts16-sts",
    "STS-B": "sentence-transformers/stsb",
    "SICK-R": "mteb/sickr-sts",
}
SENTEVAL_MULTI_FILE = ("STS12", "STS13", "STS14", "STS15", "STS16")
# Gold similarity scales: 0 (unrelated) to 5 (equivalent) for STS; SICK-R's relatedness runs from 1 to 5.
STS_SCALES = {task: (1.0, 5.0) if task == "SICK-R" else (0.0, 5.0) for task in STS_TASKS}


def warn_out_of_scale(source: str, scores: list[float], task: str) -> int:
    """Log one warning naming `source` when scores fall outside `task`'s gold scale; returns how many do. (A score
    off the scale is a sign of another file or a rescaled copy; Spearman would not notice.)"""
    low, high = STS_SCALES[task]
    outside = sum(not low <= score <= high for score in scores)
    if outside:
        logger.warning("%s: %d of %d scores are outside the %s scale [%g, %g]", source, outside, len(scores), task,
                       low, high)
    return outside


@dataclass
class STSTask:
    """One task of the suite. STS12-16: `subsets` are SentEval's sub-files and `aggregation` applies to them.
    STS-B, SICK-R: one file each, so the score is always one correlation; `subsets` (splits) are detail only.
    Pairs without a sub-file label are grouped under "all" (`labelled` is then False)."""

    name: str
    source: str
    subsets: dict[str, STSPairs]
    multi_file: bool
    labelled: bool = True

    @property
    def pairs(self) -> int:
        return sum(len(p.scores) for p in self.subsets.values())


def _short(value, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _sts_row(record, where: str) -> dict:
    """A validated STS record: sentence1/sentence2 strings, a finite numeric score, optional split and subset."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for key in ("sentence1", "sentence2", "score"):
        if record.get(key) is None:
            raise DataError(f"{where}: missing field {key!r}")
    for key in ("sentence1", "sentence2"):
        if not isinstance(record[key], str):
            raise DataError(f"{where}: field {key!r} is not a string: {_short(record[key])}")
    raw = record["score"]
    try:
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
            raise ValueError
        score = float(raw)
    except ValueError:
        raise DataError(f"{where}: field 'score' is not a number: {_short(raw)}") from None
    if not abs(score) < float("inf"):
        raise DataError(f"{where}: field 'score' is not a finite number: {_short(raw)}")
    subset = record.get("subset")
    split = record.get("split")
    return {
        "sentence1": record["sentence1"],
        "sentence2": record["sentence2"],
        "score": score,
        "split": None if split is None else str(split),
        "subset": None if subset is None else str(subset),
    }


def read_sts_jsonl(path: str) -> list[dict]:
    """Validated rows of an STS JSON Lines file (sentence1, sentence2, score, split, subset); blank lines skipped."""
    rows = []
    for number, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{number}: malformed JSON ({e.msg})") from None
        rows.append(_sts_row(record, f"{path}:{number}"))
    return rows


def _read_sts_hub(name: str, split: str = "test") -> list[dict]:
    import datasets

    try:
        dataset = datasets.load_dataset(name, split=split)
    except Exception as e:  # offline, missing repo or split: all user-facing
        raise DataError(f"{name}: could not load dataset ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    missing = [c for c in ("sentence1", "sentence2", "score") if c not in dataset.column_names]
    if missing:
        raise DataError(f"{name}: no column {missing[0]!r} in {dataset.column_names}")
    return [_sts_row(record, f"{name}[{split}]:row {i}") for i, record in enumerate(dataset)]


def load_sts_task(task: str, data_dir: str | None = None, sickr_all: bool = False) -> STSTask:
    """One task of the suite from `data_dir` (stsNN.jsonl, stsb.jsonl, sickr.jsonl) or, without it, from the Hub.

    STS12-16 and STS-B: the test pairs. SICK-R: its 4,927 test pairs (SimCSE), or all 9,927 with `sickr_all` (MTEB).
    """
    if task not in STS_TASKS:
        raise DataError(f"unknown STS task {task!r}; choose from {', '.join(STS_TASKS)}")
    if data_dir is not None:
        source = os.path.join(data_dir, STS_FILES[task])
        if not os.path.isfile(source):
            raise DataError(f"{source}: file not found ({task} expects {STS_FILES[task]} in the data folder)")
        rows = read_sts_jsonl(source)
    else:
        source = STS_HUB[task]
        rows = _read_sts_hub(source)
    warn_out_of_scale(source, [row["score"] for row in rows], task)

    multi_file = task in SENTEVAL_MULTI_FILE
    if task == "SICK-R" and sickr_all:
        selected = rows
    else:
        if task == "SICK-R" and all(row["split"] is None for row in rows):
            raise DataError(
                f"{source}: no 'split' field to pick SimCSE's 4,927 SICK-R test pairs; "
                "pass --sickr_all (MTEB: all 9,927 pairs) or a data folder with split labels"
            )
        selected = [row for row in rows if row["split"] in (None, "test")]
    if not selected:
        raise DataError(f"{source}: no test pairs for {task}")

    subsets: dict[str, STSPairs] = {}
    for row in selected:
        key = row["subset"] if multi_file else row["split"]
        pairs = subsets.setdefault(key or "all", STSPairs([], [], []))
        pairs.sentence1.append(row["sentence1"])
        pairs.sentence2.append(row["sentence2"])
        pairs.scores.append(row["score"])
    labelled = not multi_file or all(row["subset"] is not None for row in selected)
    if not labelled and len(subsets) > 1:
        raise DataError(f"{source}: some {task} pairs have a 'subset' field and some do not")
    return STSTask(task, source, subsets, multi_file, labelled)
