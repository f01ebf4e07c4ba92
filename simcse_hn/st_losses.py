"""simcse-hn's objectives as sentence-transformers losses, for `SentenceTransformerTrainer` and a `SentenceTransformer`
model: `SimCSEInfoNCELoss`, `SimCSEDCLLoss`, `SimCSEHCLLoss`, `SimCSEProGCLLoss`, `SimCSEUnReMixLoss`.

    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    from simcse_hn.st_losses import SimCSEHCLLoss

    model = SentenceTransformer("sentence-transformers/all-MiniLM-L6-v2")
    train = Dataset.from_dict({"anchor": sentences, "positive": sentences})  # dropout pairs: SimCSE unsupervised
    loss = SimCSEHCLLoss(model, temperature=0.05, beta=0.1)
    SentenceTransformerTrainer(model=model, train_dataset=train, loss=loss).train()

The dataset has two columns, (anchor, positive): the same sentence twice is SimCSE's unsupervised recipe (the model
is in train mode, so the two forward passes draw different dropout masks), a paraphrase is a supervised pair. Each
batch of B pairs becomes the rows [a_0, p_0, a_1, p_1, ...] of simcse-hn's training step, and the loss is exactly
what `SimCSETrainer` computes on those rows (`simcse_hn.trainer.contrastive_loss`): symmetric form by default, every
row an anchor against the 2B - 2 others; across processes the rows are gathered with an exact gradient.

The keyword arguments are the objective's own (`simcse_hn.losses`, docs/losses.md): HCL `beta`, `tau_plus`; ProGCL
`mode`, `warmup_ratio`, ...; UnReMix `beta`, ... UnReMix takes its uncertainty gradient at the embedding here (a
SentenceTransformer has no MLP head whose inputs the loss could see). ProGCL's warm-up needs the run's length: pass
`max_steps` (optimizer steps) and, with gradient accumulation, `gradient_accumulation_steps`; each training-mode call
counts 1 / gradient_accumulation_steps of a step. Without `max_steps` there is no warm-up.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from simcse_hn.losses import build_loss
from simcse_hn.targets import FORMS


def _embed_columns(model: nn.Module, features: list[dict[str, Tensor]]) -> list[Tensor]:
    try:  # sentence-transformers 6: columns that tokenise alike share one forward pass
        from sentence_transformers.base.losses.merged_forward import embed_columns
    except ImportError:  # 5.x: one forward per column
        return [model(f)["sentence_embedding"] for f in features]
    return embed_columns(model, features)


class SimCSELoss(nn.Module):
    """Base of the five losses; `objective` names the simcse-hn loss (`simcse_hn.losses.LOSSES`)."""

    objective = "infonce"

    def __init__(
        self,
        model: nn.Module,
        temperature: float = 0.05,
        contrast_form: str = "symmetric",
        gather_across_devices: bool = True,
        max_steps: int | None = None,
        gradient_accumulation_steps: int = 1,
        **loss_kwargs,
    ):
        super().__init__()
        if contrast_form not in FORMS:
            raise ValueError(f"contrast_form must be one of {FORMS}, got {contrast_form!r}")
        if self.objective != "infonce" and contrast_form != "symmetric":
            raise ValueError(f"{self.objective} is defined on the symmetric form only")
        if gradient_accumulation_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be >= 1, got {gradient_accumulation_steps}")
        self.model = model
        self.loss_fn = build_loss(self.objective, temperature=temperature, **loss_kwargs)
        self.temperature = float(temperature)
        self.contrast_form = contrast_form
        self.gather_across_devices = gather_across_devices
        self.max_steps = max_steps
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.loss_kwargs = loss_kwargs
        self.calls = 0  # training-mode calls: the step counter of ProGCL's schedule
        self.last_metrics: dict[str, Tensor] = {}  # the objective's diagnostics of the last call (tensors)

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None = None) -> Tensor:
        columns = _embed_columns(self.model, list(sentence_features))
        return self.compute_loss_from_embeddings(columns, labels)

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Tensor:
        """embeddings: [anchors (B, D), positives (B, D)] -> the objective on rows [a_0, p_0, a_1, p_1, ...]."""
        from simcse_hn.trainer import contrastive_loss  # the trainer module imports transformers' Trainer

        if len(embeddings) != 2:
            raise ValueError(
                f"{type(self).__name__} takes (anchor, positive) columns, got {len(embeddings)} columns; "
                "explicit negatives go through simcse-hn's paired-data training"
            )
        rows = torch.stack(embeddings, dim=1)  # (B, 2, D): anchor i and its positive are rows 2i and 2i + 1
        step = self.calls // self.gradient_accumulation_steps
        output = contrastive_loss(
            self.loss_fn,
            rows.reshape(-1, rows.shape[-1]),  # (2B, D)
            form=self.contrast_form,
            gather=self.gather_across_devices,
            step=step if self.max_steps is not None else None,
            max_steps=self.max_steps,
        )
        if self.model.training:
            self.calls += 1
        self.last_metrics = output.metrics
        return output.loss

    def get_config_dict(self) -> dict:
        return {
            "objective": self.objective,
            "temperature": self.temperature,
            "contrast_form": self.contrast_form,
            "gather_across_devices": self.gather_across_devices,
            "max_steps": self.max_steps,
            **self.loss_kwargs,
        }

    @property
    def citation(self) -> str:
        return """@inproceedings{gao2021simcse,
  title = {{SimCSE}: Simple Contrastive Learning of Sentence Embeddings},
  author = {Gao, Tianyu and Yao, Xingcheng and Chen, Danqi},
  booktitle = {Empirical Methods in Natural Language Processing (EMNLP)},
  year = {2021}
}"""


class SimCSEInfoNCELoss(SimCSELoss):
    """SimCSE's InfoNCE (arXiv:2104.08821); `contrast_form="simcse"` is the paper's first-views-against-second-views
    loss, the default `symmetric` is NT-Xent."""

    objective = "infonce"


class SimCSEDCLLoss(SimCSELoss):
    """Debiased contrastive loss (arXiv:2007.00224): `tau_plus`."""

    objective = "dcl"


class SimCSEHCLLoss(SimCSELoss):
    """Hard-negative weighting (arXiv:2010.04592): `beta`, `tau_plus`, `detach_weights`."""

    objective = "hcl"


class SimCSEProGCLLoss(SimCSELoss):
    """ProGCL (arXiv:2110.02027): `mode` weight|mix, `warmup_ratio` (with `max_steps`), ..."""

    objective = "progcl"


class SimCSEUnReMixLoss(SimCSELoss):
    """UnReMix (arXiv:2206.01197): `beta`, `tau_plus`; the uncertainty gradient is taken at the embedding."""

    objective = "unremix"

    def __init__(self, model: nn.Module, temperature: float = 0.05, **kwargs):
        kwargs.setdefault("gradient", "embedding")
        super().__init__(model, temperature, **kwargs)
