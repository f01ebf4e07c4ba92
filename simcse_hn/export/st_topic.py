"""Topic batches (docs/topic-batches.md) inside sentence-transformers' `SentenceTransformerTrainer`:
`SentenceTransformerTrainingArguments(batch_sampler=TopicBatches(...))` with `SimCSECallback(loss, batches)`.

* `TopicBatches`: what `batch_sampler=` takes. sentence-transformers calls it for every loader it builds, the
  evaluation set's too, and says neither which nor hands it the model. It answers with a `TopicBatchesSampler` per
  dataset, and while a train runs (SimCSECallback's on_train_begin to on_train_end: the training loader is built by
  then) with sentence-transformers' own default, `DefaultBatchSampler` over a `RandomSampler`: an evaluation loss is
  computed on the batches sentence-transformers would give it.
* `TopicBatchesSampler`: a `DefaultBatchSampler` (batch_size, drop_last, generator, seed, set_epoch), so that
  sentence-transformers' `ProportionalBatchSampler` and `RoundRobinBatchSampler` take one per dataset of a
  `DatasetDict`. SimCSECallback claims the samplers of the training loader when training starts (the model clusters
  the dataset's column, then every window of batch x processes is cut from one cluster: simcse_hn.data.topic_batches'
  TopicBatchSampler); a sampler no training claimed (an evaluation before or after training) yields
  sentence-transformers' default batches. Topic batches always drop an epoch's last incomplete window.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch
from accelerate.utils import extract_model_from_parallel
from sentence_transformers.base.sampler import DefaultBatchSampler
from torch import Tensor, nn
from torch.utils.data import RandomSampler

from simcse_hn.data.topic_batches import TOPIC_CLUSTERS_FILE, InForce, TopicBatchSampler, cluster_corpus
from simcse_hn.errors import ConfigError
from simcse_hn.training import distributed

TAS_B_CITATION = """@inproceedings{hofstatter2021efficiently,
  title = {Efficiently Teaching an Effective Dense Retriever with Balanced Topic Aware Sampling},
  author = {Hofst{\\"a}tter, Sebastian and Lin, Sheng-Chieh and Yang, Jheng-Hong and Lin, Jimmy and Hanbury, Allan},
  booktitle = {Proceedings of the 44th International ACM SIGIR Conference},
  year = {2021}
}"""
NOT_TEXT = ("label", "labels", "score", "scores", "dataset_name")


def default_batch_sampler(
    dataset, batch_size: int, drop_last: bool, valid_label_columns=None, generator=None, seed: int = 0
) -> DefaultBatchSampler:
    """What sentence-transformers' trainer gives a dataset by default (BatchSamplers.BATCH_SAMPLER)."""
    return DefaultBatchSampler(
        RandomSampler(dataset, generator=generator),
        batch_size=batch_size,
        drop_last=drop_last,
        valid_label_columns=valid_label_columns,
        generator=generator,
        seed=seed,
    )


class TopicBatchesSampler(DefaultBatchSampler):
    """One dataset's batches: topic batches once SimCSECallback claims it for training (`claim`), else
    sentence-transformers' default batches (an evaluation set's loader built outside a train). `shares`: each topic
    batch's share of rows from its most common cluster, as drawn."""

    def __init__(
        self,
        options: TopicBatches,
        dataset,
        batch_size: int,
        drop_last: bool = False,
        valid_label_columns=None,
        generator=None,
        seed: int = 0,
    ):
        super().__init__(
            dataset,
            batch_size=batch_size,
            drop_last=drop_last,
            valid_label_columns=valid_label_columns,
            generator=generator,
            seed=seed,
        )
        self.options = options
        self.dataset = dataset
        self.default = default_batch_sampler(dataset, batch_size, drop_last, valid_label_columns, generator, seed)
        self.window = batch_size * distributed.world_size()
        columns = [c for c in dataset.column_names if c not in NOT_TEXT]
        self.column = options.column or (columns[0] if columns else None)
        self.rows = list(zip(*(dataset[c] for c in columns))) if options.no_duplicates else None
        self.training = False  # claimed by SimCSECallback for a train
        self.iterated_as_default = False
        self.topic: TopicBatchSampler | None = None
        self.model: nn.Module | None = None
        self.shares: list[float] = []

    def problem(self) -> str | None:
        """Why this dataset cannot give topic batches (one phrase), or None."""
        if self.column not in self.dataset.column_names:
            return f"no column {self.column!r} to cluster (columns: {self.dataset.column_names})"
        if len(self.dataset) < max(self.window, self.options.clusters):
            return f"{len(self.dataset)} examples for batches of {self.window} and {self.options.clusters} clusters"
        return None

    def claim(self, model: nn.Module | None) -> None:
        """For training (SimCSECallback at the train's start): ConfigError (one line) when it cannot give topic
        batches."""
        problem = self.problem()
        if problem:
            raise ConfigError(f"TopicBatches: {problem}")
        self.training = True
        self.model = model

    def __len__(self) -> int:
        if self.iterated_as_default or (not self.training and self.problem()):
            return len(self.default)
        return len(self.dataset) // self.window * self.window // self.batch_size

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        if self.topic is not None:
            self.topic.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        if not self.training:
            if not self.options.bound:
                raise ConfigError(
                    "TopicBatches needs SimCSECallback(loss, batches) in the trainer's callbacks: it "
                    "clusters with the model and tells training batches from evaluation ones"
                )
            self.iterated_as_default = True  # an evaluation outside training: sentence-transformers' batches
            yield from self.default
            return
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
        self.topic = TopicBatchSampler(
            assignment,
            self.window,
            self.options.share,
            seed=self.seed,
            rows=self.rows,
            no_duplicates=self.options.no_duplicates,
        )
        self.topic.set_epoch(self.epoch)

    def cluster(self) -> Tensor:
        """The column embedded by the options' encoder (or the claiming model, in eval mode) and clustered, on
        process 0; every process returns process 0's assignment."""
        encoder = self.options.encoder or self.model
        assert encoder is not None  # claimed with a model, or the options have an encoder
        assignment = None
        if distributed.rank() == 0:
            assignment = cluster_corpus(
                lambda texts: encode(encoder, texts), self.dataset[self.column], self.options.clusters, seed=self.seed
            )
        return distributed.broadcast_object(assignment)

    def recluster(self, step: int, accumulation: int) -> None:
        assert self.topic is not None
        self.topic.recluster_after(step, accumulation, self.cluster())

    def schedule(self) -> list[dict]:
        assert self.topic is not None  # clustered at the train's start
        return [entry.as_dict() for entry in self.topic.schedule]

    def load_schedule(self, entries: list[dict]) -> None:
        schedule = [InForce(**entry) for entry in entries]
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

    citation = TAS_B_CITATION

    def __init__(
        self,
        clusters: int = 64,
        share: float = 1.0,
        recluster_steps: int = 0,
        column: str | None = None,
        encoder: nn.Module | None = None,
        no_duplicates: bool = False,
    ):
        if clusters < 1:
            raise ConfigError(f"TopicBatches: clusters must be >= 1, got {clusters}")
        if not 0.0 < share <= 1.0:
            raise ConfigError(f"TopicBatches: share must be in (0, 1], got {share}")
        if recluster_steps < 0 or (recluster_steps and encoder is not None):
            raise ConfigError(
                "TopicBatches: recluster_steps must be >= 0, and 0 with an encoder of its own (a fixed "
                f"encoder gives the same clusters again), got {recluster_steps}"
            )
        self.clusters = clusters
        self.share = share
        self.recluster_steps = recluster_steps
        self.column = column
        self.encoder = encoder
        self.no_duplicates = no_duplicates
        self.samplers: list[TopicBatchesSampler] = []  # every one made outside a train, the last train's among them
        self.bound = False  # a SimCSECallback in a trainer's callbacks (on_init_end or on_train_begin)
        self.in_training = False  # between its on_train_begin and on_train_end

    def __call__(
        self,
        dataset,
        batch_size: int,
        drop_last: bool = False,
        valid_label_columns=None,
        generator=None,
        seed: int = 0,
    ) -> DefaultBatchSampler:
        if self.in_training:  # the training loader is built before on_train_begin: this one is an evaluation's
            return default_batch_sampler(dataset, batch_size, drop_last, valid_label_columns, generator, seed)
        sampler = TopicBatchesSampler(self, dataset, batch_size, drop_last, valid_label_columns, generator, seed)
        self.samplers.append(sampler)
        return sampler

    def __repr__(self) -> str:
        encoder = "" if self.encoder is None else ", encoder=<a SentenceTransformer>"
        return (
            f"TopicBatches(clusters={self.clusters}, share={self.share}, recluster_steps={self.recluster_steps}, "
            f"column={self.column!r}, no_duplicates={self.no_duplicates}{encoder})"
        )


def training_samplers(loader) -> list:
    """The per-dataset batch samplers of a training loader: its batch sampler (accelerate may wrap it once), or a
    multi-dataset sampler's (ProportionalBatchSampler, RoundRobinBatchSampler: `batch_samplers`)."""
    found = getattr(loader, "batch_sampler", None)
    found = getattr(found, "batch_sampler", found)
    return list(getattr(found, "batch_samplers", [found] if found is not None else []))


class TopicSchedules:
    """The training samplers' part of a checkpoint (training.checkpoints.CheckpointPart): the clusterings in force of
    each dataset's sampler (one dataset: its list, as before several were possible), read back on resume."""

    def __init__(self, samplers: list[TopicBatchesSampler]):
        self.samplers = samplers

    def checkpoint_files(self) -> list[str]:
        return [TOPIC_CLUSTERS_FILE]

    def save_checkpoint(self, folder: str) -> None:
        schedules = [sampler.schedule() for sampler in self.samplers]
        saved = schedules[0] if len(schedules) == 1 else {"datasets": schedules}
        torch.save(saved, os.path.join(folder, TOPIC_CLUSTERS_FILE))

    def load_state(self, folder: str) -> None:
        path = os.path.join(folder, TOPIC_CLUSTERS_FILE)
        name = os.path.basename(folder)
        if not os.path.isfile(path):
            raise ConfigError(
                f"TopicBatches: {name} holds no {TOPIC_CLUSTERS_FILE}: it was not trained with topic batches"
            )
        saved = torch.load(path)
        schedules = saved["datasets"] if isinstance(saved, dict) else [saved]
        if len(schedules) != len(self.samplers):
            raise ConfigError(
                f"TopicBatches: {name} was trained on {len(schedules)} datasets, this run has {len(self.samplers)}"
            )
        for sampler, entries in zip(self.samplers, schedules):
            sampler.load_schedule(entries)
