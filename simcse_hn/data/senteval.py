"""SentEval's STS suite as its files hold it: each task's splits and sub-files, the pairs of each, and a digest of each
one's gold scores. The public Hub copies of STS12-16 and SICK-R (MTEB's) hold a task's pairs in one split without
sub-file or split labels; `find_blocks` finds SentEval's parts among a copy's rows by their scores, so that the labels
are put back only where the scores prove them (a copy in another order, or with other scores, stays unlabelled)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Block:
    """One part of a task as SentEval reads it: a split, and for STS12-16 a sub-file (`subset`)."""

    split: str
    subset: str | None
    pairs: int
    scores_sha256: str  # scores_digest of its gold scores (the first 16 hex digits)


# The digests are of SentEval's files as SimCSE's data script and SentEval's own fetch them (the original releases:
# STS12-16 pairs with a gold score, STS-B, SICK's SemEval 2014 train / trial / test files), each part in file order.
SENTEVAL = {
    "STS12": (
        Block("test", "MSRpar", 750, "3b69fc7a99a8e371"),
        Block("test", "MSRvid", 750, "5e1e7676162cbc53"),
        Block("test", "SMTeuroparl", 459, "793bf03c25c9d01d"),
        Block("test", "surprise.OnWN", 750, "32d05244a7b72db7"),
        Block("test", "surprise.SMTnews", 399, "cf72e0a0519936ec"),
    ),
    "STS13": (
        Block("test", "FNWN", 189, "88a14a85d33b1894"),
        Block("test", "headlines", 750, "3358d532b0097704"),
        Block("test", "OnWN", 561, "d8d7cd5f564096b9"),
    ),
    "STS14": (
        Block("test", "deft-forum", 450, "38a592c9d0c7f2b6"),
        Block("test", "deft-news", 300, "ccbe7f73060a51cd"),
        Block("test", "headlines", 750, "e6d5eb67c6a66aec"),
        Block("test", "images", 750, "b8d3b8912a01c443"),
        Block("test", "OnWN", 750, "9fd7fc8a1b9d07dd"),
        Block("test", "tweet-news", 750, "2bc69f6ed0b8eb4a"),
    ),
    "STS15": (
        Block("test", "answers-forums", 375, "b5deb56fe93eb53d"),
        Block("test", "answers-students", 750, "66e3a6680f63fc04"),
        Block("test", "belief", 375, "b8d3d2d3022002fd"),
        Block("test", "headlines", 750, "df1b3ea5f3939165"),
        Block("test", "images", 750, "d8aaafff2b3db26e"),
    ),
    "STS16": (
        Block("test", "answer-answer", 254, "2612fa39e425cbd1"),
        Block("test", "headlines", 249, "46aaddf21b18a718"),
        Block("test", "plagiarism", 230, "37289e07d545b082"),
        Block("test", "postediting", 244, "1d970e571c8bd713"),
        Block("test", "question-question", 209, "34138b07d7c1606a"),
    ),
    "STS-B": (
        Block("train", None, 5749, "24b7f9add4b307e7"),
        Block("dev", None, 1500, "b38f73920df7c87f"),
        Block("test", None, 1379, "2a8896b2d2e962b5"),
    ),
    "SICK-R": (
        Block("train", None, 4500, "04ccea9cb1ddbc3b"),
        Block("dev", None, 500, "e1b63ea2675543e3"),  # SICK's trial file
        Block("test", None, 4927, "ec18ed81dbfd37d4"),
    ),
}


def scores_digest(scores: Sequence[float]) -> str:
    """The first 16 hex digits of the sha256 of the scores to 3 decimals, sorted: the same for a part's pairs in any
    order, on the 0-5 scale (a copy on 0-1 is scaled first)."""
    text = "\n".join(sorted(f"{score:.3f}" for score in scores))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def find_blocks(scores: Sequence[float], blocks: Sequence[Block]) -> list[Block] | None:
    """`blocks` in the order in which they lie one after the other in `scores` (each one's scores in any order), or
    None when no order covers the rows exactly (other pairs, other scores, or the parts mixed together)."""
    if sum(block.pairs for block in blocks) != len(scores):
        return None
    digests: dict[tuple[int, Block], str] = {}

    def fits(start: int, block: Block) -> bool:
        if (start, block) not in digests:
            digests[(start, block)] = scores_digest(scores[start : start + block.pairs])
        return digests[(start, block)] == block.scores_sha256

    def arrange(start: int, left: tuple[Block, ...]) -> list[Block] | None:
        if not left:
            return []
        for k, block in enumerate(left):
            if fits(start, block):
                rest = arrange(start + block.pairs, left[:k] + left[k + 1 :])
                if rest is not None:
                    return [block, *rest]
        return None

    return arrange(0, tuple(blocks))


def label_rows(rows: list[dict], blocks: Sequence[Block]) -> bool:
    """Give `rows` (dicts with `score`, in the copy's order) the split and sub-file of SentEval's part each lies in,
    when `find_blocks` finds the parts; returns whether it did (the rows are left as they are otherwise)."""
    order = find_blocks([row["score"] for row in rows], blocks)
    if order is None:
        return False
    start = 0
    for block in order:
        for row in rows[start : start + block.pairs]:
            row["split"], row["subset"] = block.split, block.subset
        start += block.pairs
    return True
