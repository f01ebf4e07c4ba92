"""UnReMix (docs/losses.md section 5): negatives scored by anchor similarity, model uncertainty, representativeness."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from simcse_hn.losses.base import (
    ContrastiveLoss,
    NegativeWeights,
    ObjectiveInput,
    ObjectiveOutput,
    debiased_from_log_r,
    drop_nonfinite_grad,
    mean_over_anchors_with_negatives,
)
from simcse_hn.losses.options import ObjectiveOptions, TrainingShape, option
from simcse_hn.losses.targets import NEG_INF, ContrastiveTargets

GRADIENTS = ("head", "embedding")
STD_EPS = 1e-6
U_MAX = 1e15
# gamma of the learned mixture's entropy bonus: the mixture settles near lambda = softmax(g / gamma), g = dL/dlambda.
# On all-MiniLM-L6-v2 batches (beta 1) g is about (+0.3, 0.0, -0.3) for (A, U, R): gamma 0.5 keeps every component
# above ~15 % (docs/losses.md section 5).
MIXTURE_ENTROPY = 0.5


class _ReverseGrad(torch.autograd.Function):
    """Identity whose backward negates the gradient: what it guards ascends the loss that the rest descends."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return -grad


def _unit(z: Tensor) -> tuple[Tensor, Tensor]:
    norm = z.norm(dim=-1, keepdim=True).clamp_min(1e-12)  # (K, 1)
    return z / norm, norm


def _residual(logits: Tensor) -> Tensor:
    """q - onehot(argmax q) for q = softmax of masked logits (K, L) (-inf outside the other rows), made in the logits'
    memory (consumed: no (K, L) allocation). -> (K, L)"""
    label = logits.argmax(dim=1, keepdim=True)  # (K, 1) the pseudo-label, from the logits as given
    shift = logits.amax(dim=1, keepdim=True)  # (K, 1)
    residual = logits.sub_(torch.where(torch.isfinite(shift), shift, 0.0)).exp_()  # (K, L)
    residual.div_(residual.sum(dim=1, keepdim=True))  # q, minus one at the pseudo-label below
    return residual.scatter_add_(1, label, torch.full_like(residual[:, :1], -1.0))


def pseudo_label_residual(e: Tensor, shift: Tensor, lse: Tensor, pos: Tensor, positive_index: Tensor) -> Tensor:
    """`_residual` of the anchors' pseudo-posteriors over their positive and negatives, from plain InfoNCE's own
    reductions (`PlainReductions`): e = e^{m - shift} (M, N) of the masked logits m (0 outside N(i)), shift (M, 1)
    their row maxima (0 for a row without negatives), lse (M,) = log sum_j e^{m_ij}, pos (M,) the positives'
    logits. The pseudo-posterior is e rescaled to the larger of shift and pos, with the positive's entry put in:
    one (M, N) pass, where `_residual` of the masked logits with the positive put back makes the masked logits
    again, shifts, exponentiates and normalises them (six). The pseudo-label is the first largest entry, as argmax
    of those logits gives it: the negatives' first largest (e is 1 there) or the positive, the first of the two on
    a tie. -> (M, N), without gradient"""
    shift = shift.squeeze(1)
    total = torch.exp(lse - shift)  # (M,) sum_j e_ij, 0 without negatives
    top = torch.where(total > 0, shift, NEG_INF)  # the largest negative logit
    new_shift = torch.maximum(top, pos)
    factor = torch.exp(shift - new_shift)  # e's rescaling (e is 0 where top is -inf)
    positive = torch.exp(pos - new_shift)
    normaliser = total * factor + positive  # (M,)
    residual = e * (factor / normaliser)[:, None]  # (M, N), q on N(i)
    rows = positive_index[:, None]
    residual.scatter_(1, rows, (positive / normaliser)[:, None])
    negative_label = e.argmax(dim=1)  # (M,) the first largest negative (e is monotone in the logits)
    tie = torch.minimum(positive_index, negative_label)
    label = torch.where(pos > top, positive_index, torch.where(pos < top, negative_label, tie))
    return residual.scatter_add_(1, label[:, None], torch.full_like(residual[:, :1], -1.0))


