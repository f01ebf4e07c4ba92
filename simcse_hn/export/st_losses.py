"""simcse-hn's objectives as sentence-transformers losses, for `SentenceTransformerTrainer` and a `SentenceTransformer`
model: `SimCSELoss(model, objective, **options)` for any objective (a built-in name, or a class of yours), and
one named class per built-in objective, made from the registry: `SimCSEInfoNCELoss`, `SimCSEHCLLoss`, ...

    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    from simcse_hn.export.st_losses import SimCSEHCLLoss

    model = SentenceTransformer("sentence-transformers/all-MiniLM-L6-v2")
    train = Dataset.from_dict({"anchor": sentences, "positive": sentences})  # dropout pairs: SimCSE unsupervised
    loss = SimCSEHCLLoss(model, temperature=0.05, beta=0.1)
    SentenceTransformerTrainer(model=model, train_dataset=train, loss=loss).train()

The dataset has two columns, (anchor, positive): the same sentence twice is SimCSE's unsupervised recipe (the model
is in train mode, so the two forward passes draw different dropout masks), a paraphrase is a supervised pair. Each
batch of B pairs becomes the rows [a_0, p_0, a_1, p_1, ...] of simcse-hn's training step, and the loss is exactly
what `SimCSETrainer` computes on those rows (`simcse_hn.training.step.contrastive_loss`): symmetric form by
default, every row an anchor against the 2B - 2 others; across processes the rows are gathered with an exact gradient.

The keyword arguments are the objective's own options (its `Options` dataclass; docs/losses.md), on top of its
`sentence_transformers_options` (what a SentenceTransformer, which has no MLP head whose inputs a loss could see,
needs instead of the training defaults). An objective with a schedule (`uses_schedule`: a warm-up) needs the run's
length: pass `max_steps` (optimizer steps) and, with gradient accumulation, `gradient_accumulation_steps`; each
training-mode call counts 1 / gradient_accumulation_steps of a step. Without `max_steps` there is no schedule.

`queue_size=K` (and `momentum=m` for a momentum encoder) adds simcse-hn's negative queue; it needs
`simcse_hn.export.st_training.SimCSECallback(loss)` in the trainer's callbacks (docs/hub.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from simcse_hn.export.st_training import SentenceQueue
from simcse_hn.losses import BASELINE, BUILTIN, ContrastiveLoss, build_loss, objective_class_path, resolve_objective
from simcse_hn.losses.targets import FORMS
from simcse_hn.training.step import add_to_window, contrastive_loss


def _embed_columns(model: nn.Module, features: list[dict[str, Tensor]]) -> list[Tensor]:
    try:  # sentence-transformers 6: columns that tokenise alike share one forward pass
        from sentence_transformers.base.losses.merged_forward import embed_columns
    except ImportError:  # 5.x: one forward per column
        return [model(f)["sentence_embedding"] for f in features]
    return embed_columns(model, features)


class SimCSELoss(nn.Module):
    """Any simcse-hn objective as a sentence-transformers loss: `SimCSELoss(model, "hcl", beta=0.1)`, or a class of
    yours (`SimCSELoss(model, FocalLoss, gamma=2.0)`). The keyword arguments are the objective's options; one it
    declares for models without an MLP head (`sentence_transformers_options`) is its default here."""

    objective: str | type[ContrastiveLoss] = BASELINE  # the named subclasses below set it

    def __init__(
        self,
        model: nn.Module,
        objective: str | type[ContrastiveLoss] | None = None,
        temperature: float = 0.05,
        contrast_form: str = "symmetric",
        gather_across_devices: bool = True,
        max_steps: int | None = None,
        gradient_accumulation_steps: int = 1,
        queue_size: int = 0,
        momentum: float = 0.0,
        **loss_kwargs,
    ):
        super().__init__()
        if isinstance(objective, int | float):  # SimCSEHCLLoss(model, 0.05): the temperature, as before
            objective, temperature = None, float(objective)
        objective = type(self).objective if objective is None else objective
        cls = resolve_objective(objective) if isinstance(objective, str) else objective
        if contrast_form not in FORMS:
            raise ValueError(f"contrast_form must be one of {FORMS}, got {contrast_form!r}")
        if contrast_form not in cls.forms:
            raise ValueError(f"{cls.display_name()} is defined on the {' and '.join(cls.forms)} form only")
        if gradient_accumulation_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be >= 1, got {gradient_accumulation_steps}")
        loss_kwargs = {**cls.sentence_transformers_options, **loss_kwargs}
        self.model = model
        self.loss_fn = build_loss(cls, temperature=temperature, **loss_kwargs)
        self.objective_name = cls.name or objective_class_path(cls)
        self.temperature = float(temperature)
        self.contrast_form = contrast_form
        self.gather_across_devices = gather_across_devices
        self.max_steps = max_steps
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.loss_kwargs = loss_kwargs
        self.calls = 0  # training-mode calls: the step counter of a schedule
        self.last_metrics: dict[str, Tensor] = {}  # the objective's diagnostics of the last call (tensors)
        self.metric_sums: dict[str, Tensor] = {}  # and their sums over the training calls since SimCSECallback logged
        self.metric_count = 0
        if momentum and not queue_size:
            raise ValueError("momentum needs a queue: set queue_size > 0")
        # earlier optimizer steps' anchors as negatives (st_training, docs/hub.md); never part of the saved model
        self.queue = SentenceQueue(queue_size, momentum) if queue_size else None

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None = None) -> Tensor:
        features = list(sentence_features)
        if self.queue is not None:
            self.queue.see(features)  # before the forward, which adds its outputs to the features
        columns = _embed_columns(self.model, features)
        return self.compute_loss_from_embeddings(columns, labels)

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Tensor:
        """embeddings: [anchors (B, D), positives (B, D)] -> the objective on rows [a_0, p_0, a_1, p_1, ...]."""
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
            **({} if self.queue is None else self.queue.for_step(rows.device)),
        )
        if self.model.training:
            if self.queue is not None:
                self.queue.remember_anchors(self.model, rows.reshape(-1, rows.shape[-1]))
            self.calls += 1
            add_to_window(self.metric_sums, output.metrics)
            self.metric_count += 1
        self.last_metrics = output.metrics
        return output.loss

    def get_config_dict(self) -> dict:
        return {
            "objective": self.objective_name,
            "temperature": self.temperature,
            "contrast_form": self.contrast_form,
            "gather_across_devices": self.gather_across_devices,
            "max_steps": self.max_steps,
            **({"queue_size": self.queue.queue.size, "momentum": self.queue.momentum} if self.queue else {}),
            **self.loss_kwargs,
        }

    @property
    def citation(self) -> str:
        own = self.loss_fn.citation.strip()
        return own if own else SIMCSE_CITATION


SIMCSE_CITATION = BUILTIN[BASELINE].citation


def _named_loss(cls: type[ContrastiveLoss]) -> type[SimCSELoss]:
    """SimCSE{Title}Loss for a built-in objective: `SimCSELoss` with the objective fixed."""
    doc = f"{cls.summary} Options: {', '.join(f.name for f in dataclasses.fields(cls.Options)) or 'none'}."
    return type(f"SimCSE{cls.title}Loss", (SimCSELoss,), {"objective": cls.name, "__doc__": doc,
                                                          "__module__": __name__})  # fmt: skip


_NAMED = {f"SimCSE{cls.title}Loss": _named_loss(cls) for cls in BUILTIN.values()}
globals().update(_NAMED)
__all__ = ["SimCSELoss", *_NAMED]
