from __future__ import annotations

from torch import Tensor

from simcse_hn.losses.base import ContrastiveLoss


class InfoNCELoss(ContrastiveLoss):
    """Plain InfoNCE: L_i = -l_ip + log(e^{l_ip} + sum_{j in N(i)} e^{l_ij}),  l = cos / temperature.

    SimCSE (arXiv:2104.08821). The `simcse` target form reproduces the paper's CE(z1 z2^T / t, arange); the
    `symmetric` form is NT-Xent. No weights. Shapes: anchors (M, D), candidates (N, D), positive_index (M,),
    negative_mask (M, N).
    """

    has_fallback = False  # its own fallback: computed once
    needs_sim = False

    def objective(self, sim: Tensor, logits: Tensor, targets, context, anchors, candidates):
        return self.plain_reductions(logits, targets).loss(), None, {}
