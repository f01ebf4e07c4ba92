"""The hardness term of sentence-transformers' MultipleNegativesRankingLoss (`hardness_mode="in_batch_negatives"`) as
an objective: each negative's logit raised by `strength` times its cosine, held fixed (docs/losses.md section 3)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from simcse_hn.losses.base import ContrastiveLoss, ObjectiveInput, ObjectiveOutput
from simcse_hn.losses.fast_paths import masked_logsumexp
from simcse_hn.losses.options import ObjectiveOptions, TrainingShape, option


@dataclass(frozen=True)
class HardnessOptions(ObjectiveOptions):
    strength: float = option(9.0, "Hardness strength alpha: every negative's logit gains alpha x its cosine, without "
                             "gradient (Lan et al. 2025 use 9); 0 is InfoNCE.", check=lambda v: v >= 0,
                             must="be >= 0")  # fmt: skip

    def check_for_training(self, shape: TrainingShape) -> None:
        if self.strength == 0:
            raise ValueError("strength: 0 makes hardness InfoNCE: use --loss infonce, or a strength > 0")


class HardnessLoss(ContrastiveLoss):
    """Hardness-weighted InfoNCE (Lan et al. 2025, arXiv:2503.04812, Eq. 5; sentence-transformers' MNRL hardness):

    L_i = log(e^{l_ip} + sum_{j in N(i)} e^{l_ij + alpha sg(s_ij)}) - l_ip,  l = s / temperature, alpha = `strength`.

    Form (W) with the log-weight alpha s_ij = alpha t l_ij, not normalised (a harder batch weighs more in total, unlike
    HCL's mean-one weights) and without gradient through it. Neutral setting: strength 0 -> plain InfoNCE. In the
    `simcse` form it equals MNRL(scale=1/t, hardness_mode="in_batch_negatives", hardness_strength=alpha); in the
    symmetric form the term is on every negative (MNRL puts it on the query-to-document direction only), and on a
    queue's entries. The diagnostics report the weights normalised to mean one over N(i), as for every objective.
    Shapes: anchors (M, D), candidates (N, D), positive_index (M,), negative_mask (M, N).
    """

    name = "hardness"
    title = "Hardness"
    Options = HardnessOptions
    options: HardnessOptions
    summary = (
        "InfoNCE with hardness-weighted negatives (Lan et al., arXiv:2503.04812; sentence-transformers' "
        "MultipleNegativesRankingLoss hardness): every negative's logit gains `strength * s_ij` without gradient, "
        "weights `e^{strength * s_ij}` not normalised; `strength = 0` is InfoNCE."
    )
    citation = """@misc{lan2025llave,
  title = {{LLaVE}: Large Language and Vision Embedding Models with Hardness-Weighted Contrastive Learning},
  author = {Lan, Zhibin and Niu, Liqiang and Meng, Fandong and Zhou, Jie and Su, Jinsong},
  year = {2025},
  eprint = {2503.04812},
  archivePrefix = {arXiv}
}"""
    setting = ("strength",)
    forms = ("symmetric", "simcse")


    def per_anchor(self, batch: ObjectiveInput) -> ObjectiveOutput:
        plain = batch.plain
        log_weights = batch.logits.detach() * (self.options.strength * batch.temperature)  # (M, N) alpha s_ij
        lse = masked_logsumexp(plain.masked + log_weights)  # (M,) log sum_{N(i)} e^{l_ij + alpha s_ij}
        loss = torch.logaddexp(plain.pos, lse) - plain.pos
        with torch.no_grad():  # the diagnostics' weights: mean one over N(i)
            on_negatives = log_weights + batch.targets.negative_bias.to(log_weights.dtype)
            log_mean = torch.where(plain.count > 0, masked_logsumexp(on_negatives) - plain.count.log(), 0.0)
        return ObjectiveOutput(loss=loss, log_weights=log_weights - log_mean[:, None])
