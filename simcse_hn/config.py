"""Command-line and YAML configuration.

`parse_args(argv)`: `--config file.yaml` gives defaults, CLI flags override them. YAML values go through the same
argparse type conversion as flags, then every dataclass validates itself in `__post_init__`, so a bad value fails
with a one-line `ConfigError` naming the field, before any model or data is loaded.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field, fields

import yaml
from transformers import HfArgumentParser, TrainingArguments
from transformers.trainer_utils import IntervalStrategy, SaveStrategy

from simcse_hn.errors import ConfigError  # noqa: F401  (raised here, imported from here by callers)
from simcse_hn.files import is_hub_id
from simcse_hn.losses.registry import BASELINE
from simcse_hn.objective_config import (
    HELP_GROUPS as OBJECTIVE_HELP_GROUPS,
)
from simcse_hn.objective_config import (
    LOSS_HELP,
    LOSS_METAVAR,
    ObjectiveFlags,
    ResolvedObjective,
    resolve_objective_arguments,
)
from simcse_hn.pairs import DATA_FORMATS
from simcse_hn.resolved import declared_data, resolve_run, sentence_negatives

POOLERS = ("cls", "cls_before_pooler", "avg", "avg_first_last", "avg_top2", "last")
CONTRAST_FORMS = ("simcse", "symmetric")
HUB_STRATEGIES = ("end", "every_save")


def _check(condition: bool, name: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{name}: {message}")


def _check_finite(arguments) -> None:
    """Every float setting must be a finite number: an `inf` or `nan` temperature, tilt, prior or learning rate
    passes every range check and then silently disables the objective (or the training)."""
    for f in fields(arguments):
        value = getattr(arguments, f.name, None)
        if isinstance(value, float):
            _check(math.isfinite(value), f.name, f"must be a finite number, got {value}")


@dataclass
class ModelArguments:
    _argument_group_name = "model"  # HfArgumentParser's --help group (a class attribute, not a field)
    model_name_or_path: str = field(
        default="bert-base-uncased",
        metadata={
            "help": "Hub id or local folder of the encoder; 'builtin:tiny-bert' builds a tiny random BERT "
            "with a character tokenizer in code (tests, offline smoke runs)."
        },
    )
    pooler: str = field(
        default="cls",
        metadata={
            "help": f"Sentence embedding pooler, one of {POOLERS}. 'cls' adds SimCSE's MLP head (dense+tanh).",
            "choices": POOLERS,
        },
    )
    mlp_only_train: bool = field(
        default=True,
        metadata={
            "help": "Use the MLP head only in training and evaluate with the CLS vector before it "
            "(SimCSE's unsupervised recipe)."
        },
    )
    inference_max_seq_length: int | None = field(
        default=None,
        metadata={
            "help": "Token limit saved for inference (sentence-transformers' max_seq_length). Default: the base "
            "model's own (a sentence-transformers model's max_seq_length, else the encoder's position limit), not "
            "the training max_seq_length."
        },
    )
    dropout: float | None = field(
        default=None,
        metadata={
            "help": "Override the encoder's hidden and attention dropout (the two views differ only by "
            "dropout; SimCSE keeps BERT's 0.1)."
        },
    )
    tokenizer_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Hub id or local folder of the tokenizer, when model_name_or_path has none (default: it)."},
    )
    lora_r: int | None = field(
        default=None,
        metadata={
            "help": "Train LoRA adapters of this rank (peft; pip install 'simcse-hn[lora]') instead of the encoder's "
            "weights; the saved folder holds the merged weights, and the adapter in adapter/."
        },
    )
    lora_alpha: float = field(default=8, metadata={"help": "LoRA scaling numerator: updates are alpha / r x B A."})
    lora_dropout: float = field(default=0.0, metadata={"help": "Dropout on the LoRA branch's input."})
    lora_target_modules: list[str] | None = field(
        default=None,
        metadata={
            "help": "Module names to adapt (e.g. query value, or q_proj k_proj v_proj o_proj). Default: peft's "
            "choice for the architecture (BERT: query, value; Llama, Qwen2: q_proj, v_proj)."
        },
    )

    def __post_init__(self):
        _check_finite(self)
        _check(self.pooler in POOLERS, "pooler", f"must be one of {', '.join(POOLERS)}, got {self.pooler!r}")
        _check(self.dropout is None or 0 <= self.dropout < 1, "dropout", f"must be in [0, 1), got {self.dropout}")
        _check(
            self.inference_max_seq_length is None or self.inference_max_seq_length >= 2,
            "inference_max_seq_length",
            f"must be >= 2, got {self.inference_max_seq_length}",
        )
        if self.lora_r is None:
            _check(self.lora_target_modules is None, "lora_target_modules", "needs lora_r (LoRA is off without it)")
        else:
            _check(self.lora_r >= 1, "lora_r", f"must be >= 1, got {self.lora_r}")
            _check(self.lora_alpha > 0, "lora_alpha", f"must be > 0, got {self.lora_alpha}")
            _check(0 <= self.lora_dropout < 1, "lora_dropout", f"must be in [0, 1), got {self.lora_dropout}")
            from simcse_hn.lora import require_peft

            require_peft()


@dataclass
class DataArguments:
    _argument_group_name = "data"
    train_file: str | None = field(
        default=None,
        metadata={
            "help": "Training sentences from a local file: .txt (one per line), or .jsonl/.csv/.tsv with "
            "`text_column`. (A Hub dataset id here still works; --dataset_name is the usual route.)"
        },
    )
    dataset_name: str | None = field(
        default=None,
        metadata={"help": "Training sentences from a Hub dataset, read through `datasets` (instead of train_file)."},
    )
    dataset_config_name: str | None = field(
        default=None, metadata={"help": "The dataset's configuration (subset) name, when it has several."}
    )
    dataset_split: str = field(default="train", metadata={"help": "The dataset's split to train on."})
    train_data_files: str | None = field(
        default=None,
        metadata={"help": "With a Hub dataset: the file(s) inside the repo (e.g. wiki1m_for_simcse.txt)."},
    )
    text_column: str = field(default="text", metadata={"help": "Column holding the sentence in jsonl/csv/Hub data."})
    data_format: str = field(
        default="auto",
        metadata={
            "help": "'sentences' (unsupervised SimCSE), 'pairs' (anchor, positive, optional negatives) or 'auto': a "
            ".txt file holds sentences, a table with text_column sentences, one with anchor/positive or "
            "sent0/sent1 columns (or any column flag) pairs; anything else is an error asking for this flag.",
            "choices": DATA_FORMATS,
        },
    )
    anchor_column: str | None = field(
        default=None, metadata={"help": "Pairs: the anchor column (default: 'anchor', 'sent0', else the first)."}
    )
    positive_column: str | None = field(
        default=None, metadata={"help": "Pairs: the positive column (default: 'positive', 'sent1', else the next)."}
    )
    negative_columns: list[str] | None = field(
        default=None,
        metadata={
            "help": "Pairs: the explicit negative columns, in order ('none': no negatives). Default: the columns "
            "named negative, negative_1..k or hard_neg, else (columns by order) every further text column."
        },
    )
    max_seq_length: int = field(default=32, metadata={"help": "Token limit per sentence (SimCSE: 32)."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only the first N sentences."})
    drop_duplicates: bool = field(default=False, metadata={"help": "Remove repeated sentences (always counted)."})
    streaming: bool = field(
        default=False,
        metadata={
            "help": "Read train_file as a stream (datasets' streaming, local files too) instead of into memory: "
            "memory stays flat whatever the corpus size; needs max_steps; each process reads its share."
        },
    )
    streaming_shuffle_buffer: int = field(
        default=10_000,
        metadata={"help": "With streaming: sentences held in the shuffle buffer (0: the corpus's own order)."},
    )
    eval_file: str | None = field(
        default=None,
        metadata={
            "help": "STS-B dev pairs for model selection: JSON Lines with sentence1, sentence2, score "
            "(and optional split), or a Hub dataset id such as sentence-transformers/stsb."
        },
    )
    eval_split: str = field(
        default="dev", metadata={"help": "Split of eval_file to score ('dev' locally, 'validation' on the Hub)."}
    )
    eval_max_seq_length: int | None = field(
        default=None,
        metadata={
            "help": "Token limit of the STS-B dev evaluation. Default: the model's own limit (SimCSE trains at 32 "
            "tokens and evaluates without truncation)."
        },
    )

    def __post_init__(self):
        _check_finite(self)
        _check(self.max_seq_length >= 2, "max_seq_length", f"must be >= 2, got {self.max_seq_length}")
        _check(
            self.eval_max_seq_length is None or self.eval_max_seq_length >= 2,
            "eval_max_seq_length",
            f"must be >= 2, got {self.eval_max_seq_length}",
        )
        _check(self.max_train_samples is None or self.max_train_samples > 0, "max_train_samples", "must be > 0")
        _check(
            self.data_format in DATA_FORMATS,
            "data_format",
            f"must be one of {', '.join(DATA_FORMATS)}, got {self.data_format!r}",
        )
        _check(self.streaming_shuffle_buffer >= 0, "streaming_shuffle_buffer", "must be >= 0")
        for name in ("train_file", "eval_file"):
            path = getattr(self, name)
            if path is not None and not is_hub_id(path):
                _check(os.path.isfile(path), name, f"file not found: {path}")
        _check(
            self.train_file is None or self.dataset_name is None,
            "dataset_name",
            f"give train_file or dataset_name, not both (got {self.train_file!r} and {self.dataset_name!r})",
        )
        _check(
            self.dataset_name is None or is_hub_id(self.dataset_name),
            "dataset_name",
            f"{self.dataset_name!r} is not a Hub dataset id ('owner/name'); a local file goes in train_file",
        )

    @property
    def train_source(self) -> str | None:
        """Where the training sentences come from: the Hub dataset, else the file (or the Hub id in train_file)."""
        return self.dataset_name or self.train_file

    @property
    def column_flags(self) -> bool:
        """Whether any pair column flag is set (they mean paired data)."""
        return any(v is not None for v in (self.anchor_column, self.positive_column, self.negative_columns))


@dataclass
class SimCSETrainingArguments(TrainingArguments, ObjectiveFlags):
    # --- the objective ---
    loss: str = field(default=BASELINE, metadata={"help": LOSS_HELP, "metavar": LOSS_METAVAR})
    loss_options: str | None = field(
        default=None,
        metadata={
            "help": "The objective's options as a JSON mapping, e.g. '{\"gamma\": 2}' (YAML: a loss_options: "
            "mapping); any objective's, a built-in's flags (--hcl_beta ...) too."
        },
    )
    temperature: float = field(default=0.05, metadata={"help": "Softmax temperature t of cos/t (SimCSE: 0.05)."})
    contrast_form: str = field(
        default="symmetric",
        metadata={
            "help": "'simcse': first views against second views (the paper's loss); 'symmetric': every row "
            "is an anchor against all 2N-2 other rows (NT-Xent; the form hard-negative losses use).",
            "choices": CONTRAST_FORMS,
        },
    )
    # --- paired data ---
    hard_negative_weight: float = field(
        default=0.0,
        metadata={
            "help": "Paired data: log weight added to the logit of each anchor's own explicit negatives (SimCSE's "
            "hard_negative_weight; 0 = none), for every objective a weight e^w on those negatives' terms."
        },
    )
    guide_model: str | None = field(
        default=None,
        metadata={
            "help": "False-negative guard (GISTEmbed): a sentence-transformers model (Hub id or folder), or 'self' "
            "(the model being trained, its own embeddings of the step); negatives it scores above the anchor's "
            "positive minus guide_margin are dropped for the step."
        },
    )
    guide_margin: float = field(default=0.0, metadata={"help": "Guide: drop j when g_ij > g_ip - guide_margin."})
    no_duplicates: bool | None = field(
        default=None,
        metadata={
            "help": "Batches in which no text appears twice, across columns and processes (sentence-transformers' "
            "no_duplicates sampler). Default: on for paired data, off for sentences."
        },
    )
    topic_batches: bool = field(
        default=False,
        metadata={
            "help": "Topic-aware batches (TAS-B): each gathered batch (per-device batch x processes) drawn from one "
            "k-means cluster of the corpus, so in-batch negatives are near neighbours (docs/topic-batches.md)."
        },
    )
    topic_clusters: int = field(
        default=64, metadata={"help": "Topic batches: k-means clusters (about corpus size / (10 x gathered batch))."}
    )
    topic_share: float = field(
        default=1.0, metadata={"help": "Topic batches: share of a gathered batch from one cluster; the rest random."}
    )
    topic_recluster_steps: int = field(
        default=0,
        metadata={
            "help": "Topic batches: re-encode the corpus with the model being trained and re-cluster it every this "
            "many optimizer steps (0: never); the new clusters draw the batches from two steps later on."
        },
    )
    topic_encoder: str | None = field(
        default=None,
        metadata={
            "help": "Topic batches: the encoder that embeds the corpus for clustering (a model folder or Hub id, "
            "sentence-transformers or simcse-hn). Default: the model being trained, before training, in eval mode."
        },
    )
    # --- scale ---
    gather_across_devices: bool | None = field(
        default=None,
        metadata={"help": "Use every process's rows as candidates (exact gradient). Default: on with >1 process."},
    )
    cache_minibatch_size: int | None = field(
        default=None, metadata={"help": "GradCache: embed the batch in chunks of this many sentences (memory)."}
    )
    length_groups: int | None = field(
        default=None,
        metadata={
            "help": "Run each training batch as this many sub-batches of rows of similar token length, each cut to "
            "its longest row: less padding computed, the same embeddings up to rounding (dropout draws differ, "
            "equally seeded). 1: one forward. Default: 8 on a CPU; 1 on accelerators (where a batch's padding costs "
            "less than more kernel launches) and under FSDP, DeepSpeed or torch_compile."
        },
    )
    # --- SimCSE recipe defaults (differ from TrainingArguments) ---
    output_dir: str = field(default="outputs/simcse", metadata={"help": "Where checkpoints and the model go."})
    learning_rate: float = field(default=3e-5, metadata={"help": "SimCSE unsup BERT-base: 3e-5."})
    per_device_train_batch_size: int = field(
        default=64, metadata={"help": "Sentences per device per step (each becomes 2 rows; SimCSE: 64)."}
    )
    num_train_epochs: float = field(default=1.0, metadata={"help": "SimCSE trains one epoch on wiki1m."})
    eval_strategy: IntervalStrategy | str = field(
        default="steps", metadata={"help": "SimCSE evaluates STS-B dev during training."}
    )
    eval_steps: float | None = field(default=125, metadata={"help": "SimCSE: every 125 steps."})
    save_strategy: SaveStrategy | str = field(default="steps", metadata={"help": "Checkpoints follow evaluation."})
    save_steps: float = field(default=125, metadata={"help": "Keep equal to eval_steps for best-model selection."})
    save_total_limit: int | None = field(default=2, metadata={"help": "Keep the best and the latest checkpoint."})
    metric_for_best_model: str | None = field(default="stsb_spearman", metadata={"help": "STS-B dev Spearman x 100."})
    greater_is_better: bool | None = field(default=True, metadata={"help": "Higher Spearman is better."})
    load_best_model_at_end: bool = field(default=True, metadata={"help": "SimCSE keeps the best dev checkpoint."})
    logging_steps: float = field(default=25, metadata={"help": "Loss and loss diagnostics every N steps."})
    per_device_eval_batch_size: int = field(
        default=128, metadata={"help": "Sentences per device per STS-B dev batch (sorted by length: little padding)."}
    )
    dataloader_pin_memory: bool = field(
        default=False, metadata={"help": "Pin batches in memory (token ids are small; only a GPU could use it)."}
    )
    hub_strategy: str = field(
        default="end",
        metadata={
            "help": "'end': push the finished folder once (card and STS results included); 'every_save': also push "
            "the model files of every checkpoint as it is saved. Checkpoint folders themselves are never pushed.",
            "choices": HUB_STRATEGIES,
        },
    )
    dataloader_drop_last: bool = field(
        default=True,
        metadata={
            "help": "Drop a short last batch: a batch of one sentence has no negatives, and gathering needs "
            "equal batches on every process."
        },
    )
    ddp_find_unused_parameters: bool | None = field(
        default=False,
        metadata={"help": "Every trainable parameter is used each step (the encoder's own pooler is frozen)."},
    )
    remove_unused_columns: bool = field(default=False, metadata={"help": "The collator needs the text column."})
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Write into a non-empty output_dir that simcse-hn did not write (no simcse_run.json), or start "
            "a new run in one that holds an earlier run's checkpoints; files a save writes replace theirs."
        },
    )

    def __post_init__(self):
        _check_finite(self)
        _check(self.temperature > 0, "temperature", f"must be > 0, got {self.temperature}")
        _check(
            self.contrast_form in CONTRAST_FORMS,
            "contrast_form",
            f"must be one of {', '.join(CONTRAST_FORMS)}, got {self.contrast_form!r}",
        )
        _check(
            self.per_device_train_batch_size >= 2,
            "per_device_train_batch_size",
            f"must be >= 2 (a sentence needs at least one in-batch negative), got {self.per_device_train_batch_size}",
        )
        _check(
            self.cache_minibatch_size is None or self.cache_minibatch_size >= 1, "cache_minibatch_size", "must be >= 1"
        )
        _check(self.length_groups is None or self.length_groups >= 1, "length_groups", "must be >= 1")
        _check(self.topic_clusters >= 1, "topic_clusters", f"must be >= 1, got {self.topic_clusters}")
        recluster = self.topic_recluster_steps
        _check(recluster >= 0, "topic_recluster_steps", f"must be >= 0, got {recluster}")
        _check(0 < self.topic_share <= 1, "topic_share", f"must be in (0, 1], got {self.topic_share}")
        if self.hub_model_id is not None:
            _check_repo_id(self.hub_model_id)
        _check(
            str(getattr(self.hub_strategy, "value", self.hub_strategy)) in HUB_STRATEGIES,
            "hub_strategy",
            f"must be one of {', '.join(HUB_STRATEGIES)} (simcse-hn pushes model folders, never checkpoint state), "
            f"got {self.hub_strategy!r}",
        )
        super().__post_init__()
        # the objective's own values here; what it refuses of the run (check_for_training), with the data's format,
        # the engine and the rest of the run's combinations: simcse_hn.resolved (parse_args and train.py)
        self._objective = resolve_objective_arguments(self)

    def __getstate__(self) -> dict:
        # the Trainer pickles its arguments into every checkpoint: a user's objective class must not be pickled
        # (unpickling would import its module), so the resolved objective is left out and made again on first use
        state = dict(self.__dict__)
        state.pop("_objective", None)
        return state

    @property
    def objective(self) -> ResolvedObjective:
        """The objective this run trains: its class and validated options."""
        if getattr(self, "_objective", None) is None:
            self._objective = resolve_objective_arguments(self)
        return self._objective

    def sharding_engine(self) -> str | None:
        """The sharded engine the launch asks for ('FSDP', 'DeepSpeed ZeRO-2', ...: accelerate launch's config, or
        --fsdp / --deepspeed), None for plain data parallelism. (accelerate runs it on accelerators only.)"""
        if self.deepspeed_plugin is not None:
            stage = self.deepspeed_plugin.deepspeed_config.get("zero_optimization", {}).get("stage", "?")
            return f"DeepSpeed ZeRO-{stage}"
        if self.fsdp or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
            return "FSDP"
        return None

    @property
    def gathers(self) -> bool:
        """Whether every process's rows are candidates (gather_across_devices, default on with > 1 process)."""
        return self.world_size > 1 if self.gather_across_devices is None else self.gather_across_devices

    def negatives_per_anchor(self) -> int:
        """In-batch negatives of one anchor of single sentences: all candidate rows but itself and its positive
        (symmetric form); paired data has others (simcse_hn.resolved.ResolvedRun.shape)."""
        processes = self.world_size if self.gathers else 1
        return sentence_negatives(self.per_device_train_batch_size, processes, self.contrast_form)

    def loss_kwargs(self) -> dict:
        """build_loss() keyword arguments of the objective: the temperature and its options, in the paper's symbols."""
        return {"temperature": self.temperature, **self.objective.options.as_dict()}

    def check_optimizer(self) -> None:
        """The optimizer's settings, checked by the optimizer itself (built once on a dummy parameter), before any
        model or data loads: what it would reject at the first step is a ConfigError naming the field now."""
        import torch
        from transformers import Trainer

        try:
            optimizer, kwargs = Trainer.get_optimizer_cls_and_kwargs(self)
            optimizer([torch.nn.Parameter(torch.zeros(1))], **kwargs)
        except (ValueError, ImportError) as e:
            message = str(e).strip().splitlines()[0]
            name = next((field for words, field in OPTIMIZER_FIELDS if words in message.lower()), "optim")
            raise ConfigError(f"{name}: {message}") from None

    def build_loss(self):
        """The configured objective, built before any model loads (its options were validated when parsed)."""
        objective = self.objective
        return objective.cls(self.temperature, **objective.options.as_dict())


