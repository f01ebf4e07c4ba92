"""The run as it will train, and the one place that refuses the combinations of settings that cannot work.

train.py resolves the data first (configuration.data_format.resolve_data: the format and columns of a table, or of a
stream's first record; nothing more is read), then `resolve_run` puts it together with the engine the launch asks for
(FSDP, DeepSpeed), streaming, GradCache, the guide and the objective, and `ResolvedRun.check()` raises the first of
`problems()`: one line naming the settings, before any model weights or data rows load. `parse_args` runs the same
checks on what the configuration alone tells (`declared_data`: the format when a flag, a YAML key or a .txt file fixes
it; a check that needs the data's format waits for train.py). So a combination is refused with the same line whichever
way it was reached: a flag, a YAML key or the data's own columns. Each check reads the resolved run, never a flag's
spelling.

Objectives keep their own refusals (`ObjectiveOptions.check_for_training`), called here with the run's `TrainingShape`.
The table of what is refused is in docs/reliability.md ("Combinations refused").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from simcse_hn.configuration.data_format import TEXT_COLUMN, ResolvedData, column_flags
from simcse_hn.configuration.objective import ResolvedObjective, option_error
from simcse_hn.errors import ConfigError
from simcse_hn.losses.options import TrainingShape
from simcse_hn.losses.targets import RowLayout


def sentence_negatives(batch_size: int, processes: int, form: str) -> int:
    """In-batch negatives of one anchor of single sentences: all candidate rows but itself and its positive
    (symmetric form), or the other sentences' second views (simcse form)."""
    layout = RowLayout()
    sentences = batch_size * processes
    if form == "symmetric":
        return sentences * layout.rows_per_text - layout.rows_per_example
    return sentences - 1


@dataclass(frozen=True)
class ResolvedRun:
    """Everything about a run that decides whether it can work, as resolved: the data, the engine, streaming,
    GradCache, the guide and the objective. Built by `resolve_run`; `problems()` lists what cannot work."""

    data: ResolvedData
    declared_format: str
    column_flags: tuple[str, ...]
    text_column: str
    streaming: bool
    max_steps: int
    drop_duplicates: bool
    word_repetition: float
    no_duplicates: bool | None
    topic_batches: bool
    topic_recluster_steps: int
    topic_encoder: str | None
    hard_negative_weight: float
    guide_model: str | None
    guide_margin: float
    engine: str | None  # None (DDP or one process), "FSDP", "DeepSpeed ZeRO-2", ...
    zero3_saves_weights: bool
    cache_minibatch_size: int | None
    data_parallel_gpus: int  # torch DataParallel's GPUs in one process (n_gpu)
    length_groups: int | None
    torch_compile: bool
    objective: ResolvedObjective
    contrast_form: str
    batch_size: int  # per device
    processes: int  # whose rows are every anchor's candidates (world size when gathering, else 1)
    queue_size: int
    momentum: float

    def shape(self) -> TrainingShape | None:
        """What the objective's own checks see; None while the data's format (or its negatives) is not known."""
        common = {"engine": self.engine, "streaming": self.streaming, "guide_model": self.guide_model,
                  "cache_minibatch_size": self.cache_minibatch_size}  # fmt: skip
        b, p = self.batch_size, self.processes
        if self.data.format == "sentences":
            negatives = sentence_negatives(b, p, self.contrast_form)
            note = f"2 x {b} sentences x {p} processes - 2" if self.contrast_form == "symmetric" else (
                f"{b} sentences x {p} processes - 1, the other second views")  # fmt: skip
            return TrainingShape(negatives, note, data_format="sentences", **common)
        if self.data.format == "pairs" and self.data.negatives is not None:
            k = self.data.negatives
            note = f"{b} examples x {p} processes x (1 positive + {k} negatives) - 1"
            return TrainingShape(b * (1 + k) * p - 1, note, data_format="pairs", **common)
        return None

    def problems(self) -> list[str]:
        """Every combination of this run that cannot work, each one line naming the settings."""
        return [problem for check in CHECKS if (problem := check(self)) is not None]

    def check(self) -> None:
        """Raise the first problem as a ConfigError."""
        problems = self.problems()
        if problems:
            raise ConfigError(problems[0])


