"""ProGCL: the torch Beta-mixture EM against SciPy, the loss against a loop-based reference, schedule and state."""

from __future__ import annotations

import itertools
import math
import threading

import numpy as np
import pytest
import torch
from conftest import square_targets, symmetric_targets
from scipy import stats

from simcse_hn.losses import ContrastiveTargets, InfoNCELoss, LossContext, ProGCLLoss, build_loss
from simcse_hn.losses.progcl import (
    BetaMixture,
    beta_mixture_em,
    fit_beta_mixture,
    identify_components,
    negative_posteriors,
    shared_sample,
)


def simcse_like(num_rows: int, dim: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    """Close dropout positives, one repeated sentence (rows -2, -1 repeat rows 0, 1): a real false negative."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(num_rows, dim, generator=g, dtype=dtype)
    z[1::2] = z[0::2] + 0.2 * torch.randn(num_rows // 2, dim, generator=g, dtype=dtype)
    z[-2:] = z[:2] + 0.05 * torch.randn(2, dim, generator=g, dtype=dtype)
    return z


def scipy_em(x: np.ndarray, iters: int = 10, init=((1.0, 2.0), (2.0, 1.0), (0.95, 0.05))):
    """The ProGCL reference's BetaMixture1D.fit, with scipy.stats.beta."""
    x = np.clip(x.astype(np.float64), 1e-12, 1 - 1e-12)
    alpha, beta, pi = (np.array(p, dtype=np.float64) for p in init)
    for _ in range(iters):
        r = np.array([pi[c] * stats.beta.pdf(x, alpha[c], beta[c]) for c in range(2)])
        r[r <= 1e-12] = 1e-12
        r /= r.sum(axis=0)
        for c in range(2):
            mean = np.sum(r[c] * x) / np.sum(r[c])
            var = np.sum(r[c] * (x - mean) ** 2) / np.sum(r[c])
            alpha[c] = mean * (mean * (1 - mean) / var - 1)
            beta[c] = alpha[c] * (1 - mean) / mean
        if beta[1] < 1:
            beta[1] = 1.01
        pi = r.sum(axis=1) / r.sum()
    return alpha, beta, pi


def scipy_true_posterior(x: np.ndarray, alpha, beta, pi) -> np.ndarray:
    lik = np.array([pi[c] * stats.beta.pdf(x, alpha[c], beta[c]) for c in range(2)])
    true = int(np.argmin(alpha / (alpha + beta)))
    return lik[true] / (lik.sum(axis=0) + 1e-12)


def negative_x(z: torch.Tensor, negative_mask: torch.Tensor) -> np.ndarray:
    zn = torch.nn.functional.normalize(z.detach().double(), dim=1)
    return ((zn @ zn.T + 1) / 2)[negative_mask].numpy()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_em_matches_scipy(seed):
    z = simcse_like(24, 16, seed)
    _, negative_mask = symmetric_targets(24)
    x = negative_x(z, negative_mask)
    ref = scipy_em(x)
    got = fit_beta_mixture(torch.from_numpy(x), iters=10)
    for value, expected in zip(got, ref):
        np.testing.assert_allclose(value.numpy(), expected, rtol=1e-6, atol=1e-9)
    assert beta_mixture_em(torch.from_numpy(x)).valid


def test_em_masked_and_warm_started_fits_match_scipy():
    z = simcse_like(16, 8, 3)
    _, negative_mask = symmetric_targets(16)
    zn = torch.nn.functional.normalize(z, dim=1)
    x_all = (zn @ zn.T + 1) / 2  # (M, N): positives and self included, the mask excludes them
    init = ((3.0, 8.0), (5.0, 2.0), (0.7, 0.3))
    ref = scipy_em(negative_x(z, negative_mask), iters=4, init=init)
    fit = beta_mixture_em(x_all, iters=4, init=tuple(torch.tensor(p) for p in init), mask=negative_mask)
    for value, expected in zip(fit[:3], ref):
        np.testing.assert_allclose(value.numpy(), expected, rtol=1e-6, atol=1e-9)


def test_em_all_reduce_hook_fits_the_union_of_two_processes():
    """Two threads stand in for two processes, each holding half the data; the hook sums their statistics."""
    x = torch.from_numpy(negative_x(simcse_like(20, 8, 4), symmetric_targets(20)[1]))
    halves = [x[: len(x) // 2 + 7], x[len(x) // 2 + 7 :]]  # unequal halves
    barrier, slots, results = threading.Barrier(2), [None, None], [None, None]

    def run(rank):
        def all_reduce(t):
            slots[rank] = t
            barrier.wait()
            total = slots[0] + slots[1]
            barrier.wait()
            return total

        results[rank] = beta_mixture_em(halves[rank], iters=10, all_reduce=all_reduce)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    whole = beta_mixture_em(x, iters=10)
    for fit in results:
        for value, expected in zip(fit[:3], whole[:3]):
            torch.testing.assert_close(value, expected, rtol=1e-10, atol=1e-12)


def test_degenerate_fit_falls_back_to_uniform_weights():
    # collapsed batch: every similarity is 1 (float64: in float32 the rounding of s ~ 1 moves the loss by ~1e-6)
    z = torch.randn(1, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64).repeat(8, 1)
    positive_index, negative_mask = symmetric_targets(8)
    assert not beta_mixture_em(torch.ones(40)).valid
    loss_fn = ProGCLLoss(0.05)
    defaults = [b.clone() for b in (loss_fn.bmm_alpha, loss_fn.bmm_beta, loss_fn.bmm_pi)]
    out = loss_fn(z, z, positive_index, negative_mask)
    assert out.metrics["bmm_fallback"].item() == 1
    assert out.metrics["est_false_neg_frac"].item() == 0
    assert torch.equal(out.weights, negative_mask.float())
    assert out.loss.item() == pytest.approx(math.log(1 + 6), rel=1e-6)
    assert not loss_fn.bmm_valid
    for buffer, default in zip((loss_fn.bmm_alpha, loss_fn.bmm_beta, loss_fn.bmm_pi), defaults):
        assert torch.equal(buffer, default)  # a degenerate fit never overwrites the stored one


def reference_progcl(anchors, candidates, hardness, temperature, mode, permutation=None, mix_k=None):
    """docs/losses.md section 4 with loops over anchors and negatives; `hardness[i][j]` is B_ij (a float). Mix over
    all candidates pairs the negatives in candidate order, a smaller mix_k the top mix_k in hardness order."""
    total = 0.0
    units = [c / c.norm().clamp_min(1e-12) for c in candidates]
    for i in range(anchors.shape[0]):
        a = anchors[i] / anchors[i].norm().clamp_min(1e-12)
        negatives = [j for j in range(candidates.shape[0]) if j not in (i, i ^ 1)]
        s = {j: a @ units[j] for j in negatives}
        pos = torch.exp(a @ units[i ^ 1] / temperature)
        b = hardness[i]
        if mode == "weight":
            mean_b = sum(b[j] for j in negatives) / len(negatives)
            denom = pos + sum(b[j] / mean_b * torch.exp(s[j] / temperature) for j in negatives)
        else:
            denom = pos + sum(torch.exp(s[j] / temperature) for j in negatives)
            if mix_k is None or mix_k >= candidates.shape[0]:
                # every negative, paired in candidate order with the permutation's entries that are negatives
                pairs = list(zip(negatives, [p for p in permutation if p in negatives]))
            else:  # the top mix_k by B, paired in that order
                order = sorted(negatives, key=lambda j: -b[j])[:mix_k]
                sigma = [p for p in permutation if p < len(order)]
                pairs = [(j, order[sigma[k]]) for k, j in enumerate(order)]
            for j, partner in pairs:
                mixed = (b[j] * s[j] + b[partner] * s[partner]) / (b[j] + b[partner] + 1e-12)
                denom = denom + torch.exp(mixed / temperature)
        total = total - torch.log(pos / denom)
    return total / anchors.shape[0]


@pytest.mark.parametrize("square", [False, True], ids=["two-tensors", "anchors-are-candidates"])
@pytest.mark.parametrize("mode, mix_k", [("weight", None), ("mix", None), ("mix", 3)])
def test_loss_matches_loop_reference_with_scipy_mixture(mode, mix_k, square):
    """Both paths: separate anchor and candidate tensors (the full-matrix fit) and one tensor as both (the trainer's
    symmetric form on one process: the upper-triangle fit)."""
    num_rows, temperature = 16, 0.1
    z = simcse_like(num_rows, 12, 5)
    positive_index, negative_mask = symmetric_targets(num_rows)
    alpha, beta, pi = scipy_em(negative_x(z, negative_mask))
    zn = torch.nn.functional.normalize(z, dim=1)
    x = np.clip(((zn @ zn.T + 1) / 2).numpy(), 1e-12, 1 - 1e-12)
    hardness = (scipy_true_posterior(x, alpha, beta, pi) * x).tolist()
    k = min(mix_k or num_rows, num_rows)
    permutation = torch.randperm(k, generator=torch.Generator().manual_seed(0))

    loss_fn = ProGCLLoss(temperature, mode=mode, mix_k=mix_k)
    a, c = (z.clone().requires_grad_(True) for _ in range(2))
    context = LossContext(mix_permutation=permutation)
    if square:
        out = loss_fn.compute(a, square_targets(num_rows), context)
    else:
        out = loss_fn(a, c, positive_index, negative_mask, context)
    out.loss.backward()
    ra, rc = (z.clone().requires_grad_(True) for _ in range(2))
    ref = reference_progcl(ra, rc, hardness, temperature, mode, permutation.tolist(), mix_k)
    ref.backward()
    torch.testing.assert_close(out.loss, ref, rtol=1e-9, atol=1e-12)
    if square:
        torch.testing.assert_close(a.grad, ra.grad + rc.grad, rtol=1e-7, atol=1e-10)
    else:
        torch.testing.assert_close(a.grad, ra.grad, rtol=1e-7, atol=1e-10)
        torch.testing.assert_close(c.grad, rc.grad, rtol=1e-7, atol=1e-10)
    assert out.metrics["bmm_fallback"].item() == 0 and out.metrics["nonfinite_fallback"].item() == 0
    np.testing.assert_allclose(out.metrics["bmm_alpha_0"].item(), alpha[0], rtol=1e-6)


@pytest.mark.parametrize("mode", ["weight", "mix"])
def test_upper_triangle_fit_equals_full_fit_for_any_mask(mode):
    """Anchors = candidates: each unordered pair is fitted once, counted once per direction in which it is a
    negative. With negatives dropped from some rows only (an asymmetric mask) the fit, weights, metrics and loss must
    still equal the full-matrix fit's (a copy of the tensor as the anchors)."""
    z = simcse_like(20, 8, 11)
    positive_index, negative_mask = symmetric_targets(20)
    negative_mask[0, 5:9] = False  # row 0 no longer treats 5..8 as negatives, but they still treat it as one
    negative_mask[7, 0] = False
    assert not torch.equal(negative_mask, negative_mask.T)
    permutation = torch.randperm(20, generator=torch.Generator().manual_seed(2))
    square, full = ProGCLLoss(0.05, mode=mode), ProGCLLoss(0.05, mode=mode)
    context = LossContext(mix_permutation=permutation)
    targets = ContrastiveTargets(positive_index, negative_mask, anchor_index=torch.arange(20))
    assert targets.anchors_are_candidates and not targets.standard_negatives
    got = square.compute(z, targets, context)
    expected = full(z, z, positive_index, negative_mask, context)
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-12, atol=0)
    for name, value in expected.metrics.items():
        torch.testing.assert_close(got.metrics[name], value, rtol=1e-9, atol=1e-12, msg=name)
    assert expected.metrics["est_false_neg_frac"] > 0
    if mode == "weight":
        torch.testing.assert_close(got.weights, expected.weights, rtol=1e-9, atol=1e-12)
    hardness_square, _, _ = square.fit_hardness(z @ z.T, negative_mask, square=True)
    hardness_full, _, _ = full.fit_hardness(z @ z.T, negative_mask)
    torch.testing.assert_close(hardness_square, hardness_full, rtol=1e-9, atol=1e-12)
    assert (hardness_square[~negative_mask] == 0).all()


@pytest.mark.parametrize("mode", ["weight", "mix"])
def test_gradcheck_with_detached_mixture(mode, monkeypatch):
    """B is detached: hold it at its value for the unperturbed batch, then finite differences must agree."""
    z = simcse_like(8, 4, 6)
    positive_index, negative_mask = symmetric_targets(8)
    loss_fn = ProGCLLoss(0.2, mode=mode)
    zn = torch.nn.functional.normalize(z, dim=1)
    fixed = loss_fn.fit_hardness(zn @ zn.T, negative_mask)
    # a fresh B per call, as fit_hardness makes it: the objective computes the weights in B's memory
    monkeypatch.setattr(loss_fn, "fit_hardness", lambda *args, **kwargs: (fixed[0].clone(), *fixed[1:]))
    permutation = torch.randperm(8, generator=torch.Generator().manual_seed(1))
    a, c = (z.clone().requires_grad_(True) for _ in range(2))
    context = LossContext(mix_permutation=permutation)
    func = lambda x, y: loss_fn(x, y, positive_index, negative_mask, context).loss  # noqa: E731
    assert torch.autograd.gradcheck(func, (a, c))


def test_warmup_and_neutral_setting_are_infonce():
    z = simcse_like(12, 8, 7)
    positive_index, negative_mask = symmetric_targets(12)
    plain = InfoNCELoss(0.05)(z, z, positive_index, negative_mask).loss
    neutral = ProGCLLoss(0.05, warmup_ratio=1.0)
    assert torch.equal(neutral(z, z, positive_index, negative_mask).loss, plain)
    assert torch.equal(neutral(z, z, positive_index, negative_mask, LossContext(step=99, max_steps=100)).loss, plain)
    scheduled = ProGCLLoss(0.05, warmup_ratio=0.2)
    warm = scheduled(z, z, positive_index, negative_mask, LossContext(step=1, max_steps=10))
    assert torch.equal(warm.loss, plain) and warm.weights is None
    assert not scheduled.bmm_valid  # no fit during warm-up
    after = scheduled(z, z, positive_index, negative_mask, LossContext(step=2, max_steps=10))
    assert after.weights is not None and not torch.equal(after.loss, plain)
    assert scheduled.bmm_valid


def test_duplicated_sentence_gets_weight_near_zero():
    z = simcse_like(32, 32, 8, dtype=torch.float32)
    positive_index, negative_mask = symmetric_targets(32)
    out = ProGCLLoss(0.05)(z, z, positive_index, negative_mask)
    assert out.metrics["bmm_fallback"].item() == 0
    assert out.weights[0, 30] < 1e-3 and out.weights[1, 31] < 1e-3  # the repeated sentence
    assert 0 < out.metrics["est_false_neg_frac"].item() < 0.1


def test_refit_schedule_state_dict_and_warm_start():
    positive_index, negative_mask = symmetric_targets(16)
    first, second = simcse_like(16, 8, 9), simcse_like(16, 8, 10)
    loss_fn = ProGCLLoss(0.05, refit_every=3, warmup_ratio=0.2)
    loss_fn(first, first, positive_index, negative_mask, LossContext(step=2, max_steps=10))  # after warm-up: fit
    fitted = {k: v.clone() for k, v in loss_fn.state_dict().items()}
    assert set(fitted) == {"bmm_alpha", "bmm_beta", "bmm_pi", "bmm_valid"}
    reused = loss_fn(second, second, positive_index, negative_mask, LossContext(step=4, max_steps=10))  # no refit
    assert all(torch.equal(v, fitted[k]) for k, v in loss_fn.state_dict().items())

    restored = ProGCLLoss(0.05, refit_every=3, warmup_ratio=0.2)
    restored.load_state_dict(fitted)  # e.g. resuming from a checkpoint
    again = restored(second, second, positive_index, negative_mask, LossContext(step=4, max_steps=10))
    torch.testing.assert_close(again.loss, reused.loss, rtol=0, atol=0)

    loss_fn(second, second, positive_index, negative_mask, LossContext(step=5, max_steps=10))  # refit step
    assert not torch.equal(loss_fn.bmm_alpha, fitted["bmm_alpha"])

    warm = ProGCLLoss(0.05, em_iters=1, warm_start=True)
    warm.load_state_dict(fitted)
    warm(second, second, positive_index, negative_mask)
    zn = torch.nn.functional.normalize(second, dim=1)
    init = (fitted["bmm_alpha"], fitted["bmm_beta"], fitted["bmm_pi"])
    expected = beta_mixture_em((zn @ zn.T + 1) / 2, iters=1, init=init, mask=negative_mask)
    torch.testing.assert_close(warm.bmm_alpha, expected.alpha)
    torch.testing.assert_close(warm.bmm_pi, expected.pi)


@pytest.mark.parametrize("mode", ["weight", "mix"])
def test_compiles_without_graph_breaks_and_matches_eager(mode):
    z = simcse_like(12, 8, 11, dtype=torch.float32)
    positive_index, negative_mask = symmetric_targets(12)
    permutation = torch.randperm(12, generator=torch.Generator().manual_seed(2))
    # 3 EM iterations: the traced loop is unrolled, and the graph is the same with 10, only longer to compile
    eager_fn, compiled_fn = (ProGCLLoss(0.05, mode=mode, em_iters=3) for _ in range(2))
    torch._dynamo.reset()
    a = z.clone().requires_grad_(True)
    context = LossContext(step=5, max_steps=10, mix_permutation=permutation)
    out = torch.compile(compiled_fn.compute, fullgraph=True, backend="aot_eager")(a, square_targets(12), context)
    out.loss.backward()
    r = z.clone().requires_grad_(True)
    ref = eager_fn.compute(r, square_targets(12), context)
    ref.loss.backward()
    torch._dynamo.reset()
    torch.testing.assert_close(out.loss, ref.loss)
    torch.testing.assert_close(a.grad, r.grad)
    for key in ref.metrics:
        torch.testing.assert_close(out.metrics[key], ref.metrics[key])
    torch.testing.assert_close(compiled_fn.bmm_alpha, eager_fn.bmm_alpha)  # the buffer update happened in the graph


def test_argument_errors():
    for kwargs, name in [
        ({"mode": "mixup"}, "mode"),
        ({"warmup_ratio": 1.5}, "warmup_ratio"),
        ({"refit_every": 0}, "refit_every"),
        ({"em_iters": 0}, "em_iters"),
        ({"mix_k": 0}, "mix_k"),
        ({"temperature": -1.0}, "temperature"),
    ]:
        with pytest.raises(ValueError, match=name):
            build_loss("progcl", **{"temperature": 0.05, **kwargs})


def test_mix_permutation_is_shared_across_processes_through_all_reduce():
    """Each process draws its own noise; the all-reduced sum is the same everywhere, so is the permutation."""
    z = simcse_like(8, 6, 9)
    positive_index, negative_mask = symmetric_targets(8)
    shared = torch.tensor([0.9, 0.1, 0.5, 0.3, 0.8, 0.2, 0.7, 0.4], dtype=torch.float32)
    loss_fn = ProGCLLoss(0.1, mode="mix")
    reduced = []

    def all_reduce(t):
        if t.shape == shared.shape and t.dtype == shared.dtype:  # the permutation noise
            reduced.append(t)
            return shared.clone()
        return t  # EM statistics of this single "process"

    got = loss_fn.compute(z, square_targets(8), LossContext(all_reduce=all_reduce)).loss
    # the plain call: the full-matrix fit, as with all_reduce, not the one-process triangle fit
    permutation = torch.argsort(shared, stable=True)
    expected = loss_fn(z, z, positive_index, negative_mask, LossContext(mix_permutation=permutation)).loss
    assert len(reduced) == 1
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


# --- which component is "true", the guard, the sampled fit, the sort-free mix ---


def realistic_batch(seed: int, kind: str = "exact", rows: int = 64, dim: int = 96, topics: int = 0) -> torch.Tensor:
    """SimCSE-like rows [a, a', b, b', ...] calibrated to all-MiniLM-L6-v2 with a fresh MLP head (bench/results/
    dcl_clamp.md: positive cosine ~0.89, negatives 0.58 +- 0.07, row maximum ~0.71): a shared direction (the
    anisotropy), per-sentence noise, per-view 'dropout' noise; `topics` > 0 adds that many shared topic directions
    (a heavier upper tail of negatives, as real batches have). The last sentence repeats the first: exactly, or
    nearly (a small perturbation)."""
    g = torch.Generator().manual_seed(seed)
    sentences = torch.randn(rows // 2, dim, generator=g, dtype=torch.float64) / dim**0.5
    sentences[:, 0] += 1.32
    if topics:
        directions = torch.randn(topics, dim, generator=g, dtype=torch.float64) / dim**0.5
        sentences += 0.5 * directions.repeat_interleave(rows // 2 // topics, dim=0)
    sentences[-1] = sentences[0]
    if kind == "near":
        sentences[-1] += 0.1 * torch.randn(dim, generator=g, dtype=torch.float64) / dim**0.5
    views = sentences.repeat_interleave(2, dim=0)
    return (views + 0.55 * torch.randn(rows, dim, generator=g, dtype=torch.float64) / dim**0.5).float()


def duplicate_above_median(weights: torch.Tensor, negative_mask: torch.Tensor) -> bool:
    """Does any pair of the first sentence's views and its repetition's (either direction) weigh more than the
    median of its row's negatives?"""
    rows = weights.shape[0]
    pairs = [(i, j) for i in (0, 1) for j in (rows - 2, rows - 1)]
    return any(weights[a, b] > weights[a][negative_mask[a]].median() for i, j in pairs for a, b in ((i, j), (j, i)))


@pytest.mark.parametrize("kind", ["exact", "near"])
def test_duplicate_weighs_at_most_its_row_median_in_99_percent_of_seeds(kind):
    """100 seeds of 2N = 64 rows with a repeated sentence. The lower-mean rule inverts on some of the same fits (the
    broad component's mean falls below the bulk's; it is then called 'true' and the duplicate gets its row's
    largest weight): the batches exercise the failure; the majority rule with its tail guard must not."""
    positive_index, negative_mask = symmetric_targets(64)
    ours, lower_mean = 0, 0
    for seed in range(100):
        z = realistic_batch(seed, kind)
        loss_fn = ProGCLLoss(0.05)
        out = loss_fn.compute(z, square_targets(64))
        assert out.metrics["nonfinite_fallback"].item() == 0
        ours += duplicate_above_median(out.weights, negative_mask)
        alpha, beta, pi = (p.numpy() for p in loss_fn.stored_fit()[:3])
        x = np.clip(negative_x(z, torch.ones_like(negative_mask)).reshape(64, 64), 1e-12, 1 - 1e-12)
        hardness = torch.from_numpy(scipy_true_posterior(x, alpha, beta, pi) * x) * negative_mask
        weights = hardness / (hardness.sum(1, keepdim=True) / negative_mask.sum(1, keepdim=True))
        lower_mean += duplicate_above_median(weights, negative_mask)
    assert ours <= 1, f"{ours}/100 seeds"
    assert lower_mean >= 5, f"the lower-mean rule failed in only {lower_mean}/100 seeds"


def fit_of(alpha, beta, pi) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return tuple(torch.tensor(p, dtype=torch.float64) for p in (alpha, beta, pi))


def test_true_component_is_the_majority_whatever_its_label():
    """The posteriors do not depend on which index the EM left each component at."""
    x = torch.linspace(0.8, 0.99, 50, dtype=torch.float64)  # from the bulk's mean up
    fit = BetaMixture(*fit_of((80.0, 40.0), (20.0, 5.0), (0.9, 0.1)), torch.tensor(True))
    swapped = BetaMixture(*(p.flip(0) for p in fit[:3]), fit.valid)
    order, separated = identify_components(fit)
    assert order.tolist() == [0, 1] and bool(separated)
    assert identify_components(swapped)[0].tolist() == [1, 0]
    for got, expected in zip(negative_posteriors(x, swapped), negative_posteriors(x, fit)):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    p_true, _ = negative_posteriors(x, fit)
    assert p_true[0] > 0.95 and p_true[-1] < 1e-6  # the most similar pairs are the likeliest false


@pytest.mark.parametrize("mode", ["weight", "mix"])
def test_unseparated_fit_gives_uniform_weights_and_is_counted(mode):
    """A fit whose minority component has the lighter upper tail (beta_false >= beta_true: p(false | x) falls again
    towards x = 1, so a near-exact duplicate would count as a true negative) is not used: plain InfoNCE for the step,
    counted in bmm_unseparated and bmm_fallback. The same data with a separated stored fit is reweighted."""
    z = realistic_batch(0)
    positive_index, negative_mask = symmetric_targets(64)
    plain = InfoNCELoss(0.05)(z, z, positive_index, negative_mask).loss
    context = LossContext(step=5, max_steps=10, mix_permutation=torch.randperm(64))  # no refit at step 5
    for beta_false, separated in ((36.0, False), (5.0, True)):
        loss_fn = ProGCLLoss(0.05, mode=mode, warmup_ratio=0.2, refit_every=2)
        stored = fit_of((88.0, 154.0), (22.0, beta_false), (0.8, 0.2))
        loss_fn.load_state_dict(dict(zip(("bmm_alpha", "bmm_beta", "bmm_pi"), stored), bmm_valid=torch.tensor(True)))
        out = loss_fn.compute(z, square_targets(64), context)
        assert out.metrics["bmm_unseparated"].item() == (not separated)
        assert out.metrics["bmm_fallback"].item() == (not separated)
        if separated:
            assert not torch.allclose(out.loss, plain)
        else:
            torch.testing.assert_close(out.loss, plain, rtol=1e-6, atol=0)
            assert out.metrics["est_false_neg_frac"].item() == 0
            if mode == "weight":
                assert torch.equal(out.weights, negative_mask.float())


def test_sampled_fit_fits_the_drawn_pairs_and_all_pairs_when_there_are_few():
    """fit_pairs = M: EM on M pairs drawn uniformly with replacement from the fitted pairs (here the upper
    triangle), the draw given by torch's generator; with M >= the pairs, or 0, every pair, exactly."""
    z = realistic_batch(3, rows=48, dim=32).double()
    targets = square_targets(48)
    full = ProGCLLoss(0.05, fit_pairs=0)
    full.compute(z, targets)
    for fit_pairs in (48 * 47 // 2, 10**6, None):
        loss_fn = ProGCLLoss(0.05, fit_pairs=fit_pairs)
        loss_fn.compute(z, targets)
        assert torch.equal(loss_fn.bmm_alpha, full.bmm_alpha) and torch.equal(loss_fn.bmm_pi, full.bmm_pi)

    torch.manual_seed(7)
    sampled = ProGCLLoss(0.05, fit_pairs=300)
    sampled.compute(z, targets)
    torch.manual_seed(7)
    index = (torch.rand(300, dtype=torch.float64) * (48 * 47 // 2)).long()
    rows, cols = torch.triu_indices(48, 48, offset=1)
    zn = torch.nn.functional.normalize(z.double(), dim=1)
    x = ((zn @ zn.T + 1) / 2)[rows[index], cols[index]]
    mask = targets.negative_mask[rows[index], cols[index]]
    expected = beta_mixture_em(x, mask=mask)
    torch.testing.assert_close(sampled.bmm_alpha, expected.alpha, rtol=1e-6, atol=0)
    torch.testing.assert_close(sampled.bmm_pi, expected.pi, rtol=1e-6, atol=0)
    assert not torch.allclose(sampled.bmm_alpha, full.bmm_alpha)


def test_sampled_fit_is_close_to_the_full_fit_on_a_large_batch():
    """2N = 512 SimCSE-like rows (130k pairs): a 16384-pair fit gives weights within a few hundredths of the
    full fit's (bench/results/progcl_fit.md measures this on MiniLM batches)."""
    z = realistic_batch(4, rows=512, topics=16)
    targets = square_targets(512)
    full, sampled = ProGCLLoss(0.05, fit_pairs=0), ProGCLLoss(0.05, fit_pairs=16384)
    torch.manual_seed(0)
    out_full, out_sampled = full.compute(z, targets), sampled.compute(z, targets)
    assert out_full.metrics["bmm_fallback"].item() == 0 and out_sampled.metrics["bmm_fallback"].item() == 0
    w_full, w_sampled = out_full.weights, out_sampled.weights
    diff = (w_sampled - w_full)[targets.negative_mask].abs()
    assert diff.quantile(0.99) < 0.05 and diff.max() < 0.2, (diff.quantile(0.99), diff.max())
    assert diff.max() > 0  # it was a different fit


def test_sampled_fit_draws_the_same_pairs_on_every_process():
    """Two threads stand in for two processes whose random draws differ: the all-reduced draw is the same on both,
    and both fit the same mixture (the statistics of both samples)."""
    z = realistic_batch(5, rows=64, dim=32)
    halves = (z, realistic_batch(6, rows=64, dim=32))
    barrier, slots, draws, fits = threading.Barrier(2), [None, None], [None, None], [None, None]

    def run(rank):
        def all_reduce(t):
            slots[rank] = t
            barrier.wait()
            total = slots[0] + slots[1]
            barrier.wait()
            return total

        # the threads take turns on torch's one generator: their own draws differ
        draws[rank] = shared_sample(1000, 500, torch.device("cpu"), all_reduce)
        loss_fn = ProGCLLoss(0.05, fit_pairs=1000)
        loss_fn(halves[rank], halves[rank], *symmetric_targets(64), LossContext(all_reduce=all_reduce))
        fits[rank] = loss_fn.stored_fit()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert torch.equal(draws[0], draws[1]) and draws[0].min() >= 0 and draws[0].max() < 1000
    for a, b in zip(fits[0][:3], fits[1][:3]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=0)


def test_mix_without_the_sort_has_the_sorted_pairings_expectation():
    """Mix over every candidate pairs negatives in candidate order. Over all permutations its mean loss equals the
    mean loss of the sorted pairing (top n = 2N - 2 by hardness, mix_k = n): for a uniform sigma both pair each row's
    negatives by a uniform random bijection, so dropping the sort keeps the objective's expectation, exactly."""
    z = simcse_like(6, 5, 12)
    positive_index, negative_mask = symmetric_targets(6)

    def mean_loss(mix_k, size):
        loss_fn = ProGCLLoss(0.2, mode="mix", mix_k=mix_k)
        losses = [
            loss_fn(z, z, positive_index, negative_mask, LossContext(mix_permutation=torch.tensor(p))).loss
            for p in itertools.permutations(range(size))
        ]
        return torch.stack(losses).mean(), torch.stack(losses).std()

    unsorted, spread = mean_loss(None, 6)  # K = N = 6: candidate order, 720 permutations
    by_hardness, _ = mean_loss(4, 4)  # K = n = 4 < N: the sort, 24 permutations
    assert spread > 1e-4  # the pairing matters for each draw
    torch.testing.assert_close(unsorted, by_hardness, rtol=1e-12, atol=0)


@pytest.mark.parametrize("mode", ["weight", "mix"])
def test_sampled_fit_and_random_pairing_compile_without_graph_breaks(mode):
    """The draws (the fit's sample, mix's permutation) stay in the graph and follow torch's generator as in eager."""
    z = simcse_like(12, 8, 13, dtype=torch.float32)
    eager_fn, compiled_fn = (ProGCLLoss(0.05, mode=mode, em_iters=3, fit_pairs=40) for _ in range(2))
    context = LossContext(step=5, max_steps=10)
    torch._dynamo.reset()
    torch.manual_seed(0)
    out = torch.compile(compiled_fn.compute, fullgraph=True, backend="aot_eager")(z, square_targets(12), context)
    torch.manual_seed(0)
    ref = eager_fn.compute(z, square_targets(12), context)
    torch._dynamo.reset()
    torch.testing.assert_close(out.loss, ref.loss)
    torch.testing.assert_close(compiled_fn.bmm_alpha, eager_fn.bmm_alpha)
    assert not torch.equal(eager_fn.bmm_alpha, ProGCLLoss(0.05, em_iters=3, fit_pairs=0).bmm_alpha)  # it was fitted


@pytest.mark.parametrize("rank", [0, 1])
def test_closed_form_pairing_equals_the_general_one_under_standard_negatives(rank):
    """Mix over all candidates with standard negatives pairs in closed form (`standard_partners`); the general
    construction (cumulative sums over the mask) must give the same partner for every negative, on one process
    (anchors are the candidates) and on the second of two (anchors are rows 16..31 of 32 candidates)."""
    from simcse_hn.losses.progcl import standard_partners
    from simcse_hn.losses.targets import build_targets

    targets = build_targets(16, "symmetric", offset=16 * rank, num_candidates=16 * (rank + 1))
    assert targets.standard_negatives
    loss_fn = ProGCLLoss(0.05, mode="mix")
    g = torch.Generator().manual_seed(rank)
    logits = torch.randn(targets.negative_mask.shape, generator=g, dtype=torch.float64)
    hardness = torch.rand(targets.negative_mask.shape, generator=g, dtype=torch.float64) * targets.negative_mask
    usable = torch.ones((), dtype=torch.bool)
    for seed in range(20):
        permutation = torch.randperm(logits.shape[1], generator=torch.Generator().manual_seed(seed))
        context = LossContext(mix_permutation=permutation)
        general = loss_fn._synthetic_logits(logits, targets.negative_mask, hardness, usable, context)
        closed = loss_fn._synthetic_logits(logits, targets.negative_mask, hardness, usable, context, targets,
                                           targets.negative_bias)  # fmt: skip
        assert torch.equal(general.isinf(), closed.isinf()), seed
        torch.testing.assert_close(general, closed, rtol=1e-12, atol=1e-12)
        partner = standard_partners(permutation, targets.anchor_index, targets.positive_index)
        assert ((partner >= 0) & (partner < logits.shape[1])).all()
        mask = targets.negative_mask
        assert mask.gather(1, partner)[mask].all()  # negatives are paired with negatives



def test_closed_form_pairing_equals_the_general_one_for_any_anchors_and_positives():
    """`standard_partners` against the general construction for anchors that are any rows of the candidates, a
    positive that may be the anchor itself (then one entry is excluded, not two): every negative gets the same
    partner."""
    from simcse_hn.losses.progcl import standard_partners

    g = torch.Generator().manual_seed(5)
    for n in (5, 8, 33):
        columns = torch.arange(n)
        for trial in range(60):
            permutation = torch.randperm(n, generator=g)
            m = int(torch.randint(1, n + 1, (), generator=g))
            anchors = torch.randperm(n, generator=g)[:m]
            positives = torch.randint(0, n, (m,), generator=g)
            if trial % 2:  # mostly a positive of its own
                positives = torch.where(positives == anchors, (positives + 1) % n, positives)
            mask = (columns[None] != anchors[:, None]) & (columns[None] != positives[:, None])
            general = ProGCLLoss._partners(mask, permutation)
            closed = standard_partners(permutation, anchors, positives)
            assert torch.equal(general[mask], closed[mask]), (n, trial)
