"""HCL and DCL (docs/losses.md section 3): form (D) with hardness-tilted (HCL) or uniform (DCL) weights."""

from __future__ import annotations

import torch
from torch import Tensor

from simcse_hn.losses.base import (
    ContrastiveLoss,
    NegativeWeights,
    debiased_from_log_r,
    drop_nonfinite_grad,
    masked_logsumexp,
    mean_over_anchors_with_negatives,
)

# DCL's class prior at SimCSE's temperature 0.05, from bench/results/dcl_clamp.md (docs/losses.md section 3): on
# all-MiniLM-L6-v2 batches with a fresh MLP head its lower clamp holds for 5 % of anchors and removes 27 % of the
# negative sum where it does not; 0.01 already clamps 88 %, the DCL paper's 0.1 all of them.
DCL_TAU_PLUS = 1e-3


def check_tau_plus(tau_plus: float) -> float:
    if not 0.0 <= tau_plus < 1.0:
        raise ValueError(f"tau_plus must be in [0, 1), got {tau_plus}")
    return float(tau_plus)


class HCLLoss(ContrastiveLoss):
    """Hard-negative debiased contrastive loss (Robinson et al., arXiv:2010.04592), form (D) of docs/losses.md.

    w_ij = n softmax_{j in N(i)}(beta l_ij);  Ng_i = max((sum_j w_ij e^{l_ij} - tau_plus n e^{l_ip}) / (1 - tau_plus),
    n e^{-1/t});  L_i = log(e^{l_ip} + Ng_i) - l_ip,  l = cos / temperature.

    Neutral setting: beta = 0, tau_plus = 0 -> plain InfoNCE. Gradients flow through the weights, as in the
    reference code, unless `detach_weights`. Shapes: anchors (M, D), candidates (N, D), positive_index (M,),
    negative_mask (M, N). Metric `clamp_frac`: the fraction of anchors whose Ng_i is the lower clamp (their
    negatives get no gradient; docs/losses.md section 2).
    """

    needs_sim = False

    def __init__(
        self, temperature: float = 0.05, beta: float = 0.1, tau_plus: float = 0.0, detach_weights: bool = False
    ):
        super().__init__(temperature)
        if not beta >= 0:
            raise ValueError(f"beta must be >= 0, got {beta}")
        self.beta = float(beta)
        self.tau_plus = check_tau_plus(tau_plus)
        self.detach_weights = bool(detach_weights)

    def objective(self, sim: Tensor, logits: Tensor, targets, context, anchors, candidates):
        plain = self.plain_reductions(logits, targets)  # the masked logits are shared with the fallback
        n = plain.count  # (M,)
        if self.beta == 0:  # uniform weights: R_i is plain InfoNCE's negative sum
            loss, clamped = debiased_from_log_r(plain.pos, plain.lse, n, self.tau_plus, self.temperature)
            return loss, torch.zeros_like(logits), {"clamp_frac": clamped.float().mean()}
        if targets.negative_log_weights is not None:
            return self._weighted_objective(plain, logits, targets)
        # With w_ij = e^{beta l_ij} / mean_k e^{beta l_ik}:  log R_i = logsumexp_j((1 + beta) l_ij) - logsumexp_j(
        # beta l_ij) + log n_i, two row reductions over the masked logits in one autograd node (`tilted_log_ratio`),
        # whose (M,) result is guarded instead of the (M, N) masked logits. Its q gives the weights' diagnostics; the
        # (M, N) weights are made only when read.
        masked = self.plain_reductions(logits, targets, guarded=False).masked
        log_ratio, q, q_sum, q_log_q = tilted_log_ratio(masked, self.beta, self.detach_weights)
        log_r = drop_nonfinite_grad(log_ratio) + n.log()  # (M,); -inf for an anchor without negatives: its loss is 0
        loss, clamped = debiased_from_log_r(plain.pos, log_r, n, self.tau_plus, self.temperature)
        with torch.no_grad():  # w_ij = n_i q_ij / q_sum_i; the entropy of w / n is that of q / q_sum
            scale = torch.where(q_sum == 0, 0.0, n / q_sum)  # (M,)
            weights = NegativeWeights(
                make=lambda rows=slice(None): q[rows] * scale[rows, None],
                max=(q.amax(dim=1) * scale).max(),
                entropy=mean_over_anchors_with_negatives(q_sum.log() - q_log_q / q_sum, n),
            )
        return loss, weights, {"clamp_frac": clamped.float().mean()}

    def _weighted_objective(self, plain, logits: Tensor, targets):
        """With explicit negatives weighted c_ij (the targets' negative_log_weights, in the masked logits): the tilt
        is the hardness of the unweighted logit s_ij / t, so c_ij multiplies w_ij and does not tilt it. Generic
        reductions over the (M, N) guarded masked logits (paired data with a hard_negative_weight only)."""
        n = plain.count  # (M,)
        tilt = self.beta * (logits + targets.negative_bias.to(logits.dtype))  # beta l_ij on N(i), -inf elsewhere
        if self.detach_weights:
            tilt = tilt.detach()
        # (M,) log mean_k e^{beta l_ik}; 0 for an anchor without negatives, so that its R_i = 0 and its loss is 0
        log_mean = torch.where(n > 0, masked_logsumexp(tilt) - n.log(), 0.0)
        log_r = masked_logsumexp(plain.masked + tilt) - log_mean  # (M,)
        loss, clamped = debiased_from_log_r(plain.pos, log_r, n, self.tau_plus, self.temperature)
        with torch.no_grad():
            log_weights = tilt - log_mean[:, None]  # (M, N), -inf outside N(i)
        return loss, log_weights, {"clamp_frac": clamped.float().mean()}