def resolve_run(data_args, training_args, data: ResolvedData) -> ResolvedRun:
    """The run of these arguments on `data` (`resolve_data`, or `declared_data` before the data is looked at)."""
    engine = training_args.sharding_engine()
    zero = training_args.deepspeed_plugin.deepspeed_config.get("zero_optimization", {}) if engine and \
        engine.startswith("DeepSpeed") else {}  # fmt: skip
    return ResolvedRun(
        data=data,
        declared_format=data_args.data_format,
        column_flags=tuple(column_flags(data_args)),
        text_column=data_args.text_column,
        streaming=data_args.streaming,
        max_steps=training_args.max_steps,
        drop_duplicates=data_args.drop_duplicates,
        word_repetition=data_args.word_repetition,
        no_duplicates=training_args.no_duplicates,
        topic_batches=training_args.topic_batches,
        topic_recluster_steps=training_args.topic_recluster_steps,
        topic_encoder=training_args.topic_encoder,
        hard_negative_weight=training_args.hard_negative_weight,
        guide_model=training_args.guide_model,
        guide_margin=training_args.guide_margin,
        engine=engine,
        zero3_saves_weights=zero.get("stage3_gather_16bit_weights_on_model_save") is True,
        cache_minibatch_size=training_args.cache_minibatch_size,
        data_parallel_gpus=training_args.n_gpu,
        length_groups=training_args.length_groups,
        torch_compile=training_args.torch_compile,
        objective=training_args.objective,
        contrast_form=training_args.contrast_form,
        batch_size=training_args.per_device_train_batch_size,
        processes=training_args.world_size if training_args.gathers else 1,
        queue_size=training_args.queue_size,
        momentum=training_args.momentum,
    )


# --- the checks: each a function of the resolved run, returning its one-line problem or None ---


def _sentences_with_column_flags(run: ResolvedRun) -> str | None:
    if run.declared_format == "sentences" and run.column_flags:
        return ("data_format: 'sentences' takes text_column; the anchor/positive/negative column flags are for pairs "
                f"({', '.join(run.column_flags)} set)")  # fmt: skip
    return None


def _pairs_with_text_column(run: ResolvedRun) -> str | None:
    if run.data.format == "pairs" and run.text_column != TEXT_COLUMN:
        return (f"text_column: {run.text_column!r} names a sentence column; paired data ({run.data.evidence}) takes "
                "anchor_column, positive_column and negative_columns")  # fmt: skip
    return None


def _streaming_needs_max_steps(run: ResolvedRun) -> str | None:
    if run.streaming and run.max_steps <= 0:
        return "max_steps: required with streaming (a stream has no length to count epochs in), e.g. --max_steps 10000"
    return None


def _streaming_cannot_drop_duplicates(run: ResolvedRun) -> str | None:
    if run.streaming and run.drop_duplicates:
        return "drop_duplicates: not available with streaming (finding repeats needs the whole corpus in memory)"
    return None


def _streaming_takes_no_pairs(run: ResolvedRun) -> str | None:
    if not run.streaming:
        return None
    if run.data.format == "pairs":
        evidence = run.data.evidence
    elif run.hard_negative_weight != 0:
        evidence = f"hard_negative_weight {run.hard_negative_weight}, which needs pairs"
    else:
        return None
    return ("streaming: streams single-sentence corpora only; paired data (data_format pairs, hard_negative_weight) "
            f"is read into memory, and this run's data is paired ({evidence}): leave out streaming")  # fmt: skip


def _streaming_has_no_sampler(run: ResolvedRun) -> str | None:
    if run.streaming and run.no_duplicates:
        return ("no_duplicates: not available with streaming (its sampler draws each batch from the whole corpus, "
                "in memory); leave it out, or train without streaming")  # fmt: skip
    return None


def _streaming_has_no_topic_batches(run: ResolvedRun) -> str | None:
    if run.streaming and run.topic_batches:
        return ("topic_batches: not available with streaming (the corpus is clustered up front, in memory); leave it "
                "out, or train without streaming")  # fmt: skip
    return None


def _topic_re_clustering(run: ResolvedRun) -> str | None:
    if not run.topic_recluster_steps:
        return None
    if not run.topic_batches:
        return f"topic_recluster_steps: {run.topic_recluster_steps} needs topic_batches (nothing else is clustered)"
    if run.topic_encoder is not None:
        return (f"topic_recluster_steps: re-clusters with the model being trained; topic_encoder {run.topic_encoder} "
                "is fixed and would give the same clusters again: leave out one of them")  # fmt: skip
    return None


def _topic_clusters_with_a_sharded_model(run: ResolvedRun) -> str | None:
    # process 0 encodes the corpus alone: a sharded model's forward needs every process (its all-gathers would hang)
    sharded = run.engine == "FSDP" or run.engine == "DeepSpeed ZeRO-3"
    if run.topic_batches and run.topic_encoder is None and sharded:
        return (f"topic_batches: clustering with the model being trained runs on process 0 alone, which {run.engine} "
                "shards; give topic_encoder (a separate encoder, e.g. the start model's Hub id) or train without it")
    return None


