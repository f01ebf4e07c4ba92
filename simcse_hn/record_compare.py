"""What a resume compares: every field of the run's record (simcse_hn.run_record.RunRecord) but those `ALLOWLIST`
names, which cannot change a number the run computes. A field added to the record, or to the training arguments, is
compared by default (tests/test_run_record.py fails on a field neither compared nor allowlisted). The allowlist is
docs/reliability.md's table (tests/test_reliability_docs.py holds them equal)."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from simcse_hn.run_record import RunRecord, Source, section_type

# What may differ between a checkpoint and the run that resumes it: arguments (by field name) and record fields (by
# path) that cannot change a number the run computes. Everything else is compared; see docs/reliability.md.
ALLOWLIST: dict[str, str] = {
    # where the run writes and how it is resumed
    "output_dir": "where the run writes",
    "overwrite_output_dir": "whether the run may write into a folder it did not start",
    "resume_from_checkpoint": "which checkpoint the run resumes from",
    "extend_schedule": "whether a resume may lengthen the run (max_steps and num_train_epochs are compared)",
    # logging: what the logs show, not what is computed
    "logging_strategy": "how often the run logs",
    "logging_steps": "how often the run logs",
    "logging_first_step": "how often the run logs",
    "logging_nan_inf_filter": "what the logged loss shows",
    "log_on_each_node": "which processes log",
    "log_level": "how much the logs say",
    "log_level_replica": "how much the logs say",
    "disable_tqdm": "the progress bar",
    "report_to": "where the logs go",
    "run_name": "the logs' name of the run",
    "project": "the logs' project",
    "trackio_space_id": "where the logs go",
    "trackio_bucket_id": "where the logs go",
    "trackio_static_space_id": "where the logs go",
    "include_num_input_tokens_seen": "a logged count",
    "skip_memory_metrics": "logged memory figures",
    # checkpoints: saving reads the weights and the RNG state, never changes them
    "save_strategy": "how often checkpoints are written",
    "save_steps": "how often checkpoints are written",
    "save_total_limit": "how many checkpoints are kept",
    "save_on_each_node": "which processes write checkpoints",
    "enable_jit_checkpoint": "whether a checkpoint is written when the job is stopped",
    # the Hub: where the finished model goes
    "push_to_hub": "whether the model is pushed",
    "hub_token": "the push's credentials (never recorded)",
    "hub_private_repo": "the pushed repo's visibility",
    "hub_model_id": "where the model is pushed",
    "hub_strategy": "when the model is pushed",
    "hub_always_push": "when the model is pushed",
    "hub_revision": "where the model is pushed",
    # processes and loaders: how fast, not what
    "dataloader_num_workers": "how many processes load batches (the batches are the sampler's)",
    "dataloader_pin_memory": "how batches reach the device",
    "dataloader_persistent_workers": "how many processes load batches",
    "dataloader_prefetch_factor": "how far ahead batches are loaded",
    "dataloader_multiprocessing_context": "how loader processes start",
    "ddp_timeout": "how long processes wait for each other",
    "torch_empty_cache_steps": "when the device's cache is emptied (memory, not numbers)",
    "local_rank": "this process's place in the launch",
    "do_train": "not read by simcse-hn-train",
    "do_eval": "not read by simcse-hn-train",
    "do_predict": "not read by simcse-hn-train",
    # record fields
    "run_id": "which run family (a resume takes its checkpoint's)",
    "record_version": "checked on its own: an older record is refused",
    "provenance": "simcse-hn's own code and the libraries' versions: recorded, and each resume's in history",
    "budget": "how far the run got (written when it ends)",
    "history": "what happened to the run family (resumes, extensions)",
    "model.license": "read from the base model's card",
    "method.objective_file": "where the objective's file was (it may move; its sha256 is compared)",
    "method.objective_name": "the objective's own description (its class and file are compared)",
    "method.objective_title": "the objective's own description",
    "method.objective_summary": "the objective's own description",
    "method.objective_citation": "the objective's own description",
}
# The run's length: compared, and raised only with --extend_schedule (recorded in `history`).
LENGTH_FIELDS = ("optimisation.max_steps", "optimisation.num_train_epochs")


def allowlisted(path: str) -> bool:
    """Whether record field `path` ('optimisation.arguments.logging_steps', 'provenance.code') may differ."""
    parts = path.split(".")
    if parts[:2] == ["optimisation", "arguments"] and len(parts) > 2 and parts[2] in ALLOWLIST:
        return True
    return any(".".join(parts[:k]) in ALLOWLIST for k in range(1, len(parts) + 1))


@dataclass(frozen=True)
class Difference:
    path: str  # the record field ('method.queue.size')
    flag: str | None  # the flag a refusal names ('queue_size'); None: the field has none (tests fail on it)
    trained: Any  # the checkpoint's value (JSON); a section: a mapping, or None when it was off
    now: Any
    off: str | None = None  # how a section that is off reads ('no queue')


def differences(trained: RunRecord, now: RunRecord) -> list[Difference]:
    """Every field, in the record's order, in which `now` differs from `trained`, but those ALLOWLISTed."""
    return json_differences(trained.to_json(), now.to_json())


