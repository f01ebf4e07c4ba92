"""NLI-style triplets from SICK, for offline smoke runs of paired training (the lab has no copy of SimCSE's NLI file).

    python -m bench.sick_triplets --output outputs/sick_triplets.csv

Each SICK pair (sentence1 A, sentence2 B) carries an entailment label. A triplet is (A, B, C) with A entailing B
(the positive) and A contradicting C (the hard negative): SimCSE's `sent0, sent1, hard_neg` layout, written as CSV
with its header, which train.py reads as is. Contradiction is symmetric (A contradicts C iff C contradicts A), so a
CONTRADICTION pair gives a hard negative to both of its sentences; entailment is directional and is used as given.
Only the train and dev (SICK trial) splits are used; SICK-R's test pairs stay out (their sentences can still occur:
SICK reuses sentences across pairs, so do not read a SICK-R test score of a model trained on this as clean).
SICK is CC BY-NC-SA 3.0: the file is generated locally, not committed.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
from collections import defaultdict
from pathlib import Path

from bench.common import SHARED_DATA

SICK = SHARED_DATA / "sts" / "sickr.jsonl"


def sick_triplets(path: Path = SICK, splits: tuple[str, ...] = ("train", "dev"), seed: int = 0) -> list[tuple]:
    """(anchor, entailed, contradicting) for every entailment pair whose premise has a contradiction; when it has
    several, each entailment pair takes the next one (seeded order), so the contradictions are spread."""
    entailed, contradicting = defaultdict(list), defaultdict(list)
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record.get("split") not in splits:
            continue
        a, b = record["sentence1"], record["sentence2"]
        if record.get("entailment") == "ENTAILMENT":
            entailed[a].append(b)
        elif record.get("entailment") == "CONTRADICTION":
            contradicting[a].append(b)
            contradicting[b].append(a)
    rng = random.Random(seed)
    triplets = []
    for anchor in sorted(entailed):
        negatives = sorted(set(contradicting.get(anchor, [])))
        if not negatives:
            continue
        rng.shuffle(negatives)
        for k, positive in enumerate(entailed[anchor]):
            triplets.append((anchor, positive, negatives[k % len(negatives)]))
    rng.shuffle(triplets)
    return triplets


def write_csv(triplets: list[tuple], output: Path) -> Path:
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(output, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["sent0", "sent1", "hard_neg"])  # SimCSE's nli_for_simcse.csv header
        writer.writerows(triplets)
    return output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="outputs/sick_triplets.csv")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    triplets = sick_triplets(seed=args.seed)
    write_csv(triplets, Path(args.output))
    print(f"{len(triplets)} triplets ({len({t[0] for t in triplets})} anchors) -> {args.output}")


if __name__ == "__main__":
    main()
