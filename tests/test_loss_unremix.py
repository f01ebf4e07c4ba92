"""UnReMix: closed-form uncertainty against per-sample autograd gradients, the loss against a loop-based reference."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
import torch.nn.functional as F
from conftest import square_targets, symmetric_targets
from torch.func import functional_call, grad, vmap

from simcse_hn.losses import ContrastiveTargets, InfoNCELoss, LossContext, UnReMixLoss, build_loss
from simcse_hn.losses.unremix import standardise, uncertainty_scores

TAU = 0.1


def head_batch(num_rows: int, seed: int, dim: int = 6, hidden: int = 5):
    """Head inputs h (R, H), the head's Linear (W (D, H), b (D,)) and the embeddings z = tanh(W h + b) (R, D)."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(num_rows, hidden, generator=g, dtype=torch.float64)
    h[1::2] = h[0::2] + 0.3 * torch.randn(num_rows // 2, hidden, generator=g, dtype=torch.float64)
    weight = 0.7 * torch.randn(dim, hidden, generator=g, dtype=torch.float64)
    bias = 0.1 * torch.randn(dim, generator=g, dtype=torch.float64)
    return h, weight, bias, torch.tanh(h @ weight.T + bias)


def pseudo_label_ce(z_k, others_hat, other_row, label):
    """CE(q_k, y_k), q_k = softmax over the other rows of cos(z_k, o_m) / t, the other rows fixed."""
    logits = torch.where(other_row, others_hat @ (z_k / z_k.norm().clamp_min(1e-12)) / TAU, -math.inf)
    return -torch.log_softmax(logits, dim=0).gather(0, label[None]).squeeze(0)


def pseudo_labels(z, others_hat, other_mask):
    logits = torch.where(other_mask, F.normalize(z, dim=1) @ others_hat.T, -math.inf)
    return logits.argmax(dim=1)


def per_sample_gradients(z, others, other_mask, head=None):
    """Per-row gradients by torch.func: w.r.t. the embedding, or w.r.t. (W, b) of z = tanh(W h + b)."""
    others_hat = F.normalize(others, dim=1)
    labels = pseudo_labels(z, others_hat, other_mask)
    if head is None:
        return vmap(grad(pseudo_label_ce), in_dims=(0, None, 0, 0))(z, others_hat, other_mask, labels)
    h, weight, bias = head

    def head_ce(w, b, h_k, other_row, label):
        return pseudo_label_ce(torch.tanh(w @ h_k + b), others_hat, other_row, label)

    g_w, g_b = vmap(grad(head_ce, argnums=(0, 1)), in_dims=(None, None, 0, 0, 0))(weight, bias, h, other_mask, labels)
    return torch.cat([g_w.flatten(1), g_b], dim=1)  # (R, D*H + D): the last layer's parameters, flattened


@pytest.mark.parametrize("mode", ["embedding", "head"])
@pytest.mark.parametrize("form", ["symmetric", "simcse"])
def test_closed_form_uncertainty_matches_per_sample_autograd(mode, form):
    h, weight, bias, z = head_batch(12, seed=0)
    if form == "symmetric":  # every row an anchor; its other rows are all rows but itself
        anchors, candidates, h_a, h_c = z, z, h, h
        anchor_other = ~torch.eye(12, dtype=torch.bool)
    else:  # anchors are the first views, candidates the second views, all of them the anchor's other rows
        anchors, candidates, h_a, h_c = z[0::2], z[1::2], h[0::2], h[1::2]
        anchor_other = torch.ones(6, 6, dtype=torch.bool)
    candidate_other = ~torch.eye(candidates.shape[0], dtype=torch.bool)
    head = mode == "head"
    g_a = per_sample_gradients(anchors, candidates, anchor_other, (h_a, weight, bias) if head else None)
    g_c = per_sample_gradients(candidates, candidates, candidate_other, (h_c, weight, bias) if head else None)
    features = (h_a, h_c) if head else (None, None)
    closed = uncertainty_scores(anchors, candidates, anchor_other, TAU, *features)
    torch.testing.assert_close(closed, g_a @ g_c.T, rtol=1e-10, atol=1e-12)
    assert closed.abs().max() > 1e-3  # not trivially zero


def loop_uncertainty(z, h, weight, bias, negative_mask, head):
    """U_ij = g_i . g_j with one autograd call per row (symmetric form: the other rows are all rows but k)."""
    rows = z.shape[0]
    grads = []
    for k in range(rows):
        others = [F.normalize(z[m], dim=0) for m in range(rows) if m != k]
        if head:
            w, b = weight.clone().requires_grad_(True), bias.clone().requires_grad_(True)
            z_k, params = torch.tanh(w @ h[k] + b), (w, b)
        else:
            z_k = z[k].clone().requires_grad_(True)
            params = (z_k,)
        logits = torch.stack([F.normalize(z_k, dim=0) @ o / TAU for o in others])
        label = int(logits.detach().argmax())
        ce = -torch.log_softmax(logits, dim=0)[label]
        grads.append(torch.cat([g.flatten() for g in torch.autograd.grad(ce, params)]))
    return [[float(grads[i] @ grads[j]) for j in range(rows)] for i in range(rows)]


def loop_components(z, h, weight, bias, negative_mask, head):
    """Standardised A, U, R of docs/losses.md section 5 with loops, as {(i, j): value} per component."""
    rows = z.shape[0]
    unit = F.normalize(z, dim=1)
    s = [[float(unit[i] @ unit[j]) for j in range(rows)] for i in range(rows)]
    u = loop_uncertainty(z, h, weight, bias, negative_mask, head)
    components = []
    for i in range(rows):
        negatives = [j for j in range(rows) if negative_mask[i, j]]
        raw = {
            "A": {j: s[i][j] for j in negatives},
            "U": {j: u[i][j] for j in negatives},
            "R": {j: statistics.fmean(1 - s[j][k] for k in negatives if k != j) for j in negatives},
        }
        std = {}
        for name, values in raw.items():
            mean, spread = statistics.fmean(values.values()), statistics.pstdev(values.values())
            std[name] = {j: (v - mean) / (spread + 1e-6) for j, v in values.items()}
        components.append(std)
    return components


def reference_unremix(anchors, candidates, components, beta, tau_plus, temperature, lam=(1 / 3, 1 / 3, 1 / 3)):
    """Form (D) with w_ij = n softmax_j(beta C_ij), loops, exp space; the weights are constants."""
    total = 0.0
    for i in range(anchors.shape[0]):
        a = F.normalize(anchors[i], dim=0)
        negatives = sorted(components[i]["A"])
        n = len(negatives)
        score = {j: sum(lam_c * components[i][c][j] for lam_c, c in zip(lam, "AUR")) for j in negatives}
        norm = sum(math.exp(beta * v) for v in score.values())
        pos = torch.exp(a @ F.normalize(candidates[i ^ 1], dim=0) / temperature)
        weight = {j: n * math.exp(beta * score[j]) / norm for j in negatives}
        reweighted = sum(weight[j] * torch.exp(a @ F.normalize(candidates[j], dim=0) / temperature) for j in negatives)
        ng = torch.clamp((reweighted - tau_plus * n * pos) / (1 - tau_plus), min=n * math.exp(-1 / temperature))
        total = total - torch.log(pos / (pos + ng))
    return total / anchors.shape[0]


@pytest.mark.parametrize("mode, beta, tau_plus", [("embedding", 1.0, 0.0), ("head", 2.0, 0.0), ("head", 1.0, 0.1)])
def test_loss_matches_loop_reference(mode, beta, tau_plus):
    h, weight, bias, z = head_batch(10, seed=1)
    positive_index, negative_mask = symmetric_targets(10)
    components = loop_components(z, h, weight, bias, negative_mask, head=mode == "head")
    loss_fn = UnReMixLoss(TAU, beta=beta, tau_plus=tau_plus, gradient=mode)
    a, c = (z.clone().requires_grad_(True) for _ in range(2))
    out = loss_fn(a, c, positive_index, negative_mask, LossContext(anchor_features=h, candidate_features=h))
    out.loss.backward()
    ra, rc = (z.clone().requires_grad_(True) for _ in range(2))
    ref = reference_unremix(ra, rc, components, beta, tau_plus, TAU)
    ref.backward()
    torch.testing.assert_close(out.loss, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(a.grad, ra.grad, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(c.grad, rc.grad, rtol=1e-8, atol=1e-10)
    assert out.metrics["u_from_head"].item() == float(mode == "head")

    # the same components without structure (two tensors) and through the shortcuts of the training loop's targets
    # (anchors are the candidates: sim reused; standard negatives: R without a matrix product)
    unit = F.normalize(z, dim=1)
    features = (h, h) if mode == "head" else (None, None)
    for standard, targets in ((False, ContrastiveTargets(positive_index, negative_mask)), (True, square_targets(10))):
        assert targets.anchors_are_candidates == targets.standard_negatives == standard
        scores = loss_fn.component_scores(unit @ unit.T, z, z.clone(), targets, *features)
        for index, name in enumerate("AUR"):
            expected = torch.zeros(10, 10, dtype=torch.float64)
            for i in range(10):
                for j, v in components[i][name].items():
                    expected[i, j] = v
            torch.testing.assert_close(scores[index], expected, rtol=1e-8, atol=1e-9, msg=f"{name} {standard}")


def test_gradcheck_with_detached_scores_and_learned_mixture(monkeypatch):
    """The embeddings' gradient is the loss's (finite differences); theta's is by design not: it ascends
    L + gamma H(lambda). Checked against autograd of the fixed-mixture loss (theta a plain input) and of H."""
    h, weight, bias, z = head_batch(8, seed=2, dim=4, hidden=3)
    positive_index, negative_mask = symmetric_targets(8)
    learned = UnReMixLoss(0.2, beta=1.5, tau_plus=0.05, gradient="head", learn_mixture=True).double()
    fixed = UnReMixLoss(0.2, beta=1.5, tau_plus=0.05, gradient="head").double()
    unit = F.normalize(z, dim=1)
    scores = learned.raw_scores(unit @ unit.T, z, z, ContrastiveTargets(positive_index, negative_mask), h, h)
    for loss_fn in (learned, fixed):
        monkeypatch.setattr(loss_fn, "raw_scores", lambda *args, **kwargs: scores.clone())  # constant, fresh
    context = LossContext(anchor_features=h, candidate_features=h)
    theta = torch.tensor([0.3, -0.2, 0.1], dtype=torch.float64, requires_grad=True)
    a, c = (z.clone().requires_grad_(True) for _ in range(2))

    def func(loss_fn, x, y, t):
        return functional_call(loss_fn, {"theta": t}, (x, y, positive_index, negative_mask, context)).loss

    assert torch.autograd.gradcheck(lambda x, y: func(learned, x, y, theta.detach()), (a, c))
    (got,) = torch.autograd.grad(func(learned, z, z, theta), theta)
    (plain,) = torch.autograd.grad(func(fixed, z, z, theta), theta)
    lam = torch.softmax(theta, dim=0)
    (entropy,) = torch.autograd.grad(-(lam * lam.log()).sum(), theta)
    torch.testing.assert_close(got, -plain - learned.options.mixture_entropy * entropy, rtol=1e-10, atol=1e-12)
    assert plain.abs().max() > 1e-3 and entropy.abs().max() > 1e-3
    torch.testing.assert_close(func(learned, z, z, theta), func(fixed, z, z, theta), rtol=0, atol=0)  # same value


@pytest.mark.parametrize("mode", ["embedding", "head"])
def test_neutral_setting_is_infonce(mode):
    h, _, _, z = head_batch(12, seed=3)
    positive_index, negative_mask = symmetric_targets(12)
    a, c = (z.clone().requires_grad_(True) for _ in range(2))
    loss_fn = UnReMixLoss(0.05, beta=0.0, gradient=mode)
    out = loss_fn(a, c, positive_index, negative_mask, LossContext(anchor_features=h, candidate_features=h))
    out.loss.backward()
    ra, rc = (z.clone().requires_grad_(True) for _ in range(2))
    ref = InfoNCELoss(0.05)(ra, rc, positive_index, negative_mask).loss
    ref.backward()
    torch.testing.assert_close(out.loss, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(a.grad, ra.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(c.grad, rc.grad, rtol=0, atol=1e-12)


def test_head_mode_without_features_is_embedding_mode():
    _, _, _, z = head_batch(12, seed=4)
    positive_index, negative_mask = symmetric_targets(12)
    head, embedding = UnReMixLoss(0.05, gradient="head"), UnReMixLoss(0.05, gradient="embedding")
    assert head.needs_head_inputs and not embedding.needs_head_inputs
    out = head(z, z, positive_index, negative_mask)
    assert out.metrics["u_from_head"].item() == 0
    torch.testing.assert_close(out.loss, embedding(z, z, positive_index, negative_mask).loss, rtol=0, atol=0)
    # the training loop's shortcuts and two separate tensors agree
    torch.testing.assert_close(out.loss, head.compute(z, square_targets(12)).loss)


def test_mixture_parameter_or_buffer():
    h, _, _, z = head_batch(12, seed=5)
    positive_index, negative_mask = symmetric_targets(12)
    fixed = UnReMixLoss(0.05)
    assert "theta" in fixed.state_dict() and not list(fixed.parameters())
    learned = UnReMixLoss(0.05, learn_mixture=True).double()
    assert [name for name, _ in learned.named_parameters()] == ["theta"]
    assert torch.equal(learned.theta, torch.zeros(3, dtype=torch.float64))
    out = learned(z, z, positive_index, negative_mask, LossContext(anchor_features=h, candidate_features=h))
    out.loss.backward()
    assert torch.isfinite(learned.theta.grad).all() and learned.theta.grad.abs().sum() > 0
    for name in ("lambda_A", "lambda_U", "lambda_R"):
        assert out.metrics[name].item() == pytest.approx(1 / 3)


@pytest.mark.parametrize("mode, learn", [("embedding", False), ("head", True)])
def test_compiles_without_graph_breaks_and_matches_eager(mode, learn):
    h, _, _, z = head_batch(12, seed=6)
    z, h = z.float(), h.float()
    positive_index, negative_mask = symmetric_targets(12)
    loss_fn = UnReMixLoss(0.05, beta=1.0, gradient=mode, learn_mixture=learn)
    context = LossContext(candidate_features=h, step=3, max_steps=10)
    torch._dynamo.reset()
    compiled = torch.compile(loss_fn.compute, fullgraph=True, backend="aot_eager")
    a = z.clone().requires_grad_(True)
    out = compiled(a, square_targets(12), context)
    out.loss.backward()
    theta_grad = loss_fn.theta.grad.clone() if learn else None
    loss_fn.zero_grad()
    r = z.clone().requires_grad_(True)
    ref = loss_fn.compute(r, square_targets(12), context)
    ref.loss.backward()
    torch._dynamo.reset()
    torch.testing.assert_close(out.loss, ref.loss)
    torch.testing.assert_close(a.grad, r.grad)
    if learn:
        torch.testing.assert_close(theta_grad, loss_fn.theta.grad)
    for key in ref.metrics:
        torch.testing.assert_close(out.metrics[key], ref.metrics[key])


def test_standardise_masked_rows_large_and_constant():
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    x = torch.tensor([[1e15, -1e15, 0.0, 5.0], [2.0, 2.0, 2.0, 2.0]])  # U's saturation value; a constant row
    out = standardise(x, mask)
    torch.testing.assert_close(out[0], torch.tensor([math.sqrt(1.5), -math.sqrt(1.5), 0.0, 0.0]))
    assert torch.equal(out[1], torch.zeros(4))


def test_argument_errors():
    for kwargs, name in [
        ({"gradient": "logits"}, "gradient"),
        ({"tau_plus": 1.0}, "tau_plus"),
        ({"beta": -0.5}, "beta"),
        ({"temperature": 0.0}, "temperature"),
    ]:
        with pytest.raises(ValueError, match=name):
            build_loss("unremix", **{"temperature": 0.05, **kwargs})


def train_mixture(signal: str, gamma: float = 0.5, steps: int = 300, seed: int = 0) -> torch.Tensor:
    """Synthetic SimCSE-like embeddings trained directly (16 sentences, noisy 'dropout' views so that the loss stays
    informative) together with the mixture theta, Adam, `steps` steps. `signal`: "ours" (learn_mixture: adversarial
    with entropy bonus gamma) or "minimise" (theta trained by the loss's own gradient, the measured collapse).
    -> lambda at the end (3,)"""
    g = torch.Generator().manual_seed(seed)
    sentences = torch.randn(16, 32, generator=g) / 32**0.5
    sentences[:, 0] += 1.32  # SimCSE's anisotropy: negatives at cosine ~0.55
    sentences = torch.nn.Parameter(sentences)
    ours = signal == "ours"
    loss_fn = UnReMixLoss(0.05, beta=1.0, gradient="embedding", learn_mixture=ours, mixture_entropy=gamma)
    theta = loss_fn.theta if ours else torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.Adam([{"params": [sentences], "lr": 1e-3}, {"params": [theta], "lr": 0.05}])
    targets = square_targets(32)
    for _ in range(steps):
        z = sentences.repeat_interleave(2, dim=0) + 1.5 * torch.randn(32, 32, generator=g) / 32**0.5
        if ours:
            out = loss_fn.compute(z, targets)
        else:
            out = functional_call(loss_fn, {"theta": theta}, (z, z, targets.positive_index, targets.negative_mask))
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
    return torch.softmax(theta.detach(), dim=0)


def test_learned_mixture_keeps_every_component_in_play():
    """300 steps: minimising the loss over theta drives the mixture onto R (the easiest negatives), maximising it
    without the entropy bonus onto A; the adversarial mixture with its bonus leans towards A and keeps U and R."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 32 x 32 problems: one thread is several times faster on a busy machine
    try:
        _check_learned_mixture()
    finally:
        torch.set_num_threads(threads)


def _check_learned_mixture():
    collapsed = train_mixture("minimise")
    assert collapsed[2] > 0.95, collapsed
    greedy = train_mixture("ours", gamma=0.0)
    assert greedy[0] > 0.95, greedy
    learned = train_mixture("ours")
    assert learned.min() > 0.15 and learned[0] == learned.max() and learned[0] > 0.4, learned

