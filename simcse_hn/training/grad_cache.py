"""GradCache (Gao et al., arXiv:2101.06983): a contrastive step over a batch too large to back-propagate at once,
with exactly the gradient of the plain step.

1. Embed the batch in mini-batches without a graph, saving the RNG state before each one (its dropout masks).
2. Compute the loss on all the embeddings (gathered across processes by the caller's loss function, if it gathers).
3. When the caller back-propagates the loss (a hook on it, as sentence-transformers' cached losses do, so the Trainer's
   own training_step stays as it is): its gradient with respect to the embeddings (and to any other model output the
   loss uses), the cache; then re-run each mini-batch from its saved RNG state, so dropout draws the same masks, and
   back-propagate its rows of the cache: the gradient of sum_k <e_k, g_k> with respect to the parameters is dL/dtheta.

Peak activation memory is one mini-batch's graph plus the (R, D) embeddings of the batch's R rows; the cost is a
second forward pass.
This module knows nothing about ranks or the Trainer: the caller passes the no-sync and autocast hooks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import get_device_states, set_device_states

from simcse_hn.losses import LossOutput

Embed = Callable[[nn.Module, dict[str, Tensor]], tuple[Tensor, Tensor | None]]  # -> embeddings, head inputs or None


@dataclass
class RNGState:
    """The CPU generator's state and, for inputs on an accelerator, that device's (as torch.utils.checkpoint)."""

    cpu: Tensor
    device_type: str
    devices: list[int]
    device_states: list[Tensor]

    @classmethod
    def capture(cls, like: Tensor) -> RNGState:
        devices, states = get_device_states(like)
        return cls(torch.get_rng_state(), like.device.type, devices, states)

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.devices:
            set_device_states(self.devices, self.device_states, device_type=self.device_type)


def split_groups(inputs: dict[str, Tensor], examples: int, rows_per_example: int) -> list[dict[str, Tensor]]:
    """Rows in groups of `rows_per_example` consecutive rows (the batch's `RowLayout.rows_per_example`) -> mini-batches
    of `examples` examples (a group stays together), each without the trailing columns that are padding in all its
    rows."""
    if examples < 1:
        raise ValueError(f"a mini-batch needs at least one sentence, got {examples}")
    rows = inputs["input_ids"].shape[0]
    if rows_per_example < 1 or rows % rows_per_example:
        raise ValueError(f"{rows} rows are not groups of {rows_per_example}")
    chunks, step = [], rows_per_example * examples
    for start in range(0, rows, step):
        chunk = {key: value[start : start + step] for key, value in inputs.items()}
        mask = chunk.get("attention_mask")
        if mask is not None and mask.dim() == 2:
            length = int(mask.any(dim=0).nonzero().max()) + 1 if mask.any() else mask.shape[1]  # one host sync
            chunk = {k: v[:, :length] if v.dim() >= 2 and v.shape[:2] == mask.shape else v for k, v in chunk.items()}
        chunks.append(chunk)
    return chunks


def cached_loss(
    model: nn.Module,
    chunks: Sequence[dict[str, Tensor]],
    embed: Embed,
    loss_fn: Callable[[Tensor, Tensor | None], LossOutput],
    no_sync: Callable[[], AbstractContextManager] = nullcontext,
    autocast: Callable[[], AbstractContextManager] = nullcontext,
    loss_parameters: Sequence[Tensor] = (),
) -> LossOutput:
    """Steps 1 and 2 now, step 3 inside the caller's own backward. -> the loss's output, whose `loss` is a leaf
    holding the loss's value: `backward()` on it, or on it scaled (gradient accumulation, a GradScaler: the scale
    reaches the hook as the leaf's gradient), replays the mini-batches and accumulates dL/dtheta times that scale.

    embed(model, chunk) -> embeddings (b, D) and head inputs (b, H) or None; loss_fn(embeddings (2B, D), head inputs
    (2B, H) or None) -> LossOutput on the whole batch. The loss's own `loss_parameters` (a learned mixture) get their
    gradient in the last re-run's backward, the only one outside `no_sync()`: DDP, prepared by that forward, then
    reduces every parameter once. The caller runs this with autocast on (e.g. inside the Trainer's compute_loss); the
    re-runs happen later, inside backward, so they enter `autocast()` themselves. The RNG continues after the step as
    after the loss, so the next step does not replay these masks.
    """
    states, embeddings, head_inputs = [], [], []
    with torch.no_grad():
        for chunk in chunks:
            states.append(RNGState.capture(chunk["input_ids"]))
            z, h = embed(model, chunk)
            embeddings.append(z)
            head_inputs.append(h)
    z = torch.cat(embeddings).requires_grad_()  # (2B, D), a leaf: the cache is its gradient
    h = None if head_inputs[0] is None else torch.cat(head_inputs).requires_grad_()  # (2B, H)
    output = loss_fn(z, h)
    after = RNGState.capture(chunks[0]["input_ids"])
    leaves = [z] if h is None else [z, h]

    trains_loss = any(p.requires_grad for p in loss_parameters)

    def replay(scale: Tensor) -> None:
        # the loss graph is kept for the last re-run's backward when the loss has parameters of its own
        cache = torch.autograd.grad(output.loss, leaves, scale, retain_graph=trains_loss, allow_unused=True)
        start = 0
        with torch.enable_grad():
            for i, (chunk, state) in enumerate(zip(chunks, states)):
                last = i == len(chunks) - 1
                with nullcontext() if last else no_sync():
                    state.restore()
                    with autocast():
                        outputs = embed(model, chunk)
                    stop = start + outputs[0].shape[0]
                    # sum_k <e_k, g_k>: its gradient w.r.t. the mini-batch's outputs is their rows of the cache
                    surrogate = sum(
                        (out * g[start:stop].to(out.dtype)).sum()
                        for out, g in zip(outputs, cache)
                        if out is not None and g is not None
                    )
                    if last and trains_loss:  # the loss's own parameters, in the one synchronised backward
                        surrogate = surrogate + output.loss * scale
                    surrogate.backward()
                start = stop
        after.restore()

    loss = output.loss.detach().requires_grad_()  # what the caller back-propagates: its gradient is the scale
    loss.register_hook(lambda scale: replay(scale) or None)
    return dataclasses.replace(output, loss=loss)
