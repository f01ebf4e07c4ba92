"""The STS evaluation suite's data: STS12-16, STS-B and SICK-R from files in the layout of shared/data/sts or from
the public copies on the Hub (`load_sts_task`), and STS-B dev pairs (`load_sts_pairs`). The Hub copies get SentEval's
sub-file and split labels back where their scores prove them (data/senteval.py); `simcse-hn-sts-data` writes them
into a folder (data/sts_folder.py)."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

from simcse_hn.data.sentences import read_lines, short
from simcse_hn.data.senteval import SENTEVAL, label_rows
from simcse_hn.errors import DataError, did_you_mean

logger = logging.getLogger(__name__)


@dataclass
class STSPairs:
    sentence1: list[str]
    sentence2: list[str]
    scores: list[float]


# the command that builds the suite's folder from the Hub, named by every error about missing STS data
STS_DATA_COMMAND = "simcse-hn-sts-data --output DIR"
STS_DATA_HINT = f"`{STS_DATA_COMMAND}` builds the STS folder from the Hub"
SPLIT_ALIASES = {"dev": "validation", "validation": "dev"}  # STS-B's dev split, as the Hub's copies name it


class STSDataUnreachable(DataError):
    """STS data on the Hub that cannot be had here: offline, or no network, and not in the `datasets` cache."""


def load_sts_pairs(path: str, split: str | None = None) -> STSPairs:
    """STS pairs from JSON Lines (sentence1, sentence2, score, optional split) or a Hub dataset id.

    Local rows whose `split` differs from `split` are skipped (`dev` and `validation` name one split); rows without a
    `split` field are kept. A Hub dataset's split `split` (default validation), else its alias.
    """
    if not os.path.exists(path) and not os.path.splitext(path)[1]:
        splits = load_hub_dataset_dict(path)
        name = split or "validation"
        chosen = name if name in splits else SPLIT_ALIASES.get(name)
        if chosen not in splits:
            raise DataError(f"{path}: no split {name!r} (it has {', '.join(splits)})")
        dataset = splits[chosen]
        missing = [c for c in ("sentence1", "sentence2", "score") if c not in dataset.column_names]
        if missing:
            raise DataError(f"{path}: no column {missing[0]!r} in {dataset.column_names}")
        pairs = STSPairs(list(dataset["sentence1"]), list(dataset["sentence2"]), [float(s) for s in dataset["score"]])
        warn_out_of_scale(path, pairs.scores, "STS-B")
        return pairs

    rows = read_sts_jsonl(path)
    if split is not None and not any(row["split"] == split for row in rows):
        split = SPLIT_ALIASES.get(split, split)
    rows = [row for row in rows if split is None or row["split"] in (None, split)]
    pairs = STSPairs([r["sentence1"] for r in rows], [r["sentence2"] for r in rows], [r["score"] for r in rows])
    if not pairs.scores:
        raise DataError(f"{path}: no pairs" + (f" with split {split!r}" if split else ""))
    warn_out_of_scale(path, pairs.scores, "STS-B")
    return pairs


def load_dev_pairs(eval_file: str | None, split: str, optional: bool = False) -> STSPairs | None:
    """The trainer's STS-B dev pairs (load_sts_pairs), None without an eval_file, or with `optional` when eval_file
    is a Hub dataset that cannot be had here (logged; `dev_unreachable_line` is the run's last line then)."""
    if eval_file is None:
        return None
    try:
        return load_sts_pairs(eval_file, split)
    except STSDataUnreachable as e:
        if not optional:
            raise
        logger.warning("%s; training without the STS-B dev evaluation (eval_optional)", e)
        return None


def dev_unreachable_line(eval_file: str) -> str:
    """The last line of a run whose eval_file could not be had (load_dev_pairs with `optional`)."""
    return (
        f"STS-B dev was not scored: {eval_file} is not in the datasets cache and the Hub could not be reached; run "
        f"online once (the cache keeps it), or build the STS folder where the Hub can be reached ({STS_DATA_COMMAND}) "
        "and pass --eval_file DIR/stsb.jsonl"
    )


def load_hub_dataset_dict(name: str, revision: str | None = None, split: str | None = None):
    """`datasets.load_dataset(name)` (every split, or `split`), its failures one line: STSDataUnreachable when the
    Hub cannot be reached and nothing is cached, naming the command that builds a local copy; DataError otherwise."""
    import datasets  # a slow import: only where a Hub dataset or Arrow is used

    try:
        return datasets.load_dataset(name, split=split, revision=revision)
    except Exception as e:  # offline, missing repo or split: all user-facing
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        if isinstance(e, ConnectionError):
            raise STSDataUnreachable(
                f"{name}: could not reach the Hub and the datasets cache has no copy ({first}); online it is read "
                f"from the Hub, or `{STS_DATA_COMMAND}` builds the STS folder once for --data_dir / eval_file"
            ) from None
        raise DataError(f"{name}: could not load dataset ({type(e).__name__}: {first})") from None


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


@dataclass(frozen=True)
class HubCopy:
    """A task's public copy on the Hub, as `datasets` loads it: `splits` maps SentEval's splits to the copy's, or is
    None for a copy that holds all of a task's pairs in its `test` split without labels (MTEB's: STS12-16 its test
    pairs, SICK-R all 9,927), labelled by their scores (data/senteval.py); `scale` brings its scores to SentEval's."""

    dataset: str
    revision: str | None  # the revision MTEB's task metadata pins, where MTEB scores that copy
    splits: dict[str, str] | None = None
    scale: float = 1.0


STS_HUB_COPIES = {
    "STS12": HubCopy("mteb/sts12-sts", "a0d554a64d88156834ff5ae9920b964011b16384"),
    "STS13": HubCopy("mteb/sts13-sts", "7e90230a92c190f1bf69ae9002b8cea547a64cca"),
    "STS14": HubCopy("mteb/sts14-sts", "6031580fec1f6af667f0bd2da0a551cf4f0b2375"),
    "STS15": HubCopy("mteb/sts15-sts", "ae752c7c21bf194d8b67fd573edf7ae58183cbe3"),
    "STS16": HubCopy("mteb/sts16-sts", "4d8694f8f0e0100860b497b999b3dbed754a0513"),
    # sentence-transformers' copy: STS-B's three splits, its scores divided by 5
    "STS-B": HubCopy("sentence-transformers/stsb", None, {"train": "train", "dev": "validation", "test": "test"}, 5.0),
    "SICK-R": HubCopy("mteb/sickr-sts", "20a6d6f312dd54037fe07a32d58e5e168867909d"),
}
STS_HUB = {task: copy.dataset for task, copy in STS_HUB_COPIES.items()}
TASK_ALIASES = {name.lower().replace("-", ""): name for name in STS_TASKS} | {
    "stsbenchmark": "STS-B",
    "sick": "SICK-R",
    "sickrelatedness": "SICK-R",
}


def parse_tasks(spec: str) -> list[str]:
    """'all' or a comma-separated list ('sts12,stsb,sick-r', any case) -> task names in the paper's order."""
    if spec.strip().lower() == "all":
        return list(STS_TASKS)
    names = set()
    for item in spec.split(","):
        key = item.strip().lower().replace("-", "").replace("_", "")
        if key not in TASK_ALIASES:
            hint = did_you_mean(item.strip(), ["all", *STS_TASKS])
            raise ValueError(f"unknown STS task {item.strip()!r}{hint}; choose from all, {', '.join(STS_TASKS)}")
        names.add(TASK_ALIASES[key])
    return [name for name in STS_TASKS if name in names]


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


def read_hub_copy(task: str, splits: tuple[str, ...] | None = None) -> tuple[list[dict], bool]:
    """A task's rows from its public copy on the Hub (STS_HUB_COPIES; `splits`: only those of a copy with named
    splits), scores on SentEval's scale, with SentEval's split and sub-file labels where the copy has none and its
    scores prove them (senteval.label_rows). -> (rows, whether every row has its SentEval labels)"""
    copy = STS_HUB_COPIES[task]
    parts = {"test": "test"} if copy.splits is None else copy.splits
    rows = []
    for ours, theirs in parts.items():
        if splits is not None and copy.splits is not None and ours not in splits:
            continue
        dataset = load_hub_dataset_dict(copy.dataset, copy.revision, theirs)
        missing = [c for c in ("sentence1", "sentence2", "score") if c not in dataset.column_names]
        if missing:
            raise DataError(f"{copy.dataset}: no column {missing[0]!r} in {dataset.column_names}")
        for i, record in enumerate(dataset):
            row = _sts_row(record, f"{copy.dataset}[{theirs}]:row {i}")
            row["score"] = round(row["score"] * copy.scale, 6) if copy.scale != 1 else row["score"]
            if copy.splits is not None and row["split"] is None:
                row["split"] = ours
            rows.append(row | {"idx": i})
    if copy.splits is not None:
        return rows, True
    if any(row["split"] is not None or row["subset"] is not None for row in rows):
        return rows, False  # labels of the copy's own: kept as they are
    return rows, label_rows(rows, SENTEVAL[task])


def load_sts_task(task: str, data_dir: str | None = None, sickr_all: bool = False) -> STSTask:
    """One task of the suite from `data_dir` (stsNN.jsonl, stsb.jsonl, sickr.jsonl) or, without it, from the Hub.

    STS12-16 and STS-B: the test pairs. SICK-R: its 4,927 test pairs (SimCSE), or all 9,927 with `sickr_all` (MTEB).
    """
    if task not in STS_TASKS:
        raise DataError(f"unknown STS task {task!r}; choose from {', '.join(STS_TASKS)}")
    if data_dir is not None:
        source = os.path.join(data_dir, STS_FILES[task])
        if not os.path.isfile(source):
            raise DataError(
                f"{source}: file not found ({task} expects {STS_FILES[task]} in the data folder; "
                f"`{STS_DATA_COMMAND}` builds the folder from the Hub)"
            )
        rows = read_sts_jsonl(source)
    else:
        source = STS_HUB[task]
        rows, _ = read_hub_copy(task, splits=("test",))
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
