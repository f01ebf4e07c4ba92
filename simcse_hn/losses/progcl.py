"""ProGCL (docs/losses.md section 4): a two-component Beta mixture over negative similarities, fitted on the device."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from simcse_hn.losses.base import NEG_INF, ContrastiveLoss, positive_logits, weighted_loss
from simcse_hn.targets import LossContext

BMM_INIT = ((1.0, 2.0), (2.0, 1.0), (0.95, 0.05))  # alpha, beta, pi: component 0 = Beta(1, 2), 1 = Beta(2, 1)
EPS = 1e-12
MODES = ("weight", "mix")
LOG_EPS = math.log(EPS)
BETA1_FLOOR = torch.tensor([-math.inf, 1.0], dtype=torch.float64)  # only component 1's beta is floored


class BetaMixture(NamedTuple):
    """Parameters of a two-component Beta mixture, each (2,) float64; `valid` () bool (False: degenerate fit)."""

    alpha: Tensor
    beta: Tensor
    pi: Tensor
    valid: Tensor


def _default_init(device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    return tuple(torch.tensor(p, dtype=torch.float64, device=device) for p in BMM_INIT)


def _log_likelihoods(features: tuple[Tensor, Tensor], alpha: Tensor, beta: Tensor, pi: Tensor, out: Tensor) -> Tensor:
    """log(pi_c Beta(x; alpha_c, beta_c)) for both components, written into `out` (2, K). features: (log x,
    log(1-x)), each (K,). In-place multiply-adds into a reused buffer: a fresh (2, K) float64 allocation per EM
    iteration, or a (2, 3) @ (3, K) float64 matmul, is several times slower on CPUs."""
    log_norm = torch.lgamma(alpha) + torch.lgamma(beta) - torch.lgamma(alpha + beta)  # (2,)
    torch.mul((alpha - 1)[:, None], features[0], out=out)
    return out.addcmul_((beta - 1)[:, None], features[1]).add_((pi.log() - log_norm)[:, None])


def _features(x: Tensor) -> tuple[Tensor, Tensor]:
    """x (K,) float64 in (0, 1) -> (log x, log(1-x)); with x >= 1e-12 this equals xlogy's density."""
    return x.log(), torch.log1p(-x)


def beta_mixture_em(
    x: Tensor,
    iters: int = 10,
    init: tuple[Tensor, Tensor, Tensor] | None = None,
    mask: Tensor | None = None,
    all_reduce: Callable[[Tensor], Tensor] | None = None,
) -> BetaMixture:
    """EM for a two-component Beta mixture (the ProGCL reference's BetaMixture1D, in torch, float64, no host sync).

    x: data in [0, 1], any shape (detached, clamped to [1e-12, 1 - 1e-12]). mask: same shape, bool; only True entries
    are data. init: (alpha, beta, pi), each (2,); default Beta(1, 2), Beta(2, 1), pi = (0.95, 0.05).
    all_reduce: optional out-of-place sum over processes applied to every sufficient statistic, so that W processes
    fit the mixture of all their data (identity when None).
    `valid` is False when any component's variance fell to <= 1e-12 or a parameter is non-finite or non-positive.
    """
    x = x.detach().to(torch.float64).reshape(-1).clamp(EPS, 1 - EPS)  # (K,)
    m = None if mask is None else mask.detach().reshape(-1)
    if m is not None:
        x = torch.where(m, x, 0.5)  # entries outside the mask only need finite densities
    return _em(x, _features(x), m, iters, init, all_reduce)


