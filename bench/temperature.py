"""The data of the temperature study (bench/results/temperature/plan.md), written beside its plan from ../shared/data
(not committed: the plan's lock holds their sha256). `python -m bench.temperature` writes corpus.txt, the first 6,400
sentences of the shuffled wiki slice, and stsb_dev_disjoint.jsonl, STS-B's dev pairs that no test file of the
endpoint holds (either order, case and spacing aside, as the pilot counted then; it now sets punctuation aside too and
counts shared sentences: 6 test pairs and 63 pairs with a test sentence among these 369).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from bench.common import RESULTS, SHARED_DATA, shuffled_corpus
from simcse_hn.data.sts import STS_FILES, read_sts_jsonl

FOLDER = RESULTS / "temperature"
CORPUS_LINES = 6400  # bench/results/study/plan.md's


def pair_key(s1: str, s2: str) -> frozenset:
    """A sentence pair as the pilot counted the dev-test overlap when this file was locked: either order, case and
    spacing aside (the file's sha256 is in the lock: the rule stays the one it was made by)."""
    return frozenset((" ".join(s1.lower().split()), " ".join(s2.lower().split())))


def main() -> None:
    with tempfile.TemporaryDirectory() as work:
        lines = shuffled_corpus(Path(work) / "wiki_shuffled.txt").read_text(encoding="utf-8").splitlines()
    (FOLDER / "corpus.txt").write_text("\n".join(lines[:CORPUS_LINES]) + "\n", encoding="utf-8")
    sts = SHARED_DATA / "sts"
    rows = [r for name in STS_FILES.values() for r in read_sts_jsonl(str(sts / name))]
    tests = {pair_key(r["sentence1"], r["sentence2"]) for r in rows if r["split"] == "test"}
    dev = [r for r in read_sts_jsonl(str(sts / STS_FILES["STS-B"])) if r["split"] == "dev"]
    kept = [r for r in dev if pair_key(r["sentence1"], r["sentence2"]) not in tests]
    text = "".join(json.dumps({k: r[k] for k in ("sentence1", "sentence2", "score", "split")}) + "\n" for r in kept)
    (FOLDER / "stsb_dev_disjoint.jsonl").write_text(text, encoding="utf-8")
    print(f"{FOLDER}: corpus.txt ({CORPUS_LINES} sentences), stsb_dev_disjoint.jsonl ({len(kept)} of {len(dev)} "
          "STS-B dev pairs)")  # fmt: skip


if __name__ == "__main__":
    main()