# words of the optimizers' own error messages -> the field they are about
OPTIMIZER_FIELDS = (("learning rate", "learning_rate"), ("epsilon", "adam_epsilon"), ("index 0", "adam_beta1"),
                    ("index 1", "adam_beta2"), ("weight_decay", "weight_decay"))  # fmt: skip

def _check_repo_id(repo_id: str) -> None:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        _check(False, "hub_model_id", str(e).strip().splitlines()[0])


ARGUMENT_CLASSES = (ModelArguments, DataArguments, SimCSETrainingArguments)
# Fields that say the same thing in two ways: one given on the command line replaces the other given in the YAML.
ALTERNATIVE_FIELDS = (("train_file", "dataset_name"),)


# --help: simcse-hn's own flags first, in these groups (in this order), then the Trainer's. A field goes to the
# first group whose prefix or name matches.
HELP_GROUPS = {
    "objective": ("loss", "loss_options", "temperature", "contrast_form"),
    **OBJECTIVE_HELP_GROUPS,
    "scale and speed": ("gather_across_devices", "cache_minibatch_size", "length_groups"),
}
HELP_OVERRIDES = {  # the Trainer's own help where simcse-hn gives the flag more meaning
    "resume_from_checkpoint": "A checkpoint folder, or 'true' for the newest complete checkpoint of this run in "
    "output_dir (incomplete or foreign ones are skipped with a warning).",
}


