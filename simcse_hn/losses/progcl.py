"""ProGCL (docs/losses.md section 4): a two-component Beta mixture over negative similarities, fitted on the device."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, cast

import torch
from torch import Tensor

from simcse_hn.losses.base import (
    ContrastiveLoss,
    NegativeWeights,
    ObjectiveInput,
    ObjectiveOutput,
    drop_nonfinite_grad,
    mean_over_anchors_with_negatives,
)
from simcse_hn.losses.fast_paths import masked_logsumexp
from simcse_hn.losses.options import ObjectiveOptions, TrainingShape, option
from simcse_hn.losses.targets import NEG_INF, ContrastiveTargets, LossContext

BMM_INIT = ((1.0, 2.0), (2.0, 1.0), (0.95, 0.05))  # alpha, beta, pi: component 0 = Beta(1, 2), 1 = Beta(2, 1)
EPS = 1e-12
MODES = ("weight", "mix")
LOG_EPS = math.log(EPS)
# Pairs per mixture fit (per process), from bench/results/progcl_fit.md: on all-MiniLM-L6-v2 batches at 2N = 1024 the
# sampled fit keeps 99 % of the weights within 0.062 of the full fit's (means within 0.0021, the same separation
# decision), about as much as the full fit itself moves from one batch to the next, for 1/8 of the EM work
# (docs/losses.md section 4). Batches with fewer pairs are fitted whole.
FIT_PAIRS = 65536


class BetaMixture(NamedTuple):
    """Parameters of a two-component Beta mixture, each (2,) float64; `valid` () bool (False: degenerate fit)."""

    alpha: Tensor
    beta: Tensor
    pi: Tensor
    valid: Tensor


def _default_init(device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """BMM_INIT as three (2,) float64 tensors made on `device` from scalars (no copy from host memory)."""
    first = torch.arange(2, device=device) == 0  # (2,) [True, False]
    return cast(
        "tuple[Tensor, Tensor, Tensor]",  # one per BMM_INIT row
        tuple(
            torch.full((2,), second, dtype=torch.float64, device=device).masked_fill_(first, value)
            for value, second in BMM_INIT
        ),
    )


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


def _em(
    x: Tensor,
    features: tuple[Tensor, Tensor],
    mask: Tensor | None,
    iters: int,
    init: tuple[Tensor, Tensor, Tensor] | None,
    all_reduce: Callable[[Tensor], Tensor] | None,
) -> BetaMixture:
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
    floored = torch.arange(2, device=x.device) == 1  # only component 1's beta is floored
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
        beta = torch.where(floored & (beta < 1), 1.01, beta)  # the reference's "if beta_1 < 1"
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


def identify_components(fit: BetaMixture) -> tuple[Tensor, Tensor]:
    """Which component holds the true negatives, and whether the fit separates the false ones from them.

    The true-negative component is the majority (the larger pi): false negatives are a small minority of an instance
    batch's negatives. The fit is `separated` when, besides, the false component has the heavier upper tail
    (beta_false < beta_true), so that p(false | x) -> 1 as x -> 1: the most similar negatives, where duplicates lie,
    are the likeliest false, which is ProGCL's premise. Neither the reference's "component 0" nor "the lower mean"
    is safe on SimCSE batches: the fit is typically a narrow bulk and a broad component of about the same mean, and
    when the broad one's mean falls below the bulk's the lower-mean rule names it "true" and gives a duplicate its
    row's largest weight (bench/results/progcl_fit.md). -> order (2,) [true, false] indices, separated () bool."""
    true = (fit.pi[1] > fit.pi[0]).long()  # () 0 on a tie
    order = torch.arange(2, device=fit.pi.device) ^ true  # (2,)
    pi, beta = fit.pi.index_select(0, order), fit.beta.index_select(0, order)
    return order, (pi[0] > pi[1]) & (beta[1] < beta[0])


def negative_posteriors(
    x: Tensor, fit: BetaMixture, features: tuple[Tensor, Tensor] | None = None
) -> tuple[Tensor, Tensor]:
    """p(c | x) = pi_c Beta_c(x) / (sum_c' pi_c' Beta_c'(x) + 1e-12) for c = the true-negative component and the
    false-negative one (`identify_components`). x: any shape, float64 in [1e-12, 1 - 1e-12]; features:
    `_features(x.reshape(-1))` when already computed. -> p_true, p_false, each shaped like x."""
    features = _features(x.reshape(-1)) if features is None else features
    order, _ = identify_components(fit)
    params = (p.index_select(0, order) for p in fit[:3])  # swapping the (2,) parameters, not the (2, K) results
    lik = torch.empty((2, features[0].shape[0]), dtype=torch.float64, device=x.device)
    # params: alpha, beta, pi (a generator of three, whose length mypy cannot see)
    _log_likelihoods(features, *params, out=lik).exp_()  # type: ignore[misc]  # (2, K), no floor here
    post = lik.div_(lik.sum(dim=0, keepdim=True).add_(EPS)).reshape(2, *x.shape)
    return post[0], post[1]


