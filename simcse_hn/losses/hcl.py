from __future__ import annotations

from torch import Tensor

from simcse_hn.losses.base import ContrastiveLoss, debiased_loss, log_normalised_weights


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

    def objective(self, sim: Tensor, logits: Tensor, positive_index: Tensor, negative_mask: Tensor, **state):
        scores = self.beta * logits  # (M, N)
        if self.detach_weights:
            scores = scores.detach()
        log_weights = log_normalised_weights(scores, negative_mask)  # (M, N)
        loss, clamped = debiased_loss(
            logits, positive_index, negative_mask, log_weights, self.tau_plus, self.temperature
        )
        return loss, log_weights, {"clamp_frac": clamped.float().mean()}


class DCLLoss(HCLLoss):
    """Debiased contrastive loss (Chuang et al., arXiv:2007.00224): HCL with beta = 0, i.e. all w_ij = 1.

    Ng_i = max((sum_{j in N(i)} e^{l_ij} - tau_plus n e^{l_ip}) / (1 - tau_plus), n e^{-1/t}).
    Neutral setting: tau_plus = 0 -> plain InfoNCE (up to the lower clamp). No weights, so nothing to detach; the
    returned `weights` is None. Shapes as HCLLoss. Default tau_plus = 0.1 (the DCL paper's value).
    """

    def __init__(self, temperature: float = 0.05, tau_plus: float = 0.1):
        super().__init__(temperature, beta=0.0, tau_plus=tau_plus)

    def objective(self, sim: Tensor, logits: Tensor, positive_index: Tensor, negative_mask: Tensor, **state):
        loss, clamped = debiased_loss(logits, positive_index, negative_mask, None, self.tau_plus, self.temperature)
        return loss, None, {"clamp_frac": clamped.float().mean()}