class _Parser(HfArgumentParser):
    def __init__(self, dataclass_types):
        super().__init__(
            dataclass_types,
            usage="train.py [--config FILE.yaml] [--FLAG VALUE ...]  (or: accelerate launch train.py ...)",
            description="Train a SimCSE sentence encoder (simcse-hn). simcse-hn's own flags come first, by group; "
            "the Trainer's follow.",
        )
        # listed for --help only; parse_args reads it before this parser sees the flags
        self.add_argument("--config", default=argparse.SUPPRESS, help="A YAML file of flags; flags given on the "
                          "command line override it (configs/*.yaml).")  # fmt: skip

    def error(self, message):  # argparse would print usage and exit(2); we want one line naming the field
        match = re.match(r"argument --([\w]+)(?:/--[\w-]+)*: (.*)", message)
        raise ConfigError(f"{match.group(1)}: {match.group(2)}" if match else message)

    def _add_dataclass_arguments(self, dtype):
        if dtype is not SimCSETrainingArguments:
            return super()._add_dataclass_arguments(dtype)
        hints = typing.get_type_hints(dtype)
        groups = {title: self.add_argument_group(title) for title in HELP_GROUPS}
        trainer = self.add_argument_group("training (transformers.TrainingArguments, with SimCSE's defaults)")
        for item in fields(dtype):
            if not item.init:
                continue
            item.type = hints[item.name]
            title = next((t for t, keys in HELP_GROUPS.items() if item.name.startswith(keys)), None)
            if item.name in HELP_OVERRIDES:  # a copy: the field object is the dataclass's own
                item = copy.copy(item)
                item.metadata = types.MappingProxyType({**item.metadata, "help": HELP_OVERRIDES[item.name]})
            self._parse_dataclass_field(groups[title] if title else trainer, item)


