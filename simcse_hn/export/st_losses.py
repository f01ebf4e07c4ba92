"""simcse-hn's objectives as sentence-transformers losses, for `SentenceTransformerTrainer` and a `SentenceTransformer`
model: `SimCSELoss(model, objective, **options)` for any objective (a built-in name, or a class of yours), and
one named class per built-in objective, made from the registry: `SimCSEInfoNCELoss`, `SimCSEHCLLoss`, ...
(`CachedSimCSELoss` in st_cached.py: the same with GradCache.)

    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    from simcse_hn.export.st_losses import SimCSEHCLLoss

    model = SentenceTransformer("sentence-transformers/all-MiniLM-L6-v2")
    train = Dataset.from_dict({"text": sentences})  # one column: the loss makes the dropout pair (SimCSE unsupervised)
    loss = SimCSEHCLLoss(model, temperature=0.05, beta=0.1)
    SentenceTransformerTrainer(model=model, train_dataset=train, loss=loss).train()

The columns of a batch of B examples become the rows of simcse-hn's training step, and the loss is exactly what
`SimCSETrainer` computes on those rows (`simcse_hn.training.step.contrastive_loss`):
* one column: each text embedded twice (two forward passes, two dropout masks: SimCSE's unsupervised recipe),
  rows [a_0, a'_0, a_1, a'_1, ...];
* (anchor, positive): rows [a_0, p_0, a_1, p_1, ...], the same sentence twice being the recipe again;
* in both, the contrast form `contrast_form`: "symmetric" by default (NT-Xent: every row an anchor against the 2B - 2
  others, as simcse-hn's trainer), "simcse" the paper's (anchors against the other column: MultipleNegativesRanking
  Loss's default);
* (anchor, positive, negative_1, ...): SimCSE's supervised step, rows [a, p, n_1..n_k] per example, each anchor
  against every positive and negative, its own explicit negatives weighted by `hard_negative_weight` (as simcse-hn's
  trainer on paired data; contrast_form does not apply).
Across processes the rows are gathered with an exact gradient.

The keyword arguments are the objective's own options (its `Options` dataclass; docs/losses.md), on top of its
`sentence_transformers_options` (what a SentenceTransformer, which has no MLP head whose inputs a loss could see,
needs instead of the training defaults). What the trainer knows reaches the loss through
`simcse_hn.export.st_training.SimCSECallback(loss)` (`TrainerStep`): an objective with a schedule (ProGCL's warm-up)
reads the trainer's global_step and max_steps, never a count of its own calls (a wrapper loss calls it once per
Matryoshka dimension or per layer), and is refused in one line without the callback. `queue_size=K` (and
`momentum=m`) adds simcse-hn's negative queue (st_queue.py), which needs the callback too.

Nothing silent: a setting simcse-hn's own trainer refuses as a no-op (hardness strength 0, DCL's tau_plus 0) is
warned about once here, as MultipleNegativesRankingLoss warns about hardness strength 0; a batch in which the
debiasing clamp held for every anchor (nothing trained) is counted and warned about once
(training.callbacks.ClampedBatches).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from simcse_hn.errors import ConfigError
from simcse_hn.export.st_queue import SentenceQueue, TrainerStep, token_text_ids
from simcse_hn.losses import BASELINE, BUILTIN, ContrastiveLoss, build_loss, objective_class_path, resolve_objective
from simcse_hn.losses.options import TrainingShape
from simcse_hn.losses.targets import FORMS, RowLayout
from simcse_hn.training.callbacks import ClampedBatches
from simcse_hn.training.step import add_to_window, contrastive_loss

logger = logging.getLogger(__name__)
SYMMETRIC_NOTE = (
    "contrast_form symmetric (simcse-hn's default, NT-Xent): every row an anchor against all 2B - 2 others; "
    "MultipleNegativesRankingLoss's default is contrast_form 'simcse'"
)


def _embed_columns(model: nn.Module, features: list[dict[str, Tensor]]) -> list[Tensor]:
    try:  # sentence-transformers 6: columns that tokenise alike share one forward pass
        from sentence_transformers.base.losses.merged_forward import embed_columns
    except ImportError:  # 5.x: one forward per column
        return [model(f)["sentence_embedding"] for f in features]
    return embed_columns(model, features)


class BatchColumns:
    """The columns a batch is embedded as: the features the trainer gave (one column is taken twice, the second time
    a copy, so that each view's forward writes into features of its own: MatryoshkaLoss and AdaptiveLayerLoss keep
    the outputs in them between their calls) and, with a queue, the rows' text ids. Made once per batch: a wrapper's
    later calls pass the same feature dicts and get the same columns."""

    def __init__(self, features: list[dict[str, Tensor]], with_text_ids: bool):
        self.given = features
        self.input_ids = [f.get("input_ids") for f in features]
        self.columns = features + [dict(features[0])] if len(features) == 1 else features
        self.text_ids: Tensor | None = None
        if with_text_ids:
            per_column = [token_text_ids(column) for column in self.columns]  # each (B,)
            self.text_ids = torch.stack(per_column, dim=1).reshape(-1)  # (B x columns,), example-major as the rows

    def same_batch(self, features: list[dict[str, Tensor]]) -> bool:
        """The same feature dicts holding the same token tensors (a dict refilled in place is another batch)."""
        return len(features) == len(self.given) and all(
            f is g and f.get("input_ids") is ids for f, g, ids in zip(features, self.given, self.input_ids)
        )


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
        hard_negative_weight: float = 0.0,
        gather_across_devices: bool = True,
        max_steps: int | None = None,
        gradient_accumulation_steps: int | None = None,
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
        if any(value is not None and value < 1 for value in (max_steps, gradient_accumulation_steps)):
            raise ValueError(
                f"max_steps and gradient_accumulation_steps must be >= 1, got {max_steps}, "
                f"{gradient_accumulation_steps}"
            )
        if momentum and not queue_size:
            raise ValueError("momentum needs a queue: set queue_size > 0")
        loss_kwargs = {**cls.sentence_transformers_options, **loss_kwargs}
        self.model = model
        self.loss_fn = build_loss(cls, temperature=temperature, **loss_kwargs)
        self.objective_name = cls.name or objective_class_path(cls)
        self.temperature = float(temperature)
        self.contrast_form = contrast_form
        self.hard_negative_weight = float(hard_negative_weight)
        self.gather_across_devices = gather_across_devices
        self.max_steps = max_steps  # given: the trainer's must agree (SimCSECallback checks); None: the trainer's
        self.gradient_accumulation_steps = gradient_accumulation_steps  # likewise
        self.loss_kwargs = loss_kwargs
        self.trainer_step = TrainerStep()  # where the trainer is: SimCSECallback keeps it
        self.last_metrics: dict[str, Tensor] = {}  # the objective's diagnostics of the last call (tensors)
        self.metric_sums: dict[str, Tensor] = {}  # and their sums over the training calls since SimCSECallback logged
        self.metric_count = 0
        self.clamped = ClampedBatches.for_loss(self.loss_fn)
        self.card_notes: dict[str, str] = {}  # what SimCSECallback adds to the model card's loss parameters
        self.card_citations: list[str] = []  # and to its citations (topic batches)
        # earlier optimizer steps' entries as negatives (st_queue, docs/hub.md); never part of the saved model
        self.queue = SentenceQueue(queue_size, momentum) if queue_size else None
        if self.queue is not None:
            self.queue.clock = self.trainer_step
        self._batch: BatchColumns | None = None
        self._warn_about_a_no_op()

    def _warn_about_a_no_op(self) -> None:
        """A setting simcse-hn's trainer refuses because it is another objective in disguise (hardness strength 0 is
        InfoNCE): said once, as MultipleNegativesRankingLoss says it of its hardness strength 0, and trained."""
        try:  # no run shape is known here: every in-batch count passes, only the settings' own checks speak
            self.loss_fn.options.check_for_training(TrainingShape(negatives_per_anchor=2**62))
        except ValueError as problem:
            logger.warning(
                "%s(%r): %s (simcse-hn's train.py refuses this setting; this loss trains it as given)",
                type(self).__name__,
                self.objective_name,
                problem,
            )

    def batch_columns(self, sentence_features: Iterable[dict[str, Tensor]]) -> list[dict[str, Tensor]]:
        """The columns to embed for the trainer's features (BatchColumns), the same ones for every call on a batch."""
        features = list(sentence_features)
        if not features:
            raise ValueError(f"{type(self).__name__} takes one text column or more, got none")
        if self._batch is None or not self._batch.same_batch(features):
            self._batch = BatchColumns(features, with_text_ids=self.queue is not None)
        return self._batch.columns

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None = None) -> Tensor:
        columns = self.batch_columns(sentence_features)
        return self.compute_loss_from_embeddings(_embed_columns(self.model, columns), labels)

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Tensor:
        """embeddings: one (B, D) per column (a single column's two views as two) -> the objective on the rows
        [a_0, p_0, (n_0...), a_1, ...]."""
        if len(embeddings) < 2:
            raise ValueError(
                f"{type(self).__name__} needs two views of each text: call it with the features (one "
                "column is embedded twice), or with two or more columns of embeddings"
            )
        layout = RowLayout(None if len(embeddings) == 2 else len(embeddings))
        rows = torch.stack(embeddings, dim=1)  # (B, columns, D): example i's rows together
        rows = rows.reshape(-1, rows.shape[-1])  # (B x columns, D)
        width = rows.shape[-1]
        training = self.model.training
        queue = text_ids = None
        if self.queue is not None:
            if self._batch is None or self._batch.text_ids is None or len(self._batch.text_ids) != len(rows):
                raise ValueError("the queue needs the batch's features: call the loss with them, not with embeddings")
            queue = self.queue.entries(width)
            text_ids = self._batch.text_ids
        step, max_steps = self._schedule(training)
        output = contrastive_loss(
            self.loss_fn,
            rows,
            form=self.contrast_form,
            group_size=layout.group_size,
            hard_negative_weight=self.hard_negative_weight,
            gather=self.gather_across_devices,
            step=step,
            max_steps=max_steps,
            text_ids=None if text_ids is None else text_ids.to(rows.device),
            queue=queue,
        )
        if training:
            if self.queue is not None:
                assert self._batch is not None and text_ids is not None
                self.queue.remember(rows, text_ids, layout, self._batch.columns)
            add_to_window(self.metric_sums, output.metrics)
            self.metric_count += 1
            clock = self.trainer_step
            self.clamped.see(output.metrics, clock.step + 1, clock.key if clock.bound else None)
        self.last_metrics = output.metrics
        return output.loss

    def _schedule(self, training: bool) -> tuple[int | None, int | None]:
        """(step, max_steps) of an objective with a schedule: the trainer's (SimCSECallback); (None, None) without
        a schedule, or out of training without a callback (an evaluation before training: past any warm-up)."""
        if not self.loss_fn.uses_schedule:
            return None, None
        clock = self.trainer_step
        if clock.bound:
            return clock.step, self.max_steps or clock.max_steps
        if training:
            raise ConfigError(
                f"{type(self).__name__}({self.objective_name!r}): its schedule (a warm-up) counts the "
                "trainer's optimizer steps: pass callbacks=[SimCSECallback(loss)] to the trainer (outside "
                "a trainer: loss.trainer_step.set(step, max_steps) before each call)"
            )
        return None, None

    def get_config_dict(self) -> dict:
        config = {
            "objective": self.objective_name,
            "temperature": self.temperature,
            "contrast_form": self.contrast_form,
        }
        if self.contrast_form == "symmetric":
            config["contrast_form_note"] = SYMMETRIC_NOTE
        if self.hard_negative_weight:
            config["hard_negative_weight"] = self.hard_negative_weight
        config["gather_across_devices"] = self.gather_across_devices
        if self.max_steps is not None:
            config["max_steps"] = self.max_steps
        if self.queue is not None:
            config.update(queue_size=self.queue.size, momentum=self.queue.momentum)
        return {**config, **self.loss_kwargs, **self.card_notes}

    @property
    def citation(self) -> str:
        """The objective's BibTeX, SimCSE's, and those of what trains with it (topic batches: TAS-B)."""
        entries = [self.loss_fn.citation.strip(), SIMCSE_CITATION.strip(), *self.card_citations]
        return "\n\n".join(dict.fromkeys(entry for entry in entries if entry))


SIMCSE_CITATION = BUILTIN[BASELINE].citation


def _named_loss(cls: type[ContrastiveLoss]) -> type[SimCSELoss]:
    """SimCSE{Title}Loss for a built-in objective: `SimCSELoss` with the objective fixed."""
    doc = f"{cls.summary} Options: {', '.join(f.name for f in dataclasses.fields(cls.Options)) or 'none'}."
    return type(f"SimCSE{cls.title}Loss", (SimCSELoss,), {"objective": cls.name, "__doc__": doc,
                                                          "__module__": __name__})  # fmt: skip


_NAMED = {f"SimCSE{cls.title}Loss": _named_loss(cls) for cls in BUILTIN.values()}
globals().update(_NAMED)
__all__ = ["SimCSELoss", *_NAMED]
