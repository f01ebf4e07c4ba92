"""simcse-hn's negative queue and topic batches inside sentence-transformers' own `SentenceTransformerTrainer`
(docs/hub.md): three additions to an existing script.

    loss = SimCSELoss(model, "hcl", beta=0.1, queue_size=4096, momentum=0.995)  # st_losses: the queue
    batches = TopicBatches(clusters=64, share=1.0, recluster_steps=500)           # the sampler
    args = SentenceTransformerTrainingArguments(..., batch_sampler=batches)
    trainer = SentenceTransformerTrainer(..., loss=loss, callbacks=[SimCSECallback(loss, batches)])

* `SentenceQueue`: simcse_hn.training.queue's QueueRun for a SentenceTransformer. It enqueues the anchor column (one
  entry per pair: with dropout pairs each sentence once, as simcse-hn's trainer enqueues each sentence's first view),
  embedded by the momentum encoder (a copy of the unwrapped model, dropout off) or, without one, the training
  forward's own anchors, detached. sentence-transformers' batches carry no text ids: a row's text id is a hash of its
  token ids (the non-padding ones), so texts that tokenise alike count as one text.
* `TopicBatches`: what `batch_sampler=` takes; each dataset gets a `TopicBatchesSampler`, simcse_hn.data.topic_batches'
  TopicBatchSampler cut into the trainer's batches (every window of one gathered batch from one cluster).
* `SimCSECallback`: hands the sampler the model (clustering before the first step, re-clustering), advances the queue
  after each optimizer step, writes both into each checkpoint and then its manifest, last (as simcse-hn's trainer
  commits a checkpoint: training.checkpoints.CheckpointCommit), reads them back on resume from a whole checkpoint
  (`load_state`), and adds the loss's diagnostics and the batches' cluster share to the training logs.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from collections.abc import Iterator

import torch
from accelerate.utils import extract_model_from_parallel
from torch import Tensor, nn

from simcse_hn.configuration.training_arguments import sharding_engine
from simcse_hn.data.topic_batches import TOPIC_CLUSTERS_FILE, InForce, TopicBatchSampler, cluster_corpus
from simcse_hn.errors import ConfigError
from simcse_hn.losses.targets import RowLayout
from simcse_hn.training import distributed
from simcse_hn.training.checkpoints import CheckpointCommit, checkpoint_path, manifest_problem
from simcse_hn.training.queue import QUEUE_FILE, MomentumEncoder, QueueEntries, QueueRun, resume_queue
from simcse_hn.training.step import window_means

logger = logging.getLogger(__name__)
# a loss call's rows [a_0, p_0, a_1, p_1, ...]: the anchor column beside the positive column, one pair an example
ST_LAYOUT = RowLayout(group_size=2)


def token_text_ids(features: dict[str, Tensor]) -> Tensor:
    """(B,) int64: a 63-bit id of each row's token ids (where the attention mask is set), the same in every process."""
    ids = features["input_ids"].detach().cpu()
    mask = features.get("attention_mask")
    keep = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.detach().cpu().bool()
    return torch.tensor([int.from_bytes(hashlib.blake2b(row[m].numpy().tobytes(), digest_size=8).digest(),
                                        "little") >> 1 for row, m in zip(ids, keep)])  # fmt: skip


class SentenceMomentumEncoder(MomentumEncoder):
    """The momentum copy of a SentenceTransformer: it embeds a column's features (no MLP head to return)."""

    @torch.no_grad()
    def embed(self, inputs: dict[str, Tensor], return_head_inputs: bool) -> tuple[Tensor, Tensor | None]:
        return self.model(dict(inputs))["sentence_embedding"], None


