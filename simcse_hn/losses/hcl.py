from __future__ import annotations

import torch
from torch import Tensor

from simcse_hn.losses.base import NEG_INF, ContrastiveLoss, debiased_from_log_r, debiased_loss, positive_logits


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
    negative_mask (M, N).
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
        positive_index, negative_mask = targets.positive_index, targets.negative_mask
        # With w_ij = e^{beta l_ij} / mean_k e^{beta l_ik}:  log R_i = logsumexp_j((1 + beta) l_ij) - log mean_k
        # e^{beta l_ik}. Two row reductions over the masked logits; the (M, N) log-weights are only materialised,
        # without gradient, for the returned weights and diagnostics.
        masked = torch.where(negative_mask, logits, NEG_INF)  # (M, N)
        # the tilt is the hardness of the unweighted logit s_ij / t: an explicit negative's weight c_ij (the
        # targets' negative_log_weights, already in `logits`) multiplies w_ij, it does not tilt it
        hardness = masked
        if targets.negative_log_weights is not None:
            hardness = torch.where(negative_mask, sim / self.temperature, NEG_INF)
        # beta l_ij over N(i), -inf elsewhere (0 * -inf would be NaN)
        tilt = self.beta * hardness if self.beta > 0 else torch.where(negative_mask, 0.0, NEG_INF).to(logits.dtype)
        if self.detach_weights:
            tilt = tilt.detach()
        n = negative_mask.sum(dim=1).to(logits.dtype)  # (M,)
        # (M,) log mean_k e^{beta l_ik}; 0 for an anchor without negatives (a guide removed them all), so that its
        # R_i = 0 and its loss is InfoNCE's 0 rather than NaN
        log_mean = torch.where(n > 0, torch.logsumexp(tilt, dim=1) - n.log(), 0.0)
        log_r = torch.logsumexp(masked + tilt, dim=1) - log_mean  # (M,)
        pos = positive_logits(logits, positive_index)
        loss, clamped = debiased_from_log_r(pos, log_r, n, self.tau_plus, self.temperature)
        with torch.no_grad():
            log_weights = tilt - log_mean[:, None]  # (M, N), -inf outside N(i)
        return loss, log_weights, {"clamp_frac": clamped.float().mean()}


class DCLLoss(HCLLoss):
    """Debiased contrastive loss (Chuang et al., arXiv:2007.00224): HCL with beta = 0, i.e. all w_ij = 1.

    Ng_i = max((sum_{j in N(i)} e^{l_ij} - tau_plus n e^{l_ip}) / (1 - tau_plus), n e^{-1/t}).
    Neutral setting: tau_plus = 0 -> plain InfoNCE (up to the lower clamp). No weights, so nothing to detach; the
    returned `weights` is None. Shapes as HCLLoss. Default tau_plus = 0.1 (the DCL paper's value).
    """

    def __init__(self, temperature: float = 0.05, tau_plus: float = 0.1):
        super().__init__(temperature, beta=0.0, tau_plus=tau_plus)

    def objective(self, sim: Tensor, logits: Tensor, targets, context, anchors, candidates):
        loss, clamped = debiased_loss(
            logits, targets.positive_index, targets.negative_mask, None, self.tau_plus, self.temperature
        )
        return loss, None, {"clamp_frac": clamped.float().mean()}
