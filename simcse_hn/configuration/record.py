"""The run's record (simcse_hn.run_record.RunRecord) built once from the parsed arguments and what the data and the
model's files tell (`RunFacts`): every argument lands in a typed field (`CLAIMED`) or, if neither claimed nor
ALLOWLISTed, in `optimisation.arguments` as JSON, so an argument added later (ours or a new transformers') is
recorded and compared on resume by default."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import importlib.metadata
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from simcse_hn.configuration.data_format import ResolvedData
from simcse_hn.configuration.objective import ObjectiveFlags
from simcse_hn.files import file_sha256, source_record
from simcse_hn.losses.registry import portable_loss_name
from simcse_hn.record_compare import ALLOWLIST
from simcse_hn.run_record import (
    RECORD_VERSION,
    DataRecord,
    GuideRecord,
    LoraRecord,
    MethodRecord,
    ModelRecord,
    OptimisationRecord,
    Provenance,
    QueueRecord,
    RunRecord,
    Source,
    TopicRecord,
    frozen,
)

# argument field -> the record field that holds it; every other argument not in ALLOWLIST: optimisation.arguments
CLAIMED = {
    "model_name_or_path": "model.base_model",
    "tokenizer_name_or_path": "model.tokenizer",
    "pooler": "model.pooler",
    "mlp_only_train": "model.mlp_only_train",
    "dropout": "model.dropout",
    "max_seq_length": "model.max_seq_length",
    "eval_max_seq_length": "model.eval_max_seq_length",
    "inference_max_seq_length": "model.inference_max_seq_length",
    "lora_r": "model.lora.r",
    "lora_alpha": "model.lora.alpha",
    "lora_dropout": "model.lora.dropout",
    "lora_target_modules": "model.lora.target_modules",
    "train_file": "data.source",
    "dataset_name": "data.source",
    "dataset_config_name": "data.config_name",
    "dataset_split": "data.split",
    "train_data_files": "data.data_files",
    "data_format": "data.format",
    "text_column": "data.columns",
    "anchor_column": "data.columns",
    "positive_column": "data.columns",
    "negative_columns": "data.columns",
    "max_train_samples": "data.max_train_samples",
    "drop_duplicates": "data.drop_duplicates",
    "word_repetition": "data.word_repetition",
    "streaming": "data.streaming",
    "streaming_shuffle_buffer": "data.shuffle_buffer",
    "eval_file": "data.eval_file",
    "eval_split": "data.eval_split",
    "loss": "method.loss",
    "loss_options": "method.options",
    **{f.name: "method.options" for f in dataclasses.fields(ObjectiveFlags)},
    "temperature": "method.temperature",
    "contrast_form": "method.contrast_form",
    "hard_negative_weight": "method.hard_negative_weight",
    "no_duplicates": "method.no_duplicates",
    "guide_model": "method.guide.model",
    "guide_margin": "method.guide.margin",
    "topic_batches": "method.topic_batches",
    "topic_clusters": "method.topic_batches.clusters",
    "topic_share": "method.topic_batches.share",
    "topic_encoder": "method.topic_batches.encoder",
    "topic_recluster_steps": "method.topic_batches.recluster_steps",
    "queue_size": "method.queue.size",
    "momentum": "method.queue.momentum",
    "learning_rate": "optimisation.learning_rate",
    "per_device_train_batch_size": "optimisation.per_device_train_batch_size",
    "gradient_accumulation_steps": "optimisation.gradient_accumulation_steps",
    "seed": "optimisation.seed",
    "data_seed": "optimisation.data_seed",
    "max_steps": "optimisation.max_steps",
    "num_train_epochs": "optimisation.num_train_epochs",
}
VERSIONED = ("torch", "transformers", "accelerate", "datasets", "sentence-transformers", "peft")


@dataclass(frozen=True)
class RunFacts:
    """What the run knows beyond its arguments once the data and the model's files are read (before any weights
    load): the data as resolved and read, the model's identity and lengths, the run family."""

    base_model: str  # as the user named it (a packaged model's record is its Hub id)
    data: ResolvedData
    examples: int | None  # None for a stream
    negatives_per_example: int | None
    train_sha256: str | None
    weights: str | None
    architecture: str | None
    eval_max_seq_length: int | None
    inference_max_seq_length: int | None
    run_id: str
    license: str | None
    topic_encoder: str | None  # as resolved; None: the model being trained
    code: Mapping[str, Any]
    command: str | None = None  # the command line as given (provenance.command_line: no secret, no absolute path)
    tokenizer_sha256: str | None = None
    guide_weights: str | None = None  # a separate guide's (modeling.loading.weights_identity)
    topic_encoder_weights: str | None = None


def build_record(model_args, data_args, training_args, facts: RunFacts) -> RunRecord:
    """The run's record: built once, before the model loads, from the arguments the Trainer gets."""
    return RunRecord(
        run_id=facts.run_id,
        model=_model(model_args, data_args, facts),
        data=_data(data_args, facts),
        method=_method(training_args, facts),
        optimisation=_optimisation(model_args, data_args, training_args),
        provenance=Provenance(
            code=frozen(facts.code), versions=frozen(library_versions()), started=_now(), command=facts.command
        ),
        record_version=RECORD_VERSION,
    )


def _source(name: str | None) -> Source | None:
    record = source_record(name)
    return None if record is None else Source(record["name"], record["local"])


