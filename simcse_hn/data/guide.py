"""The guide model of a false-negative guard (GISTEmbed, Solatorio 2024, arXiv:2402.16829): a frozen
sentence-transformers model (`load_guide`, `Guide`), or the model being trained (`self`: its own embeddings of the
step, detached, so no second forward), and its embeddings of a batch's rows (`guide_row_embeddings`). What the guide's
scores take out of the targets is simcse_hn.losses.false_negatives'.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor, nn

from simcse_hn.choices import GUIDE_SELF
from simcse_hn.data.collator import GUIDE_PREFIX
from simcse_hn.errors import ConfigError
from simcse_hn.losses.targets import RowLayout

logger = logging.getLogger(__name__)

SELF = GUIDE_SELF


class Guide(nn.Module):
    """A frozen sentence-transformers model as the guide: `forward(features)` -> (b, E) embeddings without gradient,
    `tokenize(texts)` -> its own features (tensors) for the collator (its tokenizer and max_seq_length, not the trained
    model's)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model.eval().requires_grad_(False)

    def tokenize(self, texts: list[str]) -> dict[str, Tensor]:
        features = self.model.preprocess(texts)
        return {key: value for key, value in features.items() if isinstance(value, Tensor)}

    def train(self, mode: bool = True) -> Guide:  # always in eval mode: the guide's scores are deterministic
        return super().train(False)

    @torch.no_grad()
    def forward(self, features: dict[str, Tensor]) -> Tensor:
        return self.model(dict(features))["sentence_embedding"]


def guide_row_embeddings(guide: nn.Module, batch: dict[str, Tensor], layout: RowLayout) -> Tensor:
    """The guide's embeddings (R, E) of a batch's rows in `layout`, without gradient: the collator tokenised each text
    once for the guide (the batch's `guide_*` keys); the layout says how texts become rows (a sentence's twice)."""
    features = {key[len(GUIDE_PREFIX) :]: value for key, value in batch.items() if key.startswith(GUIDE_PREFIX)}
    if not features:
        raise ValueError("guide_model: the batch has no guide_* features; give the collator guide_tokenize")
    return layout.rows_of_texts(guide(features))  # (texts, E) -> (R, E)


def load_guide(name_or_path: str) -> Guide:
    """The guide model of `--guide_model` (a Hub id or a local folder that sentence-transformers loads, e.g. a
    simcse-hn output folder)."""
    # a slow import: only where its models are used
    from sentence_transformers import SentenceTransformer

    try:
        model = SentenceTransformer(name_or_path, device="cpu")
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"guide_model: cannot load {name_or_path} with sentence-transformers ({first})") from None
    logger.info("guide model %s (max_seq_length %s)", name_or_path, model.max_seq_length)
    return Guide(model)