def _yaml_to_argv(config: dict, path: str, known: set[str], takes_lists: set[str]) -> list[str]:
    argv = []
    for key, value in config.items():
        _check(key in known, key, f"unknown key in {path}")
        if value is None:
            continue
        if isinstance(value, dict):
            value = json.dumps(value)
        if isinstance(value, list):
            _check(key in takes_lists, key, f"expected one value, got a list {value} (in {path})")
        values = value if isinstance(value, list) else [value]
        argv.append(f"--{key}")
        argv.extend(str(v).lower() if isinstance(v, bool) else str(v) for v in values)
    return argv


def load_yaml(path: str) -> dict:
    if not os.path.isfile(path):
        raise ConfigError(f"config: file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"config: malformed YAML in {path}{where}: {problem}") from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ConfigError(f"config: {path} must be a mapping of key: value, got {type(config).__name__}")
    return config


def parse_args(argv: list[str] | None = None) -> tuple[ModelArguments, DataArguments, SimCSETrainingArguments]:
    """YAML `--config` gives defaults, CLI flags override them. Raises ConfigError (one line) on a bad value."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known_args, rest = pre.parse_known_args(argv)
    known = {f.name for cls in ARGUMENT_CLASSES for f in fields(cls) if f.init}
    # from the annotations: HfArgumentParser rewrites a field's `str | list[str]` type to `str` in place
    hints = [typing.get_type_hints(cls) for cls in ARGUMENT_CLASSES]
    takes_lists = {name for types in hints for name, annotation in types.items() if "list" in str(annotation)}
    parser = _Parser(ARGUMENT_CLASSES)
    config = load_yaml(known_args.config) if known_args.config else {}
    for alternatives in ALTERNATIVE_FIELDS:  # a source given on the command line replaces the YAML's other one
        if any(f"--{name}" in rest for name in alternatives):
            config = {k: v for k, v in config.items() if k not in alternatives or f"--{k}" in rest}
    yaml_argv = _yaml_to_argv(config, known_args.config, known, takes_lists)
    try:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses(args=yaml_argv + rest)
        # the combinations the configuration alone shows (train.py checks the same, complete, on the resolved data)
        resolve_run(data_args, training_args, declared_data(data_args)).check()
    except ConfigError as e:
        name = str(e).split(":")[0]
        if name in config and f"--{name}" not in rest:
            raise ConfigError(f"{e} (in {known_args.config})") from None
        raise
    except ValueError as e:  # TrainingArguments' own checks
        raise ConfigError(str(e).strip().splitlines()[0]) from None
    except ImportError as e:  # a launch config for DeepSpeed without deepspeed installed
        raise ConfigError(f"deepspeed: {str(e).strip().splitlines()[0]} (pip install deepspeed)") from None
    return model_args, data_args, training_args
