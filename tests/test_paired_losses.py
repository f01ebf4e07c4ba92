"""Paired data, [a, p, n_1..n_k] per example: the targets, every objective against a loop reference written per
anchor, InfoNCE against SimCSE's supervised loss, SimCSE's hard_negative_weight, and the guide model's exclusions."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats
from test_loss_progcl import scipy_em

from simcse_hn.losses import LossContext, build_loss
from simcse_hn.losses.targets import ContrastiveTargets, build_paired_targets, build_targets
from simcse_hn.training.step import contrastive_loss

TAU = 0.1


def roles(num_examples: int, negatives: int) -> list[dict]:
    """Per anchor, written out: its row, its positive's, the rows that are its negatives (every other example's
    positive and every explicit negative, its own included) and its own explicit negatives."""
    group = 2 + negatives
    rows = num_examples * group
    out = []
    for e in range(num_examples):
        anchor, positive = e * group, e * group + 1
        negs = []
        for j in range(rows):
            is_anchor = j % group == 0
            if not is_anchor and j != positive:
                negs.append(j)
        own = [e * group + 2 + m for m in range(negatives)]
        out.append({"anchor": anchor, "positive": positive, "negatives": negs, "own": own})
    return out


def paired_batch(num_examples: int, negatives: int, seed: int, dim: int = 8) -> torch.Tensor:
    """Rows [a, p, n_1..n_k]: positives near their anchor, explicit negatives nearer than a random row."""
    g = torch.Generator().manual_seed(seed)
    group = 2 + negatives
    z = torch.randn(num_examples * group, dim, generator=g, dtype=torch.float64)
    z[1::group] = z[0::group] + 0.5 * torch.randn(num_examples, dim, generator=g, dtype=torch.float64)
    for m in range(negatives):
        z[2 + m :: group] = z[0::group] + 1.2 * torch.randn(num_examples, dim, generator=g, dtype=torch.float64)
    return z


def cos(x, y):
    return x @ y / (x.norm() * y.norm())


def test_targets_are_simcse_supervised_layout_and_their_facts_are_false():
    targets = build_paired_targets(12, 3, hard_negative_weight=0.4)
    for i, r in enumerate(roles(4, 1)):
        assert int(targets.anchor_index[i]) == r["anchor"] and int(targets.positive_index[i]) == r["positive"]
        assert targets.negative_mask[i].nonzero().flatten().tolist() == r["negatives"]
        weighted = (targets.negative_log_weights[i] != 0).nonzero().flatten().tolist()
        assert weighted == r["own"] and torch.all(targets.negative_log_weights[i, r["own"]] == 0.4)
    assert not targets.anchors_are_candidates and not targets.standard_negatives
    assert build_paired_targets(12, 3).negative_log_weights is None  # weight 0: nothing to add
    # rank 1 of 2: the same layout, offset by the other process's rows
    second = build_paired_targets(12, 3, offset=12, num_candidates=24)
    assert second.anchor_index.tolist() == [12, 15, 18, 21] and second.negative_mask.shape == (4, 24)
    assert second.negative_mask[0, 1] and not second.negative_mask[0, 3]  # rank 0's positive: yes; anchor: no
    # pairs without negatives are the unsupervised simcse form's targets on [a, p, b, q, ...]
    pairs, simcse = build_paired_targets(8, 2), build_targets(8, "simcse")
    assert torch.equal(pairs.negative_mask, simcse.negative_mask)
    assert torch.equal(pairs.positive_index, simcse.positive_index)
    with pytest.raises(ValueError, match="groups|examples"):
        build_paired_targets(10, 3)


def test_restricting_negatives_keeps_anchor_facts_and_checks_nothing(monkeypatch):
    targets = build_targets(8, "symmetric")
    assert targets.anchors_are_candidates and targets.standard_negatives
    keep = torch.ones(8, 8, dtype=torch.bool)
    keep[0, 3] = False

    def no_check(self):
        raise AssertionError("restrict_negatives re-ran the fact checks")

    monkeypatch.setattr(ContrastiveTargets, "__post_init__", no_check)
    restricted = targets.restrict_negatives(keep)
    assert restricted.anchors_are_candidates and not restricted.standard_negatives
    assert not restricted.negative_mask[0, 3] and restricted.negative_mask.sum() == targets.negative_mask.sum() - 1
    assert targets.negative_mask[0, 3]  # the original targets are unchanged


def simcse_supervised_loss(z1, z2, z3, temperature, hard_negative_weight):
    """princeton-nlp/SimCSE cl_forward with a hard negative: CE over [cos(z1, z2) / t, cos(z1, z3) / t + w I]."""
    sim12 = F.cosine_similarity(z1[:, None], z2[None], dim=-1) / temperature
    sim13 = F.cosine_similarity(z1[:, None], z3[None], dim=-1) / temperature
    weights = hard_negative_weight * torch.eye(z1.shape[0], dtype=z1.dtype)
    logits = torch.cat([sim12, sim13 + weights], dim=1)
    return F.cross_entropy(logits, torch.arange(z1.shape[0]))


@pytest.mark.parametrize("weight", [0.0, 0.7, -1.5])
def test_infonce_equals_simcse_supervised_loss(weight):
    z = paired_batch(6, 1, seed=0)
    ours = z.clone().requires_grad_()
    got = contrastive_loss(build_loss("infonce", temperature=0.05), ours, group_size=3, hard_negative_weight=weight)
    got.loss.backward()
    ref = z.clone().requires_grad_()
    want = simcse_supervised_loss(ref[0::3], ref[1::3], ref[2::3], 0.05, weight)
    want.backward()
    torch.testing.assert_close(got.loss, want, rtol=1e-12, atol=0)
    torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-10, atol=1e-14)


# --- every objective against a loop reference on the paired layout, with the hard negative weight ---


def debiased(pos, negative_sum, n, tau_plus, temperature):
    ng = (negative_sum - tau_plus * n * pos) / (1 - tau_plus)
    return -torch.log(pos / (pos + torch.clamp(ng, min=n * math.exp(-1 / temperature))))


def progcl_hardness(z, layout):
    """B_ij = p(true | x_ij) x_ij of a SciPy Beta mixture fitted to every (anchor, negative) pair of the layout; the
    true negatives are the majority component, and the fit must separate the false ones (a heavier upper tail)."""
    zn = F.normalize(z.detach(), dim=1)
    x = {(r["anchor"], j): float((zn[r["anchor"]] @ zn[j] + 1) / 2) for r in layout for j in r["negatives"]}
    alpha, beta, pi = scipy_em(np.array(list(x.values())))
    true, false = int(np.argmax(pi)), int(np.argmin(pi))
    assert beta[false] < beta[true], "the fit does not separate: ProGCL would fall back, the test would be moot"

    def posterior(v):
        lik = [pi[c] * stats.beta.pdf(np.clip(v, 1e-12, 1 - 1e-12), alpha[c], beta[c]) for c in range(2)]
        return lik[true] / (lik[0] + lik[1] + 1e-12)

    return {key: float(posterior(v)) * v for key, v in x.items()}, (alpha, beta, pi)


def uncertainty_gradient(z, row, others):
    """Gradient at z[row] of CE(q, argmax q), q = softmax over `others` of cos / t (the others held fixed)."""
    z_k = z[row].detach().clone().requires_grad_()
    logits = torch.stack([cos(z_k, z[m].detach()) / TAU for m in others])
    ce = -torch.log_softmax(logits, dim=0)[int(logits.argmax())]
    return torch.autograd.grad(ce, z_k)[0]


def unremix_weights(z, layout, beta):
    """UnReMix's w_ij = n softmax_j(beta C_ij), C = mean of the standardised A, U, R over N(i), with loops
    (gradient mode "embedding": U_ij = g_i . g_j, g the pseudo-label gradient at the embedding)."""
    rows = z.shape[0]
    s = [[float(cos(z[i], z[j]).detach()) for j in range(rows)] for i in range(rows)]
    weights = []
    for r in layout:
        i, negs = r["anchor"], r["negatives"]
        g_i = uncertainty_gradient(z, i, negs + [r["positive"]])
        raw = {
            "A": {j: s[i][j] for j in negs},
            "U": {j: float(g_i @ uncertainty_gradient(z, j, [m for m in range(rows) if m != j])) for j in negs},
            "R": {j: statistics.fmean(1 - s[j][k] for k in negs if k != j) for j in negs},
        }
        score = {j: 0.0 for j in negs}
        for values in raw.values():
            mean, spread = statistics.fmean(values.values()), statistics.pstdev(values.values())
            for j in negs:
                score[j] += (values[j] - mean) / (spread + 1e-6) / 3
        norm = sum(math.exp(beta * v) for v in score.values())
        weights.append({j: len(negs) * math.exp(beta * score[j]) / norm for j in negs})
    return weights


def loop_reference(name, z, layout, weight, kwargs, permutation=None):
    """Mean over anchors of each objective's formula (docs in the loss classes), loops over negatives, exp space;
    each anchor's own explicit negatives carry the extra weight c = e^weight on e^{l_ij}."""
    temperature, tau_plus, beta = TAU, kwargs.get("tau_plus", 0.0), kwargs.get("beta", 0.0)
    hardness = progcl_hardness(z, layout)[0] if name == "progcl" else None
    mixture = unremix_weights(z, layout, beta) if name == "unremix" else None
    total = 0.0
    for index, r in enumerate(layout):
        i, negs = r["anchor"], r["negatives"]
        c = {j: math.exp(weight) if j in r["own"] else 1.0 for j in negs}
        s = {j: cos(z[i], z[j]) for j in negs}
        pos = torch.exp(cos(z[i], z[r["positive"]]) / temperature)
        e = {j: torch.exp(s[j] / temperature) for j in negs}
        n = len(negs)
        if name == "infonce":
            total = total - torch.log(pos / (pos + sum(c[j] * e[j] for j in negs)))
        elif name == "dcl":
            total = total + debiased(pos, sum(c[j] * e[j] for j in negs), n, tau_plus, temperature)
        elif name == "hcl":
            imp = {j: torch.exp(beta * s[j] / temperature) for j in negs}
            mean_imp = sum(imp.values()) / n
            total = total + debiased(pos, sum(c[j] * imp[j] / mean_imp * e[j] for j in negs), n, tau_plus,
                                     temperature)  # fmt: skip
        elif name == "progcl" and kwargs.get("mode", "weight") == "weight":
            b = {j: hardness[(i, j)] for j in negs}
            mean_b = sum(b.values()) / n
            total = total - torch.log(pos / (pos + sum(c[j] * b[j] / mean_b * e[j] for j in negs)))
        elif name == "progcl":  # mix over every negative: each paired, in candidate order, with the permutation's
            # entries that are negatives; the synthetic negatives mix unweighted similarities
            b = {j: hardness[(i, j)] for j in negs}
            denominator = pos + sum(c[j] * e[j] for j in negs)
            for j, partner in zip(negs, [p for p in permutation if p in negs]):
                mixed = (b[j] * s[j] + b[partner] * s[partner]) / (b[j] + b[partner] + 1e-12)
                denominator = denominator + torch.exp(mixed / temperature)
            total = total - torch.log(pos / denominator)
        else:  # unremix
            w = mixture[index]
            total = total + debiased(pos, sum(c[j] * w[j] * e[j] for j in negs), n, tau_plus, temperature)
    return total / len(layout)