def hardness_scores(s: Tensor, fit: BetaMixture) -> Tensor:
    """B = p(true | x) x for x = (s + 1) / 2 clamped to [1e-12, 1 - 1e-12], from similarities s (any shape) in their
    own dtype, the true component named by `identify_components`: `negative_posteriors`' p_true, as
    1 / (1 + L_f / L_t + 1e-12 / L_t) from two fused multiply-adds each of log x and log(1 - x) = log((1 - s) / 2)
    (exact in float32 too, where 1 - x is not); the constants are float64. An overflow of either ratio gives
    p_true = 0 (its value is below e^-88 then), never NaN. -> B, like s."""
    return _hardness(s, fit)


def _hardness(
    s: Tensor, fit: BetaMixture, scale: float = 1.0, bias: Tensor | None = None, usable: Tensor | None = None
) -> Tensor:
    """`hardness_scores` of the similarities scale * s (s: the logits, scale: the temperature), and with `bias`
    (0 on N(i), -inf elsewhere) and `usable` () bool, B = 0 outside N(i) and everywhere when not usable: +inf enters
    the exponent of L_f / L_t (so p_true = 0), and the constants of an unusable fit (NaN, maybe) are replaced by ones
    that give 1e-12 / L_t = inf. Four (M, N) buffers, each pass in place (x kept rather than made twice): this is most
    of ProGCL's elementwise work.
    -> B, like s"""
    order, _ = identify_components(fit)
    alpha, beta, pi = (p.index_select(0, order) for p in fit[:3])  # (2,) [true, false], float64
    log_norm = torch.lgamma(alpha) + torch.lgamma(beta) - torch.lgamma(alpha + beta) - pi.log()  # (2,)
    # log L_f - log L_t = c0 + c1 log x + c2 log(1-x);  log(1e-12) - log L_t = d0 + d1 log x + d2 log(1-x)
    c = torch.stack([log_norm[0] - log_norm[1], alpha[1] - alpha[0], beta[1] - beta[0]])
    d = torch.stack([LOG_EPS + log_norm[0], 1 - alpha[0], 1 - beta[0]])
    if usable is not None:  # unusable: c = 0, d = (inf, 0, 0)
        c = torch.where(usable, c, 0.0)
        d = torch.stack([torch.where(usable, d[0], math.inf), torch.where(usable, d[1], 0.0),
                         torch.where(usable, d[2], 0.0)])  # fmt: skip
    c, d = c.to(s.dtype), d.to(s.dtype)
    half = torch.full((), 0.5, dtype=s.dtype, device=s.device)
    x = torch.add(half, s, alpha=0.5 * scale).clamp_(EPS, 1 - EPS)  # (M, N), kept for B = x p_true
    log_x = x.log()
    log_1mx = torch.add(half, s, alpha=-0.5 * scale).clamp_min_(EPS).log_()
    ratio = torch.addcmul(c[0], log_x, c[1]).addcmul_(log_1mx, c[2])  # log(L_f / L_t)
    if bias is not None:
        ratio.sub_(bias if bias.dtype == s.dtype else bias.to(s.dtype))  # +inf outside N(i)
    ratio.exp_().add_(1)
    # 1 + L_f / L_t + 1e-12 / L_t, in log_1mx's memory (d0 + d2 log(1 - x) in one pass)
    denominator = torch.addcmul(d[0], log_1mx, d[2], out=log_1mx).addcmul_(log_x, d[1]).exp_().add_(ratio)
    return x.div_(denominator)


