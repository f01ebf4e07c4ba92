"""The checks of a plan's parts that need only its YAML (and the files it names): each problem one line naming the
file, the line and the key (plan.load_plan runs them, then the checks that need train.py's reading of each arm)."""

from __future__ import annotations

import os
import re

from simcse_hn.configuration.command_line import load_yaml
from simcse_hn.configuration.parser import ARGUMENT_CLASSES
from simcse_hn.data.sts import STS_FILES, parse_tasks, read_sts_jsonl
from simcse_hn.errors import ConfigError
from simcse_hn.evaluation.reports import split_pooler
from simcse_hn.files import PACKAGED_MODELS, is_hub_id
from simcse_hn.modeling.loading import resolve_packaged
from simcse_hn.study.analysis import MAX_SEEDS
from simcse_hn.study.files import working_dir
from simcse_hn.testing.models import BUILTIN_MODELS

STUDY_SETS = ("output_dir", "seed", "overwrite_output_dir", "resume_from_checkpoint")  # the study's, per run
EVAL_SETS = ("model", "output", "push_to_hub", "save_to_model", "no_save_to_model")
LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")  # a start's label names its files: starts/<label>.json


def train_keys() -> set[str]:
    return {f.name for cls in ARGUMENT_CLASSES for f in cls.__dataclass_fields__.values() if f.init}


def configs(path: str, raw: dict, problem) -> tuple[dict, dict[str, dict]]:
    """The base (its `config:` file merged in) and the arms, each key a train.py key the study does not set."""
    base = mapping(raw, "base", problem)
    if "config" in base:
        config = os.path.join(os.path.dirname(os.path.abspath(path)), str(base.pop("config")))
        try:
            base = {**load_yaml(config), **base}
        except ConfigError as e:
            problem(("base", "config"), str(e))
    keys_of_train(("base",), base, problem)
    arms = mapping(raw, "arms", problem)
    for arm, overrides in list(arms.items()):
        if not isinstance(arm, str):  # YAML reads `2:` as a number; names are joined into lines and file names
            problem(("arms", str(arm)), f"an arm's name is text; quote it: '{arm}'")
            del arms[arm]
            arm = str(arm)
        arms[arm] = overrides or {}
        if not isinstance(arms[arm], dict):
            problem(("arms", arm), "an arm is a mapping of train.py keys (or {} for the base as it is)")
            arms[arm] = {}
        keys_of_train(("arms", arm), arms[arm], problem)
    if len(arms) < 2:
        problem(("arms",), f"a comparison needs two arms or more, got {len(arms)}")
    baseline = raw.get("baseline")
    if isinstance(baseline, (dict, list)) or baseline not in arms:  # a list or mapping: unhashable, never an arm
        problem(("baseline",), f"{baseline!r} is not one of the arms ({', '.join(map(str, arms))})")
    return base, arms


def keys_of_train(where: tuple, keys, problem) -> None:
    known = train_keys()
    for key in keys:
        if key not in known:
            problem((*where, key), "not a train.py key")
        elif key in STUDY_SETS:
            problem((*where, key), "set by the study for each run; leave it out")


