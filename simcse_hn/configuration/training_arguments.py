"""`SimCSETrainingArguments`: `transformers.TrainingArguments` plus the objective's flags (ObjectiveFlags), the
contrast form, scale-out and Hub settings, each field with its help text and checked in `__post_init__`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from transformers import Trainer, TrainingArguments
from transformers.trainer_utils import IntervalStrategy, SaveStrategy

from simcse_hn.configuration.arguments import check_field, check_finite
from simcse_hn.configuration.objective import (
    LOSS_HELP,
    LOSS_METAVAR,
    ObjectiveFlags,
    ResolvedObjective,
    resolve_objective_arguments,
)
from simcse_hn.configuration.resolved import sentence_negatives
from simcse_hn.errors import ConfigError, did_you_mean
from simcse_hn.losses.registry import BASELINE
from simcse_hn.losses.targets import FORMS
from simcse_hn.progress import live

HUB_STRATEGIES = ("end", "every_save")


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
            "choices": FORMS,
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
    # --- negatives beyond the batch ---
    queue_size: int = field(
        default=0,
        metadata={
            "help": "Keep the embeddings of the last K sentences of earlier optimizer steps and contrast every anchor "
            "with them too, as detached negatives (MoCo, ESimCSE; docs/queue.md). 0: off."
        },
    )
    momentum: float = field(
        default=0.0,
        metadata={
            "help": "With queue_size: the queue's embeddings come from a momentum encoder, an EMA copy of the model "
            "with this rate (ESimCSE: 0.995), without dropout. 0: the training forward's own (a memory bank)."
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
            "equally seeded). A BERT encoder runs the batch's tokens without padding, attention in these groups. "
            "1: one forward. Default: 8 on a CPU; 1 on accelerators (where a batch's padding costs "
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
    extend_schedule: bool = field(
        default=False,
        metadata={
            "help": "Resume with a larger max_steps (or num_train_epochs) than the checkpoint's run: from the "
            "second step after the checkpoint the learning rate follows the new length's schedule "
            "(docs/reliability.md); recorded in simcse_config.json's history. Without it such a resume is refused."
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Write into a non-empty output_dir that simcse-hn did not write (no simcse_run.json), or start "
            "a new run in one that holds an earlier run's checkpoints; files a save writes replace theirs."
        },
    )

    def __post_init__(self):
        check_finite(self)
        check_field(self.temperature > 0, "temperature", f"must be > 0, got {self.temperature}")
        check_field(
            self.contrast_form in FORMS,
            "contrast_form",
            f"must be one of {', '.join(FORMS)}, got {self.contrast_form!r}",
        )
        check_field(
            self.per_device_train_batch_size >= 2,
            "per_device_train_batch_size",
            f"must be >= 2 (a sentence needs at least one in-batch negative), got {self.per_device_train_batch_size}",
        )
        check_field(
            self.cache_minibatch_size is None or self.cache_minibatch_size >= 1, "cache_minibatch_size", "must be >= 1"
        )
        check_field(self.length_groups is None or self.length_groups >= 1, "length_groups", "must be >= 1")
        check_field(self.topic_clusters >= 1, "topic_clusters", f"must be >= 1, got {self.topic_clusters}")
        recluster = self.topic_recluster_steps
        check_field(recluster >= 0, "topic_recluster_steps", f"must be >= 0, got {recluster}")
        check_field(0 < self.topic_share <= 1, "topic_share", f"must be in (0, 1], got {self.topic_share}")
        check_field(self.queue_size >= 0, "queue_size", f"must be >= 0, got {self.queue_size}")
        check_field(0 <= self.momentum < 1, "momentum", f"must be in [0, 1), got {self.momentum}")
        check_field(self.momentum == 0 or self.queue_size > 0, "momentum", "needs queue_size > 0 (it makes the "
                    "queue's embeddings)")  # fmt: skip
        if self.hub_model_id is not None:
            _check_repo_id(self.hub_model_id)
        check_field(
            str(getattr(self.hub_strategy, "value", self.hub_strategy)) in HUB_STRATEGIES,
            "hub_strategy",
            f"must be one of {', '.join(HUB_STRATEGIES)} (simcse-hn pushes model folders, never checkpoint state), "
            f"got {self.hub_strategy!r}",
        )
        if self.disable_tqdm is None and not live():  # a log file: each log a line, no bar's \r and \x1b[A
            self.disable_tqdm = True
        _check_trainer_values(self)
        super().__post_init__()
        _check_report_to(self.report_to)
        # the objective's own values here; what it refuses of the run (check_for_training), with the data's format,
        # the engine and the rest of the run's combinations: simcse_hn.configuration.resolved (parse_args and train.py)
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
        """The sharded engine the launch asks for (`sharding_engine`)."""
        return sharding_engine(self)

    def forward_length_groups(self) -> int:
        """Length groups of the training forward (SimCSEModel.length_groups): `length_groups`, or by default 8 on a
        CPU without sharding or compilation, else 1 (bench/results/train_throughput_versus.md measures it)."""
        if self.length_groups is not None:
            return self.length_groups
        plain = not (self.sharding_engine() or self.torch_compile)
        return 8 if plain and self.device.type == "cpu" else 1

    @property
    def gathers(self) -> bool:
        """Whether every process's rows are candidates (gather_across_devices, default on with > 1 process)."""
        return self.world_size > 1 if self.gather_across_devices is None else self.gather_across_devices

    def negatives_per_anchor(self) -> int:
        """In-batch negatives of one anchor of single sentences: all candidate rows but itself and its positive
        (symmetric form); paired data has others (simcse_hn.configuration.resolved.ResolvedRun.shape)."""
        processes = self.world_size if self.gathers else 1
        return sentence_negatives(self.per_device_train_batch_size, processes, self.contrast_form)

    def loss_kwargs(self) -> dict:
        """build_loss() keyword arguments of the objective: the temperature and its options, in the paper's symbols."""
        return {"temperature": self.temperature, **self.objective.options.as_dict()}

    def check_optimizer(self) -> None:
        """The optimizer's settings, checked by the optimizer itself (built once on a dummy parameter), before any
        model or data loads: what it would reject at the first step is a ConfigError naming the field now."""
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


