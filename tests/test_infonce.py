"""InfoNCE in both target forms against independent references, loss and gradient, float64."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from simcse_hn.losses import build_loss
from simcse_hn.losses.targets import contrastive_targets


def _views(num_sentences=6, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    z1 = torch.randn(num_sentences, dim, generator=g, dtype=torch.float64)
    z2 = z1 + 0.3 * torch.randn(num_sentences, dim, generator=g, dtype=torch.float64)
    return z1, z2


def _interleave(z1, z2):
    return torch.stack([z1, z2], dim=1).reshape(-1, z1.shape[1])  # rows [a, a', b, b', ...]


def _ours(rows, form, temperature):
    anchor_rows, positive_index, negative_mask = contrastive_targets(rows.shape[0], form)
    return build_loss("infonce", temperature=temperature)(rows[anchor_rows], rows, positive_index, negative_mask).loss


def test_simcse_form_equals_paper_cross_entropy():
    temperature = 0.05
    z1, z2 = _views()
    z1.requires_grad_(True)
    z2.requires_grad_(True)
    ours = _ours(_interleave(z1, z2), "simcse", temperature)
    grads = torch.autograd.grad(ours, (z1, z2))

    z1r, z2r = z1.detach().clone().requires_grad_(True), z2.detach().clone().requires_grad_(True)
    sim = F.cosine_similarity(z1r[:, None], z2r[None], dim=-1)  # (N, N), as SimCSE's Similarity module
    reference = F.cross_entropy(sim / temperature, torch.arange(z1.shape[0]))
    ref_grads = torch.autograd.grad(reference, (z1r, z2r))

    torch.testing.assert_close(ours, reference, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def _nt_xent_loop(rows, temperature):
    """Independent NT-Xent: python loops over anchors, explicit exp/log."""
    z = rows / rows.norm(dim=1, keepdim=True)
    total = 0.0
    for i in range(rows.shape[0]):
        p = i ^ 1
        numerator = torch.exp(z[i] @ z[p] / temperature)
        denominator = sum(torch.exp(z[i] @ z[j] / temperature) for j in range(rows.shape[0]) if j != i)
        total = total - torch.log(numerator / denominator)
    return total / rows.shape[0]


def test_symmetric_form_equals_loop_nt_xent():
    temperature = 0.5  # moderate, so the explicit exp of the loop reference is well conditioned
    rows = _interleave(*_views(seed=1)).requires_grad_(True)
    ours = _ours(rows, "symmetric", temperature)
    (grad,) = torch.autograd.grad(ours, rows)
    rows_ref = rows.detach().clone().requires_grad_(True)
    reference = _nt_xent_loop(rows_ref, temperature)
    (ref_grad,) = torch.autograd.grad(reference, rows_ref)
    torch.testing.assert_close(ours, reference, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-12)


def test_symmetric_and_simcse_forms_differ():
    rows = _interleave(*_views(seed=2))
    assert not torch.isclose(_ours(rows, "symmetric", 0.05), _ours(rows, "simcse", 0.05))


def test_float32_inputs_under_bf16_autocast_are_scored_in_float32():
    rows = _interleave(*_views(seed=3)).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = _ours(rows.bfloat16(), "symmetric", 0.05)
    assert loss.dtype == torch.float32
