"""HCL and DCL (docs/losses.md section 3): form (D) with hardness-tilted (HCL) or uniform (DCL) weights."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor

from simcse_hn.losses.base import (
    ContrastiveLoss,
    NegativeWeights,
    ObjectiveInput,
    ObjectiveOutput,
    ReweightingLoss,
    debiased_from_log_r,
    drop_nonfinite_grad,
    mean_over_anchors_with_negatives,
)
from simcse_hn.losses.options import ObjectiveOptions, TrainingShape, option

# DCL's class prior at SimCSE's temperature 0.05, from bench/results/dcl_clamp.md (docs/losses.md section 3): on
# all-MiniLM-L6-v2 batches with a fresh MLP head its lower clamp holds for 5 % of anchors and removes 27 % of the
# negative sum where it does not; 0.01 already clamps 88 %, the DCL paper's 0.1 all of them.
DCL_TAU_PLUS = 1e-3


def _prior(value: float) -> bool:
    return 0.0 <= value < 1.0


@dataclass(frozen=True)
class HCLOptions(ObjectiveOptions):
    beta: float = option(0.1, "HCL concentration beta (tilt beta/t per unit cosine).", check=lambda v: v >= 0,
                         must="be >= 0")  # fmt: skip
    tau_plus: float = option(0.0, "HCL class prior tau+ in [0, 1); 0 avoids the debiasing clamp (losses.md).",
                             check=_prior, must="be in [0, 1)")  # fmt: skip
    detach_weights: bool = option(False, "Stop gradients through HCL's weights.")


@dataclass(frozen=True)
class DCLOptions(ObjectiveOptions):
    tau_plus: float = option(
        DCL_TAU_PLUS,
        "DCL class prior tau+ in (0, 1): 1e-3 measured for temperature 0.05 (the DCL paper's 0.1 is for temperature "
        "0.5; at 0.05 its clamp holds for every anchor: docs/losses.md section 3).",
        check=_prior,
        must="be in [0, 1)",
    )

    def check_for_training(self, shape: TrainingShape) -> None:
        if self.tau_plus == 0:
            raise ValueError("tau_plus: 0 makes DCL symmetric InfoNCE: use --loss infonce --contrast_form symmetric, "
                             "or a prior > 0")  # fmt: skip


class HCLLoss(ReweightingLoss):
    """Hard-negative debiased contrastive loss (Robinson et al., arXiv:2010.04592), form (D) of docs/losses.md.

    w_ij = n softmax_{j in N(i)}(beta l_ij);  Ng_i = max((sum_j w_ij e^{l_ij} - tau_plus n e^{l_ip}) / (1 - tau_plus),
    n e^{-1/t});  L_i = log(e^{l_ip} + Ng_i) - l_ip,  l = cos / temperature.

    Neutral setting: beta = 0, tau_plus = 0 -> plain InfoNCE. Gradients flow through the weights, as in the
    reference code, unless `detach_weights`. Shapes: anchors (M, D), candidates (N, D), positive_index (M,),
    negative_mask (M, N). Metric `clamp_frac`: the fraction of anchors whose Ng_i is the lower clamp (their
    negatives get no gradient; docs/losses.md section 2). `log_weights` is the definition; `per_anchor` computes the
    same in fewer (M, N) passes (`tilted_log_ratio`).
    """

    name = "hcl"
    title = "HCL"
    Options = HCLOptions
    summary = (
        "Hard-negative contrastive loss (Robinson et al., arXiv:2010.04592): negatives weighted by "
        "`w_ij ∝ exp(beta * s_ij / t)` (mean one), then debiased with `tau_plus`; `beta = tau_plus = 0` is InfoNCE."
    )
    citation = """@inproceedings{robinson2021contrastive,
  title = {Contrastive Learning with Hard Negative Samples},
  author = {Robinson, Joshua and Chuang, Ching-Yao and Sra, Suvrit and Jegelka, Stefanie},
  booktitle = {International Conference on Learning Representations (ICLR)},
  year = {2021}
}"""
    class_prior = "tau_plus"
    setting = ("beta",)

    options: HCLOptions

    def log_weights(self, batch: ObjectiveInput) -> Tensor:
        tilt = self.options.beta * batch.logits  # (M, N)
        return tilt.detach() if self.options.detach_weights else tilt

    def per_anchor(self, batch: ObjectiveInput) -> ObjectiveOutput:
        plain, targets, logits = batch.plain, batch.targets, batch.logits
        beta, tau_plus = self.options.beta, self.options.tau_plus
        n = plain.count  # (M,)
        if beta == 0:  # uniform weights: R_i is plain InfoNCE's negative sum
            loss, clamped = debiased_from_log_r(plain.pos, plain.lse, n, tau_plus, self.temperature)
            return ObjectiveOutput(loss=loss, log_weights=torch.zeros_like(logits),
                                   metrics={"clamp_frac": clamped.float().mean()})  # fmt: skip
        if targets.negative_log_weights is not None:  # explicit negatives weighted c_ij: the generic path
            return super().per_anchor(batch)
        # With w_ij = e^{beta l_ij} / mean_k e^{beta l_ik}:  log R_i = logsumexp_j((1 + beta) l_ij) - logsumexp_j(
        # beta l_ij) + log n_i, two row reductions over the masked logits in one autograd node (`tilted_log_ratio`),
        # whose (M,) result is guarded instead of the (M, N) masked logits. Its q gives the weights' diagnostics; the
        # (M, N) weights are made only when read.
        unguarded, detach = batch.unguarded, self.options.detach_weights
        plain_lse = None
        if unguarded.exp is not None and unguarded.offset is not None:  # InfoNCE's exponentials, kept: p = e q
            log_ratio, q, q_sum, q_log_q, plain_lse = tilted_log_ratio_from_exp(
                unguarded.logits, unguarded.offset, unguarded.exp, cast(Tensor, unguarded.shift), beta, detach
            )
        else:
            log_ratio, q, q_sum, q_log_q = tilted_log_ratio(unguarded.masked, beta, detach)
        log_r = drop_nonfinite_grad(log_ratio) + n.log()  # (M,); -inf for an anchor without negatives: its loss is 0
        loss, clamped = debiased_from_log_r(plain.pos, log_r, n, tau_plus, self.temperature)
        with torch.no_grad():  # w_ij = n_i q_ij / q_sum_i; the entropy of w / n is that of q / q_sum
            scale = torch.where(q_sum == 0, 0.0, n / q_sum)  # (M,)
            weights = NegativeWeights(
                make=lambda rows=slice(None): q[rows] * scale[rows, None],
                max=(q.amax(dim=1) * scale).max(),
                entropy=mean_over_anchors_with_negatives(q_sum.log() - q_log_q / q_sum, n),
            )
        metrics = {"clamp_frac": clamped.float().mean()}
        return ObjectiveOutput(loss=loss, weights=weights, metrics=metrics, plain_lse=plain_lse)


class _TiltedLogRatio(torch.autograd.Function):
    """(M, N) masked logits m (-inf outside N(i)), b > 0 -> logsumexp_j((1 + b) m_ij) - logsumexp_j(b m_ij) (M,),
    and without gradient q = e^{b (m - max_j m)} (M, N) (0 outside N(i)), its row sums (M,) and sum_j q log q (M,).
    The gradient is (1 + b) p - b q / q_sum, p = softmax((1 + b) m) (only p when `detach`: the gradient of
    logsumexp(m + b m') with the weights' m' held fixed). Eager autograd through two logsumexps and the sum m + b m
    makes ~20 (M, N) passes, allocating most; this makes 8 in the forward (3 allocations) and 2 in the backward."""

    @staticmethod
    def forward(ctx: Any, masked: Tensor, beta: float, detach: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        shift = masked.amax(dim=1, keepdim=True)  # (M, 1)
        shift = torch.where(torch.isfinite(shift), shift, 0.0)  # a row without negatives: q = 0, see the result
        # d <= 0 on N(i); elsewhere a huge finite negative instead of -inf, so that e^{b d} = 0 and q * b d = 0 there
        d = (masked - shift).clamp_min_(torch.finfo(masked.dtype).min / (2 + 2 * beta))  # (M, N)
        tilt = torch.mul(d, beta)  # b d
        q = tilt.exp()  # e^{b d}
        q_log_q = torch.linalg.vecdot(q, tilt)  # (M,) sum_j q log q
        p = d.mul_(1 + beta).exp_()  # e^{(1 + b) d}, in d's memory
        p_sum, q_sum = p.sum(dim=1), q.sum(dim=1)  # (M,)
        ctx.beta, ctx.detach = beta, detach
        ctx.save_for_backward(p, q, p_sum, q_sum)
        ctx.mark_non_differentiable(q, q_sum, q_log_q)
        # a row without negatives (p = q = 0): 0 rather than -inf - -inf = NaN, and log n_i = -inf after it
        return torch.where(q_sum == 0, 0.0, p_sum.log() - q_sum.log() + shift.squeeze(1)), q, q_sum, q_log_q

    @staticmethod
    def backward(ctx: Any, grad: Tensor, *_: Tensor | None) -> tuple[Tensor, None, None]:
        return _tilted_backward(ctx, grad), None, None


def _tilted_backward(ctx: Any, grad: Tensor) -> Tensor:
    """The gradient of logsumexp((1 + b) m) - logsumexp(b m) to m from a tilted log ratio's saved p, q and sums."""
    p, q, p_sum, q_sum = ctx.saved_tensors[:4]
    grad = torch.where(q_sum == 0, 0.0, grad)  # a row without negatives: 0, not 0 * inf = NaN (NaN stays NaN)
    p_sum, q_sum = p_sum.clamp_min(torch.finfo(p.dtype).tiny), q_sum.clamp_min(torch.finfo(q.dtype).tiny)
    if ctx.detach:  # d/dm logsumexp(m + b m'), m' held fixed: p
        return cast(Tensor, p * (grad / p_sum)[:, None])
    grad_masked = p * (grad * (1 + ctx.beta) / p_sum)[:, None]
    return cast(Tensor, grad_masked.addcmul_(q, (grad * ctx.beta / q_sum)[:, None], value=-1.0))


class _TiltedLogRatioFromExp(torch.autograd.Function):
    """`_TiltedLogRatio` from plain InfoNCE's kept exponentials e = e^{m - shift} (`PlainReductions.exp`, 0 outside
    N(i)) and their row maxima: q = e^{b (l - shift)} straight from the logits l and the bias (0 on N(i), -inf
    elsewhere) in one buffer, p = e^{(1 + b) (m - shift)} = e q without an exponential, and sum_j q log q =
    b (sum_j q_ij l_ij - shift_i sum_j q_ij) without an (M, N) log (q = 0 outside N(i), where l is finite). Five
    (M, N) passes in the forward (two allocations) where `_TiltedLogRatio` on the masked logits makes nine; the same
    backward, to the logits. Also plain InfoNCE's log sum_j e^{m_ij} again (for the fallback: its gradient, zero
    unless the objective falls back, joins in this node's backward, where `MaskedLogSumExp`'s would make a pass of
    zeros and autograd an addition)."""

    @staticmethod
    def forward(
        ctx: Any, logits: Tensor, bias: Tensor, e: Tensor, shift: Tensor, beta: float, detach: bool
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        ctx.set_materialize_grads(False)  # no (M, N) zeros for q's gradient, which nothing has
        bias = bias if bias.dtype == logits.dtype else bias.to(logits.dtype)
        q = torch.add(bias, logits, alpha=beta).sub_(shift * beta).exp_()  # (M, N) e^{b (l - shift)} on N(i)
        q_sum = q.sum(dim=1)  # (M,)
        q_log_q = (torch.linalg.vecdot(q, logits) - shift.squeeze(1) * q_sum) * beta
        p = e * q  # e^{(1 + b) (m - shift)}
        p_sum, e_sum = p.sum(dim=1), e.sum(dim=1)
        ctx.beta, ctx.detach = beta, detach
        ctx.save_for_backward(p, q, p_sum, q_sum, e, e_sum)
        ctx.mark_non_differentiable(q, q_sum, q_log_q)
        ratio = torch.where(q_sum == 0, 0.0, p_sum.log() - q_sum.log() + shift.squeeze(1))
        return ratio, q, q_sum, q_log_q, e_sum.log() + shift.squeeze(1)

    @staticmethod
    def backward(
        ctx: Any, grad: Tensor | None, *grads: Tensor | None
    ) -> tuple[Tensor | None, None, None, None, None, None]:
        e, e_sum = ctx.saved_tensors[4:]
        grad_plain = grads[-1]  # the plain lse's; q, its sum and q log q have none
        grad_logits = None if grad is None else _tilted_backward(ctx, grad)
        if grad_plain is not None:
            plain = torch.where(e_sum > 0, grad_plain / e_sum, 0.0)[:, None]  # (M, 1); 0 for a row without negatives
            grad_logits = e * plain if grad_logits is None else grad_logits.addcmul_(e, plain)
        return grad_logits, None, None, None, None, None


def tilted_log_ratio_from_exp(
    logits: Tensor, bias: Tensor, e: Tensor, shift: Tensor, beta: float, detach: bool = False
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """`tilted_log_ratio` of the masked logits logits + bias (bias: 0 on N(i), -inf elsewhere) from plain InfoNCE's
    exponentials e (M, N) and row maxima shift (M, 1) of those masked logits (`_TiltedLogRatioFromExp`), and plain
    InfoNCE's lse (M,) from the same node."""
    return cast(
        "tuple[Tensor, Tensor, Tensor, Tensor, Tensor]",
        _TiltedLogRatioFromExp.apply(logits, bias, e, shift, beta, detach),
    )


def tilted_log_ratio(masked: Tensor, beta: float, detach: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """-> logsumexp_j((1 + beta) m_ij) - logsumexp_j(beta m_ij) (M,); q (M, N), its row sums (M,) and sum_j q log q
    (M,), without gradient (`_TiltedLogRatio`). masked (M, N): logits on N(i), -inf elsewhere; beta > 0."""
    return cast("tuple[Tensor, Tensor, Tensor, Tensor]", _TiltedLogRatio.apply(masked, beta, detach))


class DCLLoss(ContrastiveLoss):
    """Debiased contrastive loss (Chuang et al., arXiv:2007.00224): form (D) with all w_ij = 1 (HCL with beta = 0).

    Ng_i = max((sum_{j in N(i)} e^{l_ij} - tau_plus n e^{l_ip}) / (1 - tau_plus), n e^{-1/t}).
    Neutral setting: tau_plus = 0 -> plain InfoNCE (up to the lower clamp). No weights. Shapes as HCLLoss. Default
    tau_plus = 1e-3, measured for temperature 0.05 (`DCL_TAU_PLUS`; the DCL paper's 0.1 belongs to its temperature
    0.5). Its R_i is plain InfoNCE's negative sum: the objective and the fallback share that one reduction.
    """

    name = "dcl"
    title = "DCL"
    Options = DCLOptions
    summary = (
        "Debiased contrastive loss (Chuang et al., arXiv:2007.00224): the negative term is corrected for "
        "false negatives with the class prior `tau_plus`; `tau_plus = 0` is InfoNCE (up to a lower clamp)."
    )
    citation = """@inproceedings{chuang2020debiased,
  title = {Debiased Contrastive Learning},
  author = {Chuang, Ching-Yao and Robinson, Joshua and Lin, Yen-Chen and Torralba, Antonio and Jegelka, Stefanie},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  year = {2020}
}"""
    class_prior = "tau_plus"

    options: DCLOptions

    def per_anchor(self, batch: ObjectiveInput) -> ObjectiveOutput:
        plain, tau_plus = batch.plain, self.options.tau_plus
        loss, clamped = debiased_from_log_r(plain.pos, plain.lse, plain.count, tau_plus, self.temperature)
        return ObjectiveOutput(loss=loss, metrics={"clamp_frac": clamped.float().mean()})
