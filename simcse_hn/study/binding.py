"""A run's record bound to what produced it: the sha256 of the model folder's files (its weights among them), of the
scores file and the predictions, and the fully resolved config of its arm; and the check that reads a record back
against those files, recomputing every score from the stored predictions and the evaluation data's gold scores.

A record is taken only when its file name, arm, seed and options agree with each other and with its folders, its hashes
with the files, and its numbers with the predictions; else one line says which. `run` takes no record, scores file or
model it has not checked this way; `report` counts out every record that fails it.

simcse_config.json (what a trained folder says of its run, also results.json's "training") is read in one place,
`trained_as`."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from simcse_hn.data.sts import load_sts_task
from simcse_hn.errors import DataError
from simcse_hn.evaluation.results import PREDICTIONS, load_predictions
from simcse_hn.evaluation.stats import observed_scores
from simcse_hn.files import MANIFEST, REPORT_MARK, SIMCSE_CONFIG, file_sha256, read_json, recorded_files
from simcse_hn.run_record import RunRecord

RESULTS = "results.json"
SCORED = (RESULTS, PREDICTIONS)  # what a record binds of its scores folder
SCORE_TOLERANCE = 1e-9  # Spearman x 100 recomputed from the predictions: the same numbers up to float rounding


def trained_as(simcse_config: dict | None) -> dict:
    """What a trained folder's record says of how it was trained: {"seed", "loss", "loss_kwargs",
    "train_data_sha256", "source_sha256"} (None where it is silent), read through `RunRecord` (a record of any
    version). The one reader of simcse_config.json in the study."""
    if not simcse_config:
        return dict.fromkeys(("seed", "loss", "loss_kwargs", "train_data_sha256", "source_sha256"))
    record = RunRecord.from_json(simcse_config).to_json()  # plain dicts and lists, as the arm's resolved config
    method = record["method"]
    return {
        "seed": record["optimisation"]["seed"],
        "loss": method["loss"],
        "loss_kwargs": dict(sorted({"temperature": method["temperature"], **(method["options"] or {})}.items())),
        "train_data_sha256": record["data"]["sha256"],
        "source_sha256": (record["provenance"]["code"] or {}).get("source_sha256"),
    }


def model_files(folder: str) -> dict[str, str] | None:
    """{file: sha256} of every file the model folder's manifest lists (weights, config, tokenizer, ...), or None for a
    folder with no final save."""
    names = recorded_files(folder)
    if names is None:
        return None
    return {name: file_sha256(os.path.join(folder, name)) for name in sorted(names) if name != MANIFEST}


def scores_files(folder: str) -> dict[str, str]:
    present = [name for name in SCORED if os.path.isfile(os.path.join(folder, name))]
    return {name: file_sha256(os.path.join(folder, name)) for name in present}


def mark_problem(folder: str) -> str | None:
    """Whether the scores folder's mark (simcse_report.json, written by eval/sts.py) lists its results and predictions
    with the content they have now."""
    mark = (read_json(os.path.join(folder, REPORT_MARK)) or {}).get("files") or {}
    for name in SCORED:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            return f"{name} is missing"
        if file_sha256(path) not in (mark.get(name) or []):
            return f"{name} is not the file eval/sts.py wrote ({REPORT_MARK} lists another)"
    return None


class Gold:
    """The evaluation data's test pairs, loaded once per task: what each prediction's gold score must be."""

    def __init__(self, data_dir: str | None, sickr_all: bool):
        self.data_dir, self.sickr_all, self.tasks = data_dir, sickr_all, {}

    def of(self, task: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(gold scores, sub-file labels) in the order eval/sts.py scores them; None with the data on the Hub."""
        if self.data_dir is None:
            return None
        if task not in self.tasks:
            loaded = load_sts_task(task, self.data_dir, self.sickr_all)
            gold = np.asarray([s for pairs in loaded.subsets.values() for s in pairs.scores], dtype=np.float64)
            labels = np.asarray([name for name, pairs in loaded.subsets.items() for _ in pairs.scores], dtype=str)
            self.tasks[task] = (gold, labels)
        return self.tasks[task]


def recomputed(folder: str, gold: Gold, aggregation: str) -> dict:
    """Every score of a scores folder from its predictions and the evaluation data's gold scores: {"average",
    "tasks": {task: Spearman x 100}}. DataError when a prediction's gold score or sub-file is not the data's."""
    predictions = load_predictions(os.path.join(folder, PREDICTIONS))
    for task, columns in predictions.items():
        expected = gold.of(task)
        if expected is None:
            continue
        if not (np.array_equal(columns["gold"], expected[0]) and np.array_equal(columns["subset"], expected[1])):
            raise DataError(f"{PREDICTIONS}: {task}'s gold scores are not the evaluation data's test pairs")
    scores = observed_scores(predictions, aggregation)
    average = scores.pop("average")
    return {"average": average, "tasks": scores}


def _close(a, b) -> bool:
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= SCORE_TOLERANCE * (1 + abs(b))