def _model(model_args, data_args, facts: RunFacts) -> ModelRecord:
    lora = None
    if model_args.lora_r is not None:
        targets = model_args.lora_target_modules
        targets = None if targets is None else tuple(targets)
        lora = LoraRecord(model_args.lora_r, model_args.lora_alpha, model_args.lora_dropout, targets)
    return ModelRecord(
        base_model=_source(facts.base_model),
        weights=facts.weights,
        architecture=facts.architecture,
        tokenizer=_source(model_args.tokenizer_name_or_path),
        pooler=model_args.pooler,
        mlp_only_train=model_args.mlp_only_train,
        dropout=model_args.dropout,
        max_seq_length=data_args.max_seq_length,
        eval_max_seq_length=facts.eval_max_seq_length,
        inference_max_seq_length=facts.inference_max_seq_length,
        lora=lora,
        tokenizer_sha256=facts.tokenizer_sha256,
        license=facts.license,
    )


def _data(data_args, facts: RunFacts) -> DataRecord:
    data = facts.data
    if data.format == "pairs" and data.columns is not None:
        columns: tuple[str, ...] = data.columns.all
    else:
        columns = (data_args.text_column,)
    eval_file = data_args.eval_file
    return DataRecord(
        source=_source(data_args.train_source),
        sha256=facts.train_sha256,
        examples=facts.examples,
        format=data.format,
        columns=columns,
        negatives_per_example=facts.negatives_per_example,
        config_name=data_args.dataset_config_name,
        split=data_args.dataset_split,
        data_files=data_args.train_data_files,
        max_train_samples=data_args.max_train_samples,
        drop_duplicates=data_args.drop_duplicates,
        streaming=data_args.streaming,
        shuffle_buffer=data_args.streaming_shuffle_buffer if data_args.streaming else None,
        word_repetition=data_args.word_repetition,
        eval_file=_source(eval_file),
        eval_sha256=file_sha256(eval_file) if eval_file and os.path.isfile(eval_file) else None,
        eval_split=data_args.eval_split if eval_file else None,
    )


def _method(training_args, facts: RunFacts) -> MethodRecord:
    objective = training_args.objective.record()
    pairs = facts.data.format == "pairs"
    guide = None
    if training_args.guide_model is not None:  # by name only: a local guide by its folder's name
        name = source_record(training_args.guide_model)["name"]
        guide = GuideRecord(name, training_args.guide_margin, facts.guide_weights)
    topics = None
    if training_args.topic_batches:
        encoder = source_record(facts.topic_encoder)["name"] if facts.topic_encoder else "the model being trained"
        every = training_args.topic_recluster_steps
        topics = TopicRecord(
            training_args.topic_clusters, training_args.topic_share, encoder, every, facts.topic_encoder_weights
        )
    queue = QueueRecord(training_args.queue_size, training_args.momentum) if training_args.queue_size else None
    no_duplicates = training_args.no_duplicates
    return MethodRecord(
        loss=portable_loss_name(training_args.loss),
        objective_class=objective["class"],
        objective_sha256=objective.get("sha256"),
        objective_imports=frozen(objective.get("imports") or {}),
        options=frozen(_json(objective["options"])),
        temperature=training_args.temperature,
        contrast_form=None if pairs else training_args.contrast_form,  # SimCSE's supervised targets have no form
        hard_negative_weight=training_args.hard_negative_weight,
        no_duplicates=pairs if no_duplicates is None else no_duplicates,
        guide=guide,
        topic_batches=topics,
        queue=queue,
        objective_file=objective.get("file"),
        objective_name=objective["name"],
        objective_title=objective["title"],
        objective_summary=objective["summary"],
        objective_citation=objective["citation"],
    )


def _optimisation(model_args, data_args, training_args) -> OptimisationRecord:
    arguments = {}
    for args in (model_args, data_args, training_args):
        for item in dataclasses.fields(args):
            if item.init and item.name not in CLAIMED and item.name not in ALLOWLIST:
                arguments[item.name] = _json(getattr(args, item.name))
    return OptimisationRecord(
        learning_rate=training_args.learning_rate,
        per_device_train_batch_size=training_args.per_device_train_batch_size,
        gradient_accumulation_steps=training_args.gradient_accumulation_steps,
        processes=training_args.world_size,
        device=training_args.device.type,
        seed=training_args.seed,
        data_seed=training_args.data_seed,
        max_steps=training_args.max_steps,
        num_train_epochs=training_args.num_train_epochs,
        arguments=frozen(dict(sorted(arguments.items()))),
    )


def _json(value: Any) -> Any:
    """An argument's value as a record keeps it: plain JSON; a local file by its name and sha256 (a DeepSpeed or FSDP
    config: its content matters, not where it is), a folder by its name; never a path of this machine."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, enum.Enum):
        return _json(value.value)
    if isinstance(value, str):
        if os.path.isfile(value):
            return {"name": os.path.basename(value), "sha256": file_sha256(value)}
        return os.path.basename(os.path.normpath(value)) if os.path.isdir(value) else value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _json({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    if isinstance(value, Mapping):
        return {str(k): _json(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_json(v) for v in (sorted(value, key=str) if isinstance(value, (set, frozenset)) else value)]
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return _json(to_dict())
    shown = repr(value)
    # an object's repr with its address would differ in every run: its class names it
    return type(value).__qualname__ if " at 0x" in shown else shown


def library_versions() -> dict[str, str]:
    found = {}
    for name in VERSIONED:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
