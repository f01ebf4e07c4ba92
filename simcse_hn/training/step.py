"""The training step's loss, apart from the Trainer: local rows -> candidates gathered from every process, the
targets, the loss context, the objective's `LossOutput` (`contrastive_loss`: SimCSETrainer, the sentence-transformers
losses of st_losses.py, eval/negatives.py and the benches call this one function); and its diagnostics over a logging
window (`add_to_window`, `window_means`)."""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from simcse_hn.losses import ContrastiveLoss, LossOutput
from simcse_hn.losses.false_negatives import guide_targets
from simcse_hn.losses.targets import ContrastiveTargets, LossContext, RowLayout
from simcse_hn.training import distributed
from simcse_hn.training.queue import QueueEntries

logger = logging.getLogger(__name__)


def contrastive_loss(
    loss_fn: ContrastiveLoss,
    embeddings: Tensor,
    *,
    form: str = "symmetric",
    group_size: int | None = None,
    hard_negative_weight: float = 0.0,
    guide_embeddings: Tensor | None = None,
    guide_margin: float = 0.0,
    head_inputs: Tensor | None = None,
    gather: bool = True,
    step: int | None = None,
    max_steps: int | None = None,
    text_ids: Tensor | None = None,
    queue: QueueEntries | None = None,
) -> LossOutput:
    """One step's loss: local rows (R, D) -> candidates gathered from every process with gradient (when `gather` and
    there is more than one process), targets offset by rank, the loss context.

    Layouts (`RowLayout(group_size)`): `group_size` None, rows [a, a', b, b', ...] of single sentences (`form` says
    which rows are anchors); an int g, rows [a, p, n_1..n_{g-2}] per example of paired data (SimCSE's supervised
    targets, with `hard_negative_weight` on each anchor's own explicit negatives). guide_embeddings (R, E): a guide
    model's embeddings of the same rows (detached; gathered like the rows): negatives the guide scores above the
    anchor's positive minus `guide_margin` leave N(i) for the step (simcse_hn.losses.false_negatives; metrics
    `guide_removed*`).

    Each process averages over its own anchors and DDP averages gradients over processes, so W processes give exactly
    the gradient of one process on the global batch. head_inputs (R, H): the MLP head's inputs (for an objective
    that `needs_head_inputs`); text_ids (R,): each row's text id (the duplicate diagnostics).

    queue: K earlier entries (training.queue), appended after the gathered rows as detached candidates: negatives of
    every anchor, never positives, except an entry whose text is the anchor's own or its positive's (text_ids), and
    entries not yet written; the guide screens them as any candidate.
    """
    candidates, candidate_features, guide_candidates, offset = embeddings, head_inputs, guide_embeddings, 0
    candidate_ids = text_ids
    several = distributed.world_size() > 1
    if gather and several:
        candidates = distributed.all_gather_with_grad(embeddings)  # (RW, D)
        if head_inputs is not None:
            candidate_features = distributed.all_gather_with_grad(head_inputs)  # (RW, H)
        if guide_embeddings is not None:
            guide_candidates = distributed.all_gather_with_grad(guide_embeddings.detach())  # (RW, E), no graph
        if text_ids is not None:
            candidate_ids = distributed.all_gather_no_grad(text_ids)  # (RW,)
        offset = distributed.rank() * embeddings.shape[0]
    targets = RowLayout(group_size).targets(embeddings.shape[0], form, offset, candidates.shape[0], embeddings.device,
                                            hard_negative_weight)  # fmt: skip
    if queue is not None:
        candidates, targets, candidate_features, candidate_ids, guide_candidates = with_queue(
            queue, candidates, targets, candidate_features, candidate_ids, guide_candidates
        )
    guide_metrics = {}
    if guide_candidates is not None:
        targets, guide_metrics = guide_targets(guide_candidates, targets, guide_margin)
    context = LossContext(
        step=step,
        max_steps=max_steps,
        # for statistics every process must share (an objective fitted on all processes' pairs)
        all_reduce=distributed.all_reduce_sum if several else None,
        candidate_features=candidate_features,
        candidate_text_ids=None if candidate_ids is None else candidate_ids.to(embeddings.device),
    )
    output = loss_fn.compute(candidates, targets, context)
    if guide_metrics:
        output.metrics.update(guide_metrics)
    return output