def _check_trainer_values(args: TrainingArguments) -> None:
    """The Trainer's settings it takes unchecked and then fails on, with a traceback once the model has loaded (a
    zero division, a DataLoader's or numpy's refusal), or runs on silently (no step at all, or one step for 0)."""
    for name, least in (("gradient_accumulation_steps", 1), ("per_device_eval_batch_size", 1),
                        ("dataloader_num_workers", 0)):  # fmt: skip
        value = getattr(args, name)
        check_field(value >= least, name, f"must be >= {least}, got {value}")
    check_field(0 <= args.seed < 2**32, "seed", f"must be in [0, 2**32 - 1] (numpy's seeds), got {args.seed}")
    check_field(args.max_steps != 0, "max_steps", "must be > 0, or -1 (the default) for num_train_epochs, got 0")
    check_field(
        args.max_steps > 0 or args.num_train_epochs > 0,
        "num_train_epochs",
        f"must be > 0 when max_steps is not set, got {args.num_train_epochs:g} (the run would train no step)",
    )


def _check_report_to(report_to: list[str]) -> None:
    """Each --report_to integration known to transformers and installed here: else the Trainer refuses it with a
    traceback once the model has loaded."""
    from transformers.integrations.integration_utils import (
        INTEGRATION_TO_CALLBACK,
        get_available_reporting_integrations,
    )

    for name in report_to:
        if name not in INTEGRATION_TO_CALLBACK:
            hint = did_you_mean(name, INTEGRATION_TO_CALLBACK)
            known = ", ".join(["none", "all", *INTEGRATION_TO_CALLBACK])
            check_field(False, "report_to", f"unknown integration {name!r}{hint}; choose from {known}")
        # flyte and azure_ml: transformers lists no installed check of its own for them
        installed = name in ("flyte", "azure_ml") or name in get_available_reporting_integrations()
        check_field(installed, "report_to", f"{name!r} needs its Python package, which is not installed here")


def _check_repo_id(repo_id: str) -> None:
    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        check_field(False, "hub_model_id", str(e).strip().splitlines()[0])


def sharding_engine(args: TrainingArguments) -> str | None:
    """The sharded engine a launch asks for ('FSDP', 'DeepSpeed ZeRO-2', ...: accelerate launch's config, or --fsdp /
    --deepspeed), None for plain data parallelism; any Trainer's arguments (sentence-transformers' too). accelerate's
    config reaches the arguments only through the environment (ACCELERATE_USE_FSDP; transformers builds a
    deepspeed_plugin from ACCELERATE_USE_DEEPSPEED), so `args.fsdp` and `args.deepspeed` alone miss it."""
    plugin = getattr(args, "deepspeed_plugin", None)
    if plugin is not None or args.deepspeed:
        stage = plugin.deepspeed_config.get("zero_optimization", {}).get("stage", "?") if plugin else "?"
        return f"DeepSpeed ZeRO-{stage}"
    if args.fsdp or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        return "FSDP"
    return None
