"""The STS evaluation suite's data: STS12-16, STS-B and SICK-R from files in the layout of shared/data/sts or from
the public copies on the Hub (`load_sts_task`), and STS-B dev pairs (`load_sts_pairs`)."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

from simcse_hn.data.sentences import read_lines, short
from simcse_hn.errors import DataError

logger = logging.getLogger(__name__)


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
        import datasets  # a slow import: only where a Hub dataset or Arrow is used

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


def _sts_row(record, where: str) -> dict:
    """A validated STS record: sentence1/sentence2 strings, a finite numeric score, optional split and subset."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for key in ("sentence1", "sentence2", "score"):
        if record.get(key) is None:
            raise DataError(f"{where}: missing field {key!r}")
    for key in ("sentence1", "sentence2"):
        if not isinstance(record[key], str):
            raise DataError(f"{where}: field {key!r} is not a string: {short(record[key])}")
    raw = record["score"]
    try:
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
            raise ValueError
        score = float(raw)
    except ValueError:
        raise DataError(f"{where}: field 'score' is not a number: {short(raw)}") from None
    if not abs(score) < float("inf"):
        raise DataError(f"{where}: field 'score' is not a finite number: {short(raw)}")
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
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{number}: malformed JSON ({e.msg})") from None
        rows.append(_sts_row(record, f"{path}:{number}"))
    return rows


def _read_sts_hub(name: str, split: str = "test") -> list[dict]:
    import datasets  # a slow import: only where a Hub dataset or Arrow is used

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