def with_queue(
    queue: QueueEntries,
    candidates: Tensor,
    targets: ContrastiveTargets,
    features: Tensor | None,
    text_ids: Tensor | None,
    guide: Tensor | None,
) -> tuple[Tensor, ContrastiveTargets, Tensor | None, Tensor | None, Tensor | None]:
    """The step's candidates (N, D), targets, head inputs (N, H), text ids (N,) and guide embeddings (N, E), each with
    the queue's K entries appended (detached). An entry is a negative of anchor i unless it is unwritten or its text
    is anchor i's own or its positive's."""
    device = candidates.device
    queue_ids = queue.text_ids.to(device)  # (K,)
    extra = (queue_ids >= 0)[None].expand(targets.num_anchors, -1)  # (M, K)
    if text_ids is not None:
        ids = text_ids.to(device)
        own, positive = ids[targets.anchor_index], ids[targets.positive_index]  # (M,)
        extra = extra & (queue_ids[None] != own[:, None]) & (queue_ids[None] != positive[:, None])
        text_ids = torch.cat([ids, queue_ids])
    if features is not None:
        if queue.features is None:
            raise ValueError("the queue holds no head inputs for an objective that needs them")
        features = torch.cat([features, queue.features.detach().to(features.dtype)])
    if guide is not None:
        queued_guide = queue.embeddings if queue.guide is None else queue.guide  # None: the guide is `self`
        guide = torch.cat([guide, queued_guide.detach().to(guide.dtype)])
    candidates = torch.cat([candidates, queue.embeddings.detach().to(candidates.dtype)])
    return candidates, targets.with_extra_negatives(extra), features, text_ids, guide


def add_to_window(sums: dict[str, Tensor], metrics: dict[str, Tensor]) -> None:
    """Add one step's diagnostics (LossOutput.metrics) to a logging window's `sums`: tensors until the window is
    logged, so no host synchronisation in the step."""
    for key, value in metrics.items():
        value = value.detach().float()
        sums[key] = sums[key] + value if key in sums else value


def window_means(sums: dict[str, Tensor], count: int) -> dict[str, float]:
    """A logging window's diagnostics averaged over its `count` steps and over every process (one all-reduce: every
    process logs at the same steps), rounded for the logs; `duplicate_weight` is the mean weight of an anchor's exact
    duplicates in the steps that had any."""
    keys = sorted(sums)
    totals = distributed.all_reduce_sum(torch.stack([sums[key] for key in keys]))
    counts = distributed.all_reduce_sum(torch.tensor(float(count), device=totals.device))
    means = dict(zip(keys, (totals / counts).tolist()))
    pairs, total = means.pop("duplicate_pairs", 0.0), means.pop("duplicate_weight_total", 0.0)
    if pairs > 0:
        means["duplicate_weight"] = total / pairs
    return {key: round(value, 6) for key, value in means.items()}


def take_nonfinite_grads(loss_fn: ContrastiveLoss, step: int) -> dict[str, float]:
    """The logging window's rows whose loss gradient was not finite and was dropped (`nonfinite_grad_rows`, this
    process's anchors), read from the device now (when the trainer logs: the steps gain no host read), with one
    warning that names the last step with a drop and the terms (losses.base.drop_nonfinite_grad)."""
    rows, last = loss_fn.nonfinite_grads.take()
    if rows:
        terms = ", ".join(f"{term} {count}" for term, count in sorted(rows.items()))
        logger.warning("step %d: the loss's gradient was not finite in %d rows (%s) up to here: those rows got no "
                       "gradient, the rest of each step trained", last if last is not None else step,
                       sum(rows.values()), terms)  # fmt: skip
    return {"nonfinite_grad_rows": float(sum(rows.values()))}