class SentenceQueue(QueueRun):
    """A QueueRun fed by SimCSELoss: `see` the batch's column features before the forward (which adds its outputs to
    them), `remember` after the loss. `advanced` is set by SimCSECallback: without it the queue would never change."""

    encoder_class = SentenceMomentumEncoder

    def __init__(self, size: int, momentum: float):
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        super().__init__(size, momentum, group_size=None)
        self.advanced = False
        self.anchor_inputs: dict[str, Tensor] | None = None
        self.text_ids: Tensor | None = None  # (2B,) the rows [a_0, p_0, a_1, p_1, ...]

    def see(self, features: list[dict[str, Tensor]]) -> None:
        if len(features) == 2:
            self.anchor_inputs = dict(features[0])
            anchors, positives = (token_text_ids(f) for f in features)
            self.text_ids = torch.stack([anchors, positives], dim=1).reshape(-1)

    def for_step(self, device: torch.device) -> dict:
        """contrastive_loss's text_ids (the rows', on the embeddings' device: a gather needs them there) and queue."""
        return {"text_ids": None if self.text_ids is None else self.text_ids.to(device), "queue": self.entries()}

    def remember_anchors(self, model: nn.Module, rows: Tensor) -> None:
        """rows (2B, D): the step's rows [a_0, p_0, ...]; the anchors' entries wait for the optimizer step."""
        if not self.advanced:
            raise ConfigError("SimCSELoss(queue_size=...) needs SimCSECallback(loss) in the trainer's callbacks: it "
                              "advances the queue after each optimizer step and saves it with each checkpoint")
        if self.text_ids is None or self.anchor_inputs is None:
            raise ValueError("the queue needs the batch's features: call the loss with them, not with embeddings")
        if self.momentum > 0:
            self._ensure_encoder(extract_model_from_parallel(model))
            assert self.encoder is not None
            queued, _ = self.encoder.embed(self.anchor_inputs, False)
        else:
            queued = ST_LAYOUT.anchors_of(rows.detach())
        self.add_pending(QueueEntries(queued, ST_LAYOUT.anchors_of(self.text_ids.to(queued.device))))


class TopicBatchesSampler:
    """One dataset's topic batches for the trainer's DataLoader (`batch_sampler`): batches of `batch_size` cut from
    a TopicBatchSampler whose windows are `batch_size` x processes (accelerate deals the batches of a window out to
    the processes in turn). Clustered when a model is bound (SimCSECallback) or with `options.encoder`; the last
    incomplete window is dropped. `shares`: each batch's share of rows from its most common cluster, as drawn."""

    def __init__(self, options: TopicBatches, dataset, batch_size: int, seed: int):
        self.options, self.dataset, self.batch_size, self.seed = options, dataset, batch_size, seed
        self.window = batch_size * distributed.world_size()
        columns = [c for c in dataset.column_names if c not in ("label", "labels", "score", "scores")]
        self.column = options.column or columns[0]
        if self.column not in dataset.column_names:
            raise ConfigError(f"TopicBatches: no column {self.column!r} to cluster (columns: {dataset.column_names})")
        if len(dataset) < max(self.window, options.clusters):
            raise ConfigError(f"TopicBatches: {len(dataset)} examples for batches of {self.window} and "
                              f"{options.clusters} clusters")  # fmt: skip
        self.rows = list(zip(*(dataset[c] for c in columns))) if options.no_duplicates else None
        self.topic: TopicBatchSampler | None = None
        self.model: nn.Module | None = None
        self.epoch = 0
        self.shares: list[float] = []

    def __len__(self) -> int:
        return len(self.dataset) // self.window * self.window // self.batch_size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if self.topic is not None:
            self.topic.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        if self.topic is None:
            self.start(self.cluster())
        assert self.topic is not None
        batch: list[int] = []
        for index in self.topic:  # drawn window by window: a re-clustering changes the windows not read yet
            batch.append(index)
            if len(batch) == self.batch_size:
                self.shares.append(torch.bincount(self.topic.assignment[batch]).max().item() / len(batch))
                yield batch
                batch = []

    def start(self, assignment: Tensor) -> None:
        self.topic = TopicBatchSampler(assignment, self.window, self.options.share, seed=self.seed, rows=self.rows,
                                       no_duplicates=self.options.no_duplicates)  # fmt: skip
        self.topic.set_epoch(self.epoch)

    def cluster(self) -> Tensor:
        """The corpus column embedded by the options' encoder (or the bound model, in eval mode) and clustered, on
        process 0; every process returns process 0's assignment."""
        encoder = self.options.encoder or self.model
        if encoder is None:
            raise ConfigError("TopicBatches clusters with the model being trained: pass callbacks=[SimCSECallback("
                              "loss, batches)] to the trainer, or TopicBatches(encoder=...)")  # fmt: skip
        assignment = None
        if distributed.rank() == 0:
            assignment = cluster_corpus(lambda texts: encode(encoder, texts), self.dataset[self.column],
                                        self.options.clusters, seed=self.seed)  # fmt: skip
        return distributed.broadcast_object(assignment)

    def recluster(self, step: int, accumulation: int) -> None:
        assert self.topic is not None
        self.topic.recluster_after(step, accumulation, self.cluster())

    def checkpoint_files(self) -> list[str]:
        return [TOPIC_CLUSTERS_FILE]

    def save_checkpoint(self, folder: str) -> None:
        """Its part of a checkpoint (training.checkpoints.CheckpointPart): the clusterings in force."""
        assert self.topic is not None  # clustered at the train's start
        torch.save([entry.as_dict() for entry in self.topic.schedule], os.path.join(folder, TOPIC_CLUSTERS_FILE))

    def load_state(self, folder: str) -> None:
        path = os.path.join(folder, TOPIC_CLUSTERS_FILE)
        if not os.path.isfile(path):
            raise ConfigError(f"TopicBatches: {os.path.basename(folder)} holds no {TOPIC_CLUSTERS_FILE}: it was not "
                              "trained with topic batches")  # fmt: skip
        schedule = [InForce(**entry) for entry in torch.load(path)]
        self.start(schedule[0].assignment)
        assert self.topic is not None
        self.topic.load_schedule(schedule)


