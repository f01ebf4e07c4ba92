"""The [a, a', b, b', ...] collator (`SimCSECollator`): one forward pass in train mode gives two dropout views of
every sentence, the second optionally with ESimCSE's word repetition (`repeat_words`); `model_inputs` strips a
batch's bookkeeping for a plain forward."""

from __future__ import annotations

import hashlib
import logging
import random

import torch
from torch import Tensor

from simcse_hn.losses.targets import RowLayout

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


def repeat_words(special: list[int], rate: float, rng: random.Random, max_length: int) -> list[int]:
    """ESimCSE's word repetition (Wu et al., COLING 2022, arXiv 2109.04380) of one tokenised sentence of L tokens,
    `special` (L,) marking those the tokenizer added ([CLS], [SEP]; no padding) -> the positions, into the L tokens,
    of the repeated sentence: dup_len of its N other (subword) tokens, chosen uniformly without replacement, each
    listed twice in place (t_i t_i).

    dup_len is drawn from `rng` uniformly in [0, min(10, int(rate * L), N + 1)), L counting the special tokens, as the
    authors' code draws it for subword repetition (dup_type bpe); the paper writes [0, max(2, int(rate * N))]. A
    sentence repeated past `max_length` tokens is cut back to it before its closing special tokens ([SEP], </s>),
    which it keeps; the authors' code lets it grow."""
    words = [i for i, is_special in enumerate(special) if not is_special]
    bound = min(10, int(rate * len(special)), len(words) + 1)
    chosen = set(rng.sample(words, rng.randrange(bound))) if bound > 0 else set()
    positions = [i for i in range(len(special)) for _ in range(2 if i in chosen else 1)]
    if len(positions) > max_length:
        closing = len(special) - 1 - words[-1]
        positions = positions[: max_length - closing] + positions[len(positions) - closing :]
    return positions


SIMCSE_MAX_LENGTH = 32  # the training length of SimCSE's own runs (max_seq_length in its run_unsup_example.sh)


def truncation_note(max_length: int) -> str:
    """What a truncation warning adds: whose setting the length is, and how to change it."""
    larger = "a larger --max_seq_length keeps more of each sentence, at more memory and time per step"
    return f"{max_length} tokens is SimCSE's setting; {larger}" if max_length == SIMCSE_MAX_LENGTH else larger


def truncation_summary(truncated: int, trained: int, max_length: int) -> str:
    """The end of a run's word on truncation: how many of the sentences it trained on were cut, and why."""
    share = f"{100 * truncated / trained:.0f} %" if trained else "all"
    return (
        f"{truncated} of the {trained} sentences trained on ({share}) were longer than {max_length} tokens and were "
        f"truncated: {truncation_note(max_length)}"
    )


