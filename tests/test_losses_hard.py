"""HCL / DCL against a loop-based reference, the registry, and the edge cases every hard-negative loss must survive."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import square_targets, symmetric_targets

from simcse_hn.losses import (
    LOSSES,
    DCLLoss,
    HCLLoss,
    InfoNCELoss,
    LossContext,
    ObjectiveOutput,
    build_loss,
    fast_paths,
    progcl,
)
from simcse_hn.losses.base import plain_infonce, weighted_loss
from simcse_hn.losses.targets import contrastive_targets


def leaves(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Separate leaves for anchors and candidates, so both gradients are checked."""
    return z.clone().requires_grad_(True), z.clone().requires_grad_(True)


def reference_hcl(anchors, candidates, beta, tau_plus, temperature, detach_weights=False):
    """joshr17/HCL's formula written out with loops over anchors and negatives, in exp space. -> loss, clamped frac"""
    total, clamped = 0.0, 0
    units = [c / c.norm().clamp_min(1e-12) for c in candidates]
    for i in range(anchors.shape[0]):
        a = anchors[i] / anchors[i].norm().clamp_min(1e-12)
        negatives = [j for j in range(candidates.shape[0]) if j not in (i, i ^ 1)]
        n = len(negatives)
        pos = torch.exp(a @ units[i ^ 1] / temperature)
        neg = [torch.exp(a @ units[j] / temperature) for j in negatives]
        imp = [torch.exp(beta * (a @ units[j]) / temperature) for j in negatives]
        if detach_weights:
            imp = [w.detach() for w in imp]
        reweighted = sum(w * e for w, e in zip(imp, neg)) / (sum(imp) / n)
        ng = (reweighted - tau_plus * n * pos) / (1 - tau_plus)
        floor = n * math.exp(-1 / temperature)
        clamped += int(ng < floor)
        ng = torch.clamp(ng, min=floor)
        total = total - torch.log(pos / (pos + ng))
    return total / anchors.shape[0], clamped / anchors.shape[0]