@torch.no_grad()
def encode(model: nn.Module, texts: list[str]) -> Tensor:
    """(n, D): `texts` embedded by a SentenceTransformer in eval mode (its mode restored after)."""
    model = extract_model_from_parallel(model)
    training = model.training
    try:
        return model.encode(texts, convert_to_tensor=True, show_progress_bar=False).float().cpu()
    finally:
        model.train(training)


class TopicBatches:
    """`SentenceTransformerTrainingArguments(batch_sampler=TopicBatches(...))`: every gathered batch from one
    k-means cluster of the corpus (docs/topic-batches.md). clusters: k; share: the part of a batch from one cluster
    (the rest at random); recluster_steps: re-cluster with the model every K optimizer steps (0: never); column: the
    column clustered (default the first, the anchor); encoder: a SentenceTransformer that clusters instead of the
    model being trained; no_duplicates: no text twice in a window."""

    def __init__(self, clusters: int = 64, share: float = 1.0, recluster_steps: int = 0, column: str | None = None,
                 encoder: nn.Module | None = None, no_duplicates: bool = False):  # fmt: skip
        if clusters < 1:
            raise ConfigError(f"TopicBatches: clusters must be >= 1, got {clusters}")
        if not 0.0 < share <= 1.0:
            raise ConfigError(f"TopicBatches: share must be in (0, 1], got {share}")
        if recluster_steps < 0 or (recluster_steps and encoder is not None):
            raise ConfigError("TopicBatches: recluster_steps must be >= 0, and 0 with an encoder of its own (a fixed "
                              f"encoder gives the same clusters again), got {recluster_steps}")  # fmt: skip
        self.clusters, self.share, self.recluster_steps = clusters, share, recluster_steps
        self.column, self.encoder, self.no_duplicates = column, encoder, no_duplicates
        self.samplers: list[TopicBatchesSampler] = []

    def __call__(self, dataset, batch_size: int, drop_last: bool = False, valid_label_columns=None, generator=None,
                 seed: int = 0) -> TopicBatchesSampler:  # fmt: skip
        self.samplers.append(TopicBatchesSampler(self, dataset, batch_size, seed))
        return self.samplers[-1]


def resumed_checkpoint(args, state, required: bool = True) -> str | None:
    """The checkpoint a run resumes from (its state says the step; the Trainer tells callbacks no path): the one of
    output_dir at that step; ConfigError when there is none and it is `required`."""
    if not state.global_step:
        return None
    folder = checkpoint_path(args.output_dir, state.global_step)
    if not os.path.isdir(folder) and not required:
        return None
    if not os.path.isdir(folder):
        raise ConfigError(f"SimCSECallback: resuming at step {state.global_step}, but output_dir has no "
                          f"{os.path.basename(folder)}: resume from a checkpoint of output_dir")  # fmt: skip
    return folder


