"""STS scoring, shared by the trainer (STS-B dev) and eval/sts.py (the full suite).

The suite follows SentEval as SimCSE runs it: cosine similarity of the two sentence embeddings, Spearman x 100
against the gold scores. STS12-16 are several sub-files each, combined by `aggregation`:
  all    SimCSE: the sub-files' pairs pooled into one correlation (the paper's numbers; the default)
  mean   SentEval: the mean of the sub-files' correlations
  wmean  SentEval: their mean weighted by the number of pairs
STS-B and SICK-R are one file each, so every aggregation gives the same number. Every distinct sentence of the
whole suite is encoded once, in one call, so the encoder can batch the union by length.

Every correlation goes through the project's `evaluate` metric (sts_metric.py; `evaluate.load(STS_METRIC)` gives it
to anyone). eval/sts.py also measures alignment and uniformity on STS-B dev (analysis.py) from the same encode call
and saves each pair's cosine (`save_predictions`) for paired tests between runs (eval/compare.py)."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from simcse_hn.data.sts import STS_TASKS, STSPairs, STSTask
from simcse_hn.errors import DataError, did_you_mean
from simcse_hn.evaluation.analysis import alignment_uniformity_encoded, positive_pairs
from simcse_hn.evaluation.sts_metric import STSMetric

logger = logging.getLogger(__name__)

EncodeFn = Callable[[list[str]], Tensor]


AGGREGATIONS = ("all", "mean", "wmean")
AGGREGATION_HELP = {
    "all": "all (SimCSE: sub-files pooled, one correlation)",
    "mean": "mean (SentEval: mean of the sub-file correlations)",
    "wmean": "wmean (SentEval: mean of the sub-file correlations weighted by pairs)",
}
TASK_ALIASES = {name.lower().replace("-", ""): name for name in STS_TASKS} | {
    "stsbenchmark": "STS-B",
    "sick": "SICK-R",
    "sickrelatedness": "SICK-R",
}


def encode_unique(encode: EncodeFn, sentences: list[str]) -> dict[str, Tensor]:
    """Encode each distinct sentence once. -> {sentence: (D,) embedding}"""
    unique = list(dict.fromkeys(sentences))
    embeddings = encode(unique)  # (U, D)
    return dict(zip(unique, embeddings))


def cosine_scores(lookup: dict[str, Tensor], sentence1: list[str], sentence2: list[str]) -> Tensor:
    a = torch.stack([lookup[s] for s in sentence1]).double()
    b = torch.stack([lookup[s] for s in sentence2]).double()
    return torch.from_numpy(tie_equal(F.cosine_similarity(a, b, dim=-1, eps=1e-12).numpy()))


STS_METRIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sts_metric.py")


@functools.cache
def sts_metric():
    """The project's STS metric, an `evaluate.Metric` (sts_metric.py), made once per process and kept in memory.

    The class is instantiated from the package rather than through `evaluate.load(STS_METRIC)` (which gives the same
    metric, offline too): load copies the script into the modules cache and imports the copy, a writable cache the
    suite does not need. Imported here, not at the top, so that eval/sts.py reports a bad task file before `evaluate`
    (and `datasets`) load.
    """
    return STSMetric(keep_in_memory=True)


def spearman_x100(predictions, gold) -> float:
    """Spearman x 100 of predictions (float64 kept) against gold scores, through `sts_metric()`, each side passed as
    one row (the metric's list form) so that `evaluate` converts the arrays whole."""
    predictions = np.asarray(predictions, dtype=np.float64)
    gold = np.asarray(gold, dtype=np.float64)
    return sts_metric().compute(predictions=[predictions], references=[gold])["spearman"]


def sts_spearman(encode: EncodeFn, sentence1: list[str], sentence2: list[str], scores: list[float]) -> float:
    """Spearman x 100 between gold scores and the cosine similarity of the two sentences' embeddings."""
    lookup = encode_unique(encode, sentence1 + sentence2)
    return spearman_x100(cosine_scores(lookup, sentence1, sentence2).numpy(), scores)


def sts_dev_metrics(
    embeddings: Tensor, index: dict[str, int], pairs: STSPairs, device: str | torch.device | None = None
) -> dict[str, float]:
    """What an in-training evaluation logs, from the dev sentences' embeddings (U, D) and {sentence: row}:
    {"stsb_spearman", "alignment", "uniformity"}, the last two under SimCSE's protocol (analysis.py, computed on
    `device`), left out when no dev pair is above its threshold."""
    metrics = {"stsb_spearman": spearman_x100(pair_cosines(embeddings, index, pairs), pairs.scores)}
    if positive_pairs(pairs):
        geometry = alignment_uniformity_encoded(embeddings, index, pairs, device=device)
        metrics.update(alignment=geometry["alignment"], uniformity=geometry["uniformity"])
    return metrics


# --- the full suite ---


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


def check_aggregation(tasks: Sequence[STSTask], aggregation: str) -> None:
    """Fail before encoding when `aggregation` cannot be computed on these tasks."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    for task in tasks:
        if aggregation != "all" and task.multi_file and not task.labelled:
            raise DataError(
                f"{task.source}: {task.name} pairs carry no 'subset' (sub-file) labels, so --aggregation "
                f"{aggregation} cannot be computed; use --aggregation all or a local data folder"
            )


def encode_union(
    encode: EncodeFn, tasks: Sequence[STSTask], extra: Iterable[str] = ()
) -> tuple[Tensor, dict[str, int]]:
    """One `encode` call over every distinct sentence of `tasks`, then those of `extra` not among them (e.g. STS-B
    dev for alignment and uniformity: most of its sentences recur in the suite). -> embeddings (U, D), {sentence: row}
    """
    index: dict[str, int] = {}
    for task in tasks:
        for pairs in task.subsets.values():
            for sentence in pairs.sentence1 + pairs.sentence2:
                index.setdefault(sentence, len(index))
    for sentence in extra:
        index.setdefault(sentence, len(index))
    embeddings = encode(list(index))  # (U, D)
    if embeddings.shape[0] != len(index):
        raise ValueError(f"encode returned {embeddings.shape[0]} embeddings for {len(index)} sentences")
    return embeddings, index


TIE_TOLERANCE = 1e-12  # cosines closer than this are one value: float64's rounding, far below float32 embeddings'


def tie_equal(values: np.ndarray, tolerance: float = TIE_TOLERANCE) -> np.ndarray:
    """`values` with each run of sorted neighbours closer than `tolerance` set to the run's first value, so that
    cosines equal in exact arithmetic rank as ties: a pair of one sentence with itself is 1 up to float64's last bit,
    which differs from embedding to embedding, and (a, b) and (b, a) may differ there too. -> (n,) float64"""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.concatenate([[True], np.diff(ordered) > tolerance])  # (n,) a run begins
    out = np.empty_like(values)
    out[order] = ordered[np.flatnonzero(starts)[np.cumsum(starts) - 1]]
    return out


def pair_cosines(embeddings: Tensor, index: dict[str, int], pairs: STSPairs) -> np.ndarray:
    """Cosine similarity of each pair, in float64 so that near-ties rank as the exact values do, with values equal up
    to float64's rounding made equal (`tie_equal`). -> (n,)"""
    a = embeddings[[index[s] for s in pairs.sentence1]].double()  # (n, D)
    b = embeddings[[index[s] for s in pairs.sentence2]].double()  # (n, D)
    return tie_equal(F.cosine_similarity(a, b, dim=-1, eps=1e-12).numpy())


def score_sts_tasks(encode: EncodeFn, tasks: Sequence[STSTask], aggregation: str = "all") -> dict:
    """Score `tasks` with one encode call over their union.

    -> {"aggregation", "tasks": {name: {"spearman", "pairs", "subsets": {sub-file: {"spearman", "pairs"}}}},
        "average"}: the scoring part of results.json (see `sts_results`).
    """
    check_aggregation(tasks, aggregation)
    embeddings, index = encode_union(encode, tasks)
    return score_encoded_tasks(embeddings, index, tasks, aggregation)[0]


def score_encoded_tasks(
    embeddings: Tensor, index: dict[str, int], tasks: Sequence[STSTask], aggregation: str = "all"
) -> tuple[dict, dict[str, dict[str, np.ndarray]]]:
    """`score_sts_tasks` on embeddings (U, D) already computed (`encode_union`), plus every pair's prediction.

    -> (scores as score_sts_tasks, predictions {task: {"cosine": (n,) float64, "gold": (n,) float64, "subset": (n,)
    str}}), a task's pairs in the order of its sub-files (see `save_predictions`).
    """
    scored, predictions = {}, {}
    for task in tasks:
        cosines = {name: pair_cosines(embeddings, index, pairs) for name, pairs in task.subsets.items()}
        subsets = {
            name: {"spearman": spearman_x100(cosines[name], pairs.scores), "pairs": len(pairs.scores)}
            for name, pairs in task.subsets.items()
        }
        if aggregation == "all" or not task.multi_file:
            gold = [score for pairs in task.subsets.values() for score in pairs.scores]
            spearman = spearman_x100(np.concatenate(list(cosines.values())), gold)
        elif aggregation == "mean":
            spearman = float(np.mean([s["spearman"] for s in subsets.values()]))
        else:
            values = [s["spearman"] for s in subsets.values()]
            spearman = float(np.average(values, weights=[s["pairs"] for s in subsets.values()]))
        scored[task.name] = {"spearman": spearman, "pairs": task.pairs, "subsets": subsets}
        predictions[task.name] = {
            "cosine": np.concatenate(list(cosines.values())),
            "gold": np.asarray([score for pairs in task.subsets.values() for score in pairs.scores], np.float64),
            "subset": np.asarray([name for name, pairs in task.subsets.items() for _ in pairs.scores], dtype=str),
        }
    average = float(np.mean([t["spearman"] for t in scored.values()])) if scored else float("nan")
    return {"aggregation": aggregation, "tasks": scored, "average": average}, predictions
