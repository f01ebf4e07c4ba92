"""The training data as the run builder (cli/run_builder.py) reads it: the training set in its resolved format, and
its hash."""

from __future__ import annotations

import os

import datasets

from simcse_hn.configuration.data_format import ResolvedData
from simcse_hn.data.pairs import load_pairs
from simcse_hn.data.sentences import load_sentence_stream, load_sentences
from simcse_hn.errors import ConfigError, DataError
from simcse_hn.provenance import data_sha256


def load_training_data(data_args, data: ResolvedData, dataset=None) -> tuple[datasets.Dataset, str]:
    """The training set in the format resolved (`data`, simcse_hn.configuration.data_format.resolve_data): single
    sentences (a `text` column, load_sentences as SimCSE reads them) or paired examples (`anchor`, `positive`,
    `negative_1..k`: simcse_hn.data.pairs, in the columns resolved). `dataset`: a Hub dataset's split, already
    loaded."""
    source = data_args.train_source
    hub = {"config_name": data_args.dataset_config_name, "split": data_args.dataset_split, "dataset": dataset}
    if data.format == "sentences":
        sentences = load_sentences(
            source,
            data_args.text_column,
            data_args.train_data_files,
            data_args.max_train_samples,
            data_args.drop_duplicates,
            **hub,
        )
        return datasets.Dataset.from_dict({"text": sentences}), data.format
    dataset = load_pairs(
        source,
        data_args.anchor_column,
        data_args.positive_column,
        data_args.negative_columns,
        data_args.train_data_files,
        data_args.max_train_samples,
        data_args.drop_duplicates,
        columns=data.columns,
        **hub,
    )
    return dataset, data.format


def training_set(data_args, training_args, data: ResolvedData, hub_dataset) -> tuple[object, str, int | None]:
    """The training set as the run reads it -> (dataset, format, examples read; None for a stream). A corpus of fewer
    examples than one batch, or than the topic clusters, is refused in one line."""
    global_batch = training_args.per_device_train_batch_size * training_args.world_size
    if data_args.streaming:  # single sentences (resolve_run refuses a streamed paired corpus)
        stream = load_sentence_stream(
            data_args.train_source,
            data_args.text_column,
            data_args.train_data_files,
            data_args.max_train_samples,
            config_name=data_args.dataset_config_name,
            split=data_args.dataset_split,
            shuffle_buffer=data_args.streaming_shuffle_buffer,
            seed=training_args.data_seed if training_args.data_seed is not None else training_args.seed,
            rank=training_args.process_index,
            world_size=training_args.world_size,
            min_sentences=global_batch,
        )
        return stream, "sentences", None
    dataset, data_format = load_training_data(data_args, data, hub_dataset)
    unit, count = "sentences" if data_format == "sentences" else "examples", len(dataset)
    if count < global_batch:
        raise DataError(
            f"{data_args.train_source}: {count} {unit}, fewer than one batch "
            f"({training_args.per_device_train_batch_size} x {training_args.world_size} processes)"
        )
    if training_args.topic_batches and training_args.topic_clusters > count:
        raise ConfigError(f"topic_clusters: {training_args.topic_clusters} clusters for {count} {unit}")
    return dataset, data_format, count


def training_data_sha256(data_args, train_dataset) -> str | None:
    """The hash of the training data as read: the local file's bytes, else the Hub dataset's id and fingerprint
    (a stream: its source, configuration and split, since a stream has no fingerprint to hash)."""
    source = data_args.train_source
    if source is not None and os.path.exists(source):
        return data_sha256(source)
    if data_args.streaming:
        return data_sha256(f"{source}:{data_args.dataset_config_name}:{data_args.dataset_split}")
    return data_sha256(train_dataset)
