"""What a resume must repeat: the whole record of the run (simcse_hn.run_record.RunRecord), compared field by field
with the resumed checkpoint's `simcse_config.json` before any model loads. Only the fields of one allowlist
(simcse_hn.record_compare.ALLOWLIST: where the run writes, how often it logs or saves, ...) may differ; any other
difference is refused in one line (ConfigError) that names the flag and gives both values: nothing is switched
silently, and the record never claims a value the run did not use.

The run's length (max_steps, or num_train_epochs when no max_steps is set) may grow only with --extend_schedule,
which the record's history keeps. A checkpoint written before the record (no `record_version`) is refused: its
settings cannot all be compared. A user's objective is compared by its class and the sha256 of its file and of the
modules of the user's it imports, not by its path: the same code resumes from another working directory, or after a
move."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from simcse_hn.errors import ConfigError
from simcse_hn.files import SIMCSE_CONFIG, read_json
from simcse_hn.losses.registry import portable_loss_name
from simcse_hn.record_compare import LENGTH_FIELDS, Difference, differences, section_fields
from simcse_hn.run_record import HistoryEvent, RunRecord
from simcse_hn.training.checkpoints import TRAINER_STATE

EXTEND_FLAG = "extend_schedule"


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping) and set(value) == {"name", "local"}:
        return str(value["name"])  # a Source
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k} {_shown(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, (list, tuple)):
        return " ".join(_shown(v) for v in value)
    return str(value)


def trained_record(checkpoint: str) -> RunRecord | None:
    """The record of `checkpoint` (None: no simcse_config.json); ConfigError (one line) for one written before the
    whole record was kept."""
    data = read_json(os.path.join(checkpoint, SIMCSE_CONFIG))
    if not isinstance(data, dict):
        return None
    record = RunRecord.from_json(data)
    if not record.is_whole:
        raise ConfigError(
            f"resume_from_checkpoint: {_name(checkpoint)} was written by an earlier simcse-hn, before runs kept their "
            f"whole record (its {SIMCSE_CONFIG} has no record_version), so this resume cannot be compared with it: "
            "finish it with the simcse-hn that started it, or start a new run (--overwrite_output_dir true)"
        )
    return record


def _name(checkpoint: str) -> str:
    return os.path.basename(os.path.normpath(checkpoint))


def _code(method) -> str:
    """The objective as a refusal names it: `--loss` as recorded, and a user's file and hash."""
    sha = method.objective_sha256
    return f"{method.loss}" + (f" (file {method.objective_file}, sha256 {sha[:12]})" if sha else "")


def check_resumed_objective(checkpoint: str, loss: str, objective: Mapping[str, Any]) -> None:
    """A checkpoint resumes only under the objective it was trained with, named again (`--loss`; `objective`: this
    run's record of it, ResolvedObjective.record()): a user's objective is code the checkpoint never imports, compared
    by class name and the sha256 of its file and of the modules it imports. Before any data is read. Raises
    ConfigError (one line)."""
    trained = trained_record(checkpoint)
    if trained is None or trained.method.loss is None:
        return
    method, name = trained.method, _name(checkpoint)
    own = (objective.get("class", "").rpartition(":")[2], objective.get("sha256"))
    if method.objective_sha256 or objective.get("sha256"):
        same = (method.objective_class or "").rpartition(":")[2] == own[0] and method.objective_sha256 == own[1]
    else:
        same = method.loss == portable_loss_name(loss)
    if not same and method.loss == portable_loss_name(loss):  # the same name, another file: both hashes
        raise ConfigError(
            f"loss: {name} was trained with --loss {_code(method)}; this run's file has sha256 "
            f"{(objective.get('sha256') or 'none')[:12]}: resume with the file it was trained with"
        )
    if not same:
        raise ConfigError(
            f"loss: {name} was trained with --loss {method.loss}; name it again to resume (this "
            f"run names --loss {loss})"
        )
    imports = objective.get("imports") or {}
    for module in sorted(set(method.objective_imports) | set(imports)):
        old, new = method.objective_imports.get(module), imports.get(module)
        if old != new:
            raise ConfigError(
                f"loss: module {module}, which the objective's file imports, is not the one {name} was "
                f"trained with (sha256 {_shown(old)[:12]}; now {_shown(new)[:12]}): resume with the code "
                "it was trained with, or start a new run"
            )


