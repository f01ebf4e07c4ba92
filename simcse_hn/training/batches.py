"""The training batches of SimCSETrainer: which examples go together, and the DataLoader the Trainer asks for.

* `no_duplicates` (default: on for paired data): data.sampling.NoDuplicatesSampler, no text twice in one gathered
  batch.
* `topic_batches`: data.topic_batches.TopicBatchSampler over the corpus clustered once before the first step (by
  `topic_encoder`, or the model), re-clustered by the model every `topic_recluster_steps` optimizer steps.
* A streamed corpus: this process's share as it comes. Otherwise the Trainer's own sampler and loader.

`TrainingBatches` holds the sampler, and as a callback keeps it in step with the run: its epoch, its re-clustering,
and the topic assignments in force, a part of each checkpoint (TOPIC_CLUSTERS_FILE, written by
training.checkpoints.CheckpointCommit), so a resumed run draws the batches of the uninterrupted one.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable

import datasets
import torch
from accelerate.data_loader import prepare_data_loader
from torch import Tensor
from transformers import TrainerCallback
from transformers.trainer_utils import seed_worker

from simcse_hn.data.sampling import NoDuplicatesSampler
from simcse_hn.data.topic_batches import TOPIC_CLUSTERS_FILE, InForce, TopicBatchSampler, cluster_corpus
from simcse_hn.errors import ConfigError
from simcse_hn.evaluation.encoding import load_encoder
from simcse_hn.files import portable_name
from simcse_hn.training import distributed

Encode = Callable[[list[str]], Tensor]  # texts -> embeddings (n, D)


class TrainingBatches(TrainerCallback):
    """The training run's sampler (`sampler`, once the loader is made) and its loader (`loader`). `paired`: rows come
    as paired examples (no_duplicates is then on by default). `model_encoder()`: an encoder of texts by the model as
    it is now, for topic clustering without `topic_encoder` and for every re-clustering."""

    def __init__(self, args, paired: bool, model_encoder: Callable[[], Encode]):
        self.args, self.model_encoder = args, model_encoder
        self.no_duplicates: bool = paired if args.no_duplicates is None else args.no_duplicates
        self.sampler: NoDuplicatesSampler | TopicBatchSampler | None = None
        self.dataset: datasets.Dataset | None = None  # the sampler's
        self.assignment: Tensor | None = None  # (n,) int64: each example's cluster, first made
        self.schedule: list[InForce] | None = None  # a resumed run's: the checkpoint's assignments in force

    @property
    def seed(self) -> int:
        return self.args.data_seed if self.args.data_seed is not None else self.args.seed

    def make_sampler(self, dataset) -> NoDuplicatesSampler | TopicBatchSampler | None:
        """With `no_duplicates`, a sampler whose every window of one gathered batch (per-device batch x processes, in
        the order accelerate shards batches) holds no text twice; with `topic_batches`, a TopicBatchSampler. Seeded
        by data_seed (or seed) and the epoch, so every process draws the same order and a resumed run the same
        batches. None: the Trainer's own sampler."""
        args = self.args
        in_memory = dataset is not None and isinstance(dataset, datasets.Dataset)
        if args.topic_batches and not in_memory:
            raise ValueError("topic_batches: needs a corpus in memory (a stream cannot be clustered up front)")
        if not (self.no_duplicates or args.topic_batches) or not in_memory:
            return None
        self.dataset = dataset
        window = args.per_device_train_batch_size * (args.world_size if args.gathers else 1)
        columns = [c for c in dataset.column_names if c == "text" or c in ("anchor", "positive")
                   or c.startswith("negative_")]  # fmt: skip
        rows = list(zip(*(dataset[c] for c in columns)))
        if not args.topic_batches:
            return NoDuplicatesSampler(rows, window, seed=self.seed, drop_last=args.dataloader_drop_last)
        # each example's cluster: made once per run, by `topic_encoder` or the model before its first step, and the
        # same on every process (cluster); a resumed run reads its checkpoint's (TOPIC_CLUSTERS_FILE)
        if self.assignment is None:
            self.assignment = self.cluster(dataset, encoder=args.topic_encoder)
        if len(self.assignment) != len(dataset):
            raise ConfigError(f"topic_batches: {len(self.assignment)} cluster assignments (from the checkpoint) for "
                              f"{len(dataset)} training examples: another corpus")  # fmt: skip
        sampler = TopicBatchSampler(self.assignment, window, args.topic_share, seed=self.seed, rows=rows,
                                    no_duplicates=self.no_duplicates)  # fmt: skip
        if self.schedule is not None:
            sampler.load_schedule(self.schedule)
        return sampler

    def loader(self, dataset, collator, accelerator) -> torch.utils.data.DataLoader | None:
        """The batches of `make_sampler`, prepared by `accelerator` as the Trainer prepares its own; None: the
        Trainer's own loader. A streamed corpus (data.load_sentence_stream) is already this process's share: its
        batches on this process's device, without accelerate's re-sharding or its dispatching from process 0.
        Resuming, the Trainer skips the batches already trained on, so the run goes on with the sentences it would
        see next."""
        args = self.args
        workers = {"num_workers": args.dataloader_num_workers, "pin_memory": args.dataloader_pin_memory}
        if isinstance(dataset, datasets.IterableDataset):
            loader = torch.utils.data.DataLoader(dataset, batch_size=args.train_batch_size, collate_fn=collator,
                                                 drop_last=args.dataloader_drop_last, **workers)  # fmt: skip
            return prepare_data_loader(loader, args.device, num_processes=1, process_index=0, put_on_device=True,
                                       dispatch_batches=False)  # fmt: skip
        self.sampler = sampler = self.make_sampler(dataset)
        if sampler is None:
            return None
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=args.train_batch_size, sampler=sampler, collate_fn=collator,
            drop_last=args.dataloader_drop_last, persistent_workers=args.dataloader_persistent_workers,
            prefetch_factor=args.dataloader_prefetch_factor, **workers,
            worker_init_fn=functools.partial(seed_worker, num_workers=args.dataloader_num_workers,
                                             rank=args.process_index),
        )  # fmt: skip
        return accelerator.prepare(loader)

    def cluster(self, dataset: datasets.Dataset, encoder: str | None) -> Tensor:
        """The corpus (anchors for pairs) embedded by `encoder` (None: the model as it is now) and clustered, on
        process 0; every process returns process 0's assignment."""
        assignment = None
        if distributed.rank() == 0:
            texts = dataset["anchor" if "anchor" in dataset.column_names else "text"]
            if encoder is None:
                encode = self.model_encoder()
            else:
                bar = f"topic batches: encoding the corpus with {portable_name(encoder)}"
                encode = load_encoder(encoder, device=str(self.args.device), show_progress_bar=bar)[0]
            assignment = cluster_corpus(encode, texts, self.args.topic_clusters, seed=self.seed)
        return distributed.broadcast_object(assignment)

    def recluster(self, step: int) -> None:
        """Re-cluster with the model after `step` optimizer steps (TopicBatchSampler.recluster_after says from which
        window on), on every process together."""
        assert isinstance(self.sampler, TopicBatchSampler)
        assignment = self.cluster(self.dataset, encoder=None)
        self.sampler.recluster_after(step, self.args.gradient_accumulation_steps, assignment)

    def resume(self, checkpoint) -> None:
        """Before training: the topic assignments in force that `checkpoint` (a folder; anything else: not resuming)
        saved. A checkpoint and a run that disagree on topic batches are refused in one line (ConfigError): a resume
        never switches between topic and random batches."""
        if not isinstance(checkpoint, str):
            return
        path, name = os.path.join(checkpoint, TOPIC_CLUSTERS_FILE), os.path.basename(os.path.normpath(checkpoint))
        if self.args.topic_batches != os.path.isfile(path):
            trained, now = ("without", "with") if self.args.topic_batches else ("with", "without")
            raise ConfigError(f"topic_batches: {name} was trained {trained} topic batches ({TOPIC_CLUSTERS_FILE}); "
                              f"this run is {now}")  # fmt: skip
        if self.args.topic_batches:
            self.schedule = [InForce(**entry) for entry in torch.load(path)]
            self.assignment = self.schedule[0].assignment

    # --- the callback: the run's epoch and steps reach the sampler ---

    def on_epoch_begin(self, args, state, control, **kwargs):
        """accelerate's `set_epoch` does not reach a sampler under the batch-skipping wrapper of a resumed
        multi-process run; the Trainer's state says the epoch in every case (a resumed run's state.epoch is the
        checkpoint's, e.g. 1.5 -> epoch 1)."""
        if self.sampler is not None:
            self.sampler.set_epoch(math.floor((state.epoch or 0.0) + 1e-6))

    def on_step_end(self, args, state, control, **kwargs):
        """With `topic_recluster_steps` K: re-cluster after every K-th optimizer step but the last."""
        every = args.topic_recluster_steps if args.topic_batches else None
        if every and state.global_step % every == 0 and state.global_step < state.max_steps:
            self.recluster(state.global_step)

    # --- a part of each checkpoint (training.checkpoints.CheckpointCommit) ---

    def checkpoint_files(self) -> list[str]:
        return [TOPIC_CLUSTERS_FILE] if isinstance(self.sampler, TopicBatchSampler) else []

    def save_checkpoint(self, folder: str) -> None:
        if isinstance(self.sampler, TopicBatchSampler):
            torch.save([entry.as_dict() for entry in self.sampler.schedule], os.path.join(folder, TOPIC_CLUSTERS_FILE))
