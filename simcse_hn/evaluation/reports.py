"""Markdown for the STS report: the SimCSE paper's table (`results_table`), one run's report (`results_markdown`),
model labels that tell runs apart, the scoring protocol in words and the training summary."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence

from torch import Tensor

from simcse_hn.data.sts import STS_TASKS
from simcse_hn.errors import DataError
from simcse_hn.evaluation import mteb_results
from simcse_hn.evaluation.scoring import AGGREGATION_HELP
from simcse_hn.files import is_generic_folder, is_hub_id
from simcse_hn.modeling.loading import resolve_packaged
from simcse_hn.modeling.model import POOLERS
from simcse_hn.run_record import RunRecord
from simcse_hn.testing.models import BUILTIN_MODELS

logger = logging.getLogger(__name__)

EncodeFn = Callable[[list[str]], Tensor]


def task_columns(runs: Sequence[tuple[str, dict]]) -> list[str]:
    present = {name for _, results in runs for name in results["tasks"]}
    return [name for name in STS_TASKS if name in present]


def model_label(name_or_path: str) -> str:
    """A short label: a local folder's name (its parent's too for `checkpoint-N` and generic names such as `model`),
    else the Hub id.

    A path that is not a folder here (results read on another machine) is recognised by its form: absolute,
    relative with ./ or ../, or more than one '/' (a Hub id has one)."""
    local = os.path.isdir(name_or_path) or os.path.isabs(name_or_path) or name_or_path.startswith(".")
    if not local and name_or_path.count("/") <= 1:
        return name_or_path
    path = os.path.normpath(name_or_path)
    name = os.path.basename(path)
    generic = is_generic_folder(name)
    if generic and os.path.basename(os.path.dirname(path)):
        return f"{os.path.basename(os.path.dirname(path))}/{name}"
    return name


def split_pooler(spec: str) -> tuple[str, str | None]:
    """'MODEL[:POOLER]' -> (MODEL, POOLER or None): a pooler after the last ':' ('builtin:tiny-bert' has none)."""
    head, _, tail = spec.rpartition(":")
    return (head, tail) if head and tail in POOLERS else (spec, None)


def parse_baseline(spec: str) -> tuple[str, str, str | None]:
    """'MODEL[:POOLER]' -> (the model as named, its folder or Hub id, the pooler or None); a pip package's model
    (builtin:all-MiniLM-L6-v2) resolved to its folder. Checked before any model loads."""
    name, pooler = split_pooler(spec)
    path = resolve_packaged(name, field="--baseline") if name.startswith("builtin:") else name
    if not os.path.isdir(path) and not is_hub_id(path) and path not in BUILTIN_MODELS:
        raise DataError(f"--baseline {spec}: {name!r} is neither a model folder nor a Hub id (the pooler, after "
                        f"':', is one of {', '.join(POOLERS)})")  # fmt: skip
    return name, path, pooler


def pooling_name(model: str, info: dict) -> str:
    """How a row's encoder pools, for its label: the pooler, or a sentence-transformers model's own pooling as its
    Pooling module's config names it (sentence-transformers 5.x `pooling_mode_mean_tokens: true`, later
    `pooling_mode: "mean"`)."""
    if info["pooler"] is not None:
        return info["pooler"]
    try:
        with open(os.path.join(model, "1_Pooling", "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        modes = [config["pooling_mode"]] if isinstance(config.get("pooling_mode"), str) else [
            key[len("pooling_mode_"):].replace("_tokens", "").replace("_token", "")
            for key, on in config.items() if key.startswith("pooling_mode_") and on is True]  # fmt: skip
    except (OSError, ValueError, AttributeError):
        modes = []
    return f"own {'+'.join(modes)} pooling" if modes else "own modules"


def unique_labels(labels: Sequence[str], paths: Sequence[str]) -> list[str]:
    """Labels made distinct where two coincide: each of those gets the nearest folder above its path that tells
    them apart (…/run_a/sts/results.json and …/run_b/sts/results.json: "run_a/x", "run_b/x"), else a number."""
    out = list(labels)
    for label in set(labels):
        same = [k for k, other in enumerate(labels) if other == label]
        if len(same) < 2:
            continue
        parts = {k: os.path.normpath(os.path.abspath(paths[k])).split(os.sep)[:-1] for k in same}
        for depth in range(1, max(len(p) for p in parts.values()) + 1):
            names = [parts[k][-depth] if depth <= len(parts[k]) else "" for k in same]
            if len(set(names)) == len(names):
                for k, name in zip(same, names):
                    out[k] = f"{name}/{label}"
                break
        else:
            for number, k in enumerate(same, start=1):
                out[k] = f"{label} ({number})"
    return out


def protocol(results: dict) -> str:
    """How a results record was scored, in words: two records with other protocols are not one measurement."""
    if results.get("aggregation") == "mteb":  # an MTEB result folder (simcse_hn.evaluation.mteb_results.load_run)
        return "MTEB protocol (each task alone, SICK-R all 9,927 pairs)"
    sickr = "SICK-R all 9,927 pairs (MTEB)" if results.get("sickr_pairs") == "all" else "SICK-R test (SimCSE)"
    return f"aggregation {results['aggregation']}, {sickr}"


def results_table(runs: Sequence[tuple[str, dict]]) -> str:
    """Markdown table in the SimCSE paper's layout: one row per (label, results), Spearman x 100, two decimals."""
    columns = task_columns(runs)
    protocols = {protocol(results) for _, results in runs}
    header = ["Model", *columns, "Avg."] + (["Protocol"] if len(protocols) > 1 else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join([":---"] + ["---:"] * (len(columns) + 1)) + "|"]
    if len(protocols) > 1:
        lines[1] += ":---|"
    for label, results in runs:
        cells = [f"{results['tasks'][c]['spearman']:.2f}" if c in results["tasks"] else "–" for c in columns]
        row = [label, *cells, f"{results['average']:.2f}"] + ([protocol(results)] if len(protocols) > 1 else [])
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def training_summary(training: dict | None) -> str:
    """One line for the objective a results file was trained with (its simcse_config.json, of any version), or ''."""
    if not training:
        return ""
    record = RunRecord.from_json(training)
    method, optimisation = record.method, record.optimisation
    parts = [f"loss `{method.loss or '?'}`"]
    if method.contrast_form:
        parts.append(f"contrast form `{method.contrast_form}`")
    options = {"temperature": method.temperature, **method.options} if method.temperature is not None else {}
    # sorted, temperature among them, as simcse_config.json has always stored them (pages regenerate byte for byte)
    parts += [f"{key} {_word(value)}" for key, value in sorted((options or method.options).items())]
    shown = {
        "seed": optimisation.seed,
        "base_model": _source(record.model.base_model),
        "max_seq_length": record.model.max_seq_length,
        "per_device_train_batch_size": optimisation.per_device_train_batch_size,
        "learning_rate": optimisation.learning_rate,
    }
    parts += [f"{key} {_word(value)}" for key, value in shown.items() if value is not None]
    return ", ".join(parts)


