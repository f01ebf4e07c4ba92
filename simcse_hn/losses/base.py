"""Shared machinery of the contrastive losses (docs/losses.md sections 1, 2 and 6).

Every loss sees embeddings and index tensors only: `anchors` (M, D), `candidates` (N, D), `positive_index` (M,)
into the candidates, `negative_mask` (M, N) bool. Similarities and everything after them are computed in float32
or wider. Nothing here synchronises with the host: no `.item()`, no numpy, no Python branch on tensor values,
so every loss runs under `torch.compile(fullgraph=True)`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from simcse_hn.targets import ContrastiveTargets, LossContext

NEG_INF = float("-inf")


@dataclass
class LossOutput:
    """`loss`: differentiable scalar; `metrics`: detached scalar diagnostics; `weights`: (M, N) weights applied
    to the negatives (zero outside `negative_mask`), None for plain InfoNCE."""

    loss: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)
    weights: Tensor | None = None


def cosine_similarities(anchors: Tensor, candidates: Tensor) -> Tensor:
    """(M, D), (N, D) -> (M, N) cosine similarities in float32 (float64 stays float64), autocast disabled."""
    dtype = torch.float64 if anchors.dtype == torch.float64 else torch.float32
    with torch.autocast(device_type=anchors.device.type, enabled=False):
        a = anchors.to(dtype)
        c = candidates.to(dtype)
        a = a / a.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        c = c / c.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        return a @ c.T


def positive_logits(logits: Tensor, positive_index: Tensor) -> Tensor:
    """(M, N), (M,) -> (M,)"""
    return logits.gather(1, positive_index[:, None]).squeeze(1)


class PlainReductions(NamedTuple):
    """Plain InfoNCE's pieces of one loss call, which the hard-negative objectives share.

    pos (M,) = l_ip; masked (M, N) = l_ij on N(i), -inf elsewhere; lse (M,) = log sum_{j in N(i)} e^{l_ij};
    count (M,) = n_i = |N(i)| in the logits' dtype."""

    pos: Tensor
    masked: Tensor
    lse: Tensor
    count: Tensor

    def loss(self) -> Tensor:
        """Plain InfoNCE per anchor: log(e^{l_ip} + sum_{j in N(i)} e^{l_ij}) - l_ip. (M,)"""
        return torch.logaddexp(self.pos, self.lse) - self.pos


def plain_reductions(logits: Tensor, positive_index: Tensor, negative_mask: Tensor) -> PlainReductions:
    """(M, N) logits, (M,) positive_index, (M, N) negative_mask -> PlainReductions"""
    masked = torch.where(negative_mask, logits, NEG_INF)  # (M, N)
    count = negative_mask.sum(dim=1).to(logits.dtype)  # (M,)
    return PlainReductions(positive_logits(logits, positive_index), masked, torch.logsumexp(masked, dim=1), count)


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


def weight_stats(weights: Tensor | None, log_weights: Tensor | None, negative_mask: Tensor) -> dict[str, Tensor]:
    """Max weight and mean entropy (nats) of the normalised weights w_ij / sum_k w_ik over N(i).

    weights: (M, N), zero outside N(i), and log_weights their logs (used where w > 0), or both None (uniform). The
    entropy is log S_i - sum_j w_ij log w_ij / S_i with S_i = sum_j w_ij: no (M, N) normalised copy."""
    if weights is None:
        n = negative_mask.sum(dim=1).to(torch.float32)
        return {"neg_weight_max": torch.ones((), device=negative_mask.device), "neg_weight_entropy": n.log().mean()}
    w = weights.detach().float()
    w_log_w = torch.where(w > 0, w * log_weights.detach().float(), 0.0)
    total = w.sum(dim=1)  # (M,)
    entropy = total.log() - w_log_w.sum(dim=1) / total
    return {"neg_weight_max": w.max(), "neg_weight_entropy": entropy.mean()}