def _hard_negatives_need_them(run: ResolvedRun) -> str | None:
    if run.hard_negative_weight == 0 or run.streaming:  # streamed: refused above
        return None
    source = run.data.source or "the training data"
    if run.data.format == "sentences":
        return f"hard_negative_weight: needs paired data with explicit negatives; {source} holds single sentences"
    if run.data.format == "pairs" and run.data.negatives == 0:
        return (f"hard_negative_weight: {source} has no negative columns (set --negative_columns, or mine some with "
                "scripts/mine_negatives.py)")  # fmt: skip
    return None


def _pairs_have_no_contrast_form(run: ResolvedRun) -> str | None:
    if run.data.format == "pairs" and run.contrast_form == "simcse":
        return (f"contrast_form: 'simcse' pairs a sentence's two dropout views; paired data ({run.data.evidence}) "
                "trains SimCSE's supervised targets, which have no form to choose: leave contrast_form out")
    return None


def _pairs_have_no_word_repetition(run: ResolvedRun) -> str | None:
    if run.data.format == "pairs" and run.word_repetition:
        return ("word_repetition: augments the second dropout view of single sentences; paired data "
                f"({run.data.evidence}) has its own positives: leave word_repetition out")  # fmt: skip
    return None


def _objective_form(run: ResolvedRun) -> str | None:
    cls = run.objective.cls
    if run.data.format != "pairs" and run.contrast_form not in cls.forms:
        return (f"contrast_form: loss {cls.name or cls.__qualname__!r} is defined on the "
                f"{' and '.join(map(repr, cls.forms))} form only")  # fmt: skip
    return None


def _guide_margin_needs_a_guide(run: ResolvedRun) -> str | None:
    if run.guide_model is None and run.guide_margin != 0:
        return f"guide_margin: {run.guide_margin} needs guide_model (without a guide nothing uses the margin)"
    return None


def _grad_cache(run: ResolvedRun) -> str | None:
    if run.cache_minibatch_size is None:
        return None
    if (run.engine or "").startswith("DeepSpeed"):
        return (f"cache_minibatch_size: GradCache does not work with {run.engine} (its mini-batches back-propagate "
                "under no_sync, which ZeRO partitioning does not allow); use FSDP or DDP, or drop "
                "cache_minibatch_size")  # fmt: skip
    if run.data_parallel_gpus > 1:
        return ("cache_minibatch_size: not supported with DataParallel; launch one process per GPU (accelerate "
                "launch / torchrun)")  # fmt: skip
    return None


def _length_groups(run: ResolvedRun) -> str | None:
    # several forwards of each sharded layer per step, and data-dependent shapes in a compiled forward: not tested
    # there, so not offered
    if run.length_groups is None or run.length_groups <= 1:
        return None
    if run.engine:
        return f"length_groups: > 1 is not supported with {run.engine}; use 1 or leave it unset"
    if run.torch_compile:
        return ("length_groups: > 1 is not supported with torch_compile (each length group would be another "
                "compiled shape); use 1 or leave it unset")  # fmt: skip
    return None


def _zero3_saves_weights(run: ResolvedRun) -> str | None:
    if run.engine == "DeepSpeed ZeRO-3" and not run.zero3_saves_weights:
        return ("deepspeed: ZeRO-3 saves no model weights without stage3_gather_16bit_weights_on_model_save: set "
                "zero3_save_16bit_model: true in the accelerate config (or it in the DeepSpeed JSON)")  # fmt: skip
    return None


def _momentum_encoder_is_not_sharded(run: ResolvedRun) -> str | None:
    if run.momentum > 0 and run.engine:
        return (f"momentum: the momentum encoder is a whole copy of the model on every process, which {run.engine} "
                "shards (its parameters are not whole there to average); use --momentum 0 (a memory bank) or train "
                "without sharding")  # fmt: skip
    return None


def _objective_refusals(run: ResolvedRun) -> str | None:
    """The objective's own refusals of this run (its `check_for_training`), named by the flag they came from."""
    shape = run.shape()
    if shape is None:
        return None
    try:
        run.objective.options.check_for_training(shape)
    except ValueError as e:
        return str(option_error(e, run.objective.flags))
    return None


CHECKS: tuple[Callable[[ResolvedRun], str | None], ...] = (
    _sentences_with_column_flags,
    _pairs_with_text_column,
    _streaming_needs_max_steps,
    _streaming_cannot_drop_duplicates,
    _streaming_takes_no_pairs,
    _streaming_has_no_sampler,
    _streaming_has_no_topic_batches,
    _topic_re_clustering,
    _topic_clusters_with_a_sharded_model,
    _hard_negatives_need_them,
    _pairs_have_no_contrast_form,
    _pairs_have_no_word_repetition,
    _objective_form,
    _guide_margin_needs_a_guide,
    _grad_cache,
    _length_groups,
    _zero3_saves_weights,
    _momentum_encoder_is_not_sharded,
    _objective_refusals,
)