class _TiltedLogRatio(torch.autograd.Function):
    """(M, N) masked logits m (-inf outside N(i)), b > 0 -> logsumexp_j((1 + b) m_ij) - logsumexp_j(b m_ij) (M,),
    and without gradient q = e^{b (m - max_j m)} (M, N) (0 outside N(i)), its row sums (M,) and sum_j q log q (M,).
    The gradient is (1 + b) p - b q / q_sum, p = softmax((1 + b) m) (only p when `detach`: the gradient of
    logsumexp(m + b m') with the weights' m' held fixed). Eager autograd through two logsumexps and the sum m + b m
    makes ~20 (M, N) passes, allocating most; this makes 8 in the forward (3 allocations) and 2 in the backward."""

    @staticmethod
    def forward(ctx, masked: Tensor, beta: float, detach: bool):
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
    def backward(ctx, grad: Tensor, *_):
        p, q, p_sum, q_sum = ctx.saved_tensors
        grad = torch.where(q_sum == 0, 0.0, grad)  # a row without negatives: 0, not 0 * inf = NaN (NaN stays NaN)
        p_sum, q_sum = p_sum.clamp_min(torch.finfo(p.dtype).tiny), q_sum.clamp_min(torch.finfo(q.dtype).tiny)
        if ctx.detach:  # d/dm logsumexp(m + b m'), m' held fixed: p
            return p * (grad / p_sum)[:, None], None, None
        grad_masked = p * (grad * (1 + ctx.beta) / p_sum)[:, None]
        grad_masked.addcmul_(q, (grad * ctx.beta / q_sum)[:, None], value=-1.0)
        return grad_masked, None, None


def tilted_log_ratio(masked: Tensor, beta: float, detach: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """-> logsumexp_j((1 + beta) m_ij) - logsumexp_j(beta m_ij) (M,); q (M, N), its row sums (M,) and sum_j q log q
    (M,), without gradient (`_TiltedLogRatio`). masked (M, N): logits on N(i), -inf elsewhere; beta > 0."""
    return _TiltedLogRatio.apply(masked, beta, detach)


class DCLLoss(HCLLoss):
    """Debiased contrastive loss (Chuang et al., arXiv:2007.00224): HCL with beta = 0, i.e. all w_ij = 1.

    Ng_i = max((sum_{j in N(i)} e^{l_ij} - tau_plus n e^{l_ip}) / (1 - tau_plus), n e^{-1/t}).
    Neutral setting: tau_plus = 0 -> plain InfoNCE (up to the lower clamp). No weights, so nothing to detach; the
    returned `weights` is None. Shapes as HCLLoss. Default tau_plus = 1e-3, measured for temperature 0.05
    (`DCL_TAU_PLUS`; the DCL paper's 0.1 belongs to its temperature 0.5). Its R_i is plain InfoNCE's negative sum:
    the objective and the fallback share that one reduction.
    """

    def __init__(self, temperature: float = 0.05, tau_plus: float = DCL_TAU_PLUS):
        super().__init__(temperature, beta=0.0, tau_plus=tau_plus)

    def objective(self, sim: Tensor, logits: Tensor, targets, context, anchors, candidates):
        plain = self.plain_reductions(logits, targets)
        loss, clamped = debiased_from_log_r(plain.pos, plain.lse, plain.count, self.tau_plus, self.temperature)
        return loss, None, {"clamp_frac": clamped.float().mean()}