class SimCSECallback(CheckpointCommit):
    """The trainer's side of SimCSELoss's queue and of TopicBatches (either may be None). It commits each checkpoint
    as simcse-hn's trainer does (training.checkpoints.CheckpointCommit): the queue's and the sampler's files, then the
    manifest, last; so it goes after any other callback that writes into checkpoints."""

    def __init__(self, loss: nn.Module | None = None, batches: TopicBatches | None = None):
        super().__init__()
        self.loss, self.batches = loss, batches
        self.queue: SentenceQueue | None = getattr(loss, "queue", None)
        self.sampler: TopicBatchesSampler | None = None
        self.logged_memory = False

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        if self.queue is not None:
            engine = sharding_engine(args)  # accelerate launch's config included, not only --fsdp / --deepspeed
            if self.queue.momentum > 0 and engine:
                raise ConfigError(f"SimCSELoss: momentum with FSDP or DeepSpeed is not available ({engine}: the "
                                  "momentum encoder would be a whole copy of a sharded model); use momentum=0, a "
                                  "memory bank")  # fmt: skip
            self.queue.advanced = True
        if self.batches is not None:
            self.sampler = self._train_sampler(train_dataloader)
            self.sampler.model = model
        self.parts = [part for part in (self.queue, self.sampler) if part is not None]
        if args.save_total_limit == 1 and self.parts:
            logger.warning("save_total_limit 1: transformers deletes the last whole checkpoint before the new one's "
                           "manifest is written; keep 2 or more so a run killed while saving can resume")  # fmt: skip
        checkpoint = resumed_checkpoint(args, state, required=self.queue is not None or self.sampler is not None)
        if checkpoint is not None:
            self.load_state(checkpoint, args.device)
        elif self.sampler is not None and self.sampler.topic is None:
            self.sampler.start(self.sampler.cluster())

    def _train_sampler(self, loader) -> TopicBatchesSampler:
        """The TopicBatchesSampler of the training loader (accelerate may wrap it once)."""
        found = getattr(loader, "batch_sampler", None)
        found = getattr(found, "batch_sampler", found)
        if isinstance(found, TopicBatchesSampler):
            return found
        if not self.batches.samplers:  # type: ignore[union-attr]  # set when called
            raise ConfigError("SimCSECallback: pass the same TopicBatches as SentenceTransformerTrainingArguments("
                              "batch_sampler=...)")  # fmt: skip
        return self.batches.samplers[-1]  # type: ignore[union-attr]

    def on_epoch_begin(self, args, state, control, **kwargs):
        if self.sampler is not None:
            self.sampler.set_epoch(math.floor((state.epoch or 0.0) + 1e-6))

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.queue is not None:
            self.queue.step_end(extract_model_from_parallel(model))
            if not self.logged_memory and state.is_world_process_zero:
                self.queue.log_memory()
                self.logged_memory = True
        every = self.batches.recluster_steps if self.batches is not None else 0
        if every and state.global_step % every == 0 and state.global_step < state.max_steps:
            self.sampler.recluster(state.global_step, args.gradient_accumulation_steps)  # type: ignore[union-attr]

    def save_state(self, folder: str) -> None:
        """The queue (QUEUE_FILE) and the topic schedule (TOPIC_CLUSTERS_FILE) into checkpoint `folder` (on_save:
        CheckpointCommit writes them, then the manifest)."""
        for part in self.parts:
            part.save_checkpoint(folder)

    def load_state(self, folder: str, device: torch.device | str = "cpu") -> None:
        """What save_state wrote into `folder`, once the folder is a whole checkpoint (its manifest), compared with
        this run's settings (one-line ConfigError)."""
        problem = manifest_problem(folder)
        if problem:
            raise ConfigError(f"SimCSECallback: {os.path.basename(folder)} is not a whole checkpoint ({problem}); "
                              "resume from an earlier one")  # fmt: skip
        if self.queue is not None or os.path.isfile(os.path.join(folder, QUEUE_FILE)):
            resume_queue(self.queue, folder, device)
        if self.sampler is not None:
            self.sampler.load_state(folder)
        elif os.path.isfile(os.path.join(folder, TOPIC_CLUSTERS_FILE)):  # a resume never switches batch orders
            raise ConfigError(f"SimCSECallback: {os.path.basename(folder)} was trained with TopicBatches "
                              f"({TOPIC_CLUSTERS_FILE}); pass them again to resume it")  # fmt: skip

    def on_log(self, args, state, control, logs=None, **kwargs):
        """The loss's diagnostics over the logging window and the batches' mean cluster share, into the logs (and the
        run's log history); reporting callbacks placed before this one do not see them."""
        if logs is None or "loss" not in logs:
            return
        added = {}
        sums, count = getattr(self.loss, "metric_sums", None), getattr(self.loss, "metric_count", 0)
        if sums and count:
            added.update(window_means(sums, count))
            sums.clear()
            self.loss.metric_count = 0  # type: ignore[union-attr]
        if self.sampler is not None and self.sampler.shares:
            added["topic_cluster_share"] = round(sum(self.sampler.shares) / len(self.sampler.shares), 6)
            self.sampler.shares.clear()
        logs.update(added)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(added)