class _MixedLogits(torch.autograd.Function):
    """Mix mode's synthetic logits over all candidates, (B_j l_j + B_p l_p) / (B_j + B_p + 1e-12) with p the partner
    (M, N), plus `bias` (0 on N(i), -inf elsewhere) and -inf everywhere when the fit is not `usable`, as
    lambda l + mu l_p with lambda, mu (M, N) made once without gradient; the backward is lambda g plus mu g
    scattered to the partners: 3 (M, N) passes where autograd through the products and the division makes ~8."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, b: Tensor, partner: Tensor, bias: Tensor, usable: Tensor) -> Tensor:
        mu = b.gather(1, partner)  # B_p
        denominator = (b + mu).add_(EPS)
        lam = b / denominator
        mu.div_(denominator)
        mixed = torch.mul(lam, logits).addcmul_(mu, logits.gather(1, partner))
        mixed.add_(bias.to(mixed.dtype)).add_(torch.where(usable, 0.0, NEG_INF).to(mixed.dtype))
        ctx.save_for_backward(lam, mu, partner)
        return mixed

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None, None]:
        lam, mu, partner = ctx.saved_tensors
        return torch.mul(grad, lam).scatter_add_(1, partner, grad * mu), None, None, None, None


class _MixedLogSumExp(torch.autograd.Function):
    """log sum_j e^{m_ij / t} (M,) over mix mode's synthetic logits over all candidates, m / t = lambda l + mu l_p
    (`_MixedLogits`), in one node: the synthetic logits, their shift and exponential share one (M, N) buffer, and the
    backward is g e (lambda + mu scattered to the partners), g = grad / sum. b (M, N), detached, is consumed: its
    memory becomes lambda. Two (M, N) buffers in the forward and two in the backward, where `_MixedLogits` and a
    masked log-sum-exp make seven."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, b: Tensor, partner: Tensor, bias: Tensor, usable: Tensor) -> Tensor:
        mu = b.gather(1, partner)  # B_p
        buffer = torch.add(b, mu).add_(EPS)  # B + B_p + 1e-12
        lam = b.div_(buffer)
        mu.div_(buffer)
        mixed = torch.gather(logits, 1, partner, out=buffer).mul_(mu).addcmul_(lam, logits)  # (M, N)
        mixed.add_(bias if bias.dtype == mixed.dtype else bias.to(mixed.dtype))
        shift = mixed.amax(dim=1, keepdim=True)  # (M, 1)
        shift = torch.where(torch.isfinite(shift), shift, 0.0)  # no synthetic negative: the sum is 0, log -inf
        e = mixed.sub_(shift).exp_()  # (M, N)
        total = e.sum(dim=1)  # (M,)
        ctx.save_for_backward(e, lam, mu, partner, total)
        # an unusable fit has no synthetic negatives: -inf on the (M,) result, not an (M, N) pass (B is 0 then, so e
        # is finite, and the -inf gives it no gradient)
        return total.log() + shift.squeeze(1) + torch.where(usable, 0.0, NEG_INF).to(total.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None, None]:
        e, lam, mu, partner, total = ctx.saved_tensors
        scale = torch.where(total > 0, grad / total, 0.0)[:, None]  # (M, 1); 0 for a row without any, not NaN
        grad_mixed = e * scale  # (M, N)
        grad_logits = torch.mul(grad_mixed, lam)
        return grad_logits.scatter_add_(1, partner, grad_mixed.mul_(mu)), None, None, None, None


def standard_partners(permutation: Tensor, anchor_index: Tensor, positive_index: Tensor) -> Tensor:
    """Mix mode's pairing over all candidates when N(i) is every candidate but e = {anchor_index[i],
    positive_index[i]}: candidate j's rank among N(i) is t = j - [j > e_1] - [j > e_2] (e_1 < e_2), and rho_i (the
    permutation without e's two entries, at positions q_1 < q_2) has at place t the permutation's entry
    u = t + [t >= q_1] + [t >= q_2 - 1]. On N(i), t >= q is j >= J(q), the column of the negative of rank q, so
    u - j is a step function of j with four steps per row: +1 at J(q_1) and at J(q_2 - 1), -1 after e_1 and after
    e_2 (a positive that is the anchor itself: one excluded entry, two steps). It is made as their running sum
    (four entries scattered into a zero row, one int32 cumulative sum), where the steps compared one by one take
    some fifteen (M, N) passes and the general construction two cumulative sums, a scatter and a gather.
    permutation (N,) of 0..N-1, anchor_index, positive_index (M,) -> partner (M, N) int64, meaningful on N(i)."""
    n, m = permutation.shape[0], anchor_index.shape[0]
    columns = torch.arange(n, device=permutation.device, dtype=torch.int32)
    inverse = torch.empty_like(columns).scatter_(0, permutation, columns)  # position of each candidate
    e_low, e_high = torch.minimum(anchor_index, positive_index), torch.maximum(anchor_index, positive_index)  # (M,)
    q_a, q_p = inverse[anchor_index].long(), inverse[positive_index].long()
    q_low, q_high = torch.minimum(q_a, q_p), torch.maximum(q_a, q_p)
    # a positive that is the anchor itself is one excluded entry: its second steps go to the spare column n
    two = e_low != e_high
    e_second = torch.where(two, e_high, n + 1)

    def column_of(rank: Tensor) -> Tensor:  # J(q): the column of row i's negative of rank q
        column = rank + (rank >= e_low).long()
        return column + (column >= e_second).long()

    spare = torch.full_like(e_low, n)
    second, second_end = torch.where(two, column_of(q_high - 1), spare), torch.where(two, e_high + 1, spare)
    steps = torch.stack([column_of(q_low), second, e_low + 1, second_end], dim=1).clamp_(0, n)  # (M, 4)
    signs = torch.where(torch.arange(4, device=permutation.device) < 2, 1, -1).int().expand(m, -1)  # (M, 4)
    delta = torch.zeros((m, n + 1), dtype=torch.int32, device=permutation.device).scatter_add_(1, steps, signs)
    u = torch.cumsum(delta[:, :n], dim=1, dtype=torch.int32).add_(columns).clamp_(0, n - 1)  # (M, N)
    # index_select takes int32 indices (no int64 copy) and is several times faster than take on a CPU
    return permutation.index_select(0, u.view(-1)).view(u.shape)


