"""The STS suite's data folder (docs/evaluation.md#data-folder-layout: sts12.jsonl ... sts16.jsonl, stsb.jsonl,
sickr.jsonl) built from the public copies on the Hub (data/sts.py's STS_HUB_COPIES), with SentEval's pair counts
checked: what `simcse-hn-sts-data` writes, and what eval/sts.py --data_dir and train.py's eval_file then read offline.

Every row keeps the copy's text and score (STS-B's on 0-5, as SentEval's), its `split`, and for STS12-16 its SentEval
sub-file (`subset`) where the copy's scores prove it (data/senteval.py); `idx` is its row in the copy's split. A task
whose pairs are not SentEval's in number is refused, and nothing is written."""

from __future__ import annotations

import json
import os
from collections import Counter
from datetime import datetime, timezone

from simcse_hn.data.senteval import SENTEVAL
from simcse_hn.data.sts import SENTEVAL_MULTI_FILE, STS_FILES, STS_HUB_COPIES, STS_TASKS, read_hub_copy
from simcse_hn.errors import DataError
from simcse_hn.files import ReportFolder

SOURCES = "sources.json"  # beside the task files: where each came from and what was checked
FIELDS = ("sentence1", "sentence2", "score", "split", "subset", "idx")


def expected_pairs(task: str) -> dict[str, int]:
    """SentEval's pairs of `task` per split: {"test": 3108} for STS12, train / dev / test for STS-B and SICK-R."""
    counts: Counter[str] = Counter()
    for block in SENTEVAL[task]:
        counts[block.split] += block.pairs
    return dict(counts)


def task_rows(task: str) -> tuple[list[dict], dict]:
    """A task's rows as its file holds them, and its record for sources.json; DataError when the copy's pairs are not
    SentEval's in number."""
    copy = STS_HUB_COPIES[task]
    rows, labelled = read_hub_copy(task)
    expected = expected_pairs(task)
    if labelled:
        found = dict(Counter(row["split"] for row in rows))
        if found != expected:
            raise DataError(f"{copy.dataset}: {task} has {_counts(found)} pairs; SentEval's has {_counts(expected)}")
        note = "SentEval's splits and sub-files, proven by the scores" if copy.splits is None else "the copy's splits"
    else:
        total = sum(expected.values())
        if len(rows) != total:
            raise DataError(f"{copy.dataset}: {task} has {len(rows):,} pairs; SentEval's has {total:,}")
        if task in SENTEVAL_MULTI_FILE:  # the copy's test split holds the test pairs: only the sub-files are unknown
            for row in rows:
                row["split"] = "test"
            note = "no sub-file labels: their scores are not SentEval's parts in any order (aggregation all only)"
        else:
            note = "no split labels: SICK's SemEval files are not found among its scores (score it with --sickr_all)"
    record = {
        "file": STS_FILES[task],
        "dataset": copy.dataset,
        "revision": copy.revision,
        "pairs": dict(Counter(row["split"] or "unlabelled" for row in rows)),
        "labels": note,
    }
    if copy.scale != 1:
        record["scale"] = f"the copy's scores x {copy.scale:g}"
    if labelled and task in SENTEVAL_MULTI_FILE:
        record["subsets"] = dict(Counter(row["subset"] for row in rows))
    return rows, record


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{split} {n:,}" for split, n in sorted(counts.items()))


def build_sts_folder(output: str, tasks=STS_TASKS) -> dict:
    """Write `tasks`' files and sources.json into `output` (a user's file there is never replaced: files.ReportFolder).
    Every task is read and checked before anything is written. -> sources.json's record"""
    names = [STS_FILES[task] for task in tasks] + [SOURCES]
    ReportFolder(output).check(names)  # refused before any download
    built = {task: task_rows(task) for task in tasks}
    record = {
        "built_by": "simcse-hn-sts-data",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "tasks": {task: task_record for task, (_, task_record) in built.items()},
    }
    with ReportFolder(output) as folder:
        for task, (rows, _) in built.items():
            with open(folder.path(STS_FILES[task]), "w", encoding="utf-8") as f:
                for row in rows:
                    kept = {key: row[key] for key in FIELDS if row.get(key) is not None}
                    f.write(json.dumps(kept, ensure_ascii=False) + "\n")
        with open(folder.path(SOURCES), "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2)
            f.write("\n")
        folder.commit()
    return record


def summary_lines(output: str, record: dict) -> list[str]:
    """One line per task for the terminal: its pairs per split, where from, and what the labels are."""
    lines = []
    for task, entry in record["tasks"].items():
        pairs = ", ".join(f"{split} {n:,}" for split, n in entry["pairs"].items())
        path = os.path.join(output, entry["file"])
        lines.append(f"{task}: {pairs} pairs from {entry['dataset']} -> {path} ({entry['labels']})")
    return lines
