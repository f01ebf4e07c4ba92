"""The STS suite's scores as MTEB result files: MTEB's layout, schema, task metadata and STS scores; read back too.

MTEB (mteb 2.x, `mteb.results.TaskResult`, `mteb.abstasks.sts.AbsTaskSTS`) scores each STS task alone: the two
sentences of every test pair encoded, the gold score against the cosine similarity, the negative Manhattan and
Euclidean distances and the model's own similarity, Pearson and Spearman of each, as fractions (0-1, not x 100);
`main_score` is `cosine_spearman`. Its STS12-16 are the sub-files pooled (SimCSE's `all`), its STSBenchmark is STS-B
test, its SICK-R is all 9,927 pairs (SimCSE scores the 4,927 test pairs).

A folder is an MTEB results cache, as `mteb.ResultCache(folder)` reads and `mteb.evaluate(..., cache=...)` writes:
`folder/results/{org}__{model}/{revision}/{Task}.json`, with `model_meta.json` beside the task files. With `mteb`
installed the files are written by its own `TaskResult.to_disk` and `ModelMeta.to_dict`; without it, in the same
schema (tests/test_mteb_results.py checks the two agree)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from torch import Tensor

from simcse_hn.data.sts import STS_TASKS, STSTask
from simcse_hn.errors import DataError
from simcse_hn.evaluation.mteb_scores import SCORE_KEYS, SIMILARITIES, sts_scores  # noqa: F401  (SCORE_KEYS: a task file's score keys, public here)
from simcse_hn.files import PACKAGED_MODELS, is_hub_id, portable_name
from simcse_hn.run_record import RunRecord


@dataclass(frozen=True)
class MTEBTask:
    name: str  # MTEB's task name
    dataset: str  # its Hub dataset
    revision: str  # the dataset revision its metadata pins


# mteb 2.x's task metadata for the suite (mteb.get_task(name).metadata: dataset path and revision); every task: split
# "test", hf_subset "default", languages ["eng-Latn"], main_score "cosine_spearman"
MTEB_TASKS = {
    "STS12": MTEBTask("STS12", "mteb/sts12-sts", "a0d554a64d88156834ff5ae9920b964011b16384"),
    "STS13": MTEBTask("STS13", "mteb/sts13-sts", "7e90230a92c190f1bf69ae9002b8cea547a64cca"),
    "STS14": MTEBTask("STS14", "mteb/sts14-sts", "6031580fec1f6af667f0bd2da0a551cf4f0b2375"),
    "STS15": MTEBTask("STS15", "mteb/sts15-sts", "ae752c7c21bf194d8b67fd573edf7ae58183cbe3"),
    "STS16": MTEBTask("STS16", "mteb/sts16-sts", "4d8694f8f0e0100860b497b999b3dbed754a0513"),
    "STS-B": MTEBTask("STSBenchmark", "mteb/stsbenchmark-sts", "b0fddb56ed78048fa8b90373c8a3cfc37b684831"),
    "SICK-R": MTEBTask("SICK-R", "mteb/sickr-sts", "20a6d6f312dd54037fe07a32d58e5e168867909d"),
}
OUR_NAME = {task.name: ours for ours, task in MTEB_TASKS.items()}
SPLIT, HF_SUBSET, LANGUAGES, MAIN_SCORE = "test", "default", ["eng-Latn"], "cosine_spearman"
NO_REVISION = "no_revision_available"  # MTEB's revision folder for a model without one
MODEL_META = "model_meta.json"
PROTOCOL = ("MTEB: each task alone, its test pairs pooled (STS12-16 sub-files, SICK-R all 9,927 pairs), "
            "cosine_spearman")  # fmt: skip


def mteb_installed() -> bool:
    return importlib.util.find_spec("mteb") is not None


def model_name(model: str, hub_model_id: str | None = None) -> str:
    """The name MTEB files a run under ("org/model"): --hub_model_id, a Hub id as it is, else local/<folder name>."""
    if hub_model_id:
        return hub_model_id
    if model in PACKAGED_MODELS:
        return PACKAGED_MODELS[model][2]
    if is_hub_id(model):
        return model if "/" in model else f"local/{model}"
    path = os.path.normpath(model)
    name = os.path.basename(path)
    if name.startswith("checkpoint-"):  # a checkpoint is named with its run
        name = f"{os.path.basename(os.path.dirname(path))}-{name}"
    return "local/" + name.replace(":", "-")


def adapted_from(training: dict | None) -> str | None:
    """The Hub id a trained model was adapted from (MTEB's adapted_from): its simcse_config's base_model when that is
    one ({"name", "local"}, files.source_record; a bare string from an older folder)."""
    base = RunRecord.from_json(training).model.base_model if training else None
    if base is None or base.local or not is_hub_id(base.name):
        return None
    return base.name


def model_revision(path: str) -> str:
    """The Hub commit of a model read from the Hub cache (…/snapshots/<commit>/), else MTEB's placeholder."""
    match = re.search(r"(?:^|/)snapshots/([0-9a-f]{40})(?:/|$)", os.path.abspath(path).replace(os.sep, "/"))
    return match.group(1) if match else NO_REVISION


def similarity_function(model: str, backend: str) -> str:
    """The model's own similarity (what MTEB's `pearson` and `spearman` use): a sentence-transformers model's
    `similarity_fn_name` (config_sentence_transformers.json, cosine when unset), cosine for a SimCSE model."""
    if backend != "sentence-transformers":
        return "cosine"
    path = os.path.join(model, "config_sentence_transformers.json")
    if not os.path.isdir(model):
        try:
            from huggingface_hub import hf_hub_download  # looked up when called (tests stand in for it)

            path = hf_hub_download(model, "config_sentence_transformers.json")
        except Exception:  # no such file or no network: sentence-transformers' default
            return "cosine"
    try:
        with open(path, encoding="utf-8") as f:
            name = json.load(f).get("similarity_fn_name")
    except (OSError, json.JSONDecodeError, AttributeError):
        return "cosine"
    return {"dot_product": "dot"}.get(name, name) if name in SIMILARITIES + ("dot_product",) else "cosine"


def path_name(name: str) -> str:
    """MTEB's folder name for a model name (ModelMeta.model_name_as_path)."""
    return name.replace("/", "__").replace(" ", "_")


def revision_folder(cache: str, name: str, revision: str) -> str:
    return os.path.join(cache, "results", path_name(name), revision)


# ModelMeta.to_dict()'s keys in its order, for the schema without mteb (ModelMeta.create_empty's values)
MODEL_META_DEFAULTS = {
    "loader_kwargs": {}, "name": None, "revision": None, "release_date": None, "languages": None,
    "n_parameters": None, "n_active_parameters_override": None, "n_embedding_parameters": None,
    "memory_usage_mb": None, "max_tokens": None, "embed_dim": None, "license": None, "open_weights": None,
    "public_training_code": None, "public_training_data": None, "framework": [], "reference": None,
    "similarity_fn_name": None, "use_instructions": None, "training_datasets": None, "adapted_from": None,
    "superseded_by": None, "modalities": ["text"], "model_type": ["dense"], "citation": None, "contacts": None,
    "experiment_kwargs": None, "output_dtypes": None, "extra_requirements_groups": None, "loader": None,
    "is_cross_encoder": False,
}  # fmt: skip


def model_meta(fields: dict, use_mteb: bool | None = None) -> dict:
    """model_meta.json: MTEB's ModelMeta of the model (name, revision, max_tokens, embed_dim, similarity_fn_name,
    framework, adapted_from, ...), validated by ModelMeta and dumped by its to_dict when mteb is installed."""
    unknown = set(fields) - set(MODEL_META_DEFAULTS)
    if unknown:
        raise ValueError(f"not ModelMeta fields: {sorted(unknown)}")
    if use_mteb if use_mteb is not None else mteb_installed():
        from mteb.models import ModelMeta  # mteb: the optional extra

        meta = ModelMeta.model_validate(ModelMeta.create_empty().model_dump() | fields)  # validated, enums parsed
        return json.loads(json.dumps(meta.to_dict(), default=str))
    return {**MODEL_META_DEFAULTS, **fields}


def task_result(task: str, scores: dict, evaluation_time: float, date: datetime, use_mteb: bool | None = None) -> dict:
    """One task's result file: MTEB's TaskResult (from_task_results, then to_disk's rounding to 6 decimals and date as
    a timestamp) when mteb is installed, else the same record; mteb_version is then null (no mteb computed it)."""
    meta = MTEB_TASKS[task]
    entry = {**scores, "main_score": scores[MAIN_SCORE]}
    if use_mteb if use_mteb is not None else mteb_installed():
        import mteb  # mteb: the optional extra
        from mteb.results import TaskResult

        result = TaskResult.from_task_results(mteb.get_task(meta.name), {SPLIT: {HF_SUBSET: entry}}, evaluation_time,
                                              date=date)  # fmt: skip
        record = json.loads(result.model_dump_json())
        record["date"] = date.timestamp()
        result._round_scores(record["scores"], 6)
        return record
    rounded = {key: round(value, 6) for key, value in entry.items()}
    return {
        "dataset_revision": meta.revision,
        "task_name": meta.name,
        "mteb_version": None,
        "scores": {SPLIT: [{**rounded, "hf_subset": HF_SUBSET, "languages": list(LANGUAGES)}]},
        "evaluation_time": evaluation_time,
        "kg_co2_emissions": None,
        "date": date.timestamp(),
        "evaluation_phases": None,
    }


def write_results(cache: str, meta: dict, results: dict[str, dict]) -> str:
    """results {our task name: task_result(...)} and meta (model_meta(...)) into their revision folder under the MTEB
    cache `cache`. -> that folder"""
    folder = revision_folder(cache, meta["name"], meta["revision"])
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, MODEL_META), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=4)
    for task, record in results.items():
        with open(os.path.join(folder, f"{MTEB_TASKS[task].name}.json"), "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2)
    return folder


def score_tasks(
    embeddings: Tensor, index: dict[str, int], tasks: Sequence[STSTask], similarity: str, encode_seconds: float
) -> dict[str, tuple[dict[str, float], float]]:
    """MTEB's scores of each task from the suite's embeddings (U, D) and {sentence: row} (evaluation.encode_union),
    every pair of the task pooled. -> {task: (scores, evaluation_time)}; the time is the task's share of the one
    encode call (its distinct sentences at the call's rate: what encoding it alone would take) plus its scoring."""
    out = {}
    for task in tasks:
        start = time.perf_counter()
        s1 = [s for pairs in task.subsets.values() for s in pairs.sentence1]
        s2 = [s for pairs in task.subsets.values() for s in pairs.sentence2]
        gold = [score for pairs in task.subsets.values() for score in pairs.scores]
        e1 = embeddings[[index[s] for s in s1]].float().numpy()  # (n, D)
        e2 = embeddings[[index[s] for s in s2]].float().numpy()  # (n, D)
        scores = sts_scores(e1, e2, gold, similarity)
        share = encode_seconds * len(set(s1) | set(s2)) / max(len(index), 1)
        out[task.name] = (scores, share + time.perf_counter() - start)
    return out


def write_report_folder(
    cache: str, report_dir: str, scored: dict[str, tuple[dict, float]], tasks: Sequence[STSTask], fields: dict
) -> dict:
    """The MTEB folder of one eval/sts.py run, and its results.json's settings["mteb_results"]: where the files are
    (relative to the report), which mteb wrote them, the protocol, per task its name, dataset, revision, pairs, scores.
    `fields`: model_meta's (name, revision, embed_dim, max_tokens, similarity_fn_name, adapted_from, ...)."""
    date = datetime.now(timezone.utc)
    results = {task: task_result(task, scores, round(seconds, 3), date) for task, (scores, seconds) in scored.items()}
    folder = write_results(cache, model_meta(fields), results)
    pairs = {task.name: task.pairs for task in tasks}
    written = next(iter(results.values()))["mteb_version"] if results else None
    return {
        "folder": os.path.relpath(folder, report_dir),
        "written_by": f"mteb {written} (TaskResult.to_disk)" if written else "simcse-hn, in mteb 2.x's schema",
        "protocol": PROTOCOL,
        "model_name": fields["name"],
        "revision": fields["revision"],
        "tasks": {task: {"task_name": MTEB_TASKS[task].name, "dataset": MTEB_TASKS[task].dataset,
                         "dataset_revision": MTEB_TASKS[task].revision, "split": SPLIT, "hf_subset": HF_SUBSET,
                         "pairs": pairs[task], **scored[task][0]}  # unrounded: the files keep 6 decimals
                  for task in results},
    }  # fmt: skip


def markdown_section(record: dict) -> str:
    """results.md's part on the MTEB files: their scores x 100 beside the report's, and which protocol is which."""
    names = [MTEB_TASKS[task].name for task in record["tasks"]]
    lines = ["## MTEB result files", "", f"In `{record['folder']}` (written by {record['written_by']}), model "
             f"`{record['model_name']}`, revision `{record['revision']}`. These hold MTEB's numbers: {PROTOCOL}; "
             "scores there are fractions, here x 100. The table above is SimCSE's protocol with MTEB's cosine: the "
             "same number wherever the pairs are the same (STS12-16 under aggregation all, STS-B; not SICK-R's "
             "test split).", "",
             "| Score | " + " | ".join(names) + " |", "|:---|" + "---:|" * len(names)]  # fmt: skip
    for key in ("cosine_spearman", "cosine_pearson", "spearman", "pearson"):
        lines.append(f"| {key} | " + " | ".join(f"{100 * t[key]:.2f}" for t in record["tasks"].values()) + " |")
    lines.append("| pairs | " + " | ".join(f"{t['pairs']:,}" for t in record["tasks"].values()) + " |")
    return "\n".join(lines) + "\n"


# --- reading MTEB result folders (ours or published ones) for eval/compare.py ---


def revision_folders(path: str) -> list[str]:
    """Every revision folder (one run: a model at a revision) at or under `path` (an MTEB cache, its results/, a
    model's folder or a revision folder), sorted; [] when `path` holds no task file in MTEB's layout."""
    if not os.path.isdir(path):
        return []
    if _task_files(path):
        return [path]
    for pattern_depth in (1, 2, 3):  # model/revision, results/model/revision, cache/results/model/revision
        found = []
        for root, dirs, _ in os.walk(path):
            depth = os.path.relpath(root, path).count(os.sep) + (root != path)
            if depth == pattern_depth and _task_files(root):
                found.append(root)
            if depth >= pattern_depth:
                dirs.clear()
        if found:
            return sorted(found)
    return []


def _task_files(folder: str) -> list[str]:
    names = {f"{task.name}.json" for task in MTEB_TASKS.values()}
    return sorted(name for name in os.listdir(folder) if name in names and os.path.isfile(os.path.join(folder, name)))


def read_task_file(path: str) -> dict:
    """{"task_name", "dataset_revision", "mteb_version", "scores": {key: value}} of the test split's default subset.
    Read by mteb's TaskResult.from_disk when mteb is installed (it also reads older mteb formats), else as 2.x."""
    if mteb_installed():
        from mteb.results import TaskResult  # mteb: the optional extra

        try:
            record = json.loads(TaskResult.from_disk(Path(path)).model_dump_json())
        except Exception as e:  # pydantic's and json's errors: one line naming the file
            raise DataError(f"{path}: not an MTEB result file ({str(e).splitlines()[0]})") from None
    else:
        try:
            with open(path, encoding="utf-8") as f:
                record = json.load(f)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{e.lineno}: malformed JSON ({e.msg})") from None
    for key in ("task_name", "scores"):
        if not isinstance(record, dict) or key not in record:
            raise DataError(f"{path}: no {key!r} key; expected an MTEB result file (mteb 2.x)")
    entries = record["scores"].get(SPLIT) if isinstance(record["scores"], dict) else None
    entry = next((e for e in entries or [] if isinstance(e, dict) and e.get("hf_subset") == HF_SUBSET), None)
    if entry is None:
        raise DataError(f"{path}: no scores for split {SPLIT!r}, hf_subset {HF_SUBSET!r}")
    score = entry.get(MAIN_SCORE, entry.get("main_score"))
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not np.isfinite(score):
        raise DataError(f"{path}: field {MAIN_SCORE!r} is not a finite number: {score!r}")
    return {"task_name": record["task_name"], "dataset_revision": record.get("dataset_revision"),
            "mteb_version": record.get("mteb_version"), "scores": entry}  # fmt: skip


def load_run(folder: str) -> dict:
    """A revision folder as a results.json-like record for eval/compare.py: Spearman x 100 of `cosine_spearman` per
    task under our names, aggregation "mteb" (MTEB's protocol). When eval/sts.py wrote the folder, the report above it
    (`writer_report`) gives its training record and pooler."""
    meta_path = os.path.join(folder, MODEL_META)
    meta = {}
    if os.path.isfile(meta_path):
        try:
            with open(meta_path, encoding="utf-8") as f:
                meta = json.load(f)
        except json.JSONDecodeError as e:
            raise DataError(f"{meta_path}:{e.lineno}: malformed JSON ({e.msg})") from None
    name = meta.get("name") or os.path.basename(os.path.dirname(os.path.normpath(folder))).replace("__", "/")
    tasks, revisions, versions = {}, {}, set()
    for filename in _task_files(folder):
        record = read_task_file(os.path.join(folder, filename))
        ours = OUR_NAME.get(record["task_name"])
        if ours is None:
            raise DataError(f"{os.path.join(folder, filename)}: task_name {record['task_name']!r} is not its file's")
        tasks[ours] = {"spearman": 100 * float(record["scores"][MAIN_SCORE]), "pairs": None, "subsets": {}}
        revisions[ours] = record["dataset_revision"]
        versions.add(str(record["mteb_version"]))
    tasks = {task: tasks[task] for task in STS_TASKS if task in tasks}
    report = writer_report(folder)
    return {
        "model": name,
        "label": name,
        "pooler": (report or {}).get("pooler"),
        "aggregation": "mteb",
        "sickr_pairs": "all",
        "date": (report or {}).get("date", "–"),
        "settings": {"mteb_folder": portable_name(folder), "revision": meta.get("revision", os.path.basename(folder)),
                     "dataset_revisions": revisions, "mteb_version": sorted(versions)},  # fmt: skip
        "training": (report or {}).get("training"),
        "tasks": tasks,
        "average": float(np.mean([t["spearman"] for t in tasks.values()])),
        "alignment_uniformity": None,
    }


def writer_report(folder: str) -> dict | None:
    """The results.json (eval/sts.py) whose settings["mteb_results"] names this revision folder, looked for in the
    folders above it (by default REPORT/mteb/results/{org}__{model}/{revision}); None when there is none."""
    here = os.path.realpath(folder)
    parent = here
    for _ in range(6):
        parent = os.path.dirname(parent)
        path = os.path.join(parent, "results.json")
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                results = json.load(f)
        except (OSError, json.JSONDecodeError):
            continue
        settings = results.get("settings") if isinstance(results, dict) else None
        written = ((settings or {}).get("mteb_results") or {}).get("folder") if isinstance(settings, dict) else None
        if written and os.path.realpath(os.path.join(parent, written)) == here:
            return results
    return None