def shared_sample(
    population: int, count: int, device: torch.device, all_reduce: Callable[[Tensor], Tensor] | None = None
) -> Tensor:
    """`count` indices drawn uniformly, with replacement, from range(population). With `all_reduce` (a sum over
    processes) the draw is the same on every process: the fractional part of a sum of uniforms is uniform.
    -> (count,) long"""
    u = torch.rand(count, dtype=torch.float64, device=device)
    if all_reduce is not None:
        u = all_reduce(u)
        u = u - u.floor()
    return (u * population).long().clamp_max_(population - 1)


def _count(minimum: int) -> Callable[[int], bool]:
    return lambda v: v >= minimum


@dataclass(frozen=True)
class ProGCLOptions(ObjectiveOptions):
    mode: str = option("weight", "ProGCL variant.", choices=MODES)
    warmup_ratio: float = option(0.2, "Fraction of steps trained with plain InfoNCE before the mixture is used.",
                                 check=lambda v: 0 <= v <= 1, must="be in [0, 1]")  # fmt: skip
    refit_every: int = option(1, "Refit the Beta mixture every N steps.", check=_count(1), must="be >= 1")
    em_iters: int = option(10, "EM iterations per Beta-mixture fit.", check=_count(1), must="be >= 1")
    mix_k: int | None = option(None, "ProGCL-mix: hardest K negatives (None: all).", check=_count(1), must="be >= 1")
    warm_start: bool = option(False, "Start each fit from the previous one.")
    fit_pairs: int | None = option(
        FIT_PAIRS,
        "Fit the Beta mixture on this many sampled (anchor, negative) pairs per process; 0: all.",
        check=_count(0),
        must="be >= 0 (0: all pairs)",
    )

    def check_for_training(self, shape: TrainingShape) -> None:
        if self.mode == "mix" and self.mix_k is not None and self.mix_k > shape.negatives_per_anchor:
            note = f" ({shape.negatives_note})" if shape.negatives_note else ""
            raise ValueError(f"mix_k: must be <= the {shape.negatives_per_anchor} negatives per anchor{note}, got "
                             f"{self.mix_k}")  # fmt: skip


