"""One record of a run (`RunRecord`): what was trained, on what, how, with what optimisation, and where it came from.
Built once from the parsed arguments and what the data and the model's files say (simcse_hn.configuration.record),
written as `simcse_config.json` into the model folder and every checkpoint, compared whole on resume
(simcse_hn.training.resumed) and read as typed fields by the card, the reports and simcse-hn-study.

Every field is compared on resume unless `ALLOWLIST` names it (or a section above it): a field added later is
compared by default. Each compared field names the flag a refusal shows (`flag` in its metadata). Records written
before this one (no `record_version`) still read (`RunRecord.from_json`, with the fields they lack None), and are
never resumed from. Light on purpose (no torch): reports read records without it."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from simcse_hn.files import source_record

RECORD_VERSION = 2
# keys of simcse_config.json that are the folder's, not the record's: how the folder loads (SimCSEModel) and whether
# its checkpoints are whole with a manifest (simcse_hn.training.checkpoints)
FOLDER_KEYS = ("pooler", "mlp_only_train", "checkpoint_manifest")


def _flag(name: str, off: str | None = None) -> dict[str, str]:
    return {"flag": name} if off is None else {"flag": name, "off": off}


@dataclass(frozen=True)
class Source:
    """A model or a file as records name it (files.source_record): a Hub id as it is, a local path by its name."""

    name: str
    local: bool


@dataclass(frozen=True)
class LoraRecord:
    r: int = field(metadata=_flag("lora_r"))
    alpha: float = field(metadata=_flag("lora_alpha"))
    dropout: float = field(metadata=_flag("lora_dropout"))
    target_modules: tuple[str, ...] | None = field(metadata=_flag("lora_target_modules"))


@dataclass(frozen=True)
class ModelRecord:
    """What was trained."""

    base_model: Source | None = field(metadata=_flag("model_name_or_path"))
    # the base model's weights: "sha256:..." of a folder's weight files, "revision:..." of a Hub model's commit,
    # None for a model built in code (builtin:...: the package's code is its identity)
    weights: str | None = field(metadata=_flag("model_name_or_path (its weights)"))
    architecture: str | None = field(metadata=_flag("model_name_or_path (architecture)"))
    tokenizer: Source | None = field(metadata=_flag("tokenizer_name_or_path", "the model's own"))
    pooler: str | None = field(metadata=_flag("pooler"))
    mlp_only_train: bool | None = field(metadata=_flag("mlp_only_train"))
    dropout: float | None = field(metadata=_flag("dropout"))
    max_seq_length: int | None = field(metadata=_flag("max_seq_length"))
    eval_max_seq_length: int | None = field(metadata=_flag("eval_max_seq_length"))
    inference_max_seq_length: int | None = field(metadata=_flag("inference_max_seq_length"))
    lora: LoraRecord | None = field(metadata=_flag("lora_r", "no LoRA"))
    # the tokenizer as it tokenizes (its tokenizer.json, else its vocabulary), whichever folder it came from
    tokenizer_sha256: str | None = field(default=None, metadata=_flag("tokenizer_name_or_path (its files)"))
    license: str | None = None  # the base model's card's: read, not set


@dataclass(frozen=True)
class DataRecord:
    """What it was trained on."""

    source: Source | None = field(metadata=_flag("train_file"))
    sha256: str | None = field(metadata=_flag("train_file"))
    examples: int | None = field(metadata=_flag("max_train_samples (training examples read)"))
    format: str | None = field(metadata=_flag("data_format"))
    columns: tuple[str, ...] | None = field(metadata=_flag("text_column / anchor_column / positive_column"))
    negatives_per_example: int | None = field(metadata=_flag("negative_columns (negatives per example)"))
    config_name: str | None = field(metadata=_flag("dataset_config_name"))
    split: str | None = field(metadata=_flag("dataset_split"))
    data_files: str | None = field(metadata=_flag("train_data_files"))
    max_train_samples: int | None = field(metadata=_flag("max_train_samples"))
    drop_duplicates: bool | None = field(metadata=_flag("drop_duplicates"))
    streaming: bool | None = field(metadata=_flag("streaming"))
    shuffle_buffer: int | None = field(metadata=_flag("streaming_shuffle_buffer"))
    word_repetition: float | None = field(metadata=_flag("word_repetition"))
    eval_file: Source | None = field(metadata=_flag("eval_file", "no eval_file"))
    eval_sha256: str | None = field(metadata=_flag("eval_file"))
    eval_split: str | None = field(metadata=_flag("eval_split"))


@dataclass(frozen=True)
class GuideRecord:
    model: str = field(metadata=_flag("guide_model"))
    margin: float = field(metadata=_flag("guide_margin"))
    weights: str | None = field(default=None, metadata=_flag("guide_model (its weights)"))  # as ModelRecord.weights


@dataclass(frozen=True)
class TopicRecord:
    clusters: int = field(metadata=_flag("topic_clusters"))
    share: float = field(metadata=_flag("topic_share"))
    encoder: str = field(metadata=_flag("topic_encoder"))
    recluster_steps: int = field(metadata=_flag("topic_recluster_steps"))
    encoder_weights: str | None = field(default=None, metadata=_flag("topic_encoder (its weights)"))


@dataclass(frozen=True)
class QueueRecord:
    size: int = field(metadata=_flag("queue_size"))
    momentum: float = field(metadata=_flag("momentum"))


@dataclass(frozen=True)
class MethodRecord:
    """How: the objective (by class; a user's by the sha256 of its file and of every module of theirs it imports),
    its options and temperature, the contrast form and what else shapes the candidates."""

    loss: str | None = field(metadata=_flag("loss"))  # --loss as records keep it (registry.portable_loss_name)
    objective_class: str | None = field(metadata=_flag("loss"))
    objective_sha256: str | None = field(metadata=_flag("loss"))
    # module name -> sha256: modules outside site-packages and the standard library that the objective's file imports
    objective_imports: Mapping[str, str] = field(metadata=_flag("loss (a module its file imports)"))
    options: Mapping[str, Any] = field(metadata=_flag("loss_options"))  # a built-in's options: each its own flag
    temperature: float | None = field(metadata=_flag("temperature"))
    contrast_form: str | None = field(metadata=_flag("contrast_form"))  # None: paired data has no form
    hard_negative_weight: float | None = field(metadata=_flag("hard_negative_weight"))
    no_duplicates: bool | None = field(metadata=_flag("no_duplicates"))
    guide: GuideRecord | None = field(metadata=_flag("guide_model", "no guide_model"))
    topic_batches: TopicRecord | None = field(metadata=_flag("topic_batches", "no topic_batches"))
    queue: QueueRecord | None = field(metadata=_flag("queue_size", "no queue"))
    # the objective's own description, for the card: read from its class, never imported back
    objective_file: str | None = None
    objective_name: str | None = None
    objective_title: str | None = None
    objective_summary: str | None = None
    objective_citation: str | None = None


@dataclass(frozen=True)
class OptimisationRecord:
    """With what optimisation: the fields readers show, typed, and every other field of the training arguments that
    is not ALLOWLISTed (`arguments`, field name -> value as JSON): a field a new transformers adds is compared."""

    learning_rate: float | None = field(metadata=_flag("learning_rate"))
    per_device_train_batch_size: int | None = field(metadata=_flag("per_device_train_batch_size"))
    gradient_accumulation_steps: int | None = field(metadata=_flag("gradient_accumulation_steps"))
    processes: int | None = field(metadata=_flag("processes (world size)"))
    device: str | None = field(metadata=_flag("device (use_cpu, the machine)"))
    seed: int | None = field(metadata=_flag("seed"))
    data_seed: int | None = field(metadata=_flag("data_seed"))
    max_steps: int | None = field(metadata=_flag("max_steps"))
    num_train_epochs: float | None = field(metadata=_flag("num_train_epochs"))
    arguments: Mapping[str, Any] = field(default_factory=dict, metadata=_flag("(the argument)"))


@dataclass(frozen=True)
class Provenance:
    """Where the numbers came from: simcse-hn's own code and the libraries' versions (recorded, not compared)."""

    code: Mapping[str, Any] = field(default_factory=dict)
    versions: Mapping[str, str] = field(default_factory=dict)
    started: str | None = None  # UTC, ISO 8601: when the run family started
    command: str | None = None  # how it was started (provenance.command_line: no secret, no absolute path)


@dataclass(frozen=True)
class Budget:
    """How much training the finished folder had (resumed runs included); None in a checkpoint."""

    steps: int
    epochs: float | None
    sentences_seen: int


@dataclass(frozen=True)
class HistoryEvent:
    """Something that happened to a run family after it started: a resume (`resumed`) or an extension of its
    schedule (`extended`, with `changes`: field -> [before, after]), at optimizer step `step`, with the code then."""

    step: int
    event: str
    changes: Mapping[str, Any] = field(default_factory=dict)
    source_sha256: str | None = None


@dataclass(frozen=True)
class RunRecord:
    run_id: str | None
    model: ModelRecord
    data: DataRecord
    method: MethodRecord
    optimisation: OptimisationRecord
    provenance: Provenance = field(default_factory=Provenance)
    budget: Budget | None = None
    history: tuple[HistoryEvent, ...] = ()
    record_version: int = RECORD_VERSION

    @property
    def is_whole(self) -> bool:
        """Whether every field was recorded (False for a record older than RECORD_VERSION: its fields are None)."""
        return self.record_version == RECORD_VERSION

    @property
    def global_batch(self) -> int | None:
        """Sentences (or examples) per optimizer step."""
        o = self.optimisation
        if o.per_device_train_batch_size is None:
            return None
        return o.per_device_train_batch_size * (o.processes or 1) * (o.gradient_accumulation_steps or 1)

    def to_json(self) -> dict[str, Any]:
        return _to_json(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunRecord:
        """A record as simcse_config.json (or a results file's `training`) holds it, of any version."""
        if data.get("record_version") is None:
            return legacy_record(data)
        return _from_json(cls, {k: v for k, v in data.items() if k not in FOLDER_KEYS})


def _to_json(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    return value


def frozen(value: Any) -> Any:
    """A JSON value made read-only: mappings as MappingProxyType, lists as tuples (a record's fields never change)."""
    if isinstance(value, Mapping):
        return types.MappingProxyType({k: frozen(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    return value


def _from_json(cls: type, data: Any) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown field(s) {', '.join(unknown)}")
    return cls(**{name: _typed(hints[name], value) for name, value in data.items()})


def _typed(annotation: Any, value: Any) -> Any:
    if value is None:
        return None
    options = [a for a in typing.get_args(annotation) if a is not type(None)] if _is_union(annotation) else []
    if options:
        annotation = options[0]
    origin = typing.get_origin(annotation)
    if dataclasses.is_dataclass(annotation):
        return _from_json(annotation, value)
    if origin is tuple and isinstance(value, list):
        (item,) = typing.get_args(annotation)[:1]
        return tuple(_typed(item, v) for v in value)
    return frozen(value)


def section_type(annotation: Any) -> type | None:
    """The record class a field's annotation holds (`ModelRecord | None` -> ModelRecord), else None."""
    if _is_union(annotation):
        annotation = next((a for a in typing.get_args(annotation) if a is not type(None)), None)
    return annotation if dataclasses.is_dataclass(annotation) else None


def _is_union(annotation: Any) -> bool:
    return isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union


# --- records written before RECORD_VERSION: flat keys, read for reports and cards, never resumed from ---


def legacy_record(data: Mapping[str, Any]) -> RunRecord:
    """A simcse_config.json of an earlier simcse-hn (flat keys: loss, loss_kwargs, seed, ...) as a RunRecord whose
    fields it did not record are None (`record_version` 1)."""
    get = data.get
    options = dict(get("loss_kwargs") or {})
    temperature = options.pop("temperature", None)
    objective = get("objective") or {}
    lora, queue, topic, streaming = get("lora"), get("queue"), get("topic_batches"), get("streaming")
    if lora:
        lora = LoraRecord(lora["r"], lora["alpha"], lora["dropout"], frozen(lora.get("target_modules")))
    model = ModelRecord(
        base_model=_source(get("base_model")),
        weights=None,
        architecture=None,
        tokenizer=None,
        pooler=get("pooler"),
        mlp_only_train=get("mlp_only_train"),
        dropout=None,
        max_seq_length=get("max_seq_length"),
        eval_max_seq_length=get("eval_max_seq_length"),
        inference_max_seq_length=get("inference_max_seq_length"),
        lora=lora or None,
        license=get("base_model_license"),
    )
    unrecorded = ("columns", "config_name", "split", "data_files", "max_train_samples", "drop_duplicates")
    unknown = dict.fromkeys((*unrecorded, "eval_file", "eval_sha256", "eval_split"))
    data_record = DataRecord(
        source=_source(get("train_file")),
        sha256=get("train_data_sha256"),
        examples=get("train_examples"),
        format=get("data_format", "sentences"),
        negatives_per_example=get("negatives_per_example"),
        streaming=streaming is not None,
        shuffle_buffer=(streaming or {}).get("shuffle_buffer"),
        word_repetition=get("word_repetition", 0.0),
        **unknown,
    )
    method = MethodRecord(
        loss=get("loss"),
        objective_class=objective.get("class"),
        objective_sha256=objective.get("sha256"),
        objective_imports={},
        options=frozen(options),
        temperature=temperature,
        contrast_form=get("contrast_form"),
        hard_negative_weight=get("hard_negative_weight"),
        no_duplicates=get("no_duplicates"),
        guide=GuideRecord(get("guide_model"), get("guide_margin", 0.0)) if get("guide_model") else None,
        topic_batches=_topics(topic),
        queue=QueueRecord(queue["size"], queue["momentum"]) if queue else None,
        **{f"objective_{key}": objective.get(key) for key in ("file", "name", "title", "summary", "citation")},
    )
    optimisation = OptimisationRecord(
        learning_rate=get("learning_rate"),
        per_device_train_batch_size=get("per_device_train_batch_size"),
        gradient_accumulation_steps=get("gradient_accumulation_steps"),
        processes=get("world_size"),
        device=None,
        seed=get("seed"),
        data_seed=get("data_seed"),
        max_steps=None,
        num_train_epochs=None,
    )
    steps = get("steps")
    budget = Budget(steps, get("epochs"), get("sentences_seen")) if steps is not None else None
    provenance = Provenance(code=frozen(get("code") or {}), command=get("command"))
    return RunRecord(get("run_id"), model, data_record, method, optimisation, provenance, budget, (), 1)


def _topics(topic: Mapping[str, Any] | None) -> TopicRecord | None:
    if not topic:
        return None
    return TopicRecord(topic["clusters"], topic["share"], topic["encoder"], topic.get("recluster_steps", 0))


def _source(value: Any) -> Source | None:
    """A recorded source: {"name", "local"}, or a bare name from the oldest records (files.source_record's rule)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        value = source_record(str(value))
    return Source(value["name"], bool(value.get("local")))
