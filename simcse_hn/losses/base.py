"""Shared machinery of the contrastive losses (docs/losses.md sections 1, 2 and 6).

It opens with plain InfoNCE as a reader writes it (`plain_infonce`: normalise, matmul / temperature, mask,
cross-entropy). `ContrastiveLoss` computes that loss, and every objective's, from plain InfoNCE's reductions shared
with the objective, through the fast paths of losses/fast_paths.py (the same values, fewer (M, N) passes).

Every loss sees embeddings and index tensors only: `anchors` (M, D), `candidates` (N, D), `positive_index` (M,)
into the candidates, `negative_mask` (M, N) bool. Similarities and everything after them are computed in float32
or wider. Nothing here synchronises with the host: no `.item()`, no numpy, no Python branch on tensor values,
so every loss runs under `torch.compile(fullgraph=True)`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from simcse_hn.losses.fast_paths import MaskedLogSumExp, SelfLogits, WeightedLogSumExp, masked_logsumexp
from simcse_hn.losses.options import NoOptions, ObjectiveOptions
from simcse_hn.losses.targets import NEG_INF, ContrastiveTargets, LossContext


def plain_infonce(
    anchors: Tensor, candidates: Tensor, positive_index: Tensor, negative_mask: Tensor, temperature: float
) -> Tensor:
    """Plain InfoNCE (arXiv:1807.03748; SimCSE's loss, arXiv:2104.08821), as a reader writes it: the mean over the
    anchors of the cross-entropy of each anchor's positive among its positive and its negatives N(i), on cosine
    similarities / temperature. anchors (M, D), candidates (N, D), positive_index (M,), negative_mask (M, N) bool
    (N(i), without the positive). -> () in the embeddings' dtype. `ContrastiveLoss` below computes the same loss and
    gradients (tests/test_losses_hard.py holds them equal) through the fast paths (losses/fast_paths.py)."""
    a = F.normalize(anchors, dim=-1)  # (M, D)
    c = F.normalize(candidates, dim=-1)  # (N, D)
    logits = a @ c.T / temperature  # (M, N)
    candidates_of = negative_mask.clone()
    rows = torch.arange(len(positive_index), device=positive_index.device)  # (M,)
    candidates_of[rows, positive_index] = True  # the positive and N(i); no other candidate
    return F.cross_entropy(logits.masked_fill(~candidates_of, NEG_INF), positive_index)


# --- the machinery every objective shares: the fast paths (losses/fast_paths.py) are called from here ---

# `NegativeWeights.make` and `LossOutput.weights_fn`: (rows, a slice; all by default) -> the weights of those rows
WeightsMaker = Callable[..., Tensor]


@dataclass(eq=False)
class LossOutput:
    """`loss`: differentiable scalar; `metrics`: detached scalar diagnostics; `weights`: (M, N) weights applied
    to the negatives (zero outside `negative_mask`), None for plain InfoNCE, made from `weights_fn` when first read
    (a training step never reads them: two (M, N) passes saved per call)."""

    loss: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)
    weights_fn: WeightsMaker | None = field(default=None, repr=False)

    @functools.cached_property
    def weights(self) -> Tensor | None:
        return None if self.weights_fn is None else self.weights_fn()


def unit_rows(x: Tensor, dtype: torch.dtype) -> Tensor:
    """Rows of x (K, D) scaled to unit norm (a zero row stays zero), in `dtype`. -> (K, D)"""
    x = x.to(dtype)
    return cast(Tensor, x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12))


def cosine_similarities(anchors: Tensor, candidates: Tensor) -> Tensor:
    """(M, D), (N, D) -> (M, N) cosine similarities in float32 (float64 stays float64), autocast disabled."""
    dtype = torch.float64 if anchors.dtype == torch.float64 else torch.float32
    with torch.autocast(device_type=anchors.device.type, enabled=False):
        a = anchors.to(dtype)
        c = candidates.to(dtype)
        a = a / a.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        c = c / c.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        return cast(Tensor, a @ c.T)


def positive_logits(logits: Tensor, positive_index: Tensor) -> Tensor:
    """(M, N), (M,) -> (M,)"""
    return logits.gather(1, positive_index[:, None]).squeeze(1)


class NegativeWeights(NamedTuple):
    """What an objective may return instead of (M, N) log-weights when it has the weights' diagnostics at hand:
    `make(rows)` -> the weights of the anchors `rows` (a slice; all by default), zero outside N(i) (made for the
    diagnostics' anchors, and for all when `LossOutput.weights` is read); `max` () the largest weight and `entropy`
    () the mean over the anchors with negatives of the normalised weights' entropy (`weight_stats`)."""

    make: WeightsMaker
    max: Tensor
    entropy: Tensor


class PlainReductions(NamedTuple):
    """Plain InfoNCE's pieces of one loss call, which the hard-negative objectives share.

    pos (M,) = l_ip; lse (M,) = log sum_{j in N(i)} e^{l_ij}; count (M,) = n_i = |N(i)| in the logits' dtype;
    exp (M, N) = e^{masked - shift} and shift (M, 1) the row maxima (without gradient; None when not kept), which
    `weighted_lse` reuses; logits (M, N) and offset (M, N) (0 or log c_ij on N(i), -inf elsewhere), from which
    `masked` = l_ij on N(i), -inf elsewhere, is made when an objective asks for it (most never do: one (M, N) pass
    and allocation saved)."""

    pos: Tensor
    lse: Tensor
    count: Tensor  # type: ignore[assignment]  # a field named like tuple.count, the method it shadows: kept (API)
    logits: Tensor
    offset: Tensor | None = None
    exp: Tensor | None = None
    shift: Tensor | None = None
    mask: Tensor | None = None

    @property
    def masked(self) -> Tensor:
        """(M, N) l_ij (+ log c_ij) on N(i), -inf elsewhere; a new tensor per read."""
        if self.offset is None:
            return torch.where(cast(Tensor, self.mask), self.logits, NEG_INF)  # plain_reductions sets mask
        return self.logits + self.offset.to(self.logits.dtype)

    def loss(self) -> Tensor:
        """Plain InfoNCE per anchor: log(e^{l_ip} + sum_{j in N(i)} e^{l_ij}) - l_ip. (M,)"""
        return torch.logaddexp(self.pos, self.lse) - self.pos

    def weighted_lse(self, weights: Tensor) -> Tensor:
        """log sum_{j in N(i)} w_ij e^{l_ij} (M,) for weights (M, N) >= 0, finite everywhere (their values outside
        N(i) do not count). From the kept exponentials: one (M, N) pass in the forward, two in the backward (to the
        logits and, when they need it, to the weights); e is 0 outside N(i), so the logits' gradient is too."""
        return self.weighted_and_plain_lse(weights)[0]

    def weighted_and_plain_lse(self, weights: Tensor) -> tuple[Tensor, Tensor]:
        """`weighted_lse` and plain InfoNCE's `lse` again, both (M,) from one autograd node: an objective that hands
        the second to the base as `ObjectiveOutput.plain_lse` (the fallback's) saves the (M, N) pass of zeros that
        the fallback's gradient makes through `lse` while the objective is finite, and an addition."""
        if self.exp is None:
            return torch.logsumexp(self.masked + weights.log(), dim=1), self.lse
        return cast("tuple[Tensor, Tensor]", WeightedLogSumExp.apply(self.logits, weights, self.exp, self.shift))


def plain_reductions(
    logits: Tensor,
    positive_index: Tensor,
    negative_mask: Tensor,
    count: Tensor | None = None,
    bias: Tensor | None = None,
    pos: Tensor | None = None,
) -> PlainReductions:
    """(M, N) logits, (M,) positive_index, (M, N) negative_mask -> PlainReductions. Known pieces make it cheaper:
    count (M,) = |N(i)|, bias (M, N) = 0 on N(i) and -inf elsewhere (`ContrastiveTargets.negative_bias`), pos (M,)
    the positives' logits (computed from the embeddings, they need no (M, N) gather and its backward)."""
    count = (negative_mask.sum(dim=1) if count is None else count).to(logits.dtype)  # (M,)
    pos = positive_logits(logits, positive_index) if pos is None else pos
    if bias is None:
        masked = torch.where(negative_mask, logits, NEG_INF)  # (M, N)
        lse, e, shift = MaskedLogSumExp.apply(masked, None)
        return PlainReductions(pos, lse, count, logits, None, e, shift, negative_mask)
    bias = bias if bias.dtype == logits.dtype else bias.to(logits.dtype)
    lse, e, shift = MaskedLogSumExp.apply(logits, bias)  # logits + bias is made inside, in e's memory
    return PlainReductions(pos, lse, count, logits, bias, e, shift, negative_mask)


def weighted_loss(
    logits: Tensor, positive_index: Tensor, negative_mask: Tensor, log_weights: Tensor | None = None
) -> Tensor:
    """Form (W) per anchor: cross-entropy over {l_ip} and {l_ij + log w_ij : j in N(i)}. -> (M,)

    `log_weights=None` is plain InfoNCE. Candidates that are neither the positive nor negatives are ignored.
    """
    pos = positive_logits(logits, positive_index)  # (M,)
    neg = logits if log_weights is None else logits + log_weights
    neg = torch.where(negative_mask, neg, NEG_INF)  # (M, N)
    return torch.logaddexp(pos, torch.logsumexp(neg, dim=1)) - pos


def debiased_from_log_r(
    pos: Tensor, log_r: Tensor, n: Tensor, tau_plus: float, temperature: float
) -> tuple[Tensor, Tensor]:
    """Form (D) per anchor, in log space, from its row sums: pos = l_ip (M,), log_r = log R_i (M,) with
    R_i = sum_{j in N(i)} w_ij e^{l_ij}, n = |N(i)| (M,). -> loss (M,), clamped (M,) bool.

    Ng_i = max((R_i - tau_plus n e^{l_ip}) / (1 - tau_plus), n e^{-1/t});  L_i = log(e^{l_ip} + Ng_i) - l_ip.
    """
    log_n = torch.log(n)
    if tau_plus > 0:
        # log(R - tau_plus n e^{l_p}) = log R + log(1 - e^a),  a = log(tau_plus n) + l_p - log R  (defined for a < 0)
        a = math.log(tau_plus) + log_n + pos - log_r
        valid = a < 0
        a_safe = torch.where(valid, a, -1.0)  # keeps the unused branch's gradient finite
        log_diff = torch.where(valid, log_r + torch.log(-torch.expm1(a_safe)), NEG_INF)
        log_ng_raw = log_diff - math.log1p(-tau_plus)
    else:
        log_ng_raw = log_r
    log_floor = log_n - 1.0 / temperature
    clamped = log_ng_raw < log_floor
    log_ng = torch.maximum(log_ng_raw, log_floor)
    return torch.logaddexp(pos, log_ng) - pos, clamped


def mean_over_anchors_with_negatives(values: Tensor, count: Tensor) -> Tensor:
    """The mean of values (M,) over the anchors with n_i = count_i > 0 (a guide model may leave an anchor none;
    its value, NaN included, is left out); 0 when no anchor has negatives. -> () float32"""
    has = count > 0
    return torch.where(has, values, 0.0).sum().float() / has.sum().clamp_min(1)


def weight_stats(
    weights: Tensor | None, log_weights: Tensor | None, negative_mask: Tensor, count: Tensor | None = None
) -> dict[str, Tensor]:
    """Max weight and mean entropy (nats) of the normalised weights w_ij / sum_k w_ik over N(i), the mean over the
    anchors that have negatives.

    weights: (M, N), zero outside N(i), and log_weights their logs (used where w > 0), or both None (uniform; then
    the entropy is log n_i, from `count` (M,) when given). The entropy is log S_i - sum_j w_ij log w_ij / S_i with
    S_i = sum_j w_ij: no (M, N) normalised copy."""
    n = negative_mask.sum(dim=1) if count is None else count  # (M,)
    if weights is None:
        entropy = mean_over_anchors_with_negatives(n.to(torch.float32).log(), n)
        return {"neg_weight_max": torch.ones((), device=negative_mask.device), "neg_weight_entropy": entropy}
    w = weights.detach().float()
    w_log_w = torch.where(w > 0, w * cast(Tensor, log_weights).detach().float(), 0.0)  # given with weights
    total = w.sum(dim=1)  # (M,)
    entropy = mean_over_anchors_with_negatives(total.log() - w_log_w.sum(dim=1) / total, n)
    return {"neg_weight_max": w.max(), "neg_weight_entropy": entropy}


def _masked_weight_stats(
    log_weights: Tensor, negative_mask: Tensor, count: Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """`weight_stats` from the log-weights alone (any value outside N(i)); count (M,) = n_i. -> weights (M, N) in
    the log-weights' dtype, zero outside N(i), and the stats (float32). w log w is xlogy(w, w), so w = 0 needs no
    mask of its own."""
    w = torch.where(negative_mask, log_weights.detach(), NEG_INF).exp_()  # (M, N)
    total = w.sum(dim=1)  # (M,)
    entropy = mean_over_anchors_with_negatives(total.log() - torch.xlogy(w, w).sum(dim=1) / total, count)
    return w, {"neg_weight_max": w.max().float(), "neg_weight_entropy": entropy}


class NonFiniteGradients:
    """What the loss's gradient guards (`drop_nonfinite_grad`) dropped since the last read: rows per term, and the
    last optimizer step with a drop, counted on the device in the backward (no host synchronisation); `take()` reads
    them once (the trainer, when it logs) and starts again. Drops in a step whose loss fell back to InfoNCE are not
    counted: that step's objective branch gets no gradient anyway (`nonfinite_fallback` counts it)."""

    def __init__(self) -> None:
        self.rows: dict[str, Tensor] = {}
        self.last_step: Tensor | None = None

    def add(self, term: str, dropped: Tensor, step: int | None) -> None:
        self.rows[term] = dropped if term not in self.rows else self.rows[term] + dropped
        if step is not None:
            last = self.last_step if self.last_step is not None else torch.full_like(dropped, -1)
            self.last_step = torch.where(dropped > 0, torch.full_like(dropped, step), last)

    def take(self) -> tuple[dict[str, int], int | None]:
        """-> (rows dropped per term, those with any; the last step with a drop, or None), and a fresh count."""
        rows = {term: int(count) for term, count in self.rows.items() if int(count)}
        step = int(self.last_step) if self.last_step is not None and rows else None
        self.rows, self.last_step = {}, None
        return rows, (step if step is None or step >= 0 else None)


@dataclass
class _GuardCall:
    """One loss call's guards: where they count, the call's step and, once known, whether its loss fell back."""

    counter: NonFiniteGradients
    step: int | None
    fell_back: Tensor | None = None


_ACTIVE: list[_GuardCall] = []  # the loss calls running now (innermost last): guards made in them count there


class _DropNonFiniteGrad(torch.autograd.Function):
    """Identity whose backward passes the gradient on for each row (each element of a vector) whose gradient is
    finite (its sum is), and zeros for the others, counted in the loss call's `NonFiniteGradients` under `term`."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, call: _GuardCall | None, term: str) -> Tensor:
        ctx.call, ctx.term = call, term
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        # finite iff the sum is (NaN and inf propagate): one read pass instead of isfinite's write and all's read.
        # A finite row whose sum overflows float32 (|sum| > 3e38) would be dropped too.
        ok = torch.isfinite(grad.sum(dim=-1) if grad.dim() > 1 else grad)
        kept = torch.where(ok.reshape(ok.shape + (1,) * (grad.dim() - ok.dim())), grad, 0.0)
        call: _GuardCall | None = ctx.call
        if call is not None:
            dropped = (~ok).sum()
            if call.fell_back is not None:
                dropped = torch.where(call.fell_back, torch.zeros_like(dropped), dropped)
            call.counter.add(ctx.term, dropped, call.step)
        return kept, None, None


def drop_nonfinite_grad(x: Tensor, term: str = "objective") -> Tensor:
    """Guards a tensor that feeds an objective: a row whose gradient is not finite (an objective's 0 * inf, an
    infinite derivative where a loss is exactly 0) gets none, the other rows keep theirs, and the drop is counted
    (`ContrastiveLoss.nonfinite_grads`, logged as `nonfinite_grad_rows` with a warning naming the step and `term`).
    When the loss falls back, the objective's branch receives a zero gradient, but its backward can still turn 0 * inf
    into NaN; this keeps that NaN out of the embeddings. Not counted in a loss compiled by torch.compile."""
    # under torch.compile the backward keeps no Python state: rows are dropped, not counted
    call = _ACTIVE[-1] if _ACTIVE and not torch.compiler.is_compiling() else None
    return cast(Tensor, _DropNonFiniteGrad.apply(x, call, term))


@dataclass(frozen=True, kw_only=True, eq=False)
class ObjectiveInput:
    """What an objective sees of one loss call (built by the base, never kept between calls).

    logits (M, N) = cos / t, without the targets' negative_log_weights (those are in `plain`'s masked logits, lse
    and exponentials); cosines (M, N) = t logits when the objective's `needs_cosines`, else None; anchors (M, D) and
    candidates (N, D) as given (not normalised); `plain`: plain InfoNCE's reductions of the logits (computed once,
    shared with the fallback), each guarded so that a non-finite gradient from the objective's branch is dropped;
    `unguarded`: the fallback's own tensors, for an objective that guards what it makes from them instead (an (M,)
    result rather than the (M, N) masked logits) with `drop_nonfinite_grad`."""

    logits: Tensor
    targets: ContrastiveTargets
    context: LossContext
    anchors: Tensor
    candidates: Tensor
    temperature: float
    plain: PlainReductions
    unguarded: PlainReductions
    cosines: Tensor | None = None

    @property
    def negative_mask(self) -> Tensor:
        """(M, N) bool: N(i)."""
        return self.targets.negative_mask


@dataclass(frozen=True, kw_only=True, eq=False)
class ObjectiveOutput:
    """An objective's result: `loss` (M,) per anchor (the base takes the mean); the weights it applied to the
    negatives for the diagnostics, as `log_weights` (M, N) (any value outside N(i)) or, when it has their statistics
    at hand more cheaply, `weights` (`NegativeWeights`); neither for uniform weights; `metrics`: extra diagnostics
    (scalars, detached by the base); `plain_lse`: plain InfoNCE's lse (M,) as an output of the objective's own node
    (`PlainReductions.weighted_and_plain_lse`), for the fallback, or None (the shared reductions' own)."""

    loss: Tensor
    log_weights: Tensor | None = None
    weights: NegativeWeights | None = None
    metrics: dict[str, Tensor] = field(default_factory=dict)
    plain_lse: Tensor | None = None


class ContrastiveLoss(nn.Module):
    """Base class of every objective: a subclass describes itself (its class attributes, read by the configuration,
    the card, the sentence-transformers wrapper, the diagnostics and the benches) and computes a per-anchor loss.

    Writing one (docs/writing-an-objective.md): subclass `ReweightingLoss` and write `log_weights` when the
    objective reweights the negatives (the common case), else override `per_anchor` (the general case). Options are
    a frozen dataclass (`Options`, made with `options.option`), read inside the objective as `self.options.beta`.

    Two calls, one computation:
    * `loss_fn(anchors, candidates, positive_index, negative_mask=None, context=None)`: the plain call. A mask is
      read as given (no structure assumed); without one the negatives are the standard ones (`forward`), a stated
      structure that takes the shortcuts below.
    * `loss_fn.compute(candidates, targets, context=None)`: the training loop's call (`simcse_hn.training.step
      .contrastive_loss`). The anchors are the candidates' rows `targets.anchor_index`, so the targets' checked facts
      (`anchors_are_candidates`, `standard_negatives`) hold for the tensors the loss sees and a loss may use them.

    Fallback: a non-finite objective is replaced by plain InfoNCE for the step (selected with `torch.where`, no host
    synchronisation) and counted in `metrics["nonfinite_fallback"]`; the objective's inputs are guarded, so a
    non-finite gradient from its branch is dropped and the step keeps InfoNCE's. A finite loss whose gradient is not
    finite in some rows (an infinite derivative where an anchor's loss is exactly 0) loses those rows' gradient only,
    counted on the device in `nonfinite_grads` (the trainer logs `nonfinite_grad_rows` and warns). The base computes
    plain InfoNCE's reductions once per call and hands them to the objective (`ObjectiveInput.plain`): the fallback
    costs no second (M, N) pass. The temperature is folded into the normalised anchors, logits = (a / t) c^T.
    """

    # --- what the objective is: every other part of simcse-hn reads these ---
    name: ClassVar[str] = ""  # --loss NAME, the registry's key (a user's objective: its "module:Class" when empty)
    title: ClassVar[str] = ""  # display name ("HCL"); also SimCSE{title}Loss in simcse_hn.export.st_losses
    Options: ClassVar[type[ObjectiveOptions]] = NoOptions
    flag_prefix: ClassVar[str | None] = None  # configuration flags --{prefix}_{option}; None: the name
    summary: ClassVar[str] = ""  # a paragraph for the model card and the docs
    citation: ClassVar[str] = ""  # BibTeX of the method
    class_prior: ClassVar[str | None] = None  # the option that is form (D)'s class prior tau+, if any
    setting: ClassVar[tuple[str, ...]] = ()  # options that describe a setting in messages, besides the prior
    forms: ClassVar[tuple[str, ...]] = ("symmetric",)  # the contrast forms it is defined on
    variants: ClassVar[dict[str, dict[str, Any]]] = {}  # named settings the benches and tests run ({"mix": {...}})
    sentence_transformers_options: ClassVar[dict[str, Any]] = {}  # defaults in a SentenceTransformer (no MLP head)
    # --- what it needs from the step ---
    needs_cosines: ClassVar[bool] = False  # ObjectiveInput.cosines (one (M, N) pass; the logits are always there)
    uses_schedule: ClassVar[bool] = False  # reads context.step and context.max_steps
    has_fallback: ClassVar[bool] = True  # False: the objective is plain InfoNCE itself, computed once
    needs_head_inputs: bool = False  # context.anchor_features / candidate_features (the MLP head's inputs)

    def __init__(self, temperature: float = 0.05, **options: Any):
        super().__init__()
        if not 0 < temperature < math.inf:
            raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
        self.temperature = float(temperature)
        self.nonfinite_grads = NonFiniteGradients()  # what the gradient guards dropped, read when the trainer logs
        self.options = self.Options.from_mapping(options, where=f"{self.display_name()}'s options")

    @classmethod
    def display_name(cls) -> str:
        return cls.title or cls.name or cls.__name__

    def prior(self) -> float:
        """The class prior tau+ of form (D) (0 when the objective has none)."""
        return 0.0 if self.class_prior is None else float(getattr(self.options, self.class_prior))

    @classmethod
    def describe_batch(cls, metrics: dict[str, float]) -> str | None:
        """A sentence on what the objective did on one batch, from its metrics (eval/negatives.py), or None."""
        return None

    def per_anchor(self, batch: ObjectiveInput) -> ObjectiveOutput:
        """The general case: the loss of each anchor (M,) and what it applied to the negatives."""
        raise NotImplementedError(f"{type(self).__name__} must define per_anchor (or log_weights: ReweightingLoss)")

    def forward(
        self,
        anchors: Tensor | None,
        candidates: Tensor,
        positive_index: Tensor,
        negative_mask: Tensor | None = None,
        context: LossContext | None = None,
        *,
        anchor_index: Tensor | None = None,
    ) -> LossOutput:
        """The plain call. negative_mask (M, N) bool: N(i). None: the standard negatives, every candidate but
        anchor i's positive and, when `anchors is candidates` (the same tensor: anchor i is candidate i), anchor i
        itself; the call then states the structure and takes the training loop's shortcuts, with nothing read back
        from the device. A mask given with `anchors is candidates` is compared once with the standard one (one
        (M, N) pass and one read from the device), so the same negatives take the same shortcuts; with anchors of
        their own a mask is read as given (the general path).

        `anchor_index` (M,) int64 says by an index, not by passing the same tensor, that anchor i is row
        anchor_index[i] of the candidates (standard negatives then leave out that row). The targets are made with
        it, so their facts are derived from the index and the mask (`ContrastiveTargets`: one read from the device)
        and the call takes every shortcut they allow. anchors None: the anchors are candidates[anchor_index]
        (`compute`), and their gradient reaches the candidates. anchors a tensor: it must hold those rows (checked:
        one (M, D) comparison) and keeps a gradient of its own; what carries no gradient (an objective's scores)
        uses the structure."""
        if anchor_index is not None:
            return self._indexed(anchors, candidates, positive_index, negative_mask, context, anchor_index)
        if anchors is None:
            raise ValueError("anchors: None needs anchor_index, the rows of the candidates that are the anchors")
        same = anchors is candidates
        if negative_mask is None:
            targets = ContrastiveTargets.standard(positive_index, candidates.shape[0], anchors_are_candidates=same)
        elif same:
            targets = ContrastiveTargets.standard(positive_index, candidates.shape[0], anchors_are_candidates=True)
            if not torch.equal(negative_mask, targets.negative_mask):
                targets = ContrastiveTargets(positive_index, negative_mask, anchor_index=targets.anchor_index)
        else:
            targets = ContrastiveTargets(positive_index, negative_mask)
        return self._loss(anchors, candidates, targets, context)

    def _indexed(
        self,
        anchors: Tensor | None,
        candidates: Tensor,
        positive_index: Tensor,
        negative_mask: Tensor | None,
        context: LossContext | None,
        anchor_index: Tensor,
    ) -> LossOutput:
        """The plain call with `anchor_index` (`forward`)."""
        if negative_mask is None:  # standard: every candidate but the anchor's own row and its positive
            rows = torch.stack([anchor_index, positive_index], dim=1)  # (M, 2)
            size = (rows.shape[0], candidates.shape[0])
            negative_mask = torch.ones(size, dtype=torch.bool, device=candidates.device).scatter_(1, rows, False)
        targets = ContrastiveTargets(positive_index, negative_mask, anchor_index=anchor_index)
        if anchors is None:
            return self.compute(candidates, targets, context)
        rows_of_candidates = anchors.shape == (targets.num_anchors, candidates.shape[1])
        if not (rows_of_candidates and torch.equal(anchors, candidates.index_select(0, anchor_index))):
            raise ValueError(
                "anchors: not the candidates' rows anchor_index (pass anchors=None to take them from the candidates)"
            )
        return self._loss(anchors, candidates, targets, self._anchor_context(context, targets))

    def compute(
        self, candidates: Tensor, targets: ContrastiveTargets, context: LossContext | None = None
    ) -> LossOutput:
        """candidates (N, D); the anchors are candidates[targets.anchor_index] (the tensor itself when
        `targets.anchors_are_candidates`), and `context.candidate_features` gives the anchors' features likewise."""
        if targets.anchor_index is None:
            raise ValueError("compute() needs targets with anchor_index; use loss_fn(anchors, candidates, ...)")
        anchors = candidates if targets.anchors_are_candidates else candidates[targets.anchor_index]
        return self._loss(anchors, candidates, targets, self._anchor_context(context, targets))

    @staticmethod
    def _anchor_context(context: LossContext | None, targets: ContrastiveTargets) -> LossContext | None:
        """The context with the anchors' rows of the candidates' per-row extras (features, text ids) where it has
        the candidates' only; targets with anchor_index."""
        if context is None:
            return None
        same, index = targets.anchors_are_candidates, cast(Tensor, targets.anchor_index)
        derived: dict[str, Any] = {}  # Tensor values; Any: dataclasses.replace checks each field's type
        for anchor_key, candidate_key in (("anchor_features", "candidate_features"),
                                          ("anchor_text_ids", "candidate_text_ids")):  # fmt: skip
            rows = getattr(context, candidate_key)
            if rows is not None and getattr(context, anchor_key) is None:
                derived[anchor_key] = rows if same else rows[index]
        return dataclasses.replace(context, **derived) if derived else context

    def _loss(
        self, anchors: Tensor, candidates: Tensor, targets: ContrastiveTargets, context: LossContext | None
    ) -> LossOutput:
        # similarities and everything after them in float32 or wider: autocast would lower every matrix product
        with torch.autocast(device_type=anchors.device.type, enabled=False):
            return self._loss_without_autocast(anchors, candidates, targets, context)

    def _loss_without_autocast(
        self, anchors: Tensor, candidates: Tensor, targets: ContrastiveTargets, context: LossContext | None
    ) -> LossOutput:
        context = LossContext() if context is None else context
        positive_index, negative_mask, count = targets.positive_index, targets.negative_mask, targets.negative_count
        dtype = torch.float64 if anchors.dtype == torch.float64 else torch.float32
        c_hat = unit_rows(candidates, dtype)  # (N, D)
        if anchors is candidates:
            a_hat = c_hat
            logits, scaled = SelfLogits.apply(c_hat, self.temperature)  # (N, N), (N, D)
        else:
            a_hat = unit_rows(anchors, dtype)  # (M, D)
            scaled = a_hat / self.temperature  # (M, D): logits = scaled c^T, no (M, N) division
            logits = scaled @ c_hat.T  # (M, N)
        pos = (scaled * c_hat.index_select(0, positive_index)).sum(dim=1)  # (M,) the positives' logits
        sim = logits * self.temperature if self.needs_cosines else None  # (M, N); its backward runs only if used
        # the masked logits carry the targets' negative_log_weights (`negative_offset`); `logits` do not
        plain = plain_reductions(logits, positive_index, negative_mask, count, targets.negative_offset, pos)
        call = _GuardCall(self.nonfinite_grads, context.step)
        _ACTIVE.append(call)  # the guards made in this call (the objective's own too) count in its loss's counter
        try:
            if self.has_fallback:
                guarded = drop_nonfinite_grad(logits, "logits")
                shared = plain._replace(pos=drop_nonfinite_grad(plain.pos, "plain.pos"),
                                        lse=drop_nonfinite_grad(plain.lse, "plain.lse"), logits=guarded)  # fmt: skip
                sim = None if sim is None else drop_nonfinite_grad(sim, "cosines")
            else:
                guarded, shared = logits, plain
            batch = ObjectiveInput(logits=guarded, targets=targets, context=context, anchors=anchors,
                                   candidates=candidates, temperature=self.temperature, plain=shared,
                                   unguarded=plain, cosines=sim)  # fmt: skip
            result = self.per_anchor(batch)
        finally:
            _ACTIVE.pop()
        loss = result.loss.mean()
        finite = torch.isfinite(loss)
        call.fell_back = ~finite
        if self.has_fallback:
            fallback = plain if result.plain_lse is None else plain._replace(lse=result.plain_lse)
            loss = torch.where(finite, loss, fallback.loss().mean())

        weights_fn: WeightsMaker | None = None
        with torch.no_grad():
            if result.weights is None and result.log_weights is None:
                stats = weight_stats(None, None, negative_mask, count)
            else:
                make: WeightsMaker
                if result.weights is not None:
                    make = result.weights.make
                    stats = {"neg_weight_max": result.weights.max.float(),
                             "neg_weight_entropy": result.weights.entropy}  # fmt: skip
                else:
                    log_weights = cast(Tensor, result.log_weights)  # not None: the first branch
                    weights, stats = _masked_weight_stats(log_weights, negative_mask, count)  # NaN included
                    make = lambda rows=slice(None): weights[rows]  # noqa: E731
                # a non-finite weight (NaN reaches the max) or objective: uniform weights
                usable = finite & torch.isfinite(stats["neg_weight_max"])

                def weights_fn(
                    rows: slice = slice(None), make: WeightsMaker = make, usable: Tensor = usable
                ) -> Tensor:
                    return torch.where(usable, make(rows), negative_mask[rows])

            rows = slice(0, DIAGNOSTIC_ANCHORS)  # the diagnostics' anchors: their cosines and weights only
            diagnostics = negative_diagnostics(
                logits[rows].detach() * self.temperature, positive_index[rows], negative_mask[rows],
                None if weights_fn is None else weights_fn(rows), context,
            )  # fmt: skip

            metrics = {
                "pos_sim": plain.pos.mean() * self.temperature,
                "neg_sim": _mean_negative_similarity(a_hat, c_hat, logits, targets, self.temperature),
                **stats,
                "clamp_frac": torch.zeros((), device=logits.device),
                "nonfinite_fallback": (~finite).float(),
                **diagnostics,
            }
            metrics.update({k: v.detach().float() for k, v in result.metrics.items()})
        return LossOutput(loss=loss, metrics=metrics, weights_fn=weights_fn)


class ReweightingLoss(ContrastiveLoss):
    """The common case: an objective that reweights the negatives. Write `log_weights`; the base normalises the
    weights to mean one over N(i) (w_ij = n_i softmax_{j in N(i)}(log_weights_ij)), applies them in form (D) with
    the class prior (`class_prior`, 0 without one: form (W)), and reports their statistics. Gradients flow through
    the log-weights unless the objective detaches them."""

    def log_weights(self, batch: ObjectiveInput) -> Tensor:
        """-> (M, N) log-weights of the negatives, up to a per-anchor constant (values outside N(i) are ignored)."""
        raise NotImplementedError(f"{type(self).__name__} must define log_weights")

    def per_anchor(self, batch: ObjectiveInput) -> ObjectiveOutput:
        return reweighted_loss(batch, self.log_weights(batch), self.prior())


def reweighted_loss(batch: ObjectiveInput, log_weights: Tensor, tau_plus: float = 0.0) -> ObjectiveOutput:
    """Form (D) (form (W) with tau_plus 0) with w_ij = n_i softmax_{j in N(i)}(log_weights_ij): the generic path of
    a `ReweightingLoss`, from the shared (guarded) reductions. log_weights (M, N). -> ObjectiveOutput, with the
    applied log-weights and metric `clamp_frac`."""
    plain, targets = batch.plain, batch.targets
    n = plain.count  # (M,)
    tilt = log_weights + targets.negative_bias.to(log_weights.dtype)  # on N(i), -inf elsewhere
    # (M,) log mean_k w_ik; 0 for an anchor without negatives, so that its R_i = 0 and its loss is 0
    log_mean = torch.where(n > 0, masked_logsumexp(tilt) - n.log(), 0.0)
    log_r = masked_logsumexp(plain.masked + tilt) - log_mean  # (M,)
    loss, clamped = debiased_from_log_r(plain.pos, log_r, n, tau_plus, batch.temperature)
    with torch.no_grad():
        applied = tilt - log_mean[:, None]  # (M, N), -inf outside N(i)
    return ObjectiveOutput(loss=loss, log_weights=applied, metrics={"clamp_frac": clamped.float().mean()})


DIAGNOSTIC_ANCHORS = 128  # the false-negative diagnostics look at this many anchors per step (a sample: cheap)
TOP_SHARE = 0.01  # "the most similar 1 % of negatives"


def negative_diagnostics(
    sim: Tensor, positive_index: Tensor, negative_mask: Tensor, weights: Tensor | None, context: LossContext
) -> dict[str, Tensor]:
    """What the negatives an objective sees look like, without gradient or host synchronisation (tensors until the
    trainer logs them, averaged over the window):
    * `harder_than_positive`: the fraction of N(i) more similar to anchor i than its positive;
    * `top1pct_weight_share`: the share of anchor i's weight mass on its most similar 1 % of N(i) (at least one
      negative; uniform weights give 1 %);
    * `duplicate_pairs`, `duplicate_weight_total`: with the rows' text ids in the context, the (anchor, negative)
      pairs that are the same sentence, and the sum of their weights (mean one over N(i)); the trainer logs
      `duplicate_weight`, their mean weight, for windows that had any.
    Computed on the first DIAGNOSTIC_ANCHORS anchors (a random sample: batches are shuffled). sim (M, N)."""
    rows = slice(0, DIAGNOSTIC_ANCHORS)
    sim, positive_index, mask = sim[rows], positive_index[rows], negative_mask[rows]
    count = mask.sum(dim=1)  # (m,)
    n = count.clamp_min(1)
    positive = positive_logits(sim, positive_index)  # (m,)
    harder = ((sim > positive[:, None]) & mask).sum(dim=1) / n
    k = (n * TOP_SHARE).ceil().clamp_min(1)  # (m,) each row's own k_i = ceil(1 % of n_i)
    if weights is None:  # uniform: the top k_i of n_i negatives hold k_i / n_i of the mass, whatever the ties
        share = torch.where(count > 0, k / n, 0.0)
    else:
        w = weights[rows].to(sim.dtype)  # (m, N)
        k_max = max(1, math.ceil(TOP_SHARE * mask.shape[1]))  # the top k_max that the shape bounds: no host sync
        top = torch.where(mask, sim, NEG_INF).topk(k_max, dim=1).indices  # (m, k_max), most similar first
        in_top = torch.arange(k_max, device=sim.device)[None, :] < k[:, None]
        share = torch.where(in_top, w.gather(1, top), 0.0).sum(dim=1) / w.sum(dim=1).clamp_min(1e-30)
    out = {"harder_than_positive": harder.float().mean(), "top1pct_weight_share": share.float().mean()}
    if context.anchor_text_ids is not None and context.candidate_text_ids is not None:
        same = (context.anchor_text_ids[rows, None] == context.candidate_text_ids[None, :]) & mask  # (m, N)
        out["duplicate_pairs"] = same.sum().float()
        total = out["duplicate_pairs"] if weights is None else torch.where(same, w, 0.0).sum().float()
        out["duplicate_weight_total"] = total
    return out


def _mean_negative_similarity(
    a_hat: Tensor, c_hat: Tensor, logits: Tensor, targets: ContrastiveTargets, temperature: float
) -> Tensor:
    """Mean cosine over the (anchor, negative) pairs, from unit rows a_hat (M, D), c_hat (N, D) and the logits
    (M, N) = cosines / temperature. With standard negatives no (M, N) pass: sum_{j in N(i)} s_ij = a_i . sum_j c_j
    - s_ii - s_ip (candidate i is anchor i)."""
    a, c = a_hat.detach(), c_hat.detach()
    total = targets.negative_count.sum().clamp_min(1)
    if targets.standard_negatives:
        positives = (a * c.index_select(0, targets.positive_index)).sum()
        return (a.sum(dim=0) @ c.sum(dim=0) - a.square().sum() - positives) / total
    return torch.where(targets.negative_mask, logits.detach(), 0.0).sum() * temperature / total
