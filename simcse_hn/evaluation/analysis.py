"""Alignment and uniformity of sentence embeddings (Wang & Isola, ICML 2020, arXiv:2005.10242), as SimCSE reports
them (Gao et al., EMNLP 2021, arXiv:2104.08821, section 5 and figure 2).

    alignment  = E_(x, y) positive pairs ||f(x) - f(y)||^2            (alpha = 2)
    uniformity = log E_(x, y) distinct pairs exp(-2 ||f(x) - f(y)||^2)  (t = 2)

with f the L2-normalised embedding. Both are lower-is-better: positives close together, and all sentences spread
over the sphere. SimCSE's protocol: STS-B development pairs with a gold score above 4 (of 5) are the positives;
uniformity runs over every distinct sentence of STS-B dev. Both are computed in float64.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from simcse_hn.data.sts import STS_FILES, STS_HUB, STSPairs, read_hub_copy, read_sts_jsonl
from simcse_hn.errors import DataError

logger = logging.getLogger(__name__)

THRESHOLD = 4.0  # SimCSE: "pairs with scores higher than 4" on STS-B's 0-5 scale
PROTOCOL = (
    "alignment (alpha 2) and uniformity (t 2) of L2-normalised embeddings (Wang & Isola 2020) as SimCSE uses them: "
    "positives = STS-B dev pairs with gold score > {threshold}, uniformity over all distinct STS-B dev sentences"
)


def _unit(x) -> Tensor:
    return F.normalize(torch.as_tensor(x).double(), dim=-1, eps=1e-12)


def alignment(x, y, alpha: float = 2.0) -> float:
    """Mean ||x_i/|x_i| - y_i/|y_i|||^alpha over the rows. x, y: (N, D) embeddings of the N positive pairs."""
    x, y = _unit(x), _unit(y)
    if x.shape != y.shape or x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"alignment needs two (N, D) arrays of the same shape, N >= 1; got {x.shape} and {y.shape}")
    return float((x - y).norm(dim=1).pow(alpha).mean())


def uniformity(x, t: float = 2.0, chunk_size: int = 2048) -> float:
    """log of the mean of exp(-t ||x_i - x_j||^2) over all N(N-1)/2 pairs i < j of the normalised rows.

    x: (N, D), N >= 2. Rows are taken `chunk_size` at a time against the rows after them, so memory stays at
    (chunk_size, N) and each pair is computed once.
    """
    x = _unit(x)  # (N, D)
    n = x.shape[0]
    if x.ndim != 2 or n < 2:
        raise ValueError(f"uniformity needs an (N, D) array with N >= 2, got shape {tuple(x.shape)}")
    squared_norms = x.pow(2).sum(1)  # (N,): 1, or 0 for a zero embedding
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, n - 1, chunk_size):
        block = x[start : start + chunk_size]  # (C, D)
        rest = x[start:]  # (N - start, D): the block's rows and every row after them
        distances = (
            squared_norms[start : start + len(block), None] + squared_norms[None, start:] - 2 * block @ rest.T
        ).clamp_min(0)  # (C, N - start): ||x_i - x_j||^2, column k is row start + k
        total += torch.exp(-t * distances).triu(1).sum()  # j > i only
    return math.log(float(total) / (n * (n - 1) / 2))


def positive_threshold(scores: Sequence[float], threshold: float = THRESHOLD) -> float:
    """The threshold on the data's own scale: `threshold` is on STS-B's 0-5 scale; copies normalised to 0-1
    (sentence-transformers/stsb on the Hub) get threshold / 5."""
    return threshold / 5 if max(scores) <= 1.0 else threshold


def positive_pairs(pairs: STSPairs, threshold: float = THRESHOLD) -> list[int]:
    """Indices of the pairs whose gold score is above the threshold (on the data's scale): SimCSE's positives."""
    cut = positive_threshold(pairs.scores, threshold)
    return [i for i, score in enumerate(pairs.scores) if score > cut]


def alignment_uniformity_encoded(
    embeddings: Tensor,
    index: dict[str, int],
    pairs: STSPairs,
    threshold: float = THRESHOLD,
    device: str | torch.device | None = None,
) -> dict:
    """Alignment and uniformity from embeddings already computed (e.g. in the STS suite's one encode call).

    embeddings: (U, D); index: {sentence: row of `embeddings`}, covering every sentence of `pairs` (STS-B dev).
    `device`: where to compute (the dev rows are moved there; a GPU takes the (U, U) float64 products in
    milliseconds). -> {"alignment", "uniformity", "positive_pairs", "sentences", "threshold", "protocol"}
    """
    cut = positive_threshold(pairs.scores, threshold)
    positives = positive_pairs(pairs, threshold)
    if not positives:
        raise ValueError(f"no pair has a gold score above {cut:g}, so alignment has no positive pairs")
    rows = [index[s] for s in dict.fromkeys(pairs.sentence1 + pairs.sentence2)]
    x = embeddings[[index[pairs.sentence1[i]] for i in positives]].to(device)  # (P, D)
    y = embeddings[[index[pairs.sentence2[i]] for i in positives]].to(device)  # (P, D)
    scale = " (4 of 5; the scores are on 0-1)" if cut != threshold else ""
    return {
        "alignment": alignment(x, y),
        "uniformity": uniformity(embeddings[rows].to(device)),
        "positive_pairs": len(positives),
        "sentences": len(rows),
        "threshold": cut,
        "protocol": PROTOCOL.format(threshold=f"{cut:g}{scale}"),
    }


def alignment_uniformity(encode, pairs: STSPairs, threshold: float = THRESHOLD) -> dict:
    """Encode the distinct sentences of `pairs` (STS-B dev) once and measure them (`alignment_uniformity_encoded`).

    encode: list[str] -> (n, D) embeddings, as simcse_hn.evaluation's encoders.
    """
    sentences = list(dict.fromkeys(pairs.sentence1 + pairs.sentence2))
    return alignment_uniformity_encoded(encode(sentences), {s: i for i, s in enumerate(sentences)}, pairs, threshold)


def load_stsb_dev(data_dir: str | None) -> tuple[STSPairs | None, str | None]:
    """STS-B dev for alignment and uniformity: the `dev` rows of the data folder's stsb.jsonl, else the Hub copy's
    validation split. (None, None) with a log line when it is not there: the suite does not need it."""
    if data_dir is not None:
        source = os.path.join(data_dir, STS_FILES["STS-B"])
        rows = [row for row in read_sts_jsonl(source) if row["split"] == "dev"] if os.path.isfile(source) else []
        if not rows:
            logger.info("%s: no split 'dev' rows; alignment and uniformity not measured", source)
            return None, None
        pairs = STSPairs([r["sentence1"] for r in rows], [r["sentence2"] for r in rows], [r["score"] for r in rows])
        source += " (split dev)"
    else:
        source = STS_HUB["STS-B"]
        try:
            rows, _ = read_hub_copy("STS-B", splits=("dev",))
        except DataError as e:
            logger.warning("alignment and uniformity not measured: %s", e)
            return None, None
        pairs = STSPairs([r["sentence1"] for r in rows], [r["sentence2"] for r in rows], [r["score"] for r in rows])
        source += " (split validation)"
    if not positive_pairs(pairs):
        logger.warning("%s: no pair with a gold score above 4 of 5; alignment and uniformity not measured", source)
        return None, None
    return pairs, source