OBJECTIVES = [
    ("infonce", {}),
    ("dcl", {"tau_plus": 0.05}),
    ("hcl", {"beta": 0.5, "tau_plus": 0.05}),
    ("hcl", {"beta": 1.0, "tau_plus": 0.0}),
    ("progcl", {"warmup_ratio": 0.0}),
    ("progcl", {"warmup_ratio": 0.0, "mode": "mix"}),
    ("unremix", {"beta": 1.0, "gradient": "embedding"}),
    ("unremix", {"beta": 2.0, "tau_plus": 0.05, "gradient": "embedding"}),
]


@pytest.mark.parametrize("weight", [0.0, 0.6])
@pytest.mark.parametrize(("name", "kwargs"), OBJECTIVES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(OBJECTIVES)])
def test_every_objective_equals_its_loop_reference_on_paired_rows(name, kwargs, weight):
    num_examples, negatives = 4, 2
    z = paired_batch(num_examples, negatives, seed=3)
    layout = roles(num_examples, negatives)
    targets = build_paired_targets(z.shape[0], 2 + negatives, hard_negative_weight=weight)
    permutation = torch.randperm(z.shape[0], generator=torch.Generator().manual_seed(1))  # ProGCL-mix: K = N
    loss_fn = build_loss(name, temperature=TAU, **kwargs)
    ours = z.clone().requires_grad_()
    out = loss_fn.compute(ours, targets, LossContext(mix_permutation=permutation))
    out.loss.backward()
    ref = z.clone().requires_grad_()
    want = loop_reference(name, ref, layout, weight, kwargs, permutation.tolist())
    want.backward()
    torch.testing.assert_close(out.loss, want, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-7, atol=1e-10)
    assert out.metrics["nonfinite_fallback"].item() == 0
    if name == "progcl":  # the mixture was fitted to exactly the paired negatives
        assert out.metrics["bmm_fallback"].item() == 0
        np.testing.assert_allclose(loss_fn.bmm_alpha.numpy(), progcl_hardness(z, layout)[1][0], rtol=1e-6)