def _source(source) -> str | None:
    """A recorded source by its name, `(local)` after a local one's."""
    return None if source is None else source.name + (" (local)" if source.local else "")


def _word(value) -> str:
    """A record's value in a sentence: text as it is, anything else as JSON writes it (null, false, [1, 2]), never
    a Python repr."""
    return value if isinstance(value, str) else json.dumps(value)


def results_markdown(results: dict, label: str | None = None, baselines: Sequence[tuple[str, dict]] = ()) -> str:
    """results.md: the paper-layout table (with a row per baseline scored in the same run: (label, results)), the
    protocol, alignment and uniformity, each task's sub-files, the MTEB files' scores and a note when the model was
    trained by other code than evaluated it."""
    label = label or model_label(results["model"])
    aggregation = AGGREGATION_HELP[results["aggregation"]]
    pooler = results.get("pooler") or "the model's own sentence-transformers modules"
    sickr = (
        "all 9,927 pairs (MTEB's protocol, not SimCSE's)"
        if results.get("sickr_pairs") == "all"
        else "the 4,927 test pairs (SimCSE)"
    )
    lines = [
        f"# STS results: {label}",
        "",
        results_table([(label, results), *baselines]),
        f"Spearman x 100 of cosine similarities. Aggregation of STS12-16 sub-files: {aggregation}. "
        f"STS-B: test. SICK-R: {sickr}. Pooler: {pooler}. "
        f"Date: {results['date']}.",
        "",
    ]
    if baselines:
        lines += [f"{', '.join(b for b, _ in baselines)}: scored in the same run with the same tasks, protocol and "
                  "input length; the sections below are the model's.", ""]  # fmt: skip
    if results.get("training"):
        lines += [f"Trained with {training_summary(results['training'])}.", ""]
        command = RunRecord.from_json(results["training"]).provenance.command
        if command:
            lines += [f"Training command: `{command}`.", ""]
    if (results.get("settings") or {}).get("command"):
        lines += [f"Made by `{results['settings']['command']}`.", ""]
    geometry = results.get("alignment_uniformity")
    if geometry:
        lines += [
            "## Alignment and uniformity (STS-B dev)",
            "",
            "| Alignment | Uniformity | Positive pairs | Sentences |",
            "|---:|---:|---:|---:|",
            f"| {geometry['alignment']:.4f} | {geometry['uniformity']:.4f} | {geometry['positive_pairs']:,} | "
            f"{geometry['sentences']:,} |",
            "",
            f"Lower is better for both. Protocol: {geometry['protocol']}."
            + (f" Data: {geometry['source']}." if geometry.get("source") else ""),
            "",
        ]
    for name, task in results["tasks"].items():
        lines += [f"## {name}: {task['spearman']:.2f} ({task['pairs']:,} pairs)", ""]
        lines += ["| Sub-file | Pairs | Spearman |", "|:---|---:|---:|"]
        lines += [f"| {sub} | {s['pairs']:,} | {s['spearman']:.2f} |" for sub, s in task["subsets"].items()]
        lines.append("")
    text = "\n".join(lines)
    settings = results.get("settings") or {}
    if settings.get("mteb_results"):
        text += "\n" + mteb_results.markdown_section(settings["mteb_results"])
    if settings.get("same_code") is False:
        text += ("\n**Code differs:** this evaluation ran other code (source_sha256 "
                 f"{settings['code']['source_sha256'][:12]}) than the model's training "
                 f"({settings['training_code']['source_sha256'][:12]}).\n")  # fmt: skip
    return text