def seeds(seeds, problem) -> list[int]:
    if not isinstance(seeds, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        problem(("seeds",), "a list of integer seeds, one per paired replicate")
        return []
    if len(seeds) < 2:
        problem(("seeds",), f"a list of one seed cannot show a difference from seed noise; give 2 to {MAX_SEEDS}")
    elif len(set(seeds)) != len(seeds):
        problem(("seeds",), "a seed appears twice; the runs are paired by seed")
    elif len(seeds) > MAX_SEEDS:
        problem(("seeds",), f"{len(seeds)} seeds; the exact sign-flip test takes at most {MAX_SEEDS}")
    return list(seeds)


def evaluation(path: str, raw: dict, eval_options: set[str] | None, problem) -> tuple[dict, list[str]]:
    """eval/sts.py's flags, the tasks they score and the endpoint among the report's scores."""
    evaluation = mapping(raw, "evaluation", problem)
    folder = os.path.dirname(os.path.abspath(path))
    for key in evaluation:
        if eval_options is not None and key not in eval_options:
            problem(("evaluation", key), "not an eval/sts.py flag")
        elif key in EVAL_SETS:
            problem(("evaluation", key), "set by the study for each run; leave it out")
    data_dir = evaluation.get("data_dir")
    if data_dir is not None and not os.path.isdir(os.path.join(folder, str(data_dir))):
        problem(
            ("evaluation", "data_dir"),
            f"{data_dir}: no such folder (relative to the plan; a local path, not a Hub id)",
        )
    try:
        tasks = parse_tasks(str(evaluation.get("tasks", "all")))
    except ValueError as e:
        problem(("evaluation", "tasks"), str(e))
        tasks = []
    endpoint = raw.get("endpoint", "average")
    scores = ["average", *tasks, "alignment", "uniformity"]
    if endpoint not in scores:
        problem(("endpoint",), f"{endpoint!r} is not a score of the report; choose from {', '.join(scores)}")
    elif endpoint in ("alignment", "uniformity"):
        why = geometry_unmeasured(folder, evaluation)
        if why:
            problem(("endpoint",), f"{endpoint!r}: eval/sts.py will not measure it: {why}")
    return evaluation, tasks


def numbers(raw: dict, problem) -> dict:
    """The test, correction, alpha, smallest effect and assumed spread, as the Plan's fields."""
    for key, allowed in (("test", "sign_flip"), ("correction", "holm")):
        if raw.get(key, allowed) != allowed:
            problem((key,), f"{raw[key]!r}: the study offers {allowed!r}")
    alpha = raw.get("alpha", 0.05)
    if not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        problem(("alpha",), f"a level between 0 and 1, got {alpha!r}")
    effect = raw.get("smallest_effect")
    if not isinstance(effect, (int, float)) or effect <= 0:
        problem(("smallest_effect",), f"the smallest effect of interest, in endpoint points (> 0), got {effect!r}")
    spread = raw.get("spread")
    if spread is not None and (not isinstance(spread, (int, float)) or spread <= 0):
        problem(("spread",), f"the assumed sd of the paired differences (> 0), got {spread!r}")
    return {
        "alpha": float(alpha) if isinstance(alpha, (int, float)) else 0.05,
        "smallest_effect": float(effect) if isinstance(effect, (int, float)) else 0.0,
        "spread": float(spread) if isinstance(spread, (int, float)) else None,
    }


def pilot_keys(pilot, problem) -> None:
    """The train.py keys of the pilot's overrides, reference and tuning grids (the rest: pilot.check)."""
    if not isinstance(pilot, dict):
        return
    sections = [(("pilot", part), pilot.get(part) or {}) for part in ("overrides", "reference")]
    tune = pilot.get("tune")
    sections += [
        (("pilot", "tune", arm), grid)
        for arm, grid in (tune.items() if isinstance(tune, dict) else ())
        if isinstance(grid, dict)
    ]
    for where, keys in sections:
        keys_of_train(where, keys, problem)


def geometry_unmeasured(folder: str, evaluation: dict) -> str | None:
    """Why eval/sts.py under these flags measures no alignment and uniformity (it needs STS-B's dev pairs), or None."""
    if evaluation.get("no_alignment_uniformity"):
        return "evaluation.no_alignment_uniformity turns them off"
    if evaluation.get("data_dir"):
        source = os.path.join(folder, str(evaluation["data_dir"]), STS_FILES["STS-B"])
        if not os.path.isfile(source) or not any(r.get("split") == "dev" for r in read_sts_jsonl(source)):
            return f"{source} has no split 'dev' rows (alignment and uniformity are measured on STS-B dev)"
    return None


def mapping(raw: dict, key: str, problem) -> dict:
    value = raw.get(key) or {}
    if not isinstance(value, dict):
        problem((key,), f"a mapping, got {type(value).__name__}")
        return {}
    return dict(value)


def starts(path: str, raw: dict, arms: dict, check_paths: bool, problem) -> dict[str, str]:
    """The encoders the arms start from, {label: MODEL[:POOLER]} read as eval/sts.py's --baseline reads one: a plain
    name each (its files are named by it) that no arm has, a model named once, and with `check_paths` a local folder
    that is there (relative to the plan) or a builtin this machine has."""
    found = mapping(raw, "starts", problem)
    folder = os.path.dirname(os.path.abspath(path))
    out: dict[str, str] = {}
    seen: dict[str, str] = {}
    for label, value in found.items():
        where = ("starts", str(label))
        if not isinstance(label, str) or not LABEL.fullmatch(label):
            problem(where, "a start's label is a plain name (letters, digits, '_', '-'): its files are named by it")
            continue
        if label in arms:
            problem(where, f"{label!r} is an arm's name too; give the start a name of its own")
        if not isinstance(value, str) or not value.strip():
            problem(
                where,
                "a model as eval/sts.py's --baseline takes one (a folder, Hub id or builtin:NAME, then :POOLER "
                f"optionally), got {type(value).__name__}",
            )
            continue
        if value in seen:
            problem(where, f"{value} is start {seen[value]!r} too: two labels for one start")
        seen.setdefault(value, label)
        why = start_missing(folder, value, label) if check_paths else None
        if why:
            problem(where, why)
        out[label] = value
    return out


def start_missing(folder: str, value: str, label: str) -> str | None:
    """Why a start's model is not there to score: a local folder that is not (read from the plan's folder), a
    builtin that is not one or whose pip package is missing. None: it is there, or a Hub id."""
    model, _ = split_pooler(value)
    if model.startswith("builtin:"):
        if model not in (*BUILTIN_MODELS, *PACKAGED_MODELS):
            return f"{model}: not a builtin ({', '.join((*BUILTIN_MODELS, *PACKAGED_MODELS))})"
        try:
            resolve_packaged(model, field=f"starts.{label}")
        except ConfigError as e:
            return str(e).removeprefix(f"starts.{label}: ")
        return None
    with working_dir(folder):
        if is_hub_id(model) or os.path.isdir(model):
            return None
    return f"{model}: no such folder (relative to the plan; a local path, not a Hub id)"