def _em(x: Tensor, features: Tensor, mask: Tensor | None, iters: int, init, all_reduce) -> BetaMixture:
    """x (K,) float64 clamped (finite densities everywhere), features = _features(x), mask (K,) bool, or float
    multiplicities (how many times each entry counts as data), or None (all data once).

    With two components r_1 = lik_1 / (lik_0 + lik_1) = sigmoid(log lik_1 - log lik_0) (floors applied in log
    space), and component 0's statistics are the totals minus component 1's: one exp and one mat-vec per iteration.
    """
    reduce = all_reduce if all_reduce is not None else (lambda t: t)
    m = torch.ones_like(x) if mask is None else mask.to(torch.float64)
    total = reduce(m.sum())
    # Weighted moments of y = x - shift; the shift (the data mean) keeps the one-pass variance free of
    # cancellation. Entries outside the mask get zero columns, hence no weight.
    shift = reduce(m @ x) / total
    moments = torch.empty((3, x.shape[0]), dtype=torch.float64, device=x.device)  # [1, y, y^2] on the data, else 0
    moments[0] = m
    torch.mul(x - shift, m, out=moments[1])
    torch.mul(moments[1], x - shift, out=moments[2])
    totals = reduce(moments.sum(dim=1))  # (3,)
    if init is None:
        alpha, beta, pi = _default_init(x.device)
    else:
        alpha, beta, pi = (p.detach().to(device=x.device, dtype=torch.float64) for p in init)
    min_var = torch.full((2,), math.inf, dtype=torch.float64, device=x.device)
    log_lik = torch.empty((2, x.shape[0]), dtype=torch.float64, device=x.device)  # reused by every iteration
    for _ in range(iters):
        _log_likelihoods(features, alpha, beta, pi, out=log_lik).clamp_min_(LOG_EPS)  # (2, K), floored at 1e-12
        r_1 = log_lik[1].sub_(log_lik[0]).sigmoid_()  # (K,)
        stats_1 = reduce(moments @ r_1)  # (3,): sum r y^p, p = 0, 1, 2
        stats = torch.stack([totals - stats_1, stats_1])  # (2, 3)
        r_sum = stats[:, 0]
        mean_y = stats[:, 1] / r_sum
        var = stats[:, 2] / r_sum - mean_y.square()
        mean = shift + mean_y
        alpha = mean * (mean * (1 - mean) / var - 1)
        beta = alpha * (1 - mean) / mean
        beta = torch.where(BETA1_FLOOR.to(beta.device) > beta, 1.01, beta)  # the reference's "if beta_1 < 1"
        pi = r_sum / total
        min_var = torch.minimum(min_var, var)  # NaN propagates, and fails the check below
    params = torch.stack([alpha, beta, pi])
    valid = (min_var > EPS).all() & torch.isfinite(params).all() & (alpha > 0).all() & (beta > 0).all()
    return BetaMixture(alpha, beta, pi, valid)