def test_the_hard_negative_weight_changes_the_loss_only_through_own_negatives():
    """A weight on the own negatives of an anchor whose own negatives are removed changes nothing for it."""
    z = paired_batch(4, 1, seed=5)
    weighted = build_paired_targets(12, 3, hard_negative_weight=2.0)
    keep = torch.ones_like(weighted.negative_mask)
    keep[:, 2::3] = False  # every explicit negative removed: only in-batch positives are left
    loss_fn = build_loss("hcl", temperature=TAU, beta=0.5)
    plain = loss_fn.compute(z, build_paired_targets(12, 3).restrict_negatives(keep)).loss
    torch.testing.assert_close(loss_fn.compute(z, weighted.restrict_negatives(keep)).loss, plain, rtol=1e-12, atol=0)
    assert not torch.isclose(loss_fn.compute(z, weighted).loss, loss_fn.compute(z, build_paired_targets(12, 3)).loss)


# --- the guide model's false-negative guard ---


def loop_false_negatives(guide, anchors, positives, negatives, margin):
    """Candidates j with g(anchor, j) > g(anchor, positive) - margin, among each anchor's negatives."""
    out = []
    for a, p, negs in zip(anchors, positives, negatives):
        threshold = cos(guide[a], guide[p]) - margin
        out.append([j for j in negs if cos(guide[a], guide[j]) > threshold])
    return out