class SimCSECollator:
    """Tokenises each sentence once and emits 2B rows [a, a', b, b', ...]: one forward pass in train mode then
    gives two dropout views of every sentence.

    `word_repetition` > 0: each second view a' is the sentence with ESimCSE's word repetition at that rate
    (`repeat_words`; the anchor a stays as tokenised), the batch padded to its longest row. Each sentence's draw is
    seeded by (`seed`, its `text_id`) alone: a sentence gets the same repetition in every batch and process, and in
    every epoch (unsupervised SimCSE trains one), and a resumed run the same as an uninterrupted one (the data loader
    skips batches without collating them).

    Sentences longer than `max_length` tokens are truncated: the batch says how many (`num_truncated`, an int, not a
    model input: the trainer pops it and counts the batches it trains on; the data loader collates one batch ahead,
    so a count kept here would include a batch never trained on), and a warning is logged the first time. The batch
    also holds `text_ids` (2B,), each row's `text_id` (not a model input either: the duplicate diagnostics use it).
    `guide_tokenize` (simcse_hn.data.guide.Guide.tokenize): the batch also carries the guide model's own features of
    each sentence, under `guide_*` keys (B rows)."""

    def __init__(self, tokenizer, max_length: int = 32, text_column: str = "text", guide_tokenize=None,
                 word_repetition: float = 0.0, seed: int = 0):  # fmt: skip
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.text_column = text_column
        self.guide_tokenize = guide_tokenize
        self.word_repetition = word_repetition
        self.seed = seed
        self.warned = False

    @property
    def layout(self) -> RowLayout:
        return RowLayout()

    def __call__(self, features: list) -> dict[str, Tensor]:
        texts = [f[self.text_column] if isinstance(f, dict) else f for f in features]
        if len(texts) < 2:
            raise ValueError(f"a batch needs at least 2 sentences to have negatives, got {len(texts)}")
        batch, truncated = self.tokenize(texts)
        ids = [text_id(t) for t in texts]
        if self.word_repetition:
            rows = self.repeated_rows(batch, ids)  # each (2B, T'), T' >= T
        else:
            rows = {key: self.layout.rows_of_texts(value) for key, value in batch.items()}  # each (2B, T)
        text_ids = self.layout.rows_of_texts(torch.tensor(ids))  # (2B,) the same text, the same id
        return {**rows, **self.guide_features(texts), "num_truncated": truncated, "text_ids": text_ids}

    def repeated_rows(self, batch: dict[str, Tensor], ids: list[int]) -> dict[str, Tensor]:
        """`tokenize`'s batch (each (B, T), with its special_tokens_mask) and the sentences' text ids -> the rows
        [a, a', b, b', ...] with word repetition on every a', each (2B, T'), padded on the tokenizer's side."""
        special = batch.pop("special_tokens_mask").tolist()
        columns = batch["attention_mask"].shape[1]
        rows = []  # per row, the positions of its tokens among the batch's B * T
        for i, attends in enumerate(batch["attention_mask"].tolist()):
            tokens = [t for t, a in enumerate(attends) if a]
            rng = random.Random(f"word_repetition {self.seed} {ids[i]}")
            repeated = repeat_words([special[i][t] for t in tokens], self.word_repetition, rng, self.max_length)
            rows += [[i * columns + t for t in tokens], [i * columns + tokens[p] for p in repeated]]
        width = max(map(len, rows))
        left = self.tokenizer.padding_side == "left"

        def padded(row: list, value) -> list:
            return [value] * (width - len(row)) + row if left else row + [value] * (width - len(row))

        index = torch.tensor([padded(row, 0) for row in rows])  # (2B, T')
        filled = torch.tensor([padded([True] * len(row), False) for row in rows])  # (2B, T')
        pad = {"input_ids": self.tokenizer.pad_token_id, "token_type_ids": self.tokenizer.pad_token_type_id}
        return {key: torch.where(filled, value.flatten()[index], pad.get(key, 0)) for key, value in batch.items()}

    def tokenize(self, texts: list[str]) -> tuple[dict[str, Tensor], int]:
        """texts -> padded token tensors, each (len(texts), T), every text cut to its first `max_length` tokens, and
        how many were cut."""
        batch = self.tokenizer(
            texts, max_length=self.max_length, truncation=True, padding=True, return_tensors="pt",
            return_overflowing_tokens=True, return_special_tokens_mask=self.word_repetition > 0,
        )  # each (B + overflow rows, T)
        sample = batch.pop("overflow_to_sample_mapping", None)
        truncated = 0
        if sample is not None and len(sample) > len(texts):  # keep each sentence's first window
            first = torch.ones_like(sample, dtype=torch.bool)
            first[1:] = sample[1:] != sample[:-1]
            batch = {key: value[first] for key, value in batch.items()}
            truncated = int(sample[~first].unique().numel())
            if not self.warned:
                logger.warning("sentences longer than %d tokens are truncated (%d in this batch of %d): %s",
                               self.max_length, truncated, len(texts), truncation_note(self.max_length))
                self.warned = True
        return dict(batch), truncated

    def guide_features(self, texts: list[str]) -> dict[str, Tensor]:
        """The guide model's features of `texts` under `guide_*` keys (none without a guide)."""
        if self.guide_tokenize is None:
            return {}
        return {f"{GUIDE_PREFIX}{key}": value for key, value in self.guide_tokenize(texts).items()}


# --- the STS evaluation suite: files in the layout of shared/data/sts, or the public copies on the Hub ---