def _embedding_gradients(
    z_hat: Tensor, norm: Tensor, residual: Tensor, others_hat: Tensor, temperature: float
) -> Tensor:
    """delta_k = (I - z_k z_k^T) sum_m (q_km - 1[m = y_k]) o_m / (t |z_k|) from the residual q - onehot(y) (K, L)
    (`_residual`, `pseudo_label_residual`), unit rows z_hat (K, D), norms (K, 1), unit others (L, D). -> (K, D)"""
    v = residual @ others_hat / temperature  # (K, D)
    return (v - z_hat * (z_hat * v).sum(dim=1, keepdim=True)) / norm


def uncertainty_gradients(z: Tensor, others: Tensor, other_mask: Tensor, temperature: float) -> Tensor:
    """Closed-form gradient at the embedding z_k of CE(q_k, argmax q_k), q_k = softmax over the rows m of `others`
    with other_mask[k, m] of cos(z_k, o_m) / t, the other rows held fixed. z (K, D), others (L, D), other_mask (K, L)
    bool. -> delta (K, D)"""
    z_hat, norm = _unit(z)
    others_hat, _ = _unit(others)
    logits = torch.where(other_mask, z_hat @ others_hat.T / temperature, NEG_INF)  # (K, L)
    return _embedding_gradients(z_hat, norm, _residual(logits), others_hat, temperature)


def uncertainty_from_gradients(
    anchor_delta: Tensor,
    candidate_delta: Tensor,
    anchors: Tensor,
    candidates: Tensor,
    anchor_features: Tensor | None = None,
    candidate_features: Tensor | None = None,
    out: Tensor | None = None,
    scratch: Tensor | None = None,
) -> Tensor:
    """U_ij = g_i . g_j. Without features g = delta (gradient at the embedding). With the head inputs h of
    z = tanh(W h + b): delta' = delta * (1 - z^2) and U_ij = (delta'_i . delta'_j)(h_i . h_j + 1) (weight + bias).
    -> (M, N), written into `out` when given; `scratch` (M, N), when given, holds h_i . h_j + 1 (overwritten)."""
    if anchor_features is None or candidate_features is None:
        return torch.mm(anchor_delta, candidate_delta.T, out=out)
    anchor_delta = anchor_delta * (1 - anchors.square())
    candidate_delta = candidate_delta * (1 - candidates.square())
    u = torch.mm(anchor_delta, candidate_delta.T, out=out)  # (M, N)
    inputs = torch.mm(anchor_features.to(u.dtype), candidate_features.to(u.dtype).T, out=scratch)
    return u.mul_(inputs.add_(1))  # times h_i . h_j + 1


def uncertainty_scores(
    anchors: Tensor,
    candidates: Tensor,
    anchor_other_mask: Tensor,
    temperature: float,
    anchor_features: Tensor | None = None,
    candidate_features: Tensor | None = None,
) -> Tensor:
    """UnReMix model uncertainty U_ij = g_i^T g_j in closed form (no per-sample backward passes).

    Anchor i's pseudo-posterior runs over the candidates with anchor_other_mask[i] (its positive and negatives);
    candidate j's over all other candidates. anchors (M, D), candidates (N, D), anchor_other_mask (M, N) bool,
    features (M, H) and (N, H) or None (then g is the gradient at the embedding). -> (M, N)
    """
    n = candidates.shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=candidates.device)
    anchor_delta = uncertainty_gradients(anchors, candidates, anchor_other_mask, temperature)
    candidate_delta = uncertainty_gradients(candidates, candidates, ~eye, temperature)
    return uncertainty_from_gradients(
        anchor_delta, candidate_delta, anchors, candidates, anchor_features, candidate_features
    )


