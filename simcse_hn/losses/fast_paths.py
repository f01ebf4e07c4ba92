"""The fast paths of the contrastive losses: autograd Functions that compute what plain autograd computes (the same
values, the same gradients up to rounding) in fewer (M, N) passes and allocations. losses/base.py opens with plain
InfoNCE as a reader writes it (`plain_infonce`) and calls these in `ContrastiveLoss`; tests/test_losses_hard.py holds
the two equal, loss and gradient, on every path of the plain call.

* `MaskedLogSumExp` (`masked_logsumexp`): logsumexp over masked logits, keeping the exponentials for the backward.
* `WeightedLogSumExp`: log sum_j w_ij e^{l_ij} from those kept exponentials (and plain InfoNCE's sum again, for
  the fallback, in the same node).
* `SelfLogits`: the logits of unit rows against themselves (anchors that are the candidates), one matrix product in
  the backward where autograd makes two.
"""

from __future__ import annotations

from typing import Any, Literal, cast, overload

import torch
from torch import Tensor


class MaskedLogSumExp(torch.autograd.Function):
    """logsumexp over dim 1 of (M, N) masked logits x + offset (-inf outside N(i); offset None: x is masked) -> (M,),
    and without gradient e^{x + offset - max} (M, N) and the max (M, 1). The sum, the shift and the exponential are
    made in place in one (M, N) buffer, and e is kept for the backward, softmax = e / sum: one (M, N) pass there,
    where torch.logsumexp's backward makes three (x - result, exp, times grad) and allocates each. The gradient of
    the offset (a constant) is not computed; the non-differentiable outputs' zero gradients are not made
    (`set_materialize_grads(False)`: an (M, N) fill per call)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, offset: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        masked = x if offset is None else x + offset  # (M, N); with an offset, a fresh buffer: e is made in it
        shift = masked.amax(dim=1, keepdim=True)  # (M, 1)
        shift = torch.where(torch.isfinite(shift), shift, 0.0)  # a row without negatives: -inf, as logsumexp
        e = (x - shift if offset is None else masked.sub_(shift)).exp_()  # (M, N)
        total = e.sum(dim=1)  # (M,)
        ctx.save_for_backward(e, total)
        ctx.mark_non_differentiable(e, shift)
        return total.log() + shift.squeeze(1), e, shift

    @staticmethod
    def backward(ctx: Any, grad: Tensor | None, *_: Tensor | None) -> tuple[Tensor | None, None]:
        if grad is None:
            return None, None
        e, total = ctx.saved_tensors
        # a row without any finite entry (e = 0) gets 0, not 0 * inf = NaN
        return e * torch.where(total > 0, grad / total, 0.0)[:, None], None


@overload
def masked_logsumexp(masked: Tensor, keep_exp: Literal[False] = False) -> Tensor: ...
@overload
def masked_logsumexp(masked: Tensor, keep_exp: Literal[True]) -> tuple[Tensor, Tensor, Tensor]: ...
def masked_logsumexp(masked: Tensor, keep_exp: bool = False) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """log sum_j e^{masked_ij} (M,) of (M, N) logits that are -inf outside each row's set: torch.logsumexp's value,
    with a cheaper backward (`MaskedLogSumExp`). `keep_exp`: -> (lse, e^{masked - shift} (M, N), shift (M, 1))."""
    lse, e, shift = MaskedLogSumExp.apply(masked, None)
    return (lse, e, shift) if keep_exp else lse


class WeightedLogSumExp(torch.autograd.Function):
    """log sum_j w_ij e^{m_ij} = log(sum_j w_ij e_ij) + shift_i from e = e^{m - shift} (`MaskedLogSumExp`'s), m the
    masked logits, and plain InfoNCE's log sum_j e^{m_ij} again from the same e (for the fallback: its gradient,
    zero unless the objective falls back, joins the weighted sum's in this node's one (M, N) pass, where
    `MaskedLogSumExp`'s backward would make a pass of zeros and autograd an addition). Gradient: to the logits (those
    of m; e is 0 outside N(i)), e (w g_w / S_w + g_p / S_p); to w, e g_w / S_w."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, weights: Tensor, e: Tensor, shift: Tensor) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        total = torch.linalg.vecdot(e, weights.to(e.dtype))  # (M,)
        plain_total = e.sum(dim=1)  # (M,), as MaskedLogSumExp's
        ctx.save_for_backward(e, weights, total, plain_total)
        return total.log() + shift.squeeze(1), plain_total.log() + shift.squeeze(1)

    @staticmethod
    def backward(
        ctx: Any, grad: Tensor | None, grad_plain: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None, None, None]:
        e, weights, total, plain_total = ctx.saved_tensors
        # an anchor without negatives (a guide removed them all, e = 0): 0, not 0 * inf = NaN
        scale = None if grad is None else torch.where(total > 0, grad / total, 0.0)[:, None]  # (M, 1)
        plain = None if grad_plain is None else torch.where(plain_total > 0, grad_plain / plain_total, 0.0)[:, None]
        grad_masked = grad_weights = None
        if ctx.needs_input_grad[0] and (scale is not None or plain is not None):
            if scale is None:
                grad_masked = e * cast(Tensor, plain)
            elif plain is None:
                grad_masked = torch.mul(e, weights).mul_(scale)
            else:
                grad_masked = torch.addcmul(plain, weights, scale).mul_(e)  # e (w g_w / S_w + g_p / S_p)
        if ctx.needs_input_grad[1] and scale is not None:
            grad_weights = (e * scale).to(weights.dtype)
        return grad_masked, grad_weights, None, None


class SelfLogits(torch.autograd.Function):
    """The logits of unit rows against themselves, x (N, D) -> (x / t) x^T (N, N), and x / t (N, D) (for the
    positives' logits). Backward: (G + G^T)(x / t) (+ the second output's gradient / t): one (N, N, D) matrix product
    where autograd through the two factors makes two; G + G^T costs a transposed copy and an addition (N, N)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        scaled = x / temperature  # (N, D)
        ctx.temperature = temperature
        ctx.save_for_backward(scaled)
        return scaled @ x.T, scaled

    @staticmethod
    def backward(ctx: Any, grad_logits: Tensor | None, grad_scaled: Tensor | None) -> tuple[Tensor | None, None]:
        (scaled,) = ctx.saved_tensors
        grad = None
        if grad_logits is not None:
            # the blocked transposed copy and an addition: an elementwise G + G^T reads G^T with a stride, ~6x slower
            grad = grad_logits.T.contiguous().add_(grad_logits) @ scaled  # (N, D)
        if grad_scaled is not None:
            grad = grad_scaled / ctx.temperature if grad is None else grad.add_(grad_scaled, alpha=1 / ctx.temperature)
        return grad, None
