"""The data of the mean-pooling study (bench/results/mean_pooling/plan.md), written beside its plan from
../shared/data (not committed: the plan's lock holds its sha256). `python -m bench.mean_pooling` writes
dev_clean.jsonl: the STS-B train and dev pairs none of whose sentences any test file of the seven tasks holds, case,
punctuation and spacing aside (the pilot's own rule, simcse_hn.study.tuning.normal), all labelled `dev`. The study
trains on the quick start's bundled sentences (data/wiki_quickstart.txt), which the repository holds.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.common import RESULTS, SHARED_DATA
from simcse_hn.data.sts import STS_FILES, read_sts_jsonl
from simcse_hn.study.tuning import normal

FOLDER = RESULTS / "mean_pooling"


def clean_dev_pairs(sts: Path) -> list[dict]:
    """STS-B's train and dev pairs that share no sentence with a test pair of any of the seven tasks."""
    tested = set()
    for name in STS_FILES.values():
        for r in read_sts_jsonl(str(sts / name)):
            if r["split"] == "test":
                tested |= {normal(r["sentence1"]), normal(r["sentence2"])}
    rows = [r for r in read_sts_jsonl(str(sts / STS_FILES["STS-B"])) if r["split"] in ("train", "dev")]
    return [r for r in rows if normal(r["sentence1"]) not in tested and normal(r["sentence2"]) not in tested]


def main() -> None:
    FOLDER.mkdir(parents=True, exist_ok=True)
    kept = clean_dev_pairs(SHARED_DATA / "sts")
    keys = ("sentence1", "sentence2", "score")
    rows = [{**{key: r[key] for key in keys}, "split": "dev"} for r in kept]
    (FOLDER / "dev_clean.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"{FOLDER}: dev_clean.jsonl ({len(rows)} STS-B train and dev pairs)")


if __name__ == "__main__":
    main()
