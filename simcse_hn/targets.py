"""The contract between the training loop and a loss: which candidates each anchor is contrasted with
(`ContrastiveTargets`, with its structural facts checked when it is made) and what the loop tells the loss about the
step (`LossContext`, a closed set of typed fields).

`build_targets` makes the targets of a SimCSE step; `simcse_hn.trainer.contrastive_loss` gathers the candidates,
builds the targets and the context and calls the loss: the trainer, the tests and the benches all go through it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

FORMS = ("simcse", "symmetric")


@dataclass(frozen=True, eq=False)
class ContrastiveTargets:
    """positive_index (M,) and negative_mask (M, N) bool over the candidates; anchor_index (M,), when known, the row of
    the candidates that each anchor is (None when the anchors are a tensor of their own, as in a plain loss call).

    Two facts are derived from these tensors when the object is made (one host synchronisation, so make targets once
    per batch shape, as `build_targets` does), never promised by the caller:
    * `anchors_are_candidates`: anchor i is candidate i for every i (M == N): the similarity matrix is then also the
      candidates' own, and symmetric.
    * `standard_negatives`: N(i) is every candidate but anchor i itself and its positive.

    Made once here too, because every loss call needs them and each costs an (M, N) pass: `negative_count` (M,)
    long, n_i = |N(i)|, and `negative_bias` (M, N) float32, 0 on N(i) and -inf elsewhere (logits + bias are the
    masked logits, an addition whose backward is free, where `torch.where` makes another (M, N) pass).
    """

    positive_index: Tensor
    negative_mask: Tensor
    anchor_index: Tensor | None = None
    anchors_are_candidates: bool = field(init=False)
    standard_negatives: bool = field(init=False)
    negative_count: Tensor = field(init=False, repr=False)
    negative_bias: Tensor = field(init=False, repr=False)

    def __post_init__(self):
        m, n = self.negative_mask.shape
        if self.positive_index.shape != (m,):
            raise ValueError(f"positive_index {tuple(self.positive_index.shape)} does not match {m} anchors")
        if self.anchor_index is not None and self.anchor_index.shape != (m,):
            raise ValueError(f"anchor_index {tuple(self.anchor_index.shape)} does not match {m} anchors")
        same = standard = False
        if self.anchor_index is not None:
            columns = torch.arange(n, device=self.negative_mask.device)
            same = m == n and torch.equal(self.anchor_index, columns)
            expected = (columns[None] != self.anchor_index[:, None]) & (columns[None] != self.positive_index[:, None])
            standard = torch.equal(self.negative_mask, expected)
        object.__setattr__(self, "anchors_are_candidates", bool(same))
        object.__setattr__(self, "standard_negatives", bool(standard))
        object.__setattr__(self, "negative_count", self.negative_mask.sum(dim=1))
        bias = torch.zeros(self.negative_mask.shape, device=self.negative_mask.device)
        object.__setattr__(self, "negative_bias", bias.masked_fill_(~self.negative_mask, float("-inf")))

    @property
    def num_anchors(self) -> int:
        return self.negative_mask.shape[0]


@dataclass(frozen=True, kw_only=True, slots=True)
class LossContext:
    """What the training loop tells a loss; every field optional, unknown fields impossible (a typo is a TypeError).

    step, max_steps: the optimizer step and the schedule's length (ProGCL's warm-up and refits).
    all_reduce: an out-of-place sum over processes (ProGCL fits one mixture from every process's pairs).
    anchor_features (M, H), candidate_features (N, H): the MLP head's inputs (UnReMix's head gradients).
    mix_permutation (K,): ProGCL-mix's permutation instead of a random draw (tests).
    """

    step: int | None = None
    max_steps: int | None = None
    all_reduce: Callable[[Tensor], Tensor] | None = None
    anchor_features: Tensor | None = None
    candidate_features: Tensor | None = None
    mix_permutation: Tensor | None = None


def contrastive_targets(
    num_rows: int,
    form: str = "symmetric",
    offset: int = 0,
    num_candidates: int | None = None,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Targets for `num_rows` local rows [a, a', b, b', ...] whose global indices start at `offset`.

    Returns anchor_rows (M,) into the local rows, positive_index (M,) into the candidates, and negative_mask
    (M, num_candidates) bool. `symmetric`: every row is an anchor, negatives are all rows but itself and its
    pair. `simcse`: anchors are the first views, candidates their second views (the paper's loss).
    """
    if num_rows % 2 or num_rows < 4:
        raise ValueError(f"need an even number of rows from >= 2 sentences, got {num_rows} rows")
    num_candidates = num_rows if num_candidates is None else num_candidates
    if offset + num_rows > num_candidates:
        raise ValueError(f"rows {offset}..{offset + num_rows} exceed {num_candidates} candidates")
    if form == "symmetric":
        anchor_rows = torch.arange(num_rows, device=device)
    elif form == "simcse":
        anchor_rows = torch.arange(0, num_rows, 2, device=device)
    else:
        raise ValueError(f"unknown contrast form {form!r}; use one of {FORMS}")
    global_rows = anchor_rows + offset  # (M,)
    positive_index = global_rows ^ 1  # (M,)
    columns = torch.arange(num_candidates, device=device)  # (N,)
    negative_mask = (columns[None] != global_rows[:, None]) & (columns[None] != positive_index[:, None])  # (M, N)
    if form == "simcse":
        negative_mask &= (columns % 2 == 1)[None]
    return anchor_rows, positive_index, negative_mask


@functools.lru_cache(maxsize=32)
def build_targets(
    num_rows: int,
    form: str = "symmetric",
    offset: int = 0,
    num_candidates: int | None = None,
    device: torch.device | str | None = None,
) -> ContrastiveTargets:
    """`ContrastiveTargets` of a SimCSE step: local rows [a, a', b, b', ...] at global rows offset..offset+num_rows of
    `num_candidates` candidates. Cached per arguments: a training run builds (and checks) its targets once."""
    anchor_rows, positive_index, negative_mask = contrastive_targets(num_rows, form, offset, num_candidates, device)
    return ContrastiveTargets(positive_index, negative_mask, anchor_index=anchor_rows + offset)