class ProGCLLoss(ContrastiveLoss):
    """ProGCL (Xia et al., arXiv:2110.02027), adapted to SimCSE batches (docs/losses.md section 4).

    A Beta mixture fitted to x = (s + 1) / 2 over (anchor, negative) pairs gives B_ij = p(true | x_ij) x_ij
    (detached), the true component being the majority one (`identify_components`).
    * mode "weight": w_ij = B_ij / mean_{k in N(i)} B_ik, then form (W): L_i = -l_ip + log(e^{l_ip} + sum w e^{l_ij}).
    * mode "mix": InfoNCE plus K synthetic logits m_ik / t, m_ik = (B_k s_k + B_sk s_sk) / (B_k + B_sk + 1e-12) over
      the top-K negatives by B, with one random permutation sigma per step.
    Plain InfoNCE while `step < warmup_ratio * max_steps`; neutral setting: warmup_ratio = 1.0. No gradient flows
    through B; in "mix" the similarities inside m carry gradient. A degenerate fit, or one whose components are not
    separated, gives plain InfoNCE for the step (uniform weights, no synthetic negatives) and `bmm_fallback = 1`
    (`bmm_unseparated = 1` for the second reason).

    `fit_pairs`: the mixture is fitted on that many (anchor, negative) pairs per process, drawn uniformly with
    replacement and identically on every process (one draw, summed through `all_reduce`), as the paper fits a
    sample of the similarities; None or 0, or a batch with fewer pairs, fits every pair. The posteriors B are
    evaluated for every pair either way.
    "mix" over all candidates (`mix_k` None or >= N) pairs the negatives in candidate order, sigma restricted to each
    row's negatives: for a uniform sigma that has the distribution of the pairing in hardness order, without the sort
    (the permutation's meaning differs, the loss's expectation over sigma does not); a smaller K sorts by B.

    The last valid fit lives in buffers (`bmm_alpha`, `bmm_beta`, `bmm_pi`; `bmm_valid` says whether the latest fit
    was valid): saved with the state dict, reused between refits (`refit_every`), the initial point when
    `warm_start`, and what the `bmm_*` metrics report. Keep the module on the embeddings'
    device. Shapes: anchors (M, D), candidates (N, D), positive_index (M,), negative_mask (M, N).
    Context (LossContext, all optional): `step`, `max_steps` (without them the loss is past warm-up and refits every
    call), `all_reduce` (a sum over processes, so every process fits the mixture of the gathered batch),
    `mix_permutation` ((K,) long permutation of 0..K-1, K = min(mix_k, N); replaces the random draw, e.g. in tests).
    With targets whose `anchors_are_candidates` (the `compute` call on one process) the fit and the posteriors use
    the symmetric matrix's upper triangle.
    """

    name = "progcl"
    title = "ProGCL"
    Options = ProGCLOptions
    summary = (
        "ProGCL (Xia et al., arXiv:2110.02027): a two-component Beta mixture fitted to negative "
        "similarities gives each negative's probability of being a true negative; `weight` re-weights negatives by "
        "it, `mix` adds synthesised hard negatives. Plain InfoNCE during the warm-up."
    )
    citation = """@inproceedings{xia2022progcl,
  title = {{ProGCL}: Rethinking Hard Negative Mining in Graph Contrastive Learning},
  author = {Xia, Jun and Wu, Lirong and Wang, Ge and Chen, Jintao and Li, Stan Z.},
  booktitle = {International Conference on Machine Learning (ICML)},
  year = {2022}
}"""
    setting = ("mode",)
    variants: ClassVar[dict[str, dict[str, Any]]] = {"weight": {"mode": "weight"}, "mix": {"mode": "mix"}}
    uses_schedule: ClassVar[bool] = True

    options: ProGCLOptions
    # the fit's buffers (`register_buffer` in __init__)
    bmm_alpha: Tensor
    bmm_beta: Tensor
    bmm_pi: Tensor
    bmm_valid: Tensor

    @classmethod
    def describe_batch(cls, metrics: dict[str, float]) -> str | None:
        state = "not separated: uniform weights" if metrics.get("bmm_fallback") else "used"
        false = 100 * metrics.get("est_false_neg_frac", 0)
        return f"ProGCL's mixture fit {state}; estimated false negatives {false:.1f} % of pairs."

    def __init__(self, temperature: float = 0.05, **options: Any):
        super().__init__(temperature, **options)
        alpha, beta, pi = _default_init(torch.device("cpu"))
        self.register_buffer("bmm_alpha", alpha)
        self.register_buffer("bmm_beta", beta)
        self.register_buffer("bmm_pi", pi)
        self.register_buffer("bmm_valid", torch.zeros((), dtype=torch.bool))

    def in_warmup(self, step: int | None, max_steps: int | None) -> bool:
        if self.options.warmup_ratio >= 1.0:
            return True
        if step is None or max_steps is None:
            return False
        return step < self.options.warmup_ratio * max_steps

    def refits(self, step: int | None, max_steps: int | None) -> bool:
        if step is None or self.options.refit_every == 1:
            return True
        first = math.ceil(self.options.warmup_ratio * max_steps) if max_steps is not None else 0
        return (step - first) % self.options.refit_every == 0

    def stored_fit(self) -> BetaMixture:
        return BetaMixture(self.bmm_alpha.double(), self.bmm_beta.double(), self.bmm_pi.double(), self.bmm_valid)

    def mix_size(self, num_candidates: int) -> int:
        return num_candidates if self.options.mix_k is None else min(self.options.mix_k, num_candidates)

    def per_anchor(self, batch: ObjectiveInput) -> ObjectiveOutput:
        logits, targets, context = batch.logits, batch.targets, batch.context
        negative_mask = targets.negative_mask
        plain = batch.plain  # shared with the fallback
        if self.in_warmup(context.step, context.max_steps):
            zero = torch.zeros((), device=logits.device)
            return ObjectiveOutput(loss=plain.loss(), metrics=self._metrics(self.stored_fit(), zero, zero, zero))

        # The fit and the posteriors are float64; B needs only the logits' precision, except where mix sorts by it
        # (a top-K smaller than N): there B keeps float64, so that rounding cannot reorder near-ties.
        num_candidates = logits.shape[1]
        sorts = self.options.mode == "mix" and self.mix_size(num_candidates) < num_candidates
        dtype = torch.float64 if sorts else logits.dtype
        # the triangle shortcut needs sim to be the candidates' own (symmetric) matrix, fitted on this process alone
        square = targets.anchors_are_candidates and context.all_reduce is None
        # from the logits (cosines = t logits): the base makes no (M, N) cosines for ProGCL (`needs_cosines` False)
        hardness, usable, metrics = self.fit_hardness(logits.detach(), negative_mask, context, dtype=dtype,
                                                      square=square, scale=self.temperature,
                                                      bias=targets.negative_bias)  # fmt: skip
        if self.options.mode == "weight":
            n = plain.count[:, None].clamp_min(1)  # (M, 1)
            row_mean = hardness.sum(dim=1, keepdim=True) / n  # (M, 1)
            # w = B / mean B (0 outside N(i)), in B's memory; an unusable fit or an all-zero row (0 / 0 = NaN here)
            # -> w = 1 (everywhere: outside N(i) the weights do not count)
            w = hardness.div_(row_mean).masked_fill_(~(usable & (row_mean > 0)), 1.0)  # (M, N)
            # sum_j w_ij e^{l_ij} from the fallback's own exponentials (with an explicit negative's weight c_ij, the
            # targets' negative_log_weights, in them), guarded as an (M,) result
            log_r, plain_lse = batch.unguarded.weighted_and_plain_lse(w)  # the fallback's sum from the same node
            log_r = drop_nonfinite_grad(log_r)
            loss = torch.logaddexp(plain.pos, log_r) - plain.pos
            with torch.no_grad():  # sum_{j in N(i)} w_ij = n_i; w log w is 0 outside N(i) (w = 0 or 1 there)
                w_log_w = torch.linalg.vecdot(w, w.clamp_min(1e-30).log_())  # (M,)
                weights = NegativeWeights(
                    make=lambda rows=slice(None): torch.where(negative_mask[rows], w[rows], 0.0),
                    max=w.amax(),
                    entropy=mean_over_anchors_with_negatives(n.squeeze(1).log() - w_log_w / n.squeeze(1), plain.count),
                )
            return ObjectiveOutput(loss=loss, weights=weights, metrics=metrics, plain_lse=plain_lse)
        # the synthetic negatives mix the unweighted logits s / t (`logits`, masked by the unweighted bias): an
        # explicit negative's weight multiplies its own term of the negative sum only (in plain.lse)
        if self.mix_size(num_candidates) == num_candidates:
            # over all candidates: the synthetic logits' log-sum-exp in one autograd node from the unguarded logits,
            # guarded as an (M,) result (B consumed: its memory becomes the mixing coefficients)
            unguarded = batch.unguarded.logits
            partner = self._partners(negative_mask, self._permutation(num_candidates, logits.device, context), targets)
            synthetic_lse = drop_nonfinite_grad(
                _MixedLogSumExp.apply(unguarded, hardness, partner, targets.negative_bias, usable)
            )  # (M,)
        else:
            synthetic = self._synthetic_logits(
                logits, negative_mask, hardness, usable, context, targets, targets.negative_bias
            )  # (M, K)
            synthetic_lse = masked_logsumexp(synthetic)
        # InfoNCE's denominator plus the synthetic negatives: the plain part is the fallback's own reduction
        log_denominator = torch.logaddexp(torch.logaddexp(plain.pos, plain.lse), synthetic_lse)
        return ObjectiveOutput(loss=log_denominator - plain.pos, metrics=metrics)

    def fit_hardness(
        self,
        sim: Tensor,
        negative_mask: Tensor,
        context: LossContext | None = None,
        dtype: torch.dtype = torch.float64,
        square: bool = False,
        scale: float = 1.0,
        bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """(Re)fit the mixture if the schedule says so and score the negatives.
        -> B (M, N) in `dtype`, detached, 0 outside N(i) and 0 when the fit is not usable; whether it is (valid and
        separated) (); the bmm metrics. sim (M, N): the cosines, or the logits with `scale` = the temperature (the
        cosines are scale * sim; the loss passes its logits: no (M, N) cosines are made). `bias` (M, N): 0 on N(i),
        -inf elsewhere (`ContrastiveTargets.negative_bias`), which B's computation absorbs (no (M, N) select).

        The fit is float64, on the pairs drawn from the fitted ones (`fit_pairs`), gathered from sim, or on all of
        them. `square`: sim is the candidates' own similarity matrix (targets.anchors_are_candidates, one process), so
        the fitted pairs are the unordered ones, each from the upper triangle and counted once per direction in which
        it is a negative: the same moments and fit as over the full matrix (s_ji is taken to be s_ij, which the
        matrix product may compute with another rounding). The posteriors are evaluated on the full matrix in
        `dtype` (`hardness_scores`): ~20 elementwise passes, cheaper than gathering the triangle and scattering it
        back (two index_put over (M, N) cost more than the posterior itself at 2N = 1024). The metric
        `est_false_neg_frac` is the mean p(false) over the drawn pairs (every pair when they are all fitted), in
        float64; between refits the pairs are drawn all the same."""
        context = LossContext() if context is None else context
        s = sim.detach()
        fit_x, fit_data = self._fit_sample(s, negative_mask, context, square, scale)  # (K,) each
        fit_features = _features(fit_x)
        if self.refits(context.step, context.max_steps):
            init = self.stored_fit()[:3] if self.options.warm_start else None
            fit = _em(fit_x, fit_features, fit_data, self.options.em_iters, init, context.all_reduce)
            with torch.no_grad():  # the buffers keep the last valid fit, so they never hold NaN
                for buffer, value in zip((self.bmm_alpha, self.bmm_beta, self.bmm_pi), fit[:3]):
                    buffer.copy_(torch.where(fit.valid, value, buffer))
                self.bmm_valid.copy_(fit.valid)
        else:
            fit = self.stored_fit()

        _, separated = identify_components(fit)
        usable = fit.valid & separated
        if bias is None:
            hardness = _hardness(s.to(dtype), fit, scale)  # (M, N)
            # A degenerate fit may hold NaN: replace B before it touches anything with a gradient.
            hardness = torch.where(usable & negative_mask, hardness, 0.0)  # B, (M, N)
        else:  # the same, in B's own passes
            hardness = _hardness(s.to(dtype), fit, scale, bias, usable)  # B, (M, N)
        data = fit_data.to(torch.float64)
        est_false = (negative_posteriors(fit_x, fit, fit_features)[1] * data).sum() / data.sum().clamp_min(1)
        est_false = torch.where(usable, est_false, 0.0)
        metrics = self._metrics(self.stored_fit(), est_false, (~usable).float(), (fit.valid & ~separated).float())
        return hardness, usable, metrics

    def _fit_sample(
        self, s: Tensor, negative_mask: Tensor, context: LossContext, square: bool, scale: float = 1.0
    ) -> tuple[Tensor, Tensor]:
        """The pairs the mixture is fitted on: x = (scale s + 1) / 2 in float64, clamped, (K,), and their data weights
        (K,) (bool: a negative or not; with `square`, float: in how many directions the pair is a negative)."""
        flat_s, flat_mask = s.reshape(-1), negative_mask.reshape(-1)
        if square:
            upper, lower = self._triangles(s.shape[0], s.device)  # (P,) flat indices of (i, j) and (j, i), i < j
            population = upper.shape[0]
        else:
            population = flat_s.shape[0]
        fit_pairs = self.options.fit_pairs  # None or 0: every pair
        if fit_pairs and fit_pairs < population:
            index = shared_sample(population, fit_pairs, s.device, context.all_reduce)  # (fit_pairs,)
            if square:
                upper, lower = upper.index_select(0, index), lower.index_select(0, index)
        elif not square:
            index = None
        if square:  # index_select: advanced indexing is several times slower on a CPU
            fit_s = flat_s.index_select(0, upper)
            data = flat_mask.index_select(0, upper).to(torch.float64) + flat_mask.index_select(0, lower)
        elif index is None:
            fit_s, data = flat_s, flat_mask
        else:
            fit_s, data = flat_s.index_select(0, index), flat_mask.index_select(0, index)
        fit_s = fit_s.to(torch.float64) if scale == 1.0 else fit_s.to(torch.float64) * scale
        x = ((fit_s + 1) / 2).clamp(EPS, 1 - EPS)
        return torch.where(data > 0, x, 0.5), data  # non-pairs (self, positive) are not data: tame densities

    def _triangles(self, n: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """Flat indices of the pairs i < j of an (n, n) matrix, i * n + j and j * n + i, cached per size and device.
        -> (P,), (P,)"""
        key = (n, str(device))
        if getattr(self, "_triangle_key", None) != key:
            rows, cols = torch.triu_indices(n, n, offset=1, device=device)
            self._triangle_key, self._triangle_index = key, (rows * n + cols, cols * n + rows)
        return self._triangle_index

    def _permutation(self, k: int, device: torch.device, context: LossContext) -> Tensor:
        """sigma (K,): the context's, or one uniform draw, the same on every process (the sum of their noise)."""
        if context.mix_permutation is not None:
            return context.mix_permutation.to(device)
        noise = torch.rand(k, device=device)  # (K,)
        if context.all_reduce is not None:
            noise = context.all_reduce(noise)
        return torch.argsort(noise, stable=True)

    def _synthetic_logits(
        self,
        logits: Tensor,
        negative_mask: Tensor,
        hardness: Tensor,
        usable: Tensor,
        context: LossContext,
        targets: ContrastiveTargets | None = None,
        bias: Tensor | None = None,
    ) -> Tensor:
        """Mix mode's synthetic logits m / t = (B_k l_k + B_sk l_sk) / (B_k + B_sk + 1e-12), -inf where there is none.
        `targets`: their standard negatives give the pairing in closed form (`standard_partners`); `bias`: their
        negative_bias, which masks by an addition. -> (M, K)"""
        rows, num_candidates = logits.shape
        k = self.mix_size(num_candidates)
        permutation = self._permutation(k, logits.device, context)  # (K,)
        if k == num_candidates:
            partner = self._partners(negative_mask, permutation, targets)
            b = hardness.to(logits.dtype)
            if bias is None:
                b_partner, l_partner = b.gather(1, partner), logits.gather(1, partner)
                mixed = (b * logits + b_partner * l_partner) / (b + b_partner + EPS)  # (M, N)
                return torch.where(negative_mask & usable, mixed, NEG_INF)
            return cast(Tensor, _MixedLogits.apply(logits, b, partner, bias, usable))

        key = torch.where(negative_mask, hardness, NEG_INF)
        sorted_b, order = torch.sort(key, dim=1, descending=True, stable=True)
        sorted_b, order = sorted_b[:, :k], order[:, :k]  # (M, K), negatives first
        sorted_l = logits.gather(1, order)  # (M, K), carries gradient
        n = negative_mask.sum(dim=1, keepdim=True)  # (M, 1)
        in_top = torch.arange(k, device=logits.device)[None, :] < n.clamp_max(k)  # (M, K)
        # Row i's sigma: the permutation's entries below the row's count of negatives, in order, then the identity on
        # the positions beyond, so every row pairs negatives with negatives and rows with at least K negatives all
        # use the same sigma. Built by one scatter: a stable per-row argsort of the (M, K) keys took ~0.4x an
        # InfoNCE forward+backward at 2N = 1024 on a CPU.
        keep = permutation[None, :] < n.clamp_max(k)  # (M, K)
        slot = torch.where(keep, keep.cumsum(dim=1) - 1, k)  # (M, K), entries not kept land in a spare column
        sigma = torch.arange(k + 1, device=logits.device).repeat(rows, 1)  # (M, K + 1)
        sigma = sigma.scatter(1, slot, permutation.expand_as(slot))[:, :k]  # (M, K)
        b = torch.where(in_top, sorted_b, 0.0).to(logits.dtype)
        b_partner, l_partner = b.gather(1, sigma), sorted_l.gather(1, sigma)
        mixed = (b * sorted_l + b_partner * l_partner) / (b + b_partner + EPS)  # (M, K)
        return torch.where(in_top & usable, mixed, NEG_INF)

    @staticmethod
    def _partners(negative_mask: Tensor, permutation: Tensor, targets: ContrastiveTargets | None = None) -> Tensor:
        """Mix over all candidates pairs the negatives in candidate order: row i's sigma is the permutation's entries
        that are its negatives, in order (rho_i); its t-th negative is paired with rho_i[t]. `targets`: their standard
        negatives give the pairing in closed form (`standard_partners`). -> partner (M, N) long, meaningful on N(i)."""
        if targets is not None and targets.standard_negatives:
            # standard negatives: made by compute(), with anchor_index
            return standard_partners(permutation, cast(Tensor, targets.anchor_index), targets.positive_index)
        rows, num_candidates = negative_mask.shape
        # one gather of the mask, two cumulative sums, a scatter and a gather: no (M, N) sort
        keep = negative_mask.index_select(1, permutation)  # (M, N): is sigma_t a negative of row i
        slot = torch.where(keep, keep.cumsum(dim=1) - 1, num_candidates)  # (M, N), others to a spare column
        rho = torch.zeros((rows, num_candidates + 1), dtype=torch.long, device=negative_mask.device)
        rho = rho.scatter_(1, slot, permutation.expand_as(slot))  # (M, N + 1): rho_i, then junk
        rank = (negative_mask.cumsum(dim=1) - 1).clamp_min_(0)  # (M, N): t of candidate j among N(i)
        return rho.gather(1, rank)  # (M, N), meaningful on N(i)

    def _metrics(
        self, fit: BetaMixture, est_false: Tensor, fallback: Tensor, unseparated: Tensor
    ) -> dict[str, Tensor]:
        metrics = {"est_false_neg_frac": est_false, "bmm_fallback": fallback, "bmm_unseparated": unseparated}
        for name, values in zip(("alpha", "beta", "pi"), fit[:3]):
            metrics[f"bmm_{name}_0"], metrics[f"bmm_{name}_1"] = values[0], values[1]
        return metrics
