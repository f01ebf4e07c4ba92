"""simcse-hn's negative queue for a sentence-transformers loss (`SimCSELoss(queue_size=K, momentum=m)`, docs/hub.md).

`SentenceQueue` holds K entries of earlier optimizer steps and, with m > 0, the momentum encoder (a copy of the
SentenceTransformer, dropout off) that embeds them. The loss hands it each batch's rows; `SimCSECallback` says where
the trainer is (`TrainerStep`), moves the encoder and enqueues after each optimizer step, and saves it with each
checkpoint. What it enqueues, and when:

* One set of entries per batch and optimizer step, whoever calls the loss and however often: a wrapper
  (MatryoshkaLoss once per dimension, AdaptiveLayerLoss once per layer, the final layer first) calls it several
  times on one batch, and only the batch's first call at each embedding width gives entries.
* One queue per embedding width: MatryoshkaLoss hands the loss truncated embeddings, and each dimension is
  contrasted with a queue of its own width. The momentum encoder embeds a batch once; a narrower queue takes the
  first `width` dimensions of its embeddings (the objectives compare cosines, so the renormalisation MatryoshkaLoss
  applies changes nothing).
* The rows that are other anchors' negatives (`RowLayout.negative_rows`): the anchor column of (anchor, positive)
  pairs (one entry per pair: with dropout pairs each sentence once, as simcse-hn's trainer enqueues each sentence's
  first view), or the positives and explicit negatives of (anchor, positive, negative...) examples.

sentence-transformers' batches carry no text ids: a row's text id is a hash of its token ids (the non-padding ones),
so texts that tokenise alike count as one text.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os

import torch
from accelerate.utils import extract_model_from_parallel
from torch import Tensor, nn

from simcse_hn.errors import ConfigError
from simcse_hn.losses.targets import RowLayout
from simcse_hn.training import distributed
from simcse_hn.training.queue import QUEUE_FILE, MomentumEncoder, NegativeQueue, QueueEntries, bare_model

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainerStep:
    """Where the trainer is, as SimCSECallback tells a loss: `step` optimizer steps done (the trainer's global_step),
    of `max_steps`; `batch`, the micro-batch of the step (gradient accumulation); `bound`: a callback tells it. A
    loss counts nothing itself: a wrapper calls it several times per batch, and a resumed run restarts any count."""

    step: int = 0
    max_steps: int | None = None
    batch: int = 0
    bound: bool = False

    def set(self, step: int, max_steps: int | None, batch: int = 0) -> None:
        """Outside a trainer: say where the training loop is before each call of the loss."""
        self.step = step
        self.max_steps = max_steps
        self.batch = batch
        self.bound = True

    @property
    def key(self) -> tuple[int, int]:
        return (self.step, self.batch)


def token_text_ids(features: dict[str, Tensor]) -> Tensor:
    """(B,) int64: a 63-bit id of each row's token ids (where the attention mask is set), the same in every process."""
    ids = features["input_ids"].detach().cpu()
    mask = features.get("attention_mask")
    keep = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.detach().cpu().bool()
    digests = [hashlib.blake2b(row[m].numpy().tobytes(), digest_size=8).digest() for row, m in zip(ids, keep)]
    return torch.tensor([int.from_bytes(digest, "little") >> 1 for digest in digests])


class SentenceMomentumEncoder(MomentumEncoder):
    """The momentum copy of a SentenceTransformer: it embeds a column's features (no MLP head to return). Made from a
    model that a wrapper loss may have decorated (MatryoshkaLoss and AdaptiveLayerLoss replace `forward` on the
    instance while they run): the copy drops such replacements and runs its modules' own forward."""

    def __init__(self, model: nn.Module, momentum: float):
        super().__init__(model, momentum)
        for module in self.model.modules():
            module.__dict__.pop("forward", None)

    @torch.no_grad()
    def embed(self, inputs: dict[str, Tensor], return_head_inputs: bool) -> tuple[Tensor, Tensor | None]:
        return self.model(dict(inputs))["sentence_embedding"], None


class SentenceQueue:
    """K entries per embedding width and, with `momentum` > 0, the momentum encoder: see the module's docstring.
    `chunk_rows`: the momentum encoder embeds this many rows at a time (a cached loss's mini-batch bounds it too)."""

    def __init__(self, size: int, momentum: float, chunk_rows: int | None = None):
        if size < 1:
            raise ValueError(f"queue_size must be >= 1, got {size}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.size = size
        self.momentum = momentum
        self.chunk_rows = chunk_rows
        self.queues: dict[int, NegativeQueue] = {}  # embedding width -> its queue
        self.pending: dict[tuple[tuple[int, int], int], QueueEntries] = {}  # (batch key, width) -> its entries
        self.encoder: SentenceMomentumEncoder | None = None
        self._encoded: tuple[tuple[int, int], Tensor] | None = None  # the momentum encoder's rows of the last batch
        self._restored_encoder: dict[str, Tensor] | None = None
        self.clock: TrainerStep | None = None  # SimCSECallback's (SimCSELoss hands it over)

    def start(self, model: nn.Module) -> None:
        """At the train's start (SimCSECallback): the momentum encoder, a copy of the model as it is (or the
        checkpoint's, on resume), made before any wrapper loss decorates the model."""
        if self.momentum > 0 and self.encoder is None:
            self.encoder = SentenceMomentumEncoder(bare_model(extract_model_from_parallel(model)), self.momentum)
            if self._restored_encoder is not None:
                self.encoder.model.load_state_dict(self._restored_encoder)
                self._restored_encoder = None
            logger.info(
                "momentum encoder (momentum %g): a copy of the model, %.1f MiB",
                self.momentum,
                self.encoder.memory_bytes() / 2**20,
            )

    def entries(self, width: int) -> QueueEntries | None:
        """The queue of embeddings `width` wide, None before its first entries."""
        queue = self.queues.get(width)
        return None if queue is None else queue.entries()

    def remember(self, rows: Tensor, text_ids: Tensor, layout: RowLayout, columns: list[dict[str, Tensor]]) -> None:
        """The batch's entries, enqueued after the optimizer step: rows (R, W) in `layout` (detached: the memory bank),
        text_ids (R,), `columns` the batch's features per column (the momentum encoder's input)."""
        if self.clock is None or not self.clock.bound:
            raise ConfigError(
                "SimCSELoss(queue_size=...) needs SimCSECallback(loss) in the trainer's callbacks: it "
                "advances the queue after each optimizer step and saves it with each checkpoint"
            )
        width = rows.shape[-1]
        key = self.clock.key
        if (key, width) in self.pending:  # the batch gave its entries at this width already (a wrapper's 2nd call)
            return
        negative_rows = layout.negative_rows(rows.shape[0], rows.device)
        if self.momentum > 0:
            queued = self._momentum_rows(key, columns, layout)[:, :width]
        else:
            queued = rows.detach()[negative_rows]
        entries = QueueEntries(queued, text_ids.to(queued.device)[negative_rows])
        if distributed.world_size() > 1:  # every rank enqueues the gathered batch, in rank order
            entries = QueueEntries(*(distributed.all_gather_no_grad(v.contiguous()) for v in entries[:2]))
        self.pending[(key, width)] = entries

    def _momentum_rows(self, key: tuple[int, int], columns: list[dict[str, Tensor]], layout: RowLayout) -> Tensor:
        """The momentum encoder's embeddings (R', D) of the batch's negative rows, once per batch: the anchor column
        for sentences, else the positive and negative columns interleaved per example as the rows are."""
        if self._encoded is not None and self._encoded[0] == key:
            return self._encoded[1]
        if self.encoder is None:
            raise ConfigError(
                "SimCSELoss: the momentum encoder is made when training starts (SimCSECallback's "
                "on_train_begin); call the loss in training mode only inside the trainer"
            )
        chosen = columns[:1] if not layout.paired else columns[1:]
        embedded = [self._embed_in_chunks(column) for column in chosen]  # each (B, D)
        encoded = torch.stack(embedded, dim=1).reshape(-1, embedded[0].shape[-1])  # (B x columns, D), example-major
        self._encoded = (key, encoded)
        return encoded

    def _embed_in_chunks(self, features: dict[str, Tensor]) -> Tensor:
        assert self.encoder is not None
        rows = features["input_ids"].shape[0]
        step = self.chunk_rows or rows
        pieces = []
        for begin in range(0, rows, step):
            chunk = {
                k: v[begin : begin + step] if isinstance(v, Tensor) and v.dim() > 0 else v for k, v in features.items()
            }
            pieces.append(self.encoder.embed(chunk, False)[0])
        return torch.cat(pieces)

    def step_end(self, model: nn.Module) -> None:
        """After the optimizer step: the momentum encoder follows the new weights, then the step's entries enter."""
        if self.encoder is not None:
            self.encoder.update(bare_model(extract_model_from_parallel(model)))
        for (_, width), entries in self.pending.items():
            self.queues.setdefault(width, NegativeQueue(self.size)).enqueue(entries)
        self.pending.clear()
        self._encoded = None

    def memory_bytes(self) -> int:
        return sum(queue.memory_bytes() for queue in self.queues.values())

    def log_memory(self) -> None:
        logger.info(
            "negative queue: %d entries at widths %s, %.1f MiB",
            self.size,
            sorted(self.queues) or "-",
            self.memory_bytes() / 2**20,
        )

    def state_dict(self) -> dict:
        encoder = None if self.encoder is None else self.encoder.model.state_dict()
        return {
            "size": self.size,
            "momentum": self.momentum,
            "momentum_encoder": encoder,
            "queues": {width: queue.state_dict() for width, queue in self.queues.items()},
        }

    def checkpoint_files(self) -> list[str]:
        return [QUEUE_FILE]

    def save_checkpoint(self, folder: str) -> None:
        """Its part of a checkpoint (training.checkpoints.CheckpointPart), written before the checkpoint's manifest."""
        torch.save(self.state_dict(), os.path.join(folder, QUEUE_FILE))

    def restore(self, checkpoint: str, device: torch.device | str) -> None:
        """The queues and momentum encoder of `checkpoint`; ConfigError (one line) when it was trained with other
        queue settings, or none."""
        path = os.path.join(checkpoint, QUEUE_FILE)
        name = os.path.basename(os.path.normpath(checkpoint))
        if not os.path.isfile(path):
            raise ConfigError(
                f"SimCSELoss: {name} was trained without a queue (no {QUEUE_FILE}); this run names "
                f"queue_size {self.size}"
            )
        state = torch.load(path, map_location=device, weights_only=True)
        if "queue" in state:  # a checkpoint of one queue (before widths had queues of their own)
            single = state["queue"]
            width = 0 if single["buffer"] is None else single["buffer"]["embeddings"].shape[-1]
            state = {**state, "size": single["size"], "queues": {width: single} if width else {}}
        if (state["size"], state["momentum"]) != (self.size, self.momentum):
            raise ConfigError(
                f"SimCSELoss: {name} was trained with queue_size {state['size']} and momentum "
                f"{state['momentum']:g}; name them again to resume (this run: {self.size}, "
                f"{self.momentum:g})"
            )
        self.queues = {}
        for width, queue_state in state["queues"].items():
            self.queues[int(width)] = NegativeQueue(self.size)
            self.queues[int(width)].load_state_dict(queue_state, device)
        self._restored_encoder = state["momentum_encoder"]
        if self.encoder is not None and self._restored_encoder is not None:
            self.encoder.model.load_state_dict(self._restored_encoder)
            self._restored_encoder = None