@pytest.mark.parametrize(("name", "kwargs"), OBJECTIVES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(OBJECTIVES)])
def test_guide_removes_what_it_scores_above_the_positive_for_every_objective(name, kwargs):
    num_examples, negatives = 4, 2
    z = paired_batch(num_examples, negatives, seed=7)
    guide = paired_batch(num_examples, negatives, seed=8, dim=5)  # another model's embeddings of the same rows
    layout = roles(num_examples, negatives)
    removed = loop_false_negatives(guide, [r["anchor"] for r in layout], [r["positive"] for r in layout],
                                   [r["negatives"] for r in layout], margin=0.3)  # fmt: skip
    total = sum(map(len, removed))
    assert 0 < total < sum(len(r["negatives"]) for r in layout)  # the case removes some negatives, not all

    ours = z.clone().requires_grad_()
    loss_fn = build_loss(name, temperature=TAU, **kwargs)
    permutation = torch.randperm(z.shape[0], generator=torch.Generator().manual_seed(1))
    if name == "progcl" and kwargs.get("mode") == "mix":
        loss_fn.compute = _with_permutation(loss_fn.compute, permutation)
    got = contrastive_loss(loss_fn, ours, group_size=2 + negatives, hard_negative_weight=0.5,
                           guide_embeddings=guide, guide_margin=0.3)  # fmt: skip
    got.loss.backward()
    assert got.metrics["guide_removed"].item() == pytest.approx(total / num_examples)
    assert got.metrics["guide_removed_frac"].item() == pytest.approx(total / sum(len(r["negatives"]) for r in layout))

    mask = torch.zeros(num_examples, z.shape[0], dtype=torch.bool)
    for i, r in enumerate(layout):
        mask[i, [j for j in r["negatives"] if j not in removed[i]]] = True
    full = build_paired_targets(z.shape[0], 2 + negatives, hard_negative_weight=0.5)
    checked = ContrastiveTargets(full.positive_index, mask, anchor_index=full.anchor_index,
                                 negative_log_weights=full.negative_log_weights)  # fmt: skip
    ref = z.clone().requires_grad_()
    want = build_loss(name, temperature=TAU, **kwargs).compute(ref, checked, LossContext(mix_permutation=permutation))
    want.loss.backward()
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-8, atol=1e-12)


