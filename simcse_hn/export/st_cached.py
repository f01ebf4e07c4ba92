"""`CachedSimCSELoss`: `SimCSELoss` with GradCache (Gao et al. 2021, arXiv:2101.06983) on sentence-transformers' own
machinery (`CachedLossMixin`, as `CachedMultipleNegativesRankingLoss`): large batches in the memory of a mini-batch.

    loss = CachedSimCSELoss(model, "hcl", beta=0.1, mini_batch_size=32, queue_size=4096)

The mixin embeds the batch in mini-batches without a graph, the objective runs once on all the embeddings
(`calculate_loss`: SimCSELoss's own step, queue and diagnostics included) and backpropagates to them, and the
backward replays each mini-batch's forward with its recorded RNG state (the same dropout masks), chaining the
cached gradients in: the same loss and gradients as `SimCSELoss` on the whole batch, with the activations of one
mini-batch alive at a time (bench/results/st_cached.md). A momentum encoder embeds the queue's entries in
mini-batches too. MatryoshkaLoss wraps it as it wraps sentence-transformers' cached losses (its `calculate_loss`,
called once per dimension, each with a queue of its own width).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from sentence_transformers.base.losses.gradcache import CachedLossMixin
from torch import Tensor, nn

from simcse_hn.export.st_losses import SimCSELoss


class CachedSimCSELoss(CachedLossMixin, SimCSELoss):
    """`SimCSELoss(model, objective, **options)` with GradCache: `mini_batch_size` texts per forward (or
    `mini_batch_num_tokens` non-padding tokens), the rest as `SimCSELoss`."""

    def __init__(
        self,
        model: nn.Module,
        objective=None,
        mini_batch_size: int = 32,
        mini_batch_num_tokens: int | None = None,
        show_progress_bar: bool = False,
        **kwargs,
    ):
        SimCSELoss.__init__(self, model, objective, **kwargs)
        if any(True for _ in self.loss_fn.parameters()):  # the mixin backpropagates the loss itself, unscaled
            raise ValueError(
                f"CachedSimCSELoss: {self.objective_name}'s learned parameters would get their gradient outside the "
                "trainer's scaling (gradient accumulation, fp16); use SimCSELoss, or the objective without them"
            )
        if mini_batch_size < 1 or (mini_batch_num_tokens is not None and mini_batch_num_tokens < 1):
            raise ValueError(
                f"mini_batch_size and mini_batch_num_tokens must be >= 1, got {mini_batch_size}, "
                f"{mini_batch_num_tokens}"
            )
        self.mini_batch_size = mini_batch_size
        self.mini_batch_num_tokens = mini_batch_num_tokens
        self.show_progress_bar = show_progress_bar
        if self.queue is not None:
            self.queue.chunk_rows = mini_batch_size

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None = None) -> Tensor:
        return self.forward_cached(self.batch_columns(sentence_features), labels)

    def calculate_loss(
        self, reps: list[list[Tensor]], labels: Tensor | None = None, *, with_backward: bool = False
    ) -> Tensor:
        """reps: each column's embeddings, mini-batch by mini-batch -> SimCSELoss's loss on the whole batch; with
        `with_backward`, backpropagated to the embeddings and returned detached (CachedLossMixin's contract)."""
        loss = self.compute_loss_from_embeddings([torch.cat(column) for column in reps], labels)
        if with_backward:
            loss.backward()
            loss = loss.detach()
        return loss

    def get_config_dict(self) -> dict:
        return {**super().get_config_dict(), "mini_batch_size": self.mini_batch_size}