def check_resumed_record(
    checkpoint: str, now: RunRecord, option_flags: Mapping[str, str] | None = None, extend: bool = False
) -> RunRecord:
    """Refuse (ConfigError, one line) a resume of `checkpoint` whose record differs from this run's (`now`) in a
    field outside the allowlist; returns the record the resumed run goes on with: `now`, with the run family's
    start and history (this resume, and an extension of its length with `extend`)."""
    trained = trained_record(checkpoint)
    if trained is None:
        return now
    name, step = _name(checkpoint), (read_json(os.path.join(checkpoint, TRAINER_STATE)) or {}).get("global_step", 0)
    found = _relevant(differences(trained, now), now)
    others = [difference for difference in found if difference.path not in LENGTH_FIELDS]
    if others and others[0].path == "data.sha256":
        old, new = (
            f"{r.data.source.name if r.data.source else 'none'} (sha256 {str(r.data.sha256)[:12]})"
            for r in (trained, now)
        )
        raise ConfigError(
            f"train_file: {name} was trained on {old}; this run reads {new}; resume with the data it "
            "was trained on, or start a new run"
        )
    if others:
        raise ConfigError(_refusal(others[0], name, option_flags or {}))
    changes = {}
    for difference in found:
        longer = isinstance(difference.now, (int, float)) and difference.now > (difference.trained or 0)
        if not (extend and longer):
            why = f"pass --{EXTEND_FLAG} true to extend it" if longer else "a shorter run has another schedule"
            raise ConfigError(
                f"{difference.flag}: {name} was trained with {_shown(difference.trained)}; this run has "
                f"{_shown(difference.now)}: the learning-rate schedule would change mid-run; {why} "
                "(docs/reliability.md), or start a new run"
            )
        changes[difference.flag] = [difference.trained, difference.now]
    event = HistoryEvent(step, "extended" if changes else "resumed", changes, now.provenance.code.get("source_sha256"))
    provenance = dataclasses.replace(now.provenance, started=trained.provenance.started)
    return dataclasses.replace(now, provenance=provenance, history=(*trained.history, event))


def _relevant(found: list[Difference], now: RunRecord) -> list[Difference]:
    """The differences that matter, the corpus's bytes first (its refusal names both files); the number of epochs
    only where max_steps does not set the run's length."""
    found = sorted(found, key=lambda d: d.path != "data.sha256")
    steps = now.optimisation.max_steps
    return [d for d in found if not (d.path == "optimisation.num_train_epochs" and steps is not None and steps > 0)]


def _refusal(difference: Difference, name: str, option_flags: Mapping[str, str]) -> str:
    flag, old, new = difference.flag or difference.path, difference.trained, difference.now
    if difference.path.startswith("method.options."):
        key = difference.path.rpartition(".")[2]
        flag = "temperature" if key == "temperature" else option_flags.get(key, flag)
    shown = [_section(difference, value) for value in (old, new)]
    return (
        f"{flag}: {name} was trained with {shown[0]}; this run has {shown[1]}; resume with the settings it was "
        "trained with, or start a new run"
    )


def _section(difference: Difference, value: Any) -> str:
    """A value as a refusal shows it; a section by its fields' flags ('queue_size 16, momentum 0.5'), one that is off
    by its own words ('no queue')."""
    if value is None and difference.off is not None:
        return difference.off
    fields = section_fields(difference.path)
    if isinstance(value, Mapping) and fields:
        return ", ".join(f"{flag} {_shown(value.get(key))}" for key, flag in fields if value.get(key) is not None)
    return _shown(value)
