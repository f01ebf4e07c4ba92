"""What a resume must repeat: every setting that shapes the batches or the loss, as the run's record
(`simcse_config.json`) keeps it, compared with the resumed checkpoint's before any model loads. A resume repeats
them, or it is refused in one line (ConfigError) that names the setting by its flag and gives both values: nothing is
switched silently, and the record never claims a value the run did not use.

A user's objective is compared by its class and the sha256 of its file (the record's `objective`), not by its path:
the same file resumes from another working directory, or after a move."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from simcse_hn.errors import ConfigError
from simcse_hn.files import SIMCSE_CONFIG, read_json
from simcse_hn.losses.registry import portable_loss_name

# simcse_config.json key -> the flag a refusal names. Absent from a record: the setting was off (None).
SETTINGS = {
    "contrast_form": "contrast_form",
    "max_seq_length": "max_seq_length",
    "seed": "seed",
    "data_seed": "data_seed",
    "per_device_train_batch_size": "per_device_train_batch_size",
    "world_size": "world_size (processes)",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "data_format": "data_format",
    "negatives_per_example": "negative_columns (negatives per example)",
    "hard_negative_weight": "hard_negative_weight",
    "guide_model": "guide_model",
    "guide_margin": "guide_margin",
    "no_duplicates": "no_duplicates",
    "word_repetition": "word_repetition",
    "streaming": "streaming",
    "lora": "lora_r",
    "train_examples": "max_train_samples (training examples read)",
}
# settings kept as a mapping: key -> {field -> flag}
GROUPS = {
    "topic_batches": {"clusters": "topic_clusters", "share": "topic_share", "encoder": "topic_encoder",
                      "recluster_steps": "topic_recluster_steps"},  # fmt: skip
    "queue": {"size": "queue_size", "momentum": "momentum"},
}
GROUP_FLAGS = {"topic_batches": "topic_batches", "queue": "queue_size"}  # a group switched on or off


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k} {_shown(v)}" for k, v in sorted(value.items())) + "}"
    return str(value)


def _objective(record: Mapping[str, Any]) -> tuple[Any, ...]:
    """A record's objective as a resume compares it: a user's by class name and file hash, a built-in by name."""
    objective = record.get("objective") or {}
    if objective.get("sha256"):
        return (objective.get("class", "").rpartition(":")[2], objective["sha256"])
    return (record.get("loss"),)


def _code(record: Mapping[str, Any]) -> str:
    """The objective as a refusal names it: `--loss` as recorded, and a user's file and hash."""
    objective = record.get("objective") or {}
    sha = objective.get("sha256")
    return f"{record.get('loss')}" + (f" (file {objective.get('file')}, sha256 {sha[:12]})" if sha else "")


def _differs(flag: str, old: Any, new: Any) -> str:
    return f"{flag}: was trained with {_shown(old)}; this run has {_shown(new)}"


def resume_mismatch(
    trained: Mapping[str, Any], now: Mapping[str, Any], option_flags: Mapping[str, str] | None = None
) -> str | None:
    """The first setting in which record `now` (this run's simcse_config) differs from `trained` (the checkpoint's),
    as '<flag>: was trained with A; this run has B', or None when they agree. option_flags: the objective's option
    -> its flag (`temperature` is its own; others: `loss_options KEY`)."""
    if _objective(trained) != _objective(now):
        return f"loss: was trained with {_code(trained)}; this run has {_code(now)}"
    old_options, new_options = trained.get("loss_kwargs") or {}, now.get("loss_kwargs") or {}
    for key in sorted(set(old_options) | set(new_options)):
        if old_options.get(key) != new_options.get(key):
            flag = "temperature" if key == "temperature" else (option_flags or {}).get(key, f"loss_options {key}")
            return _differs(flag, old_options.get(key), new_options.get(key))
    old_data, new_data = trained.get("train_data_sha256"), now.get("train_data_sha256")
    if old_data is not None and old_data != new_data:
        old, new = ((record.get("train_file") or {}).get("name") for record in (trained, now))
        return (f"train_file: was trained on {old} (sha256 {str(old_data)[:12]}); this run reads {new} "
                f"(sha256 {str(new_data)[:12]})")  # fmt: skip
    for key, flag in SETTINGS.items():
        if key == "train_examples" and key not in trained:
            continue  # recorded since checkpoints had a manifest
        old, new = trained.get(key, _default(trained, key)), now.get(key, _default(now, key))
        if old != new:
            return _differs(flag, old, new)
    for key, fields in GROUPS.items():
        old, new = trained.get(key), now.get(key)
        if (old is None) != (new is None):
            return f"{GROUP_FLAGS[key]}: was trained with {_group(key, old)}; this run has {_group(key, new)}"
        for field, flag in fields.items():
            if old is not None and new is not None and old.get(field) != new.get(field):
                return _differs(flag, old.get(field), new.get(field))
    return None


def _group(key: str, value: Mapping[str, Any] | None) -> str:
    if value is None:
        return "no queue" if key == "queue" else f"no {key}"
    return ", ".join(f"{flag} {_shown(value.get(field))}" for field, flag in GROUPS[key].items())


def _default(record: Mapping[str, Any], key: str) -> Any:
    """What an absent key meant: no_duplicates is recorded only when it was given or the data is paired."""
    if key == "no_duplicates":
        return record.get("data_format") == "pairs"
    if key == "data_format":
        return "sentences"
    return None


def check_resumed_objective(checkpoint: str, loss: str, objective: Mapping[str, Any]) -> None:
    """A checkpoint resumes only under the objective it was trained with, named again (`--loss`; `objective`: this
    run's record of it): a user's objective is code the checkpoint never imports. Compared as `resume_mismatch`
    does, before any data is read. Raises ConfigError (one line)."""
    trained = read_json(os.path.join(checkpoint, SIMCSE_CONFIG))
    if not isinstance(trained, dict) or trained.get("loss") is None:
        return
    now = {"loss": portable_loss_name(loss), "objective": objective}
    if _objective(trained) != _objective(now):
        name = os.path.basename(os.path.normpath(checkpoint))
        if trained["loss"] == now["loss"]:  # the same name, another file: both hashes
            raise ConfigError(f"loss: {name} was trained with --loss {_code(trained)}; this run's file has sha256 "
                              f"{(objective.get('sha256') or 'none')[:12]}: resume with the file it was trained with")
        raise ConfigError(f"loss: {name} was trained with --loss {trained['loss']}; name it again to resume (this "
                          f"run names --loss {loss})")  # fmt: skip


def check_resumed_settings(
    checkpoint: str, now: Mapping[str, Any], option_flags: Mapping[str, str] | None = None
) -> None:
    """Refuse (ConfigError, one line) a resume of `checkpoint` whose record differs from this run's (`now`) in a
    setting that shapes the batches or the loss."""
    trained = read_json(os.path.join(checkpoint, SIMCSE_CONFIG))
    if not isinstance(trained, dict):
        return
    problem = resume_mismatch(trained, now, option_flags)
    if problem is not None:
        flag, _, rest = problem.partition(": ")
        name = os.path.basename(os.path.normpath(checkpoint))
        raise ConfigError(f"{flag}: {name} {rest}; resume with the settings it was trained with, or start a new run")