def fit_beta_mixture(
    x: Tensor, iters: int = 10, init: tuple[Tensor, Tensor, Tensor] | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Fit a two-component Beta mixture to `x` (values in [0, 1]). -> alpha (2,), beta (2,), pi (2,), float64.

    Use `beta_mixture_em` for the validity flag, a mask, or a multi-process fit.
    """
    fit = beta_mixture_em(x, iters=iters, init=init)
    return fit.alpha, fit.beta, fit.pi


def negative_posteriors(
    x: Tensor, fit: BetaMixture, features: tuple[Tensor, Tensor] | None = None
) -> tuple[Tensor, Tensor]:
    """p(c | x) = pi_c Beta_c(x) / (sum_c' pi_c' Beta_c'(x) + 1e-12) for c = the true-negative component (the lower
    mean alpha / (alpha + beta)) and the false-negative one. x: any shape, float64 in [1e-12, 1 - 1e-12];
    features: `_features(x.reshape(-1))` when already computed. -> p_true, p_false, each shaped like x."""
    features = _features(x.reshape(-1)) if features is None else features
    means = fit.alpha / (fit.alpha + fit.beta)
    order = torch.where(means[0] <= means[1], 0, 1) ^ torch.tensor([0, 1], device=x.device)  # [true, false]
    params = (p.index_select(0, order) for p in fit[:3])  # swapping the (2,) parameters, not the (2, K) results
    lik = torch.empty((2, features[0].shape[0]), dtype=torch.float64, device=x.device)
    _log_likelihoods(features, *params, out=lik).exp_()  # (2, K), no floor here
    post = lik.div_(lik.sum(dim=0, keepdim=True).add_(EPS)).reshape(2, *x.shape)
    return post[0], post[1]


class ProGCLLoss(ContrastiveLoss):
    """ProGCL (Xia et al., arXiv:2110.02027), adapted to SimCSE batches (docs/losses.md section 4).

    A Beta mixture fitted to x = (s + 1) / 2 over all (anchor, negative) pairs gives B_ij = p(true | x_ij) x_ij
    (detached).
    * mode "weight": w_ij = B_ij / mean_{k in N(i)} B_ik, then form (W): L_i = -l_ip + log(e^{l_ip} + sum w e^{l_ij}).
    * mode "mix": InfoNCE plus K synthetic logits m_ik / t, m_ik = (B_k s_k + B_sk s_sk) / (B_k + B_sk + 1e-12) over
      the top-K negatives by B, with one random permutation sigma per step.
    Plain InfoNCE while `step < warmup_ratio * max_steps`; neutral setting: warmup_ratio = 1.0. No gradient flows
    through B; in "mix" the similarities inside m carry gradient. A degenerate fit gives plain InfoNCE for the step
    (uniform weights, no synthetic negatives) and `bmm_fallback = 1`.

    The last valid fit lives in buffers (`bmm_alpha`, `bmm_beta`, `bmm_pi`; `bmm_valid` says whether the latest fit
    was valid): saved with the state dict, reused between refits (`refit_every`), the initial point when
    `warm_start`, and what the `bmm_*` metrics report. Keep the module on the embeddings'
    device. Shapes: anchors (M, D), candidates (N, D), positive_index (M,), negative_mask (M, N).
    Context (LossContext, all optional): `step`, `max_steps` (without them the loss is past warm-up and refits every
    call), `all_reduce` (a sum over processes, so every process fits the mixture of the gathered batch),
    `mix_permutation` ((K,) long permutation of 0..K-1, K = min(mix_k, N); replaces the random draw, e.g. in tests;
    a row with fewer than K negatives uses its entries below that count, in order). With targets whose
    `anchors_are_candidates` (the `compute` call on one process) the fit uses the symmetric matrix's upper triangle.
    """

    def __init__(
        self,
        temperature: float = 0.05,
        mode: str = "weight",
        warmup_ratio: float = 0.2,
        refit_every: int = 1,
        em_iters: int = 10,
        mix_k: int | None = None,
        warm_start: bool = False,
    ):
        super().__init__(temperature)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if not 0.0 <= warmup_ratio <= 1.0:
            raise ValueError(f"warmup_ratio must be in [0, 1], got {warmup_ratio}")
        if int(refit_every) != refit_every or refit_every < 1:
            raise ValueError(f"refit_every must be an integer >= 1, got {refit_every}")
        if int(em_iters) != em_iters or em_iters < 1:
            raise ValueError(f"em_iters must be an integer >= 1, got {em_iters}")
        if mix_k is not None and (int(mix_k) != mix_k or mix_k < 1):
            raise ValueError(f"mix_k must be None or an integer >= 1, got {mix_k}")
        self.mode = mode
        self.warmup_ratio = float(warmup_ratio)
        self.refit_every = int(refit_every)
        self.em_iters = int(em_iters)
        self.mix_k = None if mix_k is None else int(mix_k)
        self.warm_start = bool(warm_start)
        alpha, beta, pi = _default_init(torch.device("cpu"))
        self.register_buffer("bmm_alpha", alpha)
        self.register_buffer("bmm_beta", beta)
        self.register_buffer("bmm_pi", pi)
        self.register_buffer("bmm_valid", torch.zeros((), dtype=torch.bool))

    def in_warmup(self, step: int | None, max_steps: int | None) -> bool:
        if self.warmup_ratio >= 1.0:
            return True
        if step is None or max_steps is None:
            return False
        return step < self.warmup_ratio * max_steps

    def refits(self, step: int | None, max_steps: int | None) -> bool:
        if step is None or self.refit_every == 1:
            return True
        first = math.ceil(self.warmup_ratio * max_steps) if max_steps is not None else 0
        return (step - first) % self.refit_every == 0

    def stored_fit(self) -> BetaMixture:
        return BetaMixture(self.bmm_alpha.double(), self.bmm_beta.double(), self.bmm_pi.double(), self.bmm_valid)

    def objective(self, sim: Tensor, logits: Tensor, targets, context, anchors, candidates):
        positive_index, negative_mask = targets.positive_index, targets.negative_mask
        if self.in_warmup(context.step, context.max_steps):
            zero = torch.zeros((), device=sim.device)
            metrics = self._metrics(self.stored_fit(), zero, zero)
            return weighted_loss(logits, positive_index, negative_mask), None, metrics

        # The fit and B are float64; the weights, like the logits, need only the logits' precision. Mix sorts by B:
        # there B keeps float64, so that rounding cannot reorder near-ties.
        dtype = logits.dtype if self.mode == "weight" else torch.float64
        # the triangle shortcut needs sim to be the candidates' own (symmetric) matrix, fitted on this process alone
        square = targets.anchors_are_candidates and context.all_reduce is None
        hardness, valid, metrics = self.fit_hardness(sim, negative_mask, context, dtype=dtype, square=square)
        if self.mode == "weight":
            n = negative_mask.sum(dim=1, keepdim=True)  # (M, 1)
            row_mean = hardness.sum(dim=1, keepdim=True) / n.clamp_min(1)  # (M, 1)
            log_w = hardness.log() - row_mean.log()  # B = 0 -> w = 0 -> -inf, as form (W) allows
            # degenerate fit or all-zero row -> w = 1; outside N(i) the log-weights are ignored (masked downstream)
            log_w = torch.where(valid & (row_mean > 0), log_w, 0.0)
            return weighted_loss(logits, positive_index, negative_mask, log_w), log_w, metrics
        return self._mix_loss(sim, logits, positive_index, negative_mask, hardness, valid, context), None, metrics

    def fit_hardness(
        self,
        sim: Tensor,
        negative_mask: Tensor,
        context: LossContext | None = None,
        dtype: torch.dtype = torch.float64,
        square: bool = False,
    ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """(Re)fit the mixture if the schedule says so and score the negatives (in float64).
        -> B (M, N) in `dtype`, detached, 0 outside N(i); the fit's validity (); the bmm metrics.

        `square`: sim is the candidates' own similarity matrix (targets.anchors_are_candidates, one process), so every
        unordered pair is fitted and scored once, from the upper triangle, counted once per direction in which it is
        a negative: the same moments, fit and B as over the full matrix, for half the work (s_ji is taken to be s_ij,
        which the matrix product may compute with another rounding)."""
        context = LossContext() if context is None else context
        s, data = sim.detach().reshape(-1), negative_mask.reshape(-1)  # (M*N,)
        if square:
            upper, lower = self._triangles(sim.shape[0], sim.device)  # (P,) flat indices of (i, j) and (j, i), i < j
            s, data = s[upper], data[upper].to(torch.float64) + data[lower]  # (P,): 0, 1 or 2 directions
        x = ((s.to(torch.float64) + 1) / 2).clamp(EPS, 1 - EPS)
        x = torch.where(data > 0, x, 0.5)  # non-pairs (self, positive) are not data: keep their densities tame
        features = _features(x)  # shared by the fit and the posterior
        if self.refits(context.step, context.max_steps):
            init = self.stored_fit()[:3] if self.warm_start else None
            fit = _em(x, features, data, self.em_iters, init, context.all_reduce)
            with torch.no_grad():  # the buffers keep the last valid fit, so they never hold NaN
                for buffer, value in zip((self.bmm_alpha, self.bmm_beta, self.bmm_pi), fit[:3]):
                    buffer.copy_(torch.where(fit.valid, value, buffer))
                self.bmm_valid.copy_(fit.valid)
        else:
            fit = self.stored_fit()

        p_true, p_false = negative_posteriors(x, fit, features)  # like x each
        hardness = (p_true * x).to(dtype)
        if square:  # back to (M, N): the triangle and its mirror image (the diagonal is never a negative)
            full = torch.zeros(sim.numel(), dtype=dtype, device=sim.device)
            hardness = full.index_put_((upper,), hardness).index_put_((lower,), hardness)
        hardness = hardness.reshape(sim.shape)
        # A degenerate fit may hold NaN: replace B before it touches anything with a gradient.
        hardness = torch.where(fit.valid & negative_mask, hardness, 0.0)  # B, (M, N)
        data = data.to(torch.float64)
        est_false = (p_false * data).sum() / data.sum().clamp_min(1)
        est_false = torch.where(fit.valid, est_false, 0.0)
        return hardness, fit.valid, self._metrics(self.stored_fit(), est_false, (~fit.valid).float())

    def _triangles(self, n: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """Flat indices of the pairs i < j of an (n, n) matrix, i * n + j and j * n + i, cached per size and device.
        -> (P,), (P,)"""
        key = (n, str(device))
        if getattr(self, "_triangle_key", None) != key:
            rows, cols = torch.triu_indices(n, n, offset=1, device=device)
            self._triangle_key, self._triangle_index = key, (rows * n + cols, cols * n + rows)
        return self._triangle_index

    def _mix_loss(self, sim, logits, positive_index, negative_mask, hardness, valid, context: LossContext) -> Tensor:
        num_candidates = sim.shape[1]
        k = num_candidates if self.mix_k is None else min(self.mix_k, num_candidates)
        key = torch.where(negative_mask, hardness, NEG_INF)
        sorted_b, order = torch.sort(key, dim=1, descending=True, stable=True)
        sorted_b, order = sorted_b[:, :k], order[:, :k]  # (M, K), negatives first
        sorted_s = sim.gather(1, order)  # (M, K), carries gradient
        n = negative_mask.sum(dim=1, keepdim=True)  # (M, 1)
        in_top = torch.arange(k, device=sim.device)[None, :] < n.clamp_max(k)  # (M, K)

        permutation = context.mix_permutation
        if permutation is None:
            noise = torch.rand(k, device=sim.device)  # (K,)
            if context.all_reduce is not None:  # one sigma on every process: the sum of their draws
                noise = context.all_reduce(noise)
            permutation = torch.argsort(noise, stable=True)  # (K,)
        permutation = permutation.to(sim.device)
        # Row i's sigma: the permutation's entries below the row's count of negatives, in order, then the identity on
        # the positions beyond, so every row pairs negatives with negatives and rows with at least K negatives all
        # use the same sigma. Built by one scatter: a stable per-row argsort of the (M, K) keys took ~0.4x an
        # InfoNCE forward+backward at 2N = 1024 on a CPU.
        keep = permutation[None, :] < n.clamp_max(k)  # (M, K)
        slot = torch.where(keep, keep.cumsum(dim=1) - 1, k)  # (M, K), entries not kept land in a spare column
        sigma = torch.arange(k + 1, device=sim.device).repeat(sim.shape[0], 1)  # (M, K + 1)
        sigma = sigma.scatter(1, slot, permutation.expand_as(slot))[:, :k]  # (M, K)
        b = torch.where(in_top, sorted_b, 0.0).to(sim.dtype)
        b_partner, s_partner = b.gather(1, sigma), sorted_s.gather(1, sigma)
        mixed = (b * sorted_s + b_partner * s_partner) / (b + b_partner + EPS)  # (M, K)
        synthetic = torch.where(in_top & valid, mixed / self.temperature, NEG_INF)

        pos = positive_logits(logits, positive_index)  # (M,)
        neg = torch.where(negative_mask, logits, NEG_INF)
        return torch.logsumexp(torch.cat([pos[:, None], neg, synthetic], dim=1), dim=1) - pos

    def _metrics(self, fit: BetaMixture, est_false: Tensor, fallback: Tensor) -> dict[str, Tensor]:
        metrics = {"est_false_neg_frac": est_false, "bmm_fallback": fallback}
        for name, values in zip(("alpha", "beta", "pi"), fit[:3]):
            metrics[f"bmm_{name}_0"], metrics[f"bmm_{name}_1"] = values[0], values[1]
        return metrics
