"""The trainer-to-loss contract: targets whose structural facts are checked, a closed context, one step function."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import symmetric_targets

from simcse_hn.data.collator import SimCSECollator
from simcse_hn.data.pairs import PairCollator
from simcse_hn.losses import ContrastiveTargets, LossContext, build_loss
from simcse_hn.losses.targets import RowLayout, build_paired_targets, build_targets
from simcse_hn.training.step import contrastive_loss


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
    """simcse_hn.training.step.contrastive_loss (what the trainer, tests and benches call) against the loss called
    plainly with anchors = a copy of the anchor rows: same loss and same gradient on the embeddings."""
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



def test_the_plain_call_without_a_mask_states_the_standard_negatives():
    """No negative_mask: N(i) is every candidate but the positive (and the anchor itself when the anchors are the
    candidates' tensor), with the facts true by construction, equal to the checked ones of build_targets."""
    positive_index, negative_mask = symmetric_targets(8)
    stated = ContrastiveTargets.standard(positive_index, 8, anchors_are_candidates=True)
    checked = build_targets(8, "symmetric")
    assert stated.anchors_are_candidates and stated.standard_negatives
    assert torch.equal(stated.negative_mask, negative_mask) and torch.equal(stated.anchor_index, checked.anchor_index)
    for name in ("negative_bias", "negative_offset", "negative_count"):  # written, not derived from the mask
        assert torch.equal(getattr(stated, name), getattr(checked, name)), name
    own = ContrastiveTargets.standard(torch.tensor([0, 2, 1, 4, 3, 5]), 6, anchors_are_candidates=True)
    assert torch.equal(own.negative_count, own.negative_mask.sum(dim=1))  # rows 0 and 5 are their own positive
    assert torch.equal(own.negative_bias == 0, own.negative_mask)
    paper = ContrastiveTargets.standard(torch.arange(4), 4, anchors_are_candidates=False)  # SimCSE's z1 against z2
    assert not paper.anchors_are_candidates and not paper.standard_negatives and paper.anchor_index is None
    assert torch.equal(paper.negative_mask, ~torch.eye(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="positive_index"):
        ContrastiveTargets.standard(torch.arange(6), 8, anchors_are_candidates=True)


PLAIN_CASES = {
    "infonce": {}, "dcl": {}, "hcl": {"beta": 0.5, "tau_plus": 0.01},
    "progcl": {"fit_pairs": 0}, "progcl_mix": {"mode": "mix"},
    "unremix": {"gradient": "embedding", "tau_plus": 0.01}, "unremix_head": {"gradient": "head"},
}  # fmt: skip


@pytest.mark.parametrize("case", list(PLAIN_CASES))
def test_the_plain_calls_with_and_without_a_mask_and_the_trainers_call_agree(case):
    """The same loss, gradient and weights six ways: the stated standard negatives (shortcuts), the same mask given
    explicitly to a copy of the rows (the general path), to the rows themselves (compared with the standard one:
    the shortcuts), the training loop's call with checked targets, and the copy with `anchor_index` saying which
    rows it is, with the mask or without (then the anchors are taken from the rows)."""
    name = case.split("_")[0]
    g = torch.Generator().manual_seed(3)
    h = torch.randn(12, 5, generator=g, dtype=torch.float64)
    z0 = torch.tanh(h @ torch.randn(5, 6, generator=g, dtype=torch.float64))
    positive_index, negative_mask = symmetric_targets(12)
    context = LossContext(step=10, max_steps=10, anchor_features=h, candidate_features=h,
                          mix_permutation=torch.randperm(12, generator=g))  # fmt: skip

    def run(call):
        loss_fn = build_loss(name, temperature=0.1, **PLAIN_CASES[case])
        z = z0.clone().requires_grad_(True)
        out = call(loss_fn, z)
        out.loss.backward()
        return out.loss.detach(), z.grad, out.weights

    stated = run(lambda loss_fn, z: loss_fn(z, z, positive_index, context=context))
    general = run(lambda loss_fn, z: loss_fn(z, z.clone(), positive_index, negative_mask, context))
    checked = run(lambda loss_fn, z: loss_fn(z, z, positive_index, negative_mask, context))
    trainer = run(lambda loss_fn, z: loss_fn.compute(z, build_targets(12, "symmetric"), context))
    rows = torch.arange(12)
    indexed = run(lambda loss_fn, z: loss_fn(z[rows], z, positive_index, negative_mask, context, anchor_index=rows))
    taken = run(lambda loss_fn, z: loss_fn(None, z, positive_index, context=context, anchor_index=rows))
    for other in (general, checked, trainer, indexed, taken):
        torch.testing.assert_close(stated[0], other[0], rtol=1e-9, atol=0)
        torch.testing.assert_close(stated[1], other[1], rtol=1e-7, atol=1e-12)
        if stated[2] is not None:
            torch.testing.assert_close(stated[2], other[2], rtol=1e-7, atol=1e-12)


def test_a_mask_given_with_the_anchors_as_candidates_is_compared_with_the_standard_one(monkeypatch):
    """The plain call with a mask: the standard mask takes the stated targets' shortcuts, any other mask (or anchors
    of their own) the general path, and the loss is that of the general path either way."""
    seen = []
    loss_fn = build_loss("unremix", temperature=0.1)
    original = loss_fn._loss
    monkeypatch.setattr(loss_fn, "_loss", lambda *args: seen.append(args[2]) or original(*args))
    z = torch.randn(10, 4, dtype=torch.float64)
    positive_index, negative_mask = symmetric_targets(10)
    loss_fn(z, z, positive_index, negative_mask)
    assert seen[-1].standard_negatives and seen[-1].anchors_are_candidates
    other = negative_mask.clone()
    other[0, 4:7] = False
    restricted = loss_fn(z, z, positive_index, other).loss
    assert not seen[-1].standard_negatives and seen[-1].anchors_are_candidates
    assert torch.equal(seen[-1].negative_mask, other)
    general = loss_fn(z, z.clone(), positive_index, other).loss
    assert seen[-1].anchor_index is None and not seen[-1].standard_negatives
    torch.testing.assert_close(restricted, general, rtol=1e-10, atol=0)


def test_an_anchor_index_lets_anchors_of_their_own_take_the_shortcuts(monkeypatch):
    """loss_fn(z[a], z, ..., anchor_index=a): the targets know the anchors' rows, so their facts hold (checked) and
    UnReMix makes the shortcut's matrix products (the loss's similarities and both their gradients, the anchors'
    pseudo-label gradients, U: 5 of 2N x 2N x d) instead of the general path's (8, with R's product at 2N x 2N x
    2N); the anchors keep a gradient of their own; anchors that are not those rows, or no anchors and no index,
    are refused in one line."""
    from torch.utils.flop_counter import FlopCounterMode

    seen = []
    loss_fn = build_loss("unremix", temperature=0.1, gradient="embedding")
    original = loss_fn._loss
    monkeypatch.setattr(loss_fn, "_loss", lambda *args: seen.append(args[2]) or original(*args))
    g = torch.Generator().manual_seed(4)
    z = torch.randn(16, 8, generator=g, dtype=torch.float64, requires_grad=True)
    positive_index, negative_mask = symmetric_targets(16)
    rows = torch.arange(16)
    flops = {}
    for call, kwargs in (("gathered", {}), ("indexed", {"anchor_index": rows})):
        anchors = z[rows].detach().requires_grad_()
        with FlopCounterMode(display=False) as counter:
            out = loss_fn(anchors, z, positive_index, negative_mask, **kwargs)
            out.loss.backward()
        flops[call] = counter.get_total_flops()
        assert anchors.grad.abs().sum() > 0  # the anchors' own gradient, not folded into the candidates'
    assert seen[-1].anchors_are_candidates and seen[-1].standard_negatives
    assert not seen[0].standard_negatives
    n, d = 16, 8
    assert flops["indexed"] == 5 * 2 * n * n * d
    assert flops["gathered"] == 7 * 2 * n * n * d + 2 * n * n * n
    with pytest.raises(ValueError, match="not the candidates' rows anchor_index"):
        loss_fn(z[rows.flip(0)], z, positive_index, negative_mask, anchor_index=rows)
    with pytest.raises(ValueError, match="None needs anchor_index"):
        loss_fn(None, z, positive_index)


@pytest.mark.parametrize("name", ["infonce", "progcl", "unremix"])
def test_an_anchor_index_of_some_rows_equals_the_general_path(name):
    """SimCSE's form: the anchors are every other row (anchor_index 0, 2, 4, ...); with and without the index, and
    with the anchors taken from the rows, the same loss and gradient."""
    g = torch.Generator().manual_seed(6)
    h = torch.randn(12, 5, generator=g, dtype=torch.float64)
    z0 = torch.tanh(h @ torch.randn(5, 6, generator=g, dtype=torch.float64))
    targets = build_targets(12, "simcse")
    rows = targets.anchor_index
    context = LossContext(step=10, max_steps=10, anchor_features=h[rows], candidate_features=h)
    results = []
    for anchors, kwargs in (("own", {}), ("own", {"anchor_index": rows}), (None, {"anchor_index": rows})):
        z = z0.clone().requires_grad_(True)
        loss_fn = build_loss(name, temperature=0.1)
        a = z[rows] if anchors == "own" else None
        out = loss_fn(a, z, targets.positive_index, targets.negative_mask, context, **kwargs)
        out.loss.backward()
        results.append((out.loss.detach(), z.grad))
    for loss, grad in results[1:]:
        torch.testing.assert_close(loss, results[0][0], rtol=1e-10, atol=0)
        torch.testing.assert_close(grad, results[0][1], rtol=1e-8, atol=1e-12)


def test_the_row_layout_answers_for_sentences_and_paired_examples():
    """One object says what rows a batch holds: [a, a', b, b', ...] (each text twice) or [a, p, n_1..n_k] per
    example (each text once); the collators say which one they make."""
    sentences, paired = RowLayout(), RowLayout(4)  # paired: [a, p, n1, n2]
    assert (sentences.paired, sentences.rows_per_example, sentences.rows_per_text) == (False, 2, 2)
    assert (paired.paired, paired.rows_per_example, paired.rows_per_text) == (True, 4, 1)
    assert (sentences.texts(8), paired.texts(8)) == (4, 8)
    per_text = torch.tensor([10, 11, 12])
    assert sentences.rows_of_texts(per_text).tolist() == [10, 10, 11, 11, 12, 12]
    assert paired.rows_of_texts(per_text).tolist() == [10, 11, 12]
    assert sentences.negative_rows(6).tolist() == [0, 2, 4]
    assert paired.negative_rows(8).tolist() == [1, 2, 3, 5, 6, 7]
    for made, expected in ((sentences.targets(8, "simcse"), build_targets(8, "simcse")),
                           (paired.targets(8, hard_negative_weight=0.5),
                            build_paired_targets(8, 4, hard_negative_weight=0.5))):  # fmt: skip
        for name in ("positive_index", "negative_mask", "anchor_index"):
            assert torch.equal(getattr(made, name), getattr(expected, name)), name
    assert paired.targets(8, hard_negative_weight=0.5).negative_log_weights.abs().sum() > 0
    with pytest.raises(ValueError, match="hard_negative_weight needs paired data"):
        sentences.targets(8, hard_negative_weight=0.5)
    with pytest.raises(ValueError, match="an anchor and a positive, got group_size 1"):
        RowLayout(1)
    assert SimCSECollator(None).layout == sentences and PairCollator(None, negatives=2).layout == paired
