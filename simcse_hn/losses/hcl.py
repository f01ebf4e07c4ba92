"""HCL and DCL (docs/losses.md section 3): form (D) with hardness-tilted (HCL) or uniform (DCL) weights."""

from __future__ import annotations

import torch
from torch import Tensor

from simcse_hn.losses.base import NEG_INF, ContrastiveLoss, debiased_from_log_r

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
        masked, n = plain.masked, plain.count  # (M, N), (M,)
        # With w_ij = e^{beta l_ij} / mean_k e^{beta l_ik}:  log R_i = logsumexp_j((1 + beta) l_ij) - log mean_k
        # e^{beta l_ik}. Two row reductions over the masked logits; the (M, N) log-weights are only materialised,
        # without gradient, for the returned weights and diagnostics.
        # beta l_ij over N(i), -inf elsewhere (0 * -inf would be NaN)
        tilt = self.beta * masked if self.beta > 0 else torch.where(targets.negative_mask, 0.0, NEG_INF).to(n.dtype)
        if self.detach_weights:
            tilt = tilt.detach()
        log_mean = torch.logsumexp(tilt, dim=1) - n.log()  # (M,) log mean_k e^{beta l_ik}
        log_r = torch.logsumexp(masked + tilt, dim=1) - log_mean  # (M,)
        loss, clamped = debiased_from_log_r(plain.pos, log_r, n, self.tau_plus, self.temperature)
        with torch.no_grad():
            log_weights = tilt - log_mean[:, None]  # (M, N), -inf outside N(i)
        return loss, log_weights, {"clamp_frac": clamped.float().mean()}


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
