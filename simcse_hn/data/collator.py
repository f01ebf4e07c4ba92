"""The [a, a', b, b', ...] collator (`SimCSECollator`): one forward pass in train mode gives two dropout views of
every sentence; `model_inputs` strips a batch's bookkeeping for a plain forward."""

from __future__ import annotations

import hashlib
import logging

import torch
from torch import Tensor

from simcse_hn.errors import DataError  # noqa: F401  (raised here, imported from here by callers)
from simcse_hn.losses.targets import contrastive_targets  # noqa: F401  (public API: simcse_hn.losses.targets.contrastive_targets)

logger = logging.getLogger(__name__)


GUIDE_PREFIX = "guide_"  # the batch keys of a guide model's own tokenisation (simcse_hn.data.guide)


def text_id(text: str) -> int:
    """A 63-bit id of a sentence's text, the same in every process (Python's own hash is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little") >> 1


BOOKKEEPING = ("num_truncated", "text_ids")  # collator outputs that are not model inputs (the trainer pops them)


def model_inputs(batch: dict) -> dict:
    """A collator's batch (SimCSECollator, simcse_hn.data.pairs.PairCollator) as `SimCSEModel(**...)` takes it: without
    its bookkeeping (`BOOKKEEPING`) and a guide model's `guide_*` features, which the trainer pops before the
    forward. For code that runs the encoder on a batch outside the trainer (benches, eval/negatives.py)."""
    return {key: value for key, value in batch.items() if key not in BOOKKEEPING and not key.startswith(GUIDE_PREFIX)}


class SimCSECollator:
    """Tokenises each sentence once and emits 2B rows [a, a', b, b', ...]: one forward pass in train mode then
    gives two dropout views of every sentence.

    Sentences longer than `max_length` tokens are truncated: the batch says how many (`num_truncated`, an int, not a
    model input: the trainer pops it and counts the batches it trains on; the data loader collates one batch ahead,
    so a count kept here would include a batch never trained on), and a warning is logged the first time. The batch
    also holds `text_ids` (2B,), each row's `text_id` (not a model input either: the duplicate diagnostics use it).
    `guide_tokenize` (simcse_hn.data.guide.Guide.tokenize): the batch also carries the guide model's own features of
    each sentence, under `guide_*` keys (B rows)."""

    def __init__(self, tokenizer, max_length: int = 32, text_column: str = "text", guide_tokenize=None):
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.text_column = text_column
        self.guide_tokenize = guide_tokenize
        self.warned = False

    def __call__(self, features: list) -> dict[str, Tensor]:
        texts = [f[self.text_column] if isinstance(f, dict) else f for f in features]
        if len(texts) < 2:
            raise ValueError(f"a batch needs at least 2 sentences to have negatives, got {len(texts)}")
        batch, truncated = self.tokenize(texts)
        rows = {key: value.repeat_interleave(2, dim=0) for key, value in batch.items()}  # each (2B, T)
        ids = torch.tensor([text_id(t) for t in texts]).repeat_interleave(2)  # (2B,) the same text, the same id
        return {**rows, **self.guide_features(texts), "num_truncated": truncated, "text_ids": ids}

    def tokenize(self, texts: list[str]) -> tuple[dict[str, Tensor], int]:
        """texts -> padded token tensors, each (len(texts), T), every text cut to its first `max_length` tokens, and
        how many were cut."""
        batch = self.tokenizer(
            texts, max_length=self.max_length, truncation=True, padding=True, return_tensors="pt",
            return_overflowing_tokens=True,
        )  # each (B + overflow rows, T)
        sample = batch.pop("overflow_to_sample_mapping", None)
        truncated = 0
        if sample is not None and len(sample) > len(texts):  # keep each sentence's first window
            first = torch.ones_like(sample, dtype=torch.bool)
            first[1:] = sample[1:] != sample[:-1]
            batch = {key: value[first] for key, value in batch.items()}
            truncated = int(sample[~first].unique().numel())
            if not self.warned:
                logger.warning("sentences longer than %d tokens are truncated (%d in this batch of %d)",
                               self.max_length, truncated, len(texts))
                self.warned = True
        return dict(batch), truncated

    def guide_features(self, texts: list[str]) -> dict[str, Tensor]:
        """The guide model's features of `texts` under `guide_*` keys (none without a guide)."""
        if self.guide_tokenize is None:
            return {}
        return {f"{GUIDE_PREFIX}{key}": value for key, value in self.guide_tokenize(texts).items()}


# --- the STS evaluation suite: files in the layout of shared/data/sts, or the public copies on the Hub ---