def centre(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Deviation from the mean over the True entries of each row (0 elsewhere) and the population std.
    x (..., M, N) with |x| well below 1e17 (so the squares do not overflow float32), mask (M, N)
    -> dev (..., M, N), std (..., M, 1)."""
    weight = mask.to(x.dtype)
    n = weight.sum(dim=-1, keepdim=True).clamp_min(1)  # (M, 1)
    mean = torch.linalg.vecdot(x, weight)[..., None] / n  # (..., M, 1)
    dev = (x - mean).masked_fill_(~mask, 0.0)
    return dev, torch.linalg.vector_norm(dev, dim=-1, keepdim=True) / n.sqrt()


def centre_standard(x: Tensor, targets: ContrastiveTargets) -> tuple[Tensor, Tensor]:
    """`centre` under standard negatives (N(i) is every candidate but anchor_index[i] and positive_index[i]), in
    place on x (3, M, N): the two excluded entries of each row are set to the mean over N(i), so that after
    subtracting it they are 0 and the std is the norm of the whole row; no (M, N) mask or copy is made.
    -> dev (x itself, 0 outside N(i)), std (3, M, 1)."""
    anchor_index = cast(Tensor, targets.anchor_index)  # standard negatives: targets made with anchor_index
    excluded = torch.stack([anchor_index, targets.positive_index], dim=1).expand(x.shape[0], -1, -1)
    n = targets.negative_count.to(x.dtype)[:, None]  # (M, 1)
    x.scatter_(2, excluded, 0.0)
    mean = x.sum(dim=-1, keepdim=True) / n  # (3, M, 1)
    dev = x.scatter_(2, excluded, mean.expand(-1, -1, 2)).sub_(mean)
    return dev, torch.linalg.vector_norm(dev, dim=-1, keepdim=True) / n.sqrt()


def standardise(x: Tensor, mask: Tensor) -> Tensor:
    """(x - mean) / (std + 1e-6) over the True entries of each row (population std); 0 elsewhere.
    x (..., M, N), mask (M, N) -> (..., M, N)"""
    dev, std = centre(x, mask)
    return dev / (std + STD_EPS)


@dataclass(frozen=True)
class UnReMixOptions(ObjectiveOptions):
    beta: float = option(1.0, "UnReMix tilt on the standardised hardness score.", check=lambda v: v >= 0,
                         must="be >= 0")  # fmt: skip
    tau_plus: float = option(0.0, "UnReMix debiasing prior tau+ in [0, 1).", check=lambda v: 0 <= v < 1,
                             must="be in [0, 1)")  # fmt: skip
    gradient: str = option("head", "Where UnReMix takes per-sample gradients.", choices=GRADIENTS)
    learn_mixture: bool = option(
        False, "Learn the component mixture theta adversarially, with an entropy bonus (else equal weights, fixed)."
    )
    mixture_entropy: float = option(
        MIXTURE_ENTROPY,
        "Entropy bonus gamma of the learned mixture (larger: closer to equal weights).",
        check=lambda v: 0 <= v < math.inf,
        must="be a finite number >= 0",
    )

    def check_for_training(self, shape: TrainingShape) -> None:
        # the loss uses its parameter outside any module's forward, where ZeRO-3 has partitioned it away (FSDP2
        # keeps its root module's parameters, theta among them, unsharded from forward to backward)
        if self.learn_mixture and shape.engine == "DeepSpeed ZeRO-3":
            raise ValueError("learn_mixture: not with DeepSpeed ZeRO-3, which partitions the learned mixture outside "
                             "the encoder's forward; use ZeRO-2, FSDP or DDP")  # fmt: skip


class UnReMixLoss(ContrastiveLoss):
    """UnReMix (Tabassum et al., arXiv:2206.01197), adapted to SimCSE batches (docs/losses.md section 5).

    C_ij = l_A std(s_ij) + l_U std(U_ij) + l_R std(R_ij), standardised over N(i), (l_A, l_U, l_R) = softmax(theta);
    U_ij = g_i . g_j (last-layer gradients of the pseudo-label loss, closed form), R_ij = mean_{k in N(i), k != j}
    (1 - s_jk); w_ij = n softmax_{j in N(i)}(beta C_ij), then form (D) with tau_plus.

    Neutral setting: beta = 0 -> plain InfoNCE. The scores are detached; the weights carry gradient only to theta.
    theta is a fixed buffer of equal weights unless `learn_mixture`. The learned mixture is adversarial and
    entropy-regularised: theta ascends L + gamma H(lambda) (gamma = `mixture_entropy`) while the encoder descends L.
    Minimising L over theta instead chooses the scoring that makes the negatives easiest: it drives lambda onto R
    (measured (0, 0.001, 0.999) in 200 steps), against the method's aim. Maximising L alone would choose the hardest
    scoring and collapse onto A, the most similar negatives; the entropy bonus gives the interior solution
    lambda ~ softmax(dL/dlambda / gamma): the hardest mixture of the three near the equal-weight one (gamma -> inf is
    the fixed mixture). The same min-max view underlies HCL's tilt (the worst-case negative distribution in a KL ball).
    The bonus changes the gradient of theta only: the loss value is unchanged.
    gradient = "head": g is the gradient w.r.t. the MLP head's Linear (W, b) of z = tanh(W h + b); it needs the
    context's `anchor_features` (M, H) and `candidate_features` (N, H) = h, and falls back to "embedding" (g = gradient
    at z) when they are missing (metric `u_from_head` = 0). With targets whose `anchors_are_candidates` (the `compute`
    call on one process, symmetric form) each row's pseudo-posterior runs over its positive and negatives and all
    scores reuse `sim`, which saves two (N, N, D) products.
    Shapes: anchors (M, D), candidates (N, D), positive_index (M,), negative_mask (M, N).
    """

    name = "unremix"
    title = "UnReMix"
    Options = UnReMixOptions
    summary = (
        "UnReMix (Tabassum et al., arXiv:2206.01197): negatives weighted by a mixture of anchor "
        "similarity, model uncertainty (per-sample gradients) and representativeness."
    )
    citation = """@article{tabassum2022hard,
  title = {Hard Negative Sampling Strategies for Contrastive Representation Learning},
  author = {Tabassum, Afrina and Wahed, Muntasir and Eldardiry, Hoda and Lourentzou, Ismini},
  journal = {arXiv preprint arXiv:2206.01197},
  year = {2022}
}"""
    class_prior = "tau_plus"
    setting = ("beta",)
    variants: ClassVar[dict[str, dict[str, Any]]] = {"embedding": {"gradient": "embedding"},
                                                     "head": {"gradient": "head"}}  # fmt: skip
    # a SentenceTransformer has no MLP head whose inputs the loss could see
    sentence_transformers_options: ClassVar[dict[str, Any]] = {"gradient": "embedding"}

    options: UnReMixOptions

    def __init__(self, temperature: float = 0.05, **options: Any):
        super().__init__(temperature, **options)
        self.needs_head_inputs = self.options.gradient == "head"
        theta = torch.zeros(3)
        if self.options.learn_mixture:
            self.theta = nn.Parameter(theta)
        else:
            self.register_buffer("theta", theta)

    def per_anchor(self, batch: ObjectiveInput) -> ObjectiveOutput:
        logits, targets, context = batch.logits, batch.targets, batch.context
        plain = batch.plain  # shared with the fallback
        theta = drop_nonfinite_grad(self.theta).to(logits.dtype)
        lam = torch.softmax(_ReverseGrad.apply(theta) if self.options.learn_mixture else theta, dim=0)  # (3,)
        anchor_features, candidate_features = context.anchor_features, context.candidate_features
        use_head = self.needs_head_inputs and anchor_features is not None and candidate_features is not None
        metrics = {"lambda_A": lam[0], "lambda_U": lam[1], "lambda_R": lam[2]}
        metrics["u_from_head"] = torch.full((), float(use_head), device=logits.device)

        weights, log_r, plain_lse = None, plain.lse, None
        if self.options.beta > 0:
            features = (anchor_features, candidate_features) if use_head else (None, None)
            with torch.no_grad():
                dev, std = self._centred_scores(batch, features)  # (3, M, N), (3, M, 1)
            # C = sum_c lambda_c dev_c / (std_c + 1e-6): the standardised scores are never materialised
            kappa = lam[:, None, None] / (std + STD_EPS)  # (3, M, 1)
            n = plain.count[:, None]  # (M, 1)
            w_log_w = None
            if kappa.requires_grad:  # a learned mixture: autograd through C and the softmax
                combined = (dev[0] * kappa[0]).addcmul_(dev[1], kappa[1]).addcmul_(dev[2], kappa[2])  # (M, N)
                # w = n softmax_{N(i)}(beta C): mean one over N(i), 0 elsewhere
                bias = targets.negative_bias.to(logits.dtype)
                w = torch.softmax(combined.mul_(self.options.beta).add_(bias), dim=1) * n
            else:  # the same without gradient, in dev[0]'s memory
                with torch.no_grad():
                    w, w_log_w = self._fixed_mixture_weights(dev, kappa, n, targets)
            if not targets.standard_negatives:  # an anchor may have no negatives (a guide): 0, not softmax's NaN
                w = torch.where(n > 0, w, 0.0)
            # sum_j w_ij e^{l_ij} from the fallback's own exponentials, guarded as an (M,) result; the fallback's sum
            # from the same node
            log_r, plain_lse = batch.unguarded.weighted_and_plain_lse(w)
            log_r = drop_nonfinite_grad(log_r)
            with torch.no_grad():
                w = w.detach()
                if w_log_w is None:
                    w_log_w = torch.linalg.vecdot(w, w.clamp_min(1e-30).log_())  # (M,), sum_j w_ij = n_i
                entropy = mean_over_anchors_with_negatives(n.squeeze(1).log() - w_log_w / n.squeeze(1), plain.count)
                weights = NegativeWeights(make=lambda rows=slice(None): w[rows], max=w.amax(), entropy=entropy)
        loss, clamped = debiased_from_log_r(plain.pos, log_r, plain.count, self.options.tau_plus, self.temperature)
        metrics["clamp_frac"] = clamped.float().mean()
        if self.options.learn_mixture and self.options.mixture_entropy > 0:
            # + gamma (H - H) in value, -gamma H in gradient: descending it, theta ascends the entropy
            p = torch.softmax(theta, dim=0)
            entropy = -(p * p.log()).sum()
            loss = loss + self.options.mixture_entropy * (entropy.detach() - entropy)
        return ObjectiveOutput(loss=loss, weights=weights, metrics=metrics, plain_lse=plain_lse)

    def _centred_scores(
        self, batch: ObjectiveInput, features: tuple[Tensor | None, Tensor | None]
    ) -> tuple[Tensor, Tensor]:
        """(A, U, R) centred over N(i) (0 elsewhere) and their std. -> (3, M, N), (3, M, 1), without gradient."""
        logits, targets, unguarded = batch.logits, batch.targets, batch.unguarded
        # the cosines t l are A itself: written straight into the scores (`needs_cosines` is False)
        scores = torch.empty((3, *logits.shape), dtype=logits.dtype, device=logits.device)  # (3, M, N)
        sim = torch.mul(logits.detach(), self.temperature, out=scores[0])  # (M, N)
        raw_scores = functools.partial(self.raw_scores, sim, batch.anchors, batch.candidates, targets, *features)
        if targets.negative_log_weights is None and unguarded.exp is not None and unguarded.shift is not None:
            # the anchors' pseudo-posteriors from InfoNCE's own exponentials (the masked logits are its)
            pos = batch.plain.pos.detach()
            residual = pseudo_label_residual(
                unguarded.exp, unguarded.shift, unguarded.lse.detach(), pos, targets.positive_index
            )
            raw = raw_scores(residual=residual, out=scores)
        else:
            # over the positive and the negatives: the masked logits with the positive put back (unweighted: an
            # explicit negative's weight c_ij, in the masked logits, is not a similarity)
            masked = logits + targets.negative_bias
            others = masked.detach().scatter_(1, targets.positive_index[:, None], batch.plain.pos.detach()[:, None])
            raw = raw_scores(logits=others, out=scores)
        if targets.standard_negatives:
            return centre_standard(raw, targets)  # in place
        return centre(raw, targets.negative_mask)

    def _fixed_mixture_weights(
        self, dev: Tensor, kappa: Tensor, n: Tensor, targets: ContrastiveTargets
    ) -> tuple[Tensor, Tensor | None]:
        """w = n softmax_{N(i)}(beta C) for a fixed mixture, in dev[0]'s memory (no (M, N) allocation), and with
        standard negatives sum_j w_ij log w_ij (M,) (else None). dev (3, M, N) centred scores (consumed), kappa
        (3, M, 1) lambda / (std + 1e-6), n (M, 1)."""
        kappa = kappa * self.options.beta  # beta folded into the (3, M, 1) factors: one (M, N) pass less
        w = dev[0].mul_(kappa[0]).addcmul_(dev[1], kappa[1]).addcmul_(dev[2], kappa[2])  # beta C, (M, N)
        if not targets.standard_negatives:
            w.add_(targets.negative_bias.to(w.dtype))
            w.sub_(w.amax(dim=1, keepdim=True)).exp_()  # a row without negatives: NaN, as softmax's
            return w.mul_(n / w.sum(dim=1, keepdim=True)), None
        # standard negatives: C is 0 on each row's two excluded entries (`centre_standard`) and has mean 0 over
        # N(i), so the row's largest entry is N(i)'s; the excluded entries are zeroed after the exponential (no
        # (M, N) bias). log w = log n + x - log S on N(i) for x = beta C - max, e = e^x and S = sum_j e_ij, so
        # sum_j w log w = n (sum_j e x) / S + n (log n - log S): no (M, N) log.
        x = w.sub_(w.amax(dim=1, keepdim=True))  # (M, N) <= 0
        e = x.exp()
        anchor_index = cast(Tensor, targets.anchor_index)  # standard negatives: targets made with anchor_index
        e.scatter_(1, torch.stack([anchor_index, targets.positive_index], dim=1), 0.0)
        total = e.sum(dim=1, keepdim=True)  # (M, 1)
        w_log_w = (n * (torch.linalg.vecdot(e, x)[:, None] / total + n.log() - total.log())).squeeze(1)
        return e.mul_(n / total), w_log_w

    def component_scores(
        self,
        sim: Tensor,
        anchors: Tensor,
        candidates: Tensor,
        targets: ContrastiveTargets,
        anchor_features: Tensor | None = None,
        candidate_features: Tensor | None = None,
    ) -> Tensor:
        """Standardised (A, U, R) over N(i), stacked. -> (3, M, N), detached."""
        raw = self.raw_scores(sim, anchors, candidates, targets, anchor_features, candidate_features)
        return standardise(raw, targets.negative_mask)

    def raw_scores(
        self,
        sim: Tensor,
        anchors: Tensor,
        candidates: Tensor,
        targets: ContrastiveTargets,
        anchor_features: Tensor | None = None,
        candidate_features: Tensor | None = None,
        logits: Tensor | None = None,
        out: Tensor | None = None,
        residual: Tensor | None = None,
    ) -> Tensor:
        """(A, U, R) before standardisation, stacked. -> (3, M, N), detached, a fresh tensor (the caller may change
        it in place), or `out` (3, M, N) filled, whose out[0] already holds sim (no copy). `logits`: sim / t on each
        anchor's positive and negatives and -inf elsewhere, when known; consumed (the pseudo-posteriors are made in
        their memory). `residual`: the anchors' pseudo-posteriors minus their pseudo-labels (M, N), when known
        (`pseudo_label_residual`); then `logits` is not needed.

        With `targets.anchors_are_candidates` the candidates' similarities are sim; with `standard_negatives` as well,
        their pseudo-posteriors are the anchors' and R needs no matrix product."""
        positive_index, negative_mask = targets.positive_index, targets.negative_mask
        dtype = sim.dtype
        m, n_cand = sim.shape
        sim = sim.detach()
        with torch.autocast(device_type=sim.device.type, enabled=False):
            a = anchors.detach().to(dtype)
            a_hat, a_norm = _unit(a)
            same = targets.anchors_are_candidates
            c = a if same else candidates.detach().to(dtype)
            c_hat, c_norm = _unit(c)
            if residual is None:
                if logits is None:
                    other_mask = negative_mask | F.one_hot(positive_index, n_cand).bool()  # (M, N)
                    logits = torch.where(other_mask, sim / self.temperature, NEG_INF)
                residual = _residual(logits.detach())
            anchor_delta = _embedding_gradients(a_hat, a_norm, residual, c_hat, self.temperature)  # (M, D)
            cand_sim = sim if same else c_hat @ c_hat.T  # (N, N)
            if same and targets.standard_negatives:  # every anchor's pseudo-posterior already runs over all other rows
                candidate_delta = anchor_delta
            else:
                eye = torch.eye(n_cand, dtype=torch.bool, device=sim.device)
                cand_logits = torch.where(eye, NEG_INF, cand_sim / self.temperature)
                candidate_delta = _embedding_gradients(c_hat, c_norm, _residual(cand_logits), c_hat, self.temperature)
            if out is None:
                scores = torch.empty((3, m, n_cand), dtype=dtype, device=sim.device)  # (A, U, R), filled in place
                scores[0] = sim
            else:
                scores = out
            uncertainty_from_gradients(
                anchor_delta, candidate_delta, a, c, anchor_features, candidate_features, out=scores[1],
                scratch=scores[2],
            )  # fmt: skip
            # A zero-norm row's gradient is ~1/1e-12: saturate so the squares in `centre` stay finite. One huge score
            # in a row standardises to about sqrt(n) whatever its size, so this changes nothing that matters.
            scores[1].clamp_(-U_MAX, U_MAX)

            # R_ij = (n_i - sum_{k in N(i)} s_jk - (1 - s_jj)) / (n_i - 1), s symmetric. The sum is mask @ S (M N^2
            # flops) or (mask @ C) @ C^T (2 M N D), whichever is cheaper.
            n = targets.negative_count.to(dtype)[:, None]  # (M, 1)
            self_sim = c_hat.square().sum(dim=1)  # (N,), 1 (0 for a zero-norm row)
            mask = None if same and targets.standard_negatives else negative_mask.to(dtype)
            if same and targets.standard_negatives:
                # sum_{k in N(i)} s_jk = sum_k s_jk - s_ji - s_{j,p(i)}, and s is symmetric: O(N^2), no product;
                # R_ij = (s_ij + s_{p(i),j} + (s_jj - 1 - sum_k s_jk) + n_i) / (n_i - 1), in place
                torch.index_select(sim, 0, positive_index, out=scores[2]).add_(sim)
                scores[2].add_((self_sim - 1 - sim.sum(dim=1))[None, :]).add_(n)
            else:
                mask = cast(Tensor, mask)  # None only on the branch above
                if 2 * c.shape[1] < n_cand:
                    torch.mm(mask @ c_hat, c_hat.T, out=scores[2])
                else:
                    torch.mm(mask, cand_sim, out=scores[2])
                scores[2].neg_().add_(n).sub_(1 - self_sim)
            scores[2].div_((n - 1).clamp_min(1))
            return scores