def numbers_problem(record: dict, results: dict, again: dict) -> str | None:
    """Whether the record's scores, results.json's and those the predictions give are one set of numbers."""
    for task, value in again["tasks"].items():
        said = record["scores"]["tasks"].get(task)
        if not _close(said, value):
            return f"its {task} {said} is not what its predictions give ({value!r})"
        if not _close(results["tasks"].get(task, {}).get("spearman"), value):
            return f"{RESULTS}'s {task} is not what its predictions give ({value!r})"
    if set(record["scores"]["tasks"]) != set(again["tasks"]):
        return "its tasks are not the tasks its predictions hold"
    if not _close(record["scores"]["average"], again["average"]):
        return f"its average {record['scores']['average']} is not what its predictions give ({again['average']!r})"
    if not _close(results.get("average"), again["average"]):
        return f"{RESULTS}'s average is not what its predictions give ({again['average']!r})"
    for key in ("alignment", "uniformity"):  # not in the predictions: held to the scores file the record binds
        geometry = results.get("alignment_uniformity") or {}
        if key in record["scores"] and not _close(record["scores"][key], geometry.get(key)):
            return f"its {key} is not its {RESULTS}'s"
    return None


def run_problem(record: dict, key: str, arm: str, seed: int) -> str | None:
    """Whether the record is the run its file is named for."""
    if (record.get("arm"), record.get("seed")) != (arm, seed):
        return f"names arm {record.get('arm')!r} seed {record.get('seed')!r}, not the run {key}"
    return None


def trained_problem(trained: dict, seed: int, objective: dict, where: str) -> str | None:
    """Whether a trained folder's own record (`trained_as`) is of this seed and the arm's objective."""
    if trained["seed"] != seed:
        return f"{where} was trained with seed {trained['seed']}, not {seed}"
    if trained["loss"] != objective["loss"]:
        return f"{where} was trained with loss {trained['loss']!r}, not the arm's {objective['loss']!r}"
    if trained["loss_kwargs"] != objective["loss_kwargs"]:
        return (
            f"{where} was trained with the options {trained['loss_kwargs']}, not the arm's {objective['loss_kwargs']}"
        )
    return None


def bound_problem(folder: str, record: dict) -> str | None:
    """Whether a scores folder is there, its mark lists its files as they are, and (a bound record) they are the
    files its record binds."""
    if not os.path.isdir(folder):
        return f"its scores folder {os.path.basename(folder)} is missing"
    problem = mark_problem(folder)
    if problem:
        return problem
    bound = (record.get("bound") or {}).get("scores")
    if bound is not None and bound != scores_files(folder):
        changed = [name for name in SCORED if bound.get(name) != scores_files(folder).get(name)]
        return f"{', '.join(changed)} is not the file its record binds (another sha256)"
    return None


def recomputed_problem(folder: str, record: dict, results: dict, gold: Gold, aggregation: str) -> str | None:
    """Whether every number of the record and of results.json is what the folder's predictions give."""
    try:
        again = recomputed(folder, gold, aggregation)
    except (DataError, OSError, ValueError, KeyError) as e:
        return str(e).splitlines()[0]
    return numbers_problem(record, results, again)


def check_scores(folder: str, record: dict, seed: int, objective: dict, gold: Gold, aggregation: str) -> str | None:
    """A run's scores folder against its record: the mark, the bound hashes (a bound record), the scored model's
    seed and objective, and every number recomputed from the predictions. -> why not, or None."""
    problem = bound_problem(folder, record)
    if problem:
        return problem
    results = read_json(os.path.join(folder, RESULTS))
    problem = trained_problem(trained_as(results.get("training")), seed, objective, "the scored model")
    return problem or recomputed_problem(folder, record, results, gold, aggregation)


def check_model(folder: str, record: dict, seed: int, objective: dict) -> str | None:
    """A bound record's model folder, when it is there (a study may keep its scores and not its weights): every file
    its record binds with that sha256, and the folder's own record of its seed and objective."""
    if not os.path.isdir(folder):
        return None
    files = model_files(folder)
    bound = ((record.get("bound") or {}).get("model") or {}).get("files")
    if files is None:
        return f"its model folder has no {MANIFEST} (no final save)"
    if bound is not None and files != bound:
        changed = sorted(n for n in set(files) | set(bound) if files.get(n) != bound.get(n))
        verb = "is" if len(changed) == 1 else "are"
        return f"its model folder's {', '.join(changed[:3])} {verb} not what its record binds"
    return trained_problem(trained_as(read_json(os.path.join(folder, SIMCSE_CONFIG))), seed, objective, "its model")


def copies(records: dict[str, dict], content: Callable[[dict], str | None], run: Callable[[dict], str]) -> dict:
    """{key: the earlier key whose content (predictions, weights) it repeats}: runs of different settings or seeds
    never give the same predictions or weights, so a repeat by another `run` (settings and seed) is a copy."""
    seen: dict[str, tuple[str, str]] = {}
    out = {}
    for key, record in records.items():
        found = content(record)
        if found is None:
            continue
        if found in seen and seen[found][1] != run(record):
            out[key] = seen[found][0]
        seen.setdefault(found, (key, run(record)))
    return out