@pytest.mark.parametrize(
    "beta, tau_plus, temperature, detach",
    [(0.0, 0.0, 0.1, False), (1.0, 0.0, 0.1, False), (0.5, 0.1, 0.5, False), (2.0, 0.05, 0.2, True)],
)
def test_hcl_matches_loop_reference(beta, tau_plus, temperature, detach):
    torch.manual_seed(0)
    z = torch.randn(10, 6, dtype=torch.float64)
    positive_index, negative_mask = symmetric_targets(10)
    a, c = leaves(z)
    loss_fn = HCLLoss(temperature, beta=beta, tau_plus=tau_plus, detach_weights=detach)
    out = loss_fn(a, c, positive_index, negative_mask)
    out.loss.backward()
    ra, rc = leaves(z)
    ref, clamped = reference_hcl(ra, rc, beta, tau_plus, temperature, detach)
    ref.backward()
    torch.testing.assert_close(out.loss, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(a.grad, ra.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(c.grad, rc.grad, rtol=1e-10, atol=1e-12)
    assert out.metrics["clamp_frac"].item() == pytest.approx(clamped)
    assert out.metrics["nonfinite_fallback"].item() == 0
    weights = out.weights
    torch.testing.assert_close(weights.sum(dim=1), negative_mask.sum(dim=1).double())  # mean one over N(i)


def test_dcl_matches_loop_reference_with_active_clamp():
    torch.manual_seed(1)
    z = torch.randn(12, 5, dtype=torch.float64)
    z[1::2] = z[0::2] + 0.3 * torch.randn(6, 5, dtype=torch.float64)  # close positives: the clamp bites for some
    positive_index, negative_mask = symmetric_targets(12)
    a, c = leaves(z)
    out = DCLLoss(temperature=0.2, tau_plus=0.1)(a, c, positive_index, negative_mask)
    out.loss.backward()
    ra, rc = leaves(z)
    ref, clamped = reference_hcl(ra, rc, 0.0, 0.1, 0.2)
    ref.backward()
    assert 0 < clamped < 1
    torch.testing.assert_close(out.loss, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(a.grad, ra.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(c.grad, rc.grad, rtol=1e-10, atol=1e-12)
    assert out.metrics["clamp_frac"].item() == pytest.approx(clamped)
    assert out.weights is None


@pytest.mark.parametrize("loss_fn", [HCLLoss(0.2, beta=1.5, tau_plus=0.1), DCLLoss(0.3, tau_plus=0.1)])
def test_gradcheck(loss_fn):
    torch.manual_seed(2)
    positive_index, negative_mask = symmetric_targets(6)
    a, c = leaves(torch.randn(6, 4, dtype=torch.float64))
    assert torch.autograd.gradcheck(lambda x, y: loss_fn(x, y, positive_index, negative_mask).loss, (a, c))


@pytest.mark.parametrize("loss_fn", [HCLLoss(0.05, beta=0.0, tau_plus=0.0), DCLLoss(0.05, tau_plus=0.0)])
def test_neutral_setting_is_infonce(loss_fn):
    torch.manual_seed(3)
    z = torch.randn(16, 8, dtype=torch.float64)
    positive_index, negative_mask = symmetric_targets(16)
    a, c = leaves(z)
    out = loss_fn(a, c, positive_index, negative_mask)
    out.loss.backward()
    assert out.metrics["nonfinite_fallback"].item() == 0  # InfoNCE by the objective itself, not by the fallback
    ra, rc = leaves(z)
    ref = InfoNCELoss(0.05)(ra, rc, positive_index, negative_mask).loss
    ref.backward()
    torch.testing.assert_close(out.loss, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(a.grad, ra.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(c.grad, rc.grad, rtol=0, atol=1e-12)


def test_hcl_up_weights_a_duplicated_sentence():
    torch.manual_seed(4)
    z = torch.randn(8, 16)
    z[6:8] = z[0:2] + 0.01 * torch.randn(2, 16)  # sentence 3 repeats sentence 0: a false negative of rows 0, 1
    positive_index, negative_mask = symmetric_targets(8)
    weights = HCLLoss(0.05, beta=0.1)(z, z, positive_index, negative_mask).weights
    assert weights[0, 6] > 1.5 and weights[0, 6] == weights[0].max()
    assert weights[1, 7] > 1.5 and weights[1, 7] == weights[1].max()


@pytest.mark.parametrize("name", ["hcl_beta4", "progcl_weight", "unremix_embedding"])
def test_weight_diagnostics_describe_the_returned_weights(name):
    """neg_weight_max is the largest weight; neg_weight_entropy the mean over anchors of the entropy (nats) of the
    row's weights normalised over N(i), computed here the long way, row by row."""
    torch.manual_seed(6)
    z = torch.randn(12, 16, dtype=torch.float64)
    z[10:12] = z[0:2] + 0.01 * torch.randn(2, 16, dtype=torch.float64)  # a false negative: non-uniform weights
    positive_index, negative_mask = symmetric_targets(12)
    loss_fn = EDGE_LOSSES[name]()
    out = loss_fn(z, z, positive_index, negative_mask)
    entropies = []
    for i in range(12):
        p = out.weights[i][negative_mask[i]].double()
        p = p / p.sum()
        entropies.append(-(p * p.log()).sum().item())
    assert max(entropies) < math.log(10) - 1e-3  # not the uniform value: the check can tell weights apart
    assert out.metrics["neg_weight_entropy"].item() == pytest.approx(sum(entropies) / 12, rel=1e-5)
    assert out.metrics["neg_weight_max"].item() == pytest.approx(out.weights.max().item(), rel=1e-6)
    assert out.metrics["neg_weight_max"].item() > 1


def test_hcl_compiles_without_graph_breaks_and_matches_eager():
    torch.manual_seed(5)
    z = torch.randn(8, 16)
    positive_index, negative_mask = symmetric_targets(8)
    for loss_fn in (HCLLoss(0.05, beta=0.5, tau_plus=0.1), DCLLoss(0.05, tau_plus=0.1)):
        torch._dynamo.reset()
        compiled = torch.compile(loss_fn, fullgraph=True, backend="aot_eager")
        a, c = leaves(z)
        out = compiled(a, c, positive_index, negative_mask, LossContext(step=3, max_steps=10))
        out.loss.backward()
        ra, rc = leaves(z)
        ref = loss_fn(ra, rc, positive_index, negative_mask)
        ref.loss.backward()
        torch.testing.assert_close(out.loss, ref.loss)
        torch.testing.assert_close(a.grad, ra.grad)
        torch.testing.assert_close(c.grad, rc.grad)
        assert out.metrics.keys() == ref.metrics.keys()
        for key in ref.metrics:
            torch.testing.assert_close(out.metrics[key], ref.metrics[key])
    torch._dynamo.reset()


# --- the edge cases of docs/losses.md section 7, for every hard-negative loss ---

EDGE_LOSSES = {
    "dcl": lambda: build_loss("dcl", temperature=0.05, tau_plus=0.1),
    "hcl_beta4": lambda: build_loss("hcl", temperature=0.05, beta=4.0, tau_plus=0.0),
    "hcl_debiased": lambda: build_loss("hcl", temperature=0.05, beta=0.1, tau_plus=0.1),
    "hardness": lambda: build_loss("hardness", temperature=0.05, strength=9.0),
    "progcl_weight": lambda: build_loss("progcl", temperature=0.05, mode="weight"),
    "progcl_mix": lambda: build_loss("progcl", temperature=0.05, mode="mix"),
    "unremix_head": lambda: build_loss("unremix", temperature=0.05, beta=4.0, gradient="head"),
    "unremix_embedding": lambda: build_loss("unremix", temperature=0.05, beta=1.0, tau_plus=0.1, gradient="embedding"),
}


def edge_batch(case: str) -> torch.Tensor:
    torch.manual_seed(6)
    z = torch.randn(8, 16)
    if case == "duplicate":
        z[6:8] = z[0:2] + 1e-3 * torch.randn(2, 16)
    elif case == "exact_duplicates":  # dropout off: positives and the repeated sentence all have s = 1
        z[1::2] = z[0::2]
        z[6:8] = z[0:2]
    elif case == "collapsed":
        z[:] = z[0]
    elif case == "zero_norm":
        z[3] = 0.0
    return z


@pytest.mark.parametrize("case", ["random", "duplicate", "exact_duplicates", "collapsed", "zero_norm"])
@pytest.mark.parametrize("name", list(EDGE_LOSSES))
def test_edge_cases_are_finite(name, case):
    z = edge_batch(case)
    positive_index, negative_mask = symmetric_targets(8)
    features = torch.randn(8, 12).requires_grad_(True)  # the head inputs h, for UnReMix's "head" gradient
    a = z.clone().requires_grad_(True)
    loss_fn = EDGE_LOSSES[name]()
    out = loss_fn.compute(a, square_targets(8), LossContext(candidate_features=features))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert torch.isfinite(a.grad).all()
    assert out.metrics["nonfinite_fallback"].item() == 0
    assert all(torch.isfinite(v).all() for v in out.metrics.values()), out.metrics
    if out.weights is not None:
        assert torch.isfinite(out.weights).all() and (out.weights >= 0).all()
    if case == "collapsed":
        n = negative_mask.sum(dim=1)[0].item()
        raised = getattr(loss_fn.options, "strength", 0.0)  # hardness: every negative's logit + strength x cosine 1
        assert out.loss.item() == pytest.approx(math.log(1 + n * math.exp(raised)), rel=1e-5)


@pytest.mark.parametrize("name", list(EDGE_LOSSES))
def test_autocast_does_not_lower_the_precision_of_the_loss(name):
    """Similarities and everything after them stay float32 under bf16 autocast (the encoder's matmuls would not)."""
    z = edge_batch("duplicate")
    positive_index, negative_mask = symmetric_targets(8)
    features = torch.randn(8, 12, generator=torch.Generator().manual_seed(0))
    context = LossContext(candidate_features=features, mix_permutation=torch.randperm(8))
    torch.manual_seed(0)
    plain = EDGE_LOSSES[name]().compute(z, square_targets(8), context)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = EDGE_LOSSES[name]().compute(z, square_targets(8), context)
    assert mixed.loss.dtype == torch.float32
    torch.testing.assert_close(mixed.loss, plain.loss, rtol=1e-6, atol=1e-6)
    if plain.weights is not None:
        torch.testing.assert_close(mixed.weights, plain.weights, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(EDGE_LOSSES))
def test_nonfinite_objective_falls_back_to_infonce(name, monkeypatch):
    torch.manual_seed(7)
    z = torch.randn(8, 16)
    positive_index, negative_mask = symmetric_targets(8)
    loss_fn = EDGE_LOSSES[name]()

    def broken(batch):
        # NaN weights inside the graph: the value is NaN and its backward would be NaN too.
        logits, targets = batch.logits, batch.targets
        log_weights = logits * float("nan")
        loss = weighted_loss(logits, targets.positive_index, targets.negative_mask, log_weights)
        return ObjectiveOutput(loss=loss, log_weights=log_weights)

    monkeypatch.setattr(loss_fn, "per_anchor", broken)
    a = z.clone().requires_grad_(True)
    out = loss_fn(a, a, positive_index, negative_mask)
    out.loss.backward()
    r = z.clone().requires_grad_(True)
    ref = InfoNCELoss(0.05)(r, r, positive_index, negative_mask).loss
    ref.backward()
    assert out.metrics["nonfinite_fallback"].item() == 1
    torch.testing.assert_close(out.loss, ref)
    torch.testing.assert_close(a.grad, r.grad)
    assert torch.equal(out.weights, negative_mask.float())

    monkeypatch.setattr(loss_fn, "per_anchor", lambda batch: ObjectiveOutput(loss=torch.full((8,), math.inf)))
    out = loss_fn(z, z, positive_index, negative_mask)
    assert out.metrics["nonfinite_fallback"].item() == 1
    torch.testing.assert_close(out.loss, ref.detach())


def test_registry_and_argument_errors():
    assert {"infonce", "dcl", "hcl", "progcl", "unremix"} <= set(LOSSES)
    assert isinstance(build_loss("dcl", temperature=0.05, tau_plus=0.1), DCLLoss)
    hcl = build_loss("hcl", temperature=0.05, beta=0.1, tau_plus=0.0, detach_weights=False)
    assert isinstance(hcl, HCLLoss) and hcl.options.beta == 0.1
    with pytest.raises(ValueError, match="unknown loss"):
        build_loss("hardneg", temperature=0.05)
    with pytest.raises(ValueError, match="tau_plus"):
        build_loss("hcl", temperature=0.05, tau_plus=1.0)
    with pytest.raises(ValueError, match="tau_plus"):
        build_loss("dcl", temperature=0.05, tau_plus=-0.1)
    with pytest.raises(ValueError, match="temperature"):
        build_loss("hcl", temperature=0.0)
    with pytest.raises(ValueError, match="beta"):
        build_loss("hcl", temperature=0.05, beta=-1.0)


class CountCalls(torch.overrides.TorchFunctionMode):
    def __init__(self, func):
        super().__init__()
        self.func, self.count = func, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += func is self.func
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "name, reductions",
    [("infonce", 1), ("dcl", 1), ("progcl_mix", 2), ("hcl_beta4", 1), ("progcl_weight", 2), ("unremix_embedding", 2)],
)
def test_plain_infonce_is_computed_once_per_call(name, reductions, monkeypatch):
    """The fallback's log-sum-exp over the negatives is the objective's own where it can be (InfoNCE, DCL's R, mix's
    InfoNCE part): one (M, N) reduction for InfoNCE and DCL, one more for mix's synthetic negatives; ProGCL-weight
    and UnReMix (weighted sums) add theirs to the one shared with the fallback; HCL's two tilted sums are one
    autograd node of their own (hcl.tilted_log_ratio, not a logsumexp)."""
    loss_fn = build_loss("infonce", temperature=0.05) if name == "infonce" else EDGE_LOSSES[name]()
    counter = CountCalls(torch.logsumexp)
    masked_calls = []  # fast_paths.masked_logsumexp (a log-sum-exp, a cheaper backward) and weighted_lse (its reuse)
    for function in (fast_paths.MaskedLogSumExp, fast_paths.WeightedLogSumExp, progcl._MixedLogSumExp):
        original = function.apply
        monkeypatch.setattr(function, "apply", staticmethod(lambda *a, f=original: masked_calls.append(1) or f(*a)))
    with counter:
        loss_fn.compute(edge_batch("duplicate"), square_targets(8))
    assert counter.count + len(masked_calls) == reductions


@pytest.mark.parametrize("name", ["dcl", "progcl_mix", "hcl_debiased"])
def test_shared_reductions_keep_infonce_gradient_on_fallback(name, monkeypatch):
    """An objective that uses the shared reductions and turns non-finite: the step falls back to InfoNCE with
    InfoNCE's gradient (the objective's share of the reductions is guarded, the fallback's is not)."""
    loss_fn = EDGE_LOSSES[name]()
    original = loss_fn.per_anchor

    def broken(batch):
        result = original(batch)
        plain = batch.plain
        loss = result.loss + plain.lse * torch.sqrt(plain.pos - 1e3)  # NaN, NaN gradient
        return dataclasses.replace(result, loss=loss)

    monkeypatch.setattr(loss_fn, "per_anchor", broken)
    z = edge_batch("random")
    a = z.clone().requires_grad_(True)
    out = loss_fn.compute(a, square_targets(8))
    out.loss.backward()
    r = z.clone().requires_grad_(True)
    InfoNCELoss(0.05).compute(r, square_targets(8)).loss.backward()
    assert out.metrics["nonfinite_fallback"].item() == 1
    torch.testing.assert_close(a.grad, r.grad)


@pytest.mark.parametrize("call", ["standard", "same mask", "gathered", "random mask"])
def test_plain_infonce_as_a_reader_writes_it_equals_the_fast_paths(call):
    """base.plain_infonce (normalise, matmul / t, mask, cross-entropy) and InfoNCELoss through the fast paths
    (losses/fast_paths.py): the same loss and gradient on each path of the plain call: no mask (the standard
    negatives, stated), the standard mask with the anchors as candidates (compared, then the shortcuts), anchors
    gathered from the rows (the general path), and a random mask (some anchors left without negatives)."""
    generator = torch.Generator().manual_seed(3)
    z = torch.randn(16, 8, dtype=torch.float64, generator=generator).requires_grad_()
    anchor_rows, positive_index, mask = contrastive_targets(16, "symmetric")
    if call == "random mask":
        mask = mask & (torch.rand(mask.shape, generator=generator) < 0.3)
        mask[:3] = False
    results = []
    for loss in (lambda a, m: InfoNCELoss(0.05)(a, z, positive_index, m).loss,
                 lambda a, m: plain_infonce(a, z, positive_index, mask, 0.05)):  # fmt: skip
        anchors = z[anchor_rows] if call in ("gathered", "random mask") else z
        value = loss(anchors, None if call == "standard" else mask)
        results.append((value, *torch.autograd.grad(value, z)))
    (got, got_grad), (want, want_grad) = results
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)
    assert got_grad.abs().sum() > 0