class _DropNonFiniteGrad(torch.autograd.Function):
    """Identity whose backward passes the gradient on only when all of it is finite, else zeros."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return torch.where(torch.isfinite(grad).all(), grad, 0.0)


def drop_nonfinite_grad(x: Tensor) -> Tensor:
    """Guards a tensor that feeds an objective: when the loss falls back, the objective's branch receives a zero
    gradient, but its backward can still turn 0 * inf into NaN; this keeps that NaN out of the embeddings."""
    return _DropNonFiniteGrad.apply(x)


class ContrastiveLoss(nn.Module):
    """Base class. Subclasses implement `objective`; the base adds similarities, diagnostics and the fallback.

    Two calls, one computation:
    * `loss_fn(anchors, candidates, positive_index, negative_mask, context=None)`: the plain call. No structure is
      assumed between anchors and candidates.
    * `loss_fn.compute(candidates, targets, context=None)`: the training loop's call (`simcse_hn.trainer
      .contrastive_loss`). The anchors are the candidates' rows `targets.anchor_index`, so the targets' checked facts
      (`anchors_are_candidates`, `standard_negatives`) hold for the tensors the loss sees and a loss may use them.

    Fallback: a non-finite objective is replaced by plain InfoNCE for the step (selected with `torch.where`,
    no host synchronisation) and counted in `metrics["nonfinite_fallback"]`. The objective sees `sim` through
    `drop_nonfinite_grad`, so a non-finite gradient from its branch is dropped and the step keeps InfoNCE's.
    InfoNCE is its own fallback (`has_fallback = False`): it is computed once. The other losses share plain
    InfoNCE's reductions with the fallback: the base computes them once from the unguarded logits, and an objective
    gets them, each behind its own `drop_nonfinite_grad`, from `self.plain_reductions(logits, targets)`; so the
    fallback costs no second pass over the (M, N) logits in the forward, and one log-sum-exp backward serves both.
    """

    has_fallback = True

    def __init__(self, temperature: float = 0.05):
        super().__init__()
        if not 0 < temperature < math.inf:
            raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
        self.temperature = float(temperature)

    def objective(
        self,
        sim: Tensor,
        logits: Tensor,
        targets: ContrastiveTargets,
        context: LossContext,
        anchors: Tensor,
        candidates: Tensor,
    ) -> tuple[Tensor, Tensor | None, dict[str, Tensor]]:
        """sim, logits (M, N); anchors (M, D), candidates (N, D) as given (not normalised).
        -> per-anchor loss (M,), log-weights applied to the negatives (M, N) or None, extra metrics."""
        raise NotImplementedError

    def forward(
        self,
        anchors: Tensor,
        candidates: Tensor,
        positive_index: Tensor,
        negative_mask: Tensor,
        context: LossContext | None = None,
    ) -> LossOutput:
        return self._loss(anchors, candidates, ContrastiveTargets(positive_index, negative_mask), context)

    def compute(
        self, candidates: Tensor, targets: ContrastiveTargets, context: LossContext | None = None
    ) -> LossOutput:
        """candidates (N, D); the anchors are candidates[targets.anchor_index] (the tensor itself when
        `targets.anchors_are_candidates`), and `context.candidate_features` gives the anchors' features likewise."""
        if targets.anchor_index is None:
            raise ValueError("compute() needs targets with anchor_index; use loss_fn(anchors, candidates, ...)")
        same = targets.anchors_are_candidates
        anchors = candidates if same else candidates[targets.anchor_index]
        if context is not None:  # the anchors' rows of the candidates' per-row extras
            derived = {}
            for anchor_key, candidate_key in (("anchor_features", "candidate_features"),
                                              ("anchor_text_ids", "candidate_text_ids")):  # fmt: skip
                rows = getattr(context, candidate_key)
                if rows is not None and getattr(context, anchor_key) is None:
                    derived[anchor_key] = rows if same else rows[targets.anchor_index]
            context = dataclasses.replace(context, **derived) if derived else context
        return self._loss(anchors, candidates, targets, context)

    def plain_reductions(self, logits: Tensor, targets: ContrastiveTargets) -> PlainReductions:
        """Plain InfoNCE's reductions of `logits` (M, N). Inside a loss call, for the logits the objective was given,
        these are the base's own (computed once, shared with the fallback), each guarded by `drop_nonfinite_grad`;
        otherwise they are computed here."""
        shared = self._shared
        if shared is not None and shared[0] is logits:
            return shared[1]
        return plain_reductions(logits, targets.positive_index, targets.negative_mask)

    _shared: tuple[Tensor, PlainReductions] | None = None

    def _loss(
        self, anchors: Tensor, candidates: Tensor, targets: ContrastiveTargets, context: LossContext | None
    ) -> LossOutput:
        context = LossContext() if context is None else context
        positive_index, negative_mask = targets.positive_index, targets.negative_mask
        sim = cosine_similarities(anchors, candidates)  # (M, N)
        if not self.has_fallback:
            per_anchor, log_weights, extra = self.objective(
                sim, sim / self.temperature, targets, context, anchors, candidates
            )
            loss = per_anchor.mean()
            finite = torch.isfinite(loss)
        else:
            plain = plain_reductions(sim / self.temperature, positive_index, negative_mask)
            guarded = drop_nonfinite_grad(sim)
            logits = guarded / self.temperature
            shared = PlainReductions(*(drop_nonfinite_grad(t) for t in plain[:3]), plain.count)
            self._shared = (logits, shared)
            try:
                per_anchor, log_weights, extra = self.objective(
                    guarded, logits, targets, context, anchors, candidates
                )
            finally:
                self._shared = None
            loss = per_anchor.mean()
            finite = torch.isfinite(loss)
            loss = torch.where(finite, loss, plain.loss().mean())

        weights = None
        with torch.no_grad():
            if log_weights is not None:
                weights = torch.where(negative_mask, log_weights.exp(), 0.0)  # (M, N)
            stats = weight_stats(weights, log_weights, negative_mask)  # of the weights applied, NaN included
            if weights is not None:  # a non-finite weight (NaN reaches the max) or objective: uniform weights
                usable = finite & torch.isfinite(stats["neg_weight_max"])
                weights = torch.where(usable, weights, negative_mask)
            neg_sims = torch.where(negative_mask, sim, 0.0).sum() / negative_mask.sum().clamp_min(1)
            metrics = {
                "pos_sim": positive_logits(sim, positive_index).mean(),
                "neg_sim": neg_sims,
                **stats,
                "clamp_frac": torch.zeros((), device=sim.device),
                "nonfinite_fallback": (~finite).float(),
            }
            metrics.update(negative_diagnostics(sim, positive_index, negative_mask, weights, context))
            metrics.update({k: v.detach().float() for k, v in extra.items()})
        return LossOutput(loss=loss, metrics=metrics, weights=weights)


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
    w = mask.to(sim.dtype) if weights is None else weights[rows].to(sim.dtype)  # (m, N)
    n = mask.sum(dim=1).clamp_min(1)  # (m,)
    positive = positive_logits(sim, positive_index)  # (m,)
    harder = ((sim > positive[:, None]) & mask).sum(dim=1) / n
    # each row's own k_i = ceil(1 % of n_i), out of the top k_max that the shape bounds (no host synchronisation)
    k_max = max(1, math.ceil(TOP_SHARE * mask.shape[1]))
    top = torch.where(mask, sim, NEG_INF).topk(k_max, dim=1).indices  # (m, k_max), most similar first
    k = (n * TOP_SHARE).ceil().clamp_min(1)  # (m,)
    in_top = torch.arange(k_max, device=sim.device)[None, :] < k[:, None]
    share = torch.where(in_top, w.gather(1, top), 0.0).sum(dim=1) / w.sum(dim=1).clamp_min(1e-30)
    out = {"harder_than_positive": harder.float().mean(), "top1pct_weight_share": share.float().mean()}
    if context.anchor_text_ids is not None and context.candidate_text_ids is not None:
        same = (context.anchor_text_ids[rows, None] == context.candidate_text_ids[None, :]) & mask  # (m, N)
        out["duplicate_pairs"] = same.sum().float()
        out["duplicate_weight_total"] = torch.where(same, w, 0.0).sum().float()
    return out


def log_normalised_weights(scores: Tensor, negative_mask: Tensor) -> Tensor:
    """log w with w_ij = n softmax_{j in N(i)}(scores_ij), i.e. weights with mean one over N(i). (M, N)"""
    n = negative_mask.sum(dim=1, keepdim=True).to(scores.dtype)
    masked = torch.where(negative_mask, scores, NEG_INF)
    return torch.where(negative_mask, F.log_softmax(masked, dim=1) + n.log(), NEG_INF)
