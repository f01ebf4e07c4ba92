"""The contract between the training loop and a loss: how a batch's rows are laid out (`RowLayout`), which
candidates each anchor is contrasted with (`ContrastiveTargets`, with its structural facts checked when it is made)
and what the loop tells the loss about the step (`LossContext`, a closed set of typed fields).

`build_targets` makes the targets of a SimCSE step over rows [a, a', b, b', ...], `build_paired_targets` those of a
step over paired data, rows [a, p, n_1..n_k] per example (SimCSE's supervised layout), and `RowLayout.targets` the
one its layout calls for; `simcse_hn.training.step.contrastive_loss` gathers the candidates, builds the targets and
the context and calls the loss: the trainer, the tests and the benches all go through it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

FORMS = ("simcse", "symmetric")
NEG_INF = float("-inf")


@dataclass(frozen=True)
class RowLayout:
    """How a training batch's rows are laid out, said in this one place: single sentences as rows [a, a', b, b', ...],
    each text twice (two dropout views; `group_size` None: SimCSECollator), or paired examples as rows
    [a, p, n_1..n_k] per example, each text once (`group_size` = 2 + k: PairCollator). The collators make batches in
    it; the step's targets, the queue's entries, GradCache's mini-batches, the guide's rows and the counts of trained
    texts ask it."""

    group_size: int | None = None

    def __post_init__(self) -> None:
        if self.group_size is not None and self.group_size < 2:
            raise ValueError(f"a paired example has an anchor and a positive, got group_size {self.group_size}")

    @property
    def paired(self) -> bool:
        return self.group_size is not None

    @property
    def rows_per_example(self) -> int:
        """The consecutive rows that belong together, never split: a sentence's two views, an example's texts."""
        return 2 if self.group_size is None else self.group_size

    @property
    def rows_per_text(self) -> int:
        return 2 if self.group_size is None else 1

    def texts(self, num_rows: int) -> int:
        """The texts (sentences, or texts of paired examples) that `num_rows` rows hold."""
        return num_rows // self.rows_per_text

    def rows_of_texts(self, per_text: Tensor) -> Tensor:
        """Something given per text (T, ...), in the batch's text order, as rows (R, ...): each sentence's twice."""
        return per_text if self.rows_per_text == 1 else per_text.repeat_interleave(self.rows_per_text, dim=0)

    def anchors_of(self, rows: Tensor) -> Tensor:
        """Each example's first row (its anchor, or a sentence's first view) of rows (R, ...) in this layout."""
        return rows[0 :: self.rows_per_example]

    def negative_rows(self, num_rows: int, device: torch.device | str | None = None) -> Tensor:
        """(R',) int64: one row of each text that can be another anchor's negative: each sentence's first view, or each
        paired example's positive and explicit negatives (anchors never are, in SimCSE's supervised targets)."""
        rows = torch.arange(num_rows, device=device)
        if self.group_size is None:
            return rows[0 :: self.rows_per_text]
        return rows[rows % self.group_size != 0]

    def targets(
        self,
        num_rows: int,
        form: str = "symmetric",
        offset: int = 0,
        num_candidates: int | None = None,
        device: torch.device | str | None = None,
        hard_negative_weight: float = 0.0,
    ) -> ContrastiveTargets:
        """The targets of `num_rows` local rows in this layout at global rows offset..offset+num_rows of
        `num_candidates` candidates: `build_targets` (`form` says which rows are anchors) or `build_paired_targets`
        (with `hard_negative_weight` on each anchor's own explicit negatives)."""
        if self.group_size is None:
            if hard_negative_weight != 0:
                raise ValueError("hard_negative_weight needs paired data with explicit negatives (group_size > 2)")
            return build_targets(num_rows, form, offset, num_candidates, device)
        return build_paired_targets(num_rows, self.group_size, offset, num_candidates, device, hard_negative_weight)


@dataclass(frozen=True, eq=False)
class ContrastiveTargets:
    """positive_index (M,) and negative_mask (M, N) bool over the candidates; anchor_index (M,), when known, the row of
    the candidates that each anchor is (None when the anchors are a tensor of their own, as in a plain loss call);
    negative_log_weights (M, N) float or None: log c_ij added to negative j's logit l_ij, i.e. a weight c_ij on
    e^{l_ij} on top of the objective's own (SimCSE's `hard_negative_weight` on each anchor's own explicit negatives;
    zero elsewhere; entries outside negative_mask are ignored).

    Two facts are derived from these tensors when the object is made (one host synchronisation, so make targets once
    per batch shape, as `build_targets` does), never promised by the caller:
    * `anchors_are_candidates`: anchor i is candidate i for every i (M == N): the similarity matrix is then also the
      candidates' own, and symmetric.
    * `standard_negatives`: N(i) is every candidate but anchor i itself and its positive.

    Made once here too, because every loss call needs them and each costs an (M, N) pass: `negative_count` (M,)
    long, n_i = |N(i)|, `negative_bias` (M, N) float32, 0 on N(i) and -inf elsewhere, and `negative_offset`, the
    same with log c_ij on N(i) (in negative_log_weights' dtype; the bias itself without them): logits + offset are
    the masked logits, an addition whose backward is free, where `torch.where` makes another (M, N) pass.
    """

    positive_index: Tensor
    negative_mask: Tensor
    anchor_index: Tensor | None = None
    negative_log_weights: Tensor | None = None
    anchors_are_candidates: bool = field(init=False)
    standard_negatives: bool = field(init=False)
    negative_count: Tensor = field(init=False, repr=False)
    negative_bias: Tensor = field(init=False, repr=False)
    negative_offset: Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        m, n = self.negative_mask.shape
        if self.positive_index.shape != (m,):
            raise ValueError(f"positive_index {tuple(self.positive_index.shape)} does not match {m} anchors")
        if self.anchor_index is not None and self.anchor_index.shape != (m,):
            raise ValueError(f"anchor_index {tuple(self.anchor_index.shape)} does not match {m} anchors")
        if self.negative_log_weights is not None and self.negative_log_weights.shape != (m, n):
            raise ValueError(f"negative_log_weights {tuple(self.negative_log_weights.shape)} is not {(m, n)}")
        same = standard = False
        if self.anchor_index is not None:
            columns = torch.arange(n, device=self.negative_mask.device)
            same = m == n and torch.equal(self.anchor_index, columns)
            expected = (columns[None] != self.anchor_index[:, None]) & (columns[None] != self.positive_index[:, None])
            standard = torch.equal(self.negative_mask, expected)
        object.__setattr__(self, "anchors_are_candidates", bool(same))
        object.__setattr__(self, "standard_negatives", bool(standard))
        self._set_masks(self.negative_mask)

    def _set_masks(self, negative_mask: Tensor) -> None:
        """negative_mask and what is made from it (no host synchronisation)."""
        object.__setattr__(self, "negative_mask", negative_mask)
        object.__setattr__(self, "negative_count", negative_mask.sum(dim=1))
        bias = torch.where(negative_mask, 0.0, NEG_INF)  # float32: one pass
        object.__setattr__(self, "negative_bias", bias)
        offset = bias
        if self.negative_log_weights is not None:
            offset = self.negative_log_weights.masked_fill(~negative_mask, NEG_INF)
        object.__setattr__(self, "negative_offset", offset)

    @classmethod
    def standard(cls, positive_index: Tensor, num_candidates: int, anchors_are_candidates: bool) -> ContrastiveTargets:
        """Standard negatives stated by the caller, so the facts hold by construction and nothing is read back from
        the device: N(i) is every candidate but positive_index[i] and, when `anchors_are_candidates` (anchor i is
        candidate i; M == num_candidates), anchor i itself; then anchor_index is 0..M-1 and `standard_negatives`
        holds. The plain call makes these when it is given no negative_mask."""
        m = positive_index.shape[0]
        if positive_index.dim() != 1 or (anchors_are_candidates and m != num_candidates):
            raise ValueError(f"positive_index {tuple(positive_index.shape)} does not match {num_candidates} rows")
        device, rows = positive_index.device, positive_index[:, None]  # (M, 1)
        # written, not compared: an (M, N) fill and M scattered entries, where a comparison, a reduction over the
        # mask and a `torch.where` are each an (M, N) pass (at 2N = 4096 on 2 CPU cores: 55 ms against 270 ms)
        negative_mask = torch.ones((m, num_candidates), dtype=torch.bool, device=device).scatter_(1, rows, False)
        bias = torch.zeros((m, num_candidates), device=device).scatter_(1, rows, NEG_INF)  # float32, as _set_masks
        count = torch.full((m,), num_candidates - 1, device=device)  # int64, as a mask's sum
        anchor_index = None
        if anchors_are_candidates:
            anchor_index = torch.arange(m, device=device)
            negative_mask.fill_diagonal_(False)
            bias.fill_diagonal_(NEG_INF)
            count -= (positive_index != anchor_index).long()  # a positive that is the anchor itself is excluded once
        facts = {"positive_index": positive_index, "anchor_index": anchor_index, "negative_log_weights": None,
                 "anchors_are_candidates": anchors_are_candidates, "standard_negatives": anchors_are_candidates,
                 "negative_mask": negative_mask, "negative_count": count, "negative_bias": bias,
                 "negative_offset": bias}  # fmt: skip
        targets = object.__new__(cls)
        for name, value in facts.items():
            object.__setattr__(targets, name, value)
        return targets

    @property
    def num_anchors(self) -> int:
        return self.negative_mask.shape[0]

    def restrict_negatives(self, keep: Tensor) -> ContrastiveTargets:
        """These targets with N(i) restricted to the candidates where keep (M, N) bool is True, without a host
        synchronisation: made once per step (a guide model's exclusions), so the facts are not checked again. A
        restriction keeps `anchors_are_candidates` (it depends on anchor_index only) and can only make the negatives
        non-standard: `standard_negatives` is set False, which is always safe (the losses then take their general
        path)."""
        restricted = object.__new__(ContrastiveTargets)
        for name, value in vars(self).items():
            object.__setattr__(restricted, name, value)
        restricted._set_masks(self.negative_mask & keep)
        object.__setattr__(restricted, "standard_negatives", False)
        return restricted

    def with_extra_negatives(self, extra: Tensor) -> ContrastiveTargets:
        """These targets over K more candidates appended after the N (a queue's entries): extra (M, K) bool says which
        are negatives of each anchor; they are never positives, and carry no log weight. Made once per step without a
        host synchronisation; the anchors stay candidates[anchor_index], so `anchors_are_candidates` and
        `standard_negatives` no longer hold (M < N + K)."""
        extended = object.__new__(ContrastiveTargets)
        for name, value in vars(self).items():
            object.__setattr__(extended, name, value)
        if self.negative_log_weights is not None:
            zeros = self.negative_log_weights.new_zeros(extra.shape)
            object.__setattr__(extended, "negative_log_weights", torch.cat([self.negative_log_weights, zeros], 1))
        extended._set_masks(torch.cat([self.negative_mask, extra], dim=1))  # (M, N + K)
        object.__setattr__(extended, "anchors_are_candidates", False)
        object.__setattr__(extended, "standard_negatives", False)
        return extended


@dataclass(frozen=True, kw_only=True, slots=True)
class LossContext:
    """What the training loop tells a loss; every field optional, unknown fields impossible (a typo is a TypeError).

    step, max_steps: the optimizer step and the schedule's length (ProGCL's warm-up and refits).
    all_reduce: an out-of-place sum over processes (ProGCL fits one mixture from every process's pairs).
    anchor_features (M, H), candidate_features (N, H): the MLP head's inputs (UnReMix's head gradients).
    anchor_text_ids (M,), candidate_text_ids (N,): int64 ids of each row's sentence text (equal ids: the same text),
    for the diagnostics of the weight given to exact duplicates of the anchor.
    mix_permutation (K,): ProGCL-mix's permutation instead of a random draw (tests).
    """

    step: int | None = None
    max_steps: int | None = None
    all_reduce: Callable[[Tensor], Tensor] | None = None
    anchor_features: Tensor | None = None
    candidate_features: Tensor | None = None
    anchor_text_ids: Tensor | None = None
    candidate_text_ids: Tensor | None = None
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


def paired_targets(
    num_rows: int,
    group_size: int,
    offset: int = 0,
    num_candidates: int | None = None,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Targets for `num_rows` local rows of paired data, [a, p, n_1..n_k] per example (group_size = 2 + k), whose
    global indices start at `offset`, as SimCSE's supervised `cl_forward`: each anchor against its positive, every
    other example's positive and every explicit negative of the batch (its own included); anchors are never
    negatives.

    Returns anchor_rows (M,) into the local rows, positive_index (M,) and own_negatives (M, N) bool (each anchor's
    own explicit negatives) into the candidates, and negative_mask (M, N) bool; M = num_rows / group_size.
    """
    if group_size < 2 or num_rows % group_size or num_rows < 2 * group_size:
        raise ValueError(f"need rows of >= 2 examples of {group_size} rows each, got {num_rows} rows")
    num_candidates = num_rows if num_candidates is None else num_candidates
    if offset % group_size or num_candidates % group_size or offset + num_rows > num_candidates:
        raise ValueError(f"rows {offset}..{offset + num_rows} of {num_candidates} candidates split a group")
    anchor_rows = torch.arange(0, num_rows, group_size, device=device)  # (M,)
    global_rows = anchor_rows + offset
    positive_index = global_rows + 1  # (M,)
    columns = torch.arange(num_candidates, device=device)  # (N,)
    role = columns % group_size  # 0 anchor, 1 positive, >= 2 explicit negative
    negative_mask = (role != 0)[None] & (columns[None] != positive_index[:, None])  # (M, N)
    own_negatives = (columns // group_size)[None] == (global_rows // group_size)[:, None]
    own_negatives &= (role >= 2)[None]
    return anchor_rows, positive_index, own_negatives, negative_mask


@functools.lru_cache(maxsize=32)
def build_paired_targets(
    num_rows: int,
    group_size: int,
    offset: int = 0,
    num_candidates: int | None = None,
    device: torch.device | str | None = None,
    hard_negative_weight: float = 0.0,
) -> ContrastiveTargets:
    """`ContrastiveTargets` of a paired step (`paired_targets`): local rows [a, p, n_1..n_k] per example at global rows
    offset..offset+num_rows of `num_candidates` candidates. `hard_negative_weight` is SimCSE's: a log weight on each
    anchor's own explicit negatives (None when 0 or there are none). Cached per arguments, as `build_targets`."""
    anchor_rows, positive_index, own_negatives, negative_mask = paired_targets(
        num_rows, group_size, offset, num_candidates, device
    )
    log_weights = None
    if hard_negative_weight != 0 and group_size > 2:
        # (M, N) float64: exact for float64 logits, cast to the logits' dtype when used
        log_weights = torch.zeros(own_negatives.shape, dtype=torch.float64, device=device)
        log_weights.masked_fill_(own_negatives, float(hard_negative_weight))
    return ContrastiveTargets(positive_index, negative_mask, anchor_index=anchor_rows + offset,
                              negative_log_weights=log_weights)  # fmt: skip
