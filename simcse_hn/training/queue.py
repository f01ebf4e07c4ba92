"""Negatives beyond the batch: a queue of earlier optimizer steps' embeddings (MoCo, He et al. 2020; ESimCSE, Wu et al.
2022), contrasted with every anchor as detached candidates (training.step.contrastive_loss).

* `NegativeQueue`: a ring buffer of K entries (embedding, text id, and when the run needs them the MLP head's inputs
  and an external guide's embedding); the newest replace the oldest.
* `MomentumEncoder`: an exponential moving average of the model (encoder and head), run without dropout, that embeds
  what is enqueued; without one (`momentum` 0) the queue holds the training forward's own embeddings, detached (a
  memory bank).
* `QueueRun`: one run's queue. During an optimizer step it collects the step's entries (`remember`), gathered from
  every process, so the queue is the same on every rank; after the optimizer step (`QueueCallback.on_step_end`) the
  momentum encoder moves towards the new weights and the entries are enqueued: the queue changes once per optimizer
  step, never inside one (gradient accumulation and GradCache see one queue). Both are saved in every checkpoint
  (QUEUE_FILE: a part of the checkpoint, training.checkpoints.CheckpointCommit), never in the model folder, and
  restored on resume.

What is enqueued: one entry per sentence (the first view's row of [a, a', ...]), or the positive and explicit negatives
of each paired example (the rows that are candidates in SimCSE's supervised layout; anchors never are).
"""

from __future__ import annotations

import copy
import logging
import os
from typing import NamedTuple

import torch
from torch import Tensor, nn
from transformers import TrainerCallback

from simcse_hn.errors import ConfigError
from simcse_hn.losses.targets import RowLayout
from simcse_hn.training import distributed
from simcse_hn.training.checkpoints import QUEUE_FILE

logger = logging.getLogger(__name__)

EMPTY = -1  # the text id of an entry not yet written (text ids are >= 0)


class QueueEntries(NamedTuple):
    """K entries (or a step's rows to enqueue): embeddings (K, D); text_ids (K,) int64, EMPTY where unwritten;
    features (K, H), the MLP head's inputs (for an objective that `needs_head_inputs`), or None; guide (K, E), an
    external guide model's embeddings, or None (no guide, or the guide `self`: the entries themselves)."""

    embeddings: Tensor
    text_ids: Tensor
    features: Tensor | None = None
    guide: Tensor | None = None


class NegativeQueue:
    """A ring buffer of `size` entries, allocated at the first `enqueue` (its widths and dtypes are the rows')."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"a queue needs size >= 1, got {size}")
        self.size = size
        self.buffer: QueueEntries | None = None
        self.position = 0  # where the next entry goes

    def entries(self) -> QueueEntries | None:
        """All K entries (EMPTY text ids where unwritten), None before the first enqueue."""
        return self.buffer

    def enqueue(self, rows: QueueEntries) -> None:
        """Write rows (B, ...) over the oldest entries (only the last `size` when B > size)."""
        device = rows.embeddings.device  # every part of an entry lives where its embedding does
        rows = QueueEntries(*(None if value is None else value.detach()[-self.size :].to(device) for value in rows))
        if self.buffer is None:
            self.buffer = QueueEntries(*(None if value is None else value.new_zeros((self.size, *value.shape[1:]))
                                         for value in rows))  # fmt: skip
            self.buffer.text_ids.fill_(EMPTY)
        count = rows.embeddings.shape[0]
        index = (self.position + torch.arange(count, device=rows.embeddings.device)) % self.size
        for stored, value in zip(self.buffer, rows):
            if stored is not None:
                stored.index_copy_(0, index, value.to(stored.dtype))
        self.position = (self.position + count) % self.size

    def state_dict(self) -> dict:
        return {"size": self.size, "position": self.position,
                "buffer": None if self.buffer is None else self.buffer._asdict()}  # fmt: skip

    def load_state_dict(self, state: dict, device: torch.device | str) -> None:
        buffer = state["buffer"]
        self.position = state["position"]
        self.buffer = None if buffer is None else QueueEntries(**{
            key: None if value is None else value.to(device) for key, value in buffer.items()})  # fmt: skip

    def memory_bytes(self) -> int:
        return 0 if self.buffer is None else sum(v.numel() * v.element_size() for v in self.buffer if v is not None)


def bare_model(model: nn.Module) -> nn.Module:
    """The model without a torch.compile wrapper (accelerate's unwrap_model may keep it)."""
    return getattr(model, "_orig_mod", model)


class MomentumEncoder:
    """theta_k <- m theta_k + (1 - m) theta_q after each optimizer step, theta_q the model's parameters: a copy of the
    model (encoder and head, without its loss) in training mode with the encoder's dropout off, so it embeds as
    training does (the MLP head included) without dropout noise, as ESimCSE's momentum encoder (its `model.eval()`)."""

    def __init__(self, model: nn.Module, momentum: float):
        loss_fn = getattr(model, "loss_fn", None)
        memo = {} if loss_fn is None else {id(loss_fn): None}  # the loss and its state stay with the model
        self.model = copy.deepcopy(model, memo).requires_grad_(False)
        self.model.train()
        getattr(self.model, "encoder", self.model).eval()  # dropout off; SimCSEModel still runs its training head
        self.momentum = momentum

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """One step towards `model`'s parameters, matched by name (the model's loss may have parameters of its own,
        which the copy has not)."""
        online = dict(model.named_parameters())
        mine = [p for _, p in self.model.named_parameters()]
        theirs = [online[name] for name, _ in self.model.named_parameters()]
        torch._foreach_lerp_(mine, theirs, 1.0 - self.momentum)  # m theta_k + (1 - m) theta_q

    @torch.no_grad()
    def embed(self, inputs: dict[str, Tensor], return_head_inputs: bool) -> tuple[Tensor, Tensor | None]:
        output = self.model(**inputs, return_head_inputs=return_head_inputs)
        return output.embeddings, output.head_inputs

    def memory_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())


