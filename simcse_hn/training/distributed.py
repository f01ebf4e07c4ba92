"""Process-group helpers: rank, world size, a broadcast from process 0, gathers and sums; used by the training step
(training.step), the queue (training.queue), the gradient guard (training.callbacks), topic clustering
(training.batches) and train.py.

Without an initialised process group every helper is the identity (one process, rank 0).
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from torch import Tensor

logger = logging.getLogger(__name__)


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def broadcast_object(obj):
    """Process 0's `obj` on every process (a picklable value; the identity on one process)."""
    if not is_distributed():
        return obj
    objects = [obj]
    dist.broadcast_object_list(objects, src=0)
    return objects[0]


class _AllGatherWithGrad(torch.autograd.Function):
    """Concatenate every process's rows along dim 0 and route gradients back to their owners.

    Backward sums the incoming gradient over processes before taking the local slice: every process's loss
    depends on every process's rows, so the local rows' gradient is the sum of all those contributions.
    (SimCSE's reference gathers without grad and re-inserts the local rows, which keeps only the local
    loss's share of that sum.)
    """

    @staticmethod
    def forward(ctx, tensor: Tensor) -> Tensor:
        ctx.rank, ctx.rows = dist.get_rank(), tensor.shape[0]
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.rank * ctx.rows : (ctx.rank + 1) * ctx.rows]


def all_gather_with_grad(tensor: Tensor) -> Tensor:
    """(n, ...) on each of W processes -> (W*n, ...) in rank order; differentiable. Identity with one process.

    Every process must pass the same number of rows (the trainer drops a short last batch for this).
    """
    if world_size() == 1:
        return tensor
    return _AllGatherWithGrad.apply(tensor)


def all_reduce_sum(tensor: Tensor) -> Tensor:
    """Sum over processes, as a new tensor (the input is left unchanged); no gradient. Identity with one process.

    For statistics that every process must agree on (an objective's fit on all processes' pairs).
    """
    if world_size() == 1:
        return tensor
    total = tensor.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


def all_gather_no_grad(tensor: Tensor) -> Tensor:
    """Gather without a gradient path; the local slice is the caller's tensor (SimCSE's reference gather).

    For the rows' text ids (integers: no gradient to route), and for tests that show how its gradient differs from
    `all_gather_with_grad`.
    """
    if world_size() == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(world_size())]
    dist.all_gather(parts, tensor.detach().contiguous())
    parts[rank()] = tensor
    return torch.cat(parts, dim=0)


def warn_if_unsharded(requested: str | None, sharded: bool, device_type: str) -> None:
    """A warning when the configuration asked for FSDP or DeepSpeed (`requested`) and accelerate, which decides what
    runs, did not shard: it shards on GPUs (or other accelerators) only."""
    if requested and not sharded:
        logger.warning(
            "%s was requested, but accelerate runs it on GPUs (or other accelerators) only: this run on %s is plain "
            "data parallel (same results, unsharded memory)",
            requested,
            device_type,
        )
