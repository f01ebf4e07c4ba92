"""The trainer-to-loss contract: targets whose structural facts are checked, a closed context, one step function."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import symmetric_targets

from simcse_hn.losses import ContrastiveTargets, LossContext, build_loss
from simcse_hn.targets import build_targets
from simcse_hn.trainer import contrastive_loss


def test_facts_are_derived_from_the_tensors_not_promised():
    one_process = build_targets(8, "symmetric")
    assert one_process.anchors_are_candidates and one_process.standard_negatives
    second_rank = build_targets(8, "symmetric", offset=8, num_candidates=16)  # rank 1 of 2: anchors are rows 8..15
    assert not second_rank.anchors_are_candidates and second_rank.standard_negatives
    assert torch.equal(second_rank.anchor_index, torch.arange(8, 16))
    paper = build_targets(8, "simcse")
    assert not paper.anchors_are_candidates and not paper.standard_negatives
    plain = ContrastiveTargets(*symmetric_targets(8))  # no anchor_index: nothing can be known
    assert not plain.anchors_are_candidates and not plain.standard_negatives


def test_a_mask_that_is_not_the_standard_one_cannot_take_the_shortcut():
    """Before, a caller's promise of standard negatives with another mask gave a wrong UnReMix score silently; now
    the fact is computed, so such targets take the general path and equal the plain call."""
    positive_index, negative_mask = symmetric_targets(10)
    negative_mask[0, 4:7] = False
    targets = ContrastiveTargets(positive_index, negative_mask, anchor_index=torch.arange(10))
    assert targets.anchors_are_candidates and not targets.standard_negatives
    z = torch.randn(10, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    loss_fn = build_loss("unremix", temperature=0.1, gradient="embedding")
    via_trainer = loss_fn.compute(z, targets)
    plain = loss_fn(z, z.clone(), positive_index, negative_mask)
    torch.testing.assert_close(via_trainer.loss, plain.loss, rtol=1e-10, atol=0)
    torch.testing.assert_close(via_trainer.weights, plain.weights, rtol=1e-8, atol=1e-12)


def test_targets_check_their_shapes():
    positive_index, negative_mask = symmetric_targets(8)
    with pytest.raises(ValueError, match="positive_index"):
        ContrastiveTargets(positive_index[:6], negative_mask)
    with pytest.raises(ValueError, match="anchor_index"):
        ContrastiveTargets(positive_index, negative_mask, anchor_index=torch.arange(6))
    with pytest.raises(dataclasses.FrozenInstanceError):
        build_targets(8).standard_negatives = False  # a fact cannot be changed afterwards either


def test_the_context_has_no_room_for_a_misspelt_field():
    with pytest.raises(TypeError, match="max_step"):
        LossContext(step=3, max_step=10)  # misspelt: it would have been ignored in a **state dict
    context = LossContext(step=3, max_steps=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        context.step = 4
    with pytest.raises((AttributeError, TypeError)):
        context.warmup = 1  # slots: no new attributes either


def test_compute_needs_targets_that_know_the_anchors():
    with pytest.raises(ValueError, match="anchor_index"):
        build_loss("infonce").compute(torch.randn(8, 4), ContrastiveTargets(*symmetric_targets(8)))


STEP_CASES = [("infonce", "simcse"), ("infonce", "symmetric"), ("hcl", "symmetric"), ("progcl", "symmetric"),
              ("unremix", "symmetric")]  # fmt: skip  (hard-negative objectives are defined on the symmetric form)


@pytest.mark.parametrize(("name", "form"), STEP_CASES)
def test_the_step_function_equals_the_plain_call_on_the_same_rows(name, form):
    """simcse_hn.trainer.contrastive_loss (what the trainer, tests and benches call) against the loss called plainly
    with anchors = a copy of the anchor rows: same loss and same gradient on the embeddings."""
    z = torch.randn(12, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    h = torch.randn(12, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    a, b = z.clone().requires_grad_(), z.clone().requires_grad_()
    got = contrastive_loss(build_loss(name), a, form=form, head_inputs=h, step=10, max_steps=10)
    got.loss.backward()
    anchor_rows = torch.arange(12) if form == "symmetric" else torch.arange(0, 12, 2)
    targets = build_targets(12, form)
    context = LossContext(step=10, max_steps=10, anchor_features=h[anchor_rows], candidate_features=h)
    want = build_loss(name)(b[anchor_rows], b, targets.positive_index, targets.negative_mask, context)
    want.loss.backward()
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-10, atol=0)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-8, atol=1e-12)