class QueueRun:
    """One run's queue (`size` entries) and, with `momentum` > 0, its momentum encoder, made from the model at the
    first step (or restored from a checkpoint). `group_size`: the batches' layout (None: sentences)."""

    encoder_class: type[MomentumEncoder] = MomentumEncoder  # how the momentum copy embeds (st_training's for ST)

    def __init__(self, size: int, momentum: float, group_size: int | None, chunk_rows: int | None = None):
        self.queue = NegativeQueue(size)
        self.momentum = momentum
        self.layout = RowLayout(group_size)
        self.chunk_rows = chunk_rows  # GradCache: the momentum encoder embeds this many rows at a time
        self.encoder: MomentumEncoder | None = None
        self.pending: list[QueueEntries] = []
        self._restored_encoder: dict[str, Tensor] | None = None

    @classmethod
    def for_run(cls, args, group_size: int | None) -> QueueRun | None:
        """The queue of training arguments `args` (queue_size, momentum; GradCache's mini-batch bounds the momentum
        encoder's), None without one."""
        if not args.queue_size:
            return None
        chunk = args.cache_minibatch_size and args.cache_minibatch_size * RowLayout(group_size).rows_per_example
        return cls(args.queue_size, args.momentum, group_size, chunk)

    def entries(self) -> QueueEntries | None:
        return self.queue.entries()

    def remember(
        self,
        model: nn.Module,
        inputs: dict[str, Tensor],
        embeddings: Tensor,
        head_inputs: Tensor | None,
        text_ids: Tensor,
        guide_embeddings: Tensor | None,
    ) -> None:
        """Collect this micro-batch's entries (gathered from every process), enqueued after the optimizer step.
        model: the model itself (not a DDP wrapper), its objective as `model.loss_fn`; inputs: the batch's model inputs
        (R, T); embeddings (R, D) and head_inputs (R, H): the training forward's; guide_embeddings (R, E): an external
        guide's."""
        needs_head_inputs = model.loss_fn.needs_head_inputs
        if text_ids is None:  # the collators give them; an entry's text is how an anchor's own is masked
            raise ValueError("a queue needs the batch's text_ids (SimCSECollator and PairCollator give them)")
        rows = self.layout.negative_rows(embeddings.shape[0], embeddings.device)  # one row per negative text
        if self.momentum > 0:
            self._ensure_encoder(model)
            assert self.encoder is not None
            selected = {key: value[rows] for key, value in inputs.items()}
            step = self.chunk_rows or rows.numel()
            pieces = [self.encoder.embed({k: v[i : i + step] for k, v in selected.items()}, needs_head_inputs)
                      for i in range(0, rows.numel(), step)]  # fmt: skip
            queued = torch.cat([z for z, _ in pieces])
            features = torch.cat([h for _, h in pieces]) if needs_head_inputs else None  # type: ignore[misc]
        else:
            queued = embeddings.detach()[rows]
            features = None if head_inputs is None or not needs_head_inputs else head_inputs.detach()[rows]
        guide = None if guide_embeddings is None else guide_embeddings.detach()[rows]
        self.add_pending(QueueEntries(queued, text_ids.to(queued.device)[rows], features, guide))

    def add_pending(self, entries: QueueEntries) -> None:
        """Hold one micro-batch's entries until the optimizer step, gathered from every process: every rank enqueues
        the gathered batch, in rank order."""
        if distributed.world_size() > 1:
            entries = QueueEntries(*(None if v is None else distributed.all_gather_no_grad(v.contiguous())
                                     for v in entries))  # fmt: skip
        self.pending.append(entries)

    def step_end(self, model: nn.Module) -> None:
        """After the optimizer step: the momentum encoder follows the new weights, then the step's entries enter."""
        if self.encoder is not None:
            self.encoder.update(bare_model(model))
        for entries in self.pending:
            self.queue.enqueue(entries)
        self.pending.clear()

    def _ensure_encoder(self, model: nn.Module) -> None:
        if self.encoder is not None:
            return
        self.encoder = self.encoder_class(bare_model(model), self.momentum)
        if self._restored_encoder is not None:
            self.encoder.model.load_state_dict(self._restored_encoder)
            self._restored_encoder = None
        logger.info("momentum encoder (momentum %g): a copy of the model, %.1f MiB", self.momentum,
                    self.encoder.memory_bytes() / 2**20)  # fmt: skip

    def log_memory(self) -> None:
        logger.info("negative queue: %d entries, %.1f MiB", self.queue.size, self.queue.memory_bytes() / 2**20)

    def state_dict(self) -> dict:
        encoder = None if self.encoder is None else self.encoder.model.state_dict()
        return {"queue": self.queue.state_dict(), "momentum": self.momentum, "momentum_encoder": encoder}

    def checkpoint_files(self) -> list[str]:
        return [QUEUE_FILE]

    def save_checkpoint(self, folder: str) -> None:
        """Its part of a checkpoint (training.checkpoints.CheckpointPart), written before the checkpoint's manifest."""
        torch.save(self.state_dict(), os.path.join(folder, QUEUE_FILE))

    def restore(self, checkpoint: str, device: torch.device | str) -> None:
        """The queue and momentum encoder of `checkpoint` (QUEUE_FILE); ConfigError (one line) when the checkpoint was
        trained with another queue, or none."""
        path = os.path.join(checkpoint, QUEUE_FILE)
        name = os.path.basename(os.path.normpath(checkpoint))
        if not os.path.isfile(path):  # a whole checkpoint of a run without a queue (checked before: resumed.py)
            raise ConfigError(f"queue_size: {name} was trained without a queue (no {QUEUE_FILE}); this run names "
                              f"queue_size {self.queue.size}")  # fmt: skip
        state = torch.load(path, map_location=device, weights_only=True)
        size, momentum = state["queue"]["size"], state["momentum"]
        if (size, momentum) != (self.queue.size, self.momentum):
            raise ConfigError(f"queue_size: {name} was trained with queue_size {size} and momentum {momentum:g}; "
                              f"name them again to resume (this run: {self.queue.size}, {self.momentum:g})")
        self.queue.load_state_dict(state["queue"], device)
        self._restored_encoder = state["momentum_encoder"]


class QueueCallback(TrainerCallback):
    """Enqueues after each optimizer step (QueueRun.step_end) and logs the queue's memory once it is allocated. (The
    QueueRun itself is a part of every checkpoint: CheckpointCommit writes it.)"""

    def __init__(self, run: QueueRun):
        self.run = run
        self.logged = False

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.run.step_end(model)
        if not self.logged and state.is_world_process_zero:
            self.run.log_memory()
            self.logged = True


def resume_queue(run: QueueRun | None, checkpoint, device: torch.device | str) -> None:
    """Resuming from `checkpoint` (a folder; anything else: not resuming): its queue into `run`, or, for a run without
    a queue, a refusal of a checkpoint that has one (its negatives would change mid-run)."""
    if not isinstance(checkpoint, str):
        return
    if run is not None:
        run.restore(checkpoint, device)
    elif os.path.isfile(os.path.join(checkpoint, QUEUE_FILE)):
        name = os.path.basename(os.path.normpath(checkpoint))
        raise ConfigError(f"queue_size: {name} was trained with a queue ({QUEUE_FILE}); name --queue_size and "
                          "--momentum again to resume it")  # fmt: skip
