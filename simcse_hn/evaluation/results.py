"""The STS report's records: each pair's cosine and gold score (`save_predictions`, `load_predictions`, what
eval/compare.py's paired bootstrap resamples) and results.json (`sts_results`: scores, settings, package versions)."""

from __future__ import annotations

import logging
import platform
from collections.abc import Callable
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version

import numpy as np
from torch import Tensor

from simcse_hn.errors import DataError
from simcse_hn.files import portable_name

logger = logging.getLogger(__name__)

EncodeFn = Callable[[list[str]], Tensor]


# predictions.npz beside results.json: for each task T, three arrays of its n pairs, in the order of its sub-files
# in results.json ("T/cosine" float64, "T/gold" float64, "T/subset" unicode: the pair's sub-file), nothing pickled.
PREDICTIONS = "predictions.npz"


def save_predictions(path: str, predictions: dict[str, dict[str, np.ndarray]]) -> None:
    arrays = {f"{task}/{key}": value for task, columns in predictions.items() for key, value in columns.items()}
    np.savez_compressed(path, **arrays)


def load_predictions(path: str) -> dict[str, dict[str, np.ndarray]]:
    """-> {task: {"cosine", "gold", "subset"}} as `score_encoded_tasks` returns them."""
    predictions: dict[str, dict[str, np.ndarray]] = {}
    with np.load(path, allow_pickle=False) as data:
        for key in data.files:
            task, _, column = key.rpartition("/")
            predictions.setdefault(task, {})[column] = data[key]
    for task, columns in predictions.items():
        if set(columns) != {"cosine", "gold", "subset"} or len({len(v) for v in columns.values()}) != 1:
            raise DataError(f"{path}: {task}: expected cosine, gold and subset arrays of one length")
    return predictions


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    names = ("simcse-hn", "torch", "transformers", "sentence-transformers", "datasets", "evaluate", "scipy", "numpy")
    for name in names:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def sts_results(
    scores: dict,
    model: str,
    pooler: str | None,
    sickr_all: bool = False,
    settings: dict | None = None,
    alignment_uniformity: dict | None = None,
    training: dict | None = None,
) -> dict:
    """The results.json record (also the model folder's sts_results.json; hub.py's model card reads it).

    `alignment_uniformity`: analysis.alignment_uniformity_encoded's record (None when STS-B dev was not there);
    `training`: the evaluated folder's simcse_config.json (loss, loss_kwargs, contrast_form, seed, ...), None for
    a model this project did not train, so that a results file says what it measures by itself. Models, data and
    files are named as `files.portable_name` names them (no machine's absolute path).
    """
    settings = dict(settings or {})
    if "data" in settings:
        settings["data"] = portable_name(settings["data"])
    if "sources" in settings:
        settings["sources"] = {task: portable_name(source) for task, source in settings["sources"].items()}
    if alignment_uniformity and "source" in alignment_uniformity:
        alignment_uniformity = {**alignment_uniformity, "source": portable_name(alignment_uniformity["source"])}
    return {
        "model": portable_name(model),
        "pooler": pooler,
        "aggregation": scores["aggregation"],
        "sickr_pairs": "all" if sickr_all else "test",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": package_versions(),
        "settings": settings,
        "training": training,
        "tasks": scores["tasks"],
        "average": scores["average"],
        "alignment_uniformity": alignment_uniformity,
    }


# --- encoders: a SimCSEModel (saved folder, Hub id, builtin) or any sentence-transformers model ---