def _with_permutation(compute, permutation):
    import dataclasses

    return lambda candidates, targets, context=None: compute(
        candidates, targets, dataclasses.replace(context, mix_permutation=permutation)
    )


@pytest.mark.parametrize(("name", "kwargs"), OBJECTIVES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(OBJECTIVES)])
def test_an_anchor_left_without_negatives_contributes_zero(name, kwargs):
    """A guide can remove all of an anchor's negatives: its loss is InfoNCE's 0 (not NaN, no fallback), and the
    others' losses and gradients are those of the batch without it (mean over all anchors)."""
    z = paired_batch(4, 2, seed=9)
    targets = build_paired_targets(16, 4, hard_negative_weight=0.5)
    keep = torch.ones_like(targets.negative_mask)
    keep[1] = False
    loss_fn = build_loss(name, temperature=TAU, **kwargs)
    permutation = torch.randperm(16, generator=torch.Generator().manual_seed(2))
    context = LossContext(mix_permutation=permutation)
    ours = z.clone().requires_grad_()
    out = loss_fn.compute(ours, targets.restrict_negatives(keep), context)
    out.loss.backward()
    assert out.metrics["nonfinite_fallback"].item() == 0 and torch.isfinite(out.metrics["neg_weight_entropy"])
    others = torch.tensor([0, 2, 3])  # the batch without anchor 1 (its rows stay candidates)
    without = ContrastiveTargets(targets.positive_index[others], targets.negative_mask[others],
                                 anchor_index=targets.anchor_index[others],
                                 negative_log_weights=targets.negative_log_weights[others])  # fmt: skip
    ref = z.clone().requires_grad_()
    want = build_loss(name, temperature=TAU, **kwargs).compute(ref, without, context).loss * 3 / 4
    want.backward()
    torch.testing.assert_close(out.loss, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("name", ["infonce", "progcl", "unremix"])
def test_guide_in_the_single_sentence_layout_keeps_the_anchor_fact(name):
    """Rows [a, a', b, b', ...] (symmetric form, one process) with the model as its own guide: the restricted targets
    keep anchors_are_candidates (ProGCL's triangle fit, UnReMix's shared products), lose standard_negatives, and the
    loss equals the plain call with the loop-built mask."""
    z = paired_batch(6, 0, seed=11)  # rows [a, p]: two close views per sentence
    z[8:10] = z[0:2] + 0.01  # sentence 4 repeats sentence 0: a false negative
    seen = {}
    loss_fn = build_loss(name, temperature=TAU, **({"warmup_ratio": 0.0} if name == "progcl" else {}))
    compute = loss_fn.compute

    def spy(candidates, targets, context=None):
        seen["targets"] = targets
        return compute(candidates, targets, context)

    loss_fn.compute = spy
    got = contrastive_loss(loss_fn, z, form="symmetric", guide_embeddings=z.detach(), guide_margin=0.0)
    targets = seen["targets"]
    assert targets.anchors_are_candidates and not targets.standard_negatives
    rows = list(range(12))
    removed = loop_false_negatives(z, rows, [i ^ 1 for i in rows], [[j for j in rows if j not in (i, i ^ 1)]
                                   for i in rows], margin=0.0)  # fmt: skip
    assert 8 in removed[0] and 9 in removed[1] and got.metrics["guide_removed"].item() > 0
    mask = torch.zeros(12, 12, dtype=torch.bool)
    for i in rows:
        mask[i, [j for j in rows if j not in (i, i ^ 1) and j not in removed[i]]] = True
    assert torch.equal(targets.negative_mask, mask)
    plain_fn = build_loss(name, temperature=TAU, **({"warmup_ratio": 0.0} if name == "progcl" else {}))
    want = plain_fn(z, z.clone(), torch.tensor(rows) ^ 1, mask)
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-9, atol=1e-12)