def json_differences(trained: dict[str, Any], now: dict[str, Any]) -> list[Difference]:
    """`differences` of two records as JSON (RunRecord.to_json)."""
    found: list[Difference] = []
    _walk(RunRecord, trained, now, "", found)
    return found


def _walk(cls: Any, old: Any, new: Any, prefix: str, found: list[Difference]) -> None:
    hints = typing.get_type_hints(cls)
    for item in dataclasses.fields(cls):
        path = f"{prefix}{item.name}"
        if allowlisted(path):
            continue
        a, b = old.get(item.name), new.get(item.name)
        kind = section_type(hints[item.name])
        if kind is not None and kind is not Source and isinstance(a, dict) and isinstance(b, dict):
            _walk(kind, a, b, path + ".", found)
        elif kind is None and isinstance(a, dict) and isinstance(b, dict):  # a mapping: key by key
            for key in [*a, *(k for k in b if k not in a)]:
                if not allowlisted(f"{path}.{key}") and a.get(key) != b.get(key):
                    found.append(Difference(f"{path}.{key}", _mapping_flag(path, key), a.get(key), b.get(key)))
        elif a != b:
            off = item.metadata.get("off")
            found.append(Difference(path, item.metadata.get("flag"), a, b, off))


def _mapping_flag(path: str, key: str) -> str:
    if path == "optimisation.arguments":
        return key
    if path == "method.options":
        return f"loss_options {key}"
    if path == "method.objective_imports":
        return f"loss (module {key}, imported by its file)"
    return f"{path}.{key}"


def record_paths(cls: type = RunRecord, prefix: str = "") -> list[tuple[str, str | None]]:
    """(path, flag) of every field of the record's classes, sections expanded (docs and tests list them)."""
    hints = typing.get_type_hints(cls)
    rows: list[tuple[str, str | None]] = []
    for item in dataclasses.fields(cls):
        path = f"{prefix}{item.name}"
        section = section_type(hints[item.name])
        rows.append((path, item.metadata.get("flag")))
        if section is not None and section is not Source:
            rows += record_paths(section, path + ".")
    return rows


def section_fields(path: str) -> list[tuple[str, str]]:
    """(field, flag) of the record section at `path` ('method.queue' -> size queue_size, momentum momentum); [] when
    `path` is no section."""
    cls: Any = RunRecord
    for name in path.split("."):
        hints = typing.get_type_hints(cls)
        cls = section_type(hints[name]) if name in hints else None
        if cls is None or cls is Source:  # a source reads as its name
            return []
    return [(f.name, f.metadata.get("flag", f.name)) for f in dataclasses.fields(cls)]


def allowlist_markdown() -> str:
    """docs/reliability.md's table of what a resume may change (tests/test_reliability_docs.py holds them equal)."""
    rows = [f"| `{name}` | {why} |" for name, why in ALLOWLIST.items()]
    return "\n".join(["| may differ on resume | because it is |", "|:--|:--|", *rows])


def record_markdown() -> str:
    """docs/reliability.md's table of the record's fields and the flag a refusal names."""
    rows = []
    for path, flag in record_paths():
        if allowlisted(path):
            shown = "not compared (allowlist)"
        elif path == "optimisation.arguments":
            shown = "every other argument not in the allowlist, by its own name"
        else:
            shown = f"`{flag}`" if flag else "(its fields)"
        rows.append(f"| `{path}` | {shown} |")
    return "\n".join(["| field of simcse_config.json | a refusal names |", "|:--|:--|", *rows])
