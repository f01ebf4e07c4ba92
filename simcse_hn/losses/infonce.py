from __future__ import annotations

from typing import ClassVar

from simcse_hn.losses.base import ContrastiveLoss, ObjectiveInput, ObjectiveOutput


class InfoNCELoss(ContrastiveLoss):
    """Plain InfoNCE: L_i = -l_ip + log(e^{l_ip} + sum_{j in N(i)} e^{l_ij}),  l = cos / temperature.

    SimCSE (arXiv:2104.08821). The `simcse` target form reproduces the paper's CE(z1 z2^T / t, arange); the
    `symmetric` form is NT-Xent. No weights, no options. Shapes: anchors (M, D), candidates (N, D), positive_index
    (M,), negative_mask (M, N).
    """

    name = "infonce"
    title = "InfoNCE"
    summary = (
        "InfoNCE over in-batch negatives, as in SimCSE (arXiv:2104.08821): "
        "`L_i = -log( e^{s_ip/t} / (e^{s_ip/t} + sum_j e^{s_ij/t}) )` with cosine similarities `s`."
    )
    citation = """@inproceedings{gao2021simcse,
  title = {{SimCSE}: Simple Contrastive Learning of Sentence Embeddings},
  author = {Gao, Tianyu and Yao, Xingcheng and Chen, Danqi},
  booktitle = {Empirical Methods in Natural Language Processing (EMNLP)},
  year = {2021}
}"""
    forms: ClassVar[tuple[str, ...]] = ("simcse", "symmetric")
    has_fallback: ClassVar[bool] = False  # its own fallback: computed once

    def per_anchor(self, batch: ObjectiveInput) -> ObjectiveOutput:
        return ObjectiveOutput(loss=batch.plain.loss())
