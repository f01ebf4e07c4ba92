"""The sections of a study's plan (simcse_hn.study.plan.load_plan), each read and checked on its own: the base and
its arms, the seeds, the evaluation and its endpoint, the statistics, the pilot. Each problem goes to `problem(where,
message)`, so a plan's every problem is listed at once."""

from __future__ import annotations

import os

from simcse_hn.configuration.command_line import load_yaml
from simcse_hn.data.sts import STS_FILES, parse_tasks, read_sts_jsonl
from simcse_hn.errors import ConfigError

STUDY_SETS = ("output_dir", "seed", "overwrite_output_dir", "resume_from_checkpoint")  # the study's, per run
EVAL_SETS = ("model", "output", "push_to_hub", "save_to_model")
MAX_EXACT_SEEDS = 20  # stats.sign_flip_test: every one of 2^n sign patterns


def base_and_arms(path: str, raw: dict, known: set[str], problem) -> tuple[dict, dict]:
    """The plan's base settings (with its `config` file's) and arms, each key checked; the baseline among them."""
    base = mapping_of(raw, "base", problem)
    if "config" in base:
        config = os.path.join(os.path.dirname(os.path.abspath(path)), str(base.pop("config")))
        try:
            base = {**load_yaml(config), **base}
        except ConfigError as e:
            problem(("base", "config"), str(e))
    for key in base:
        if key not in known:
            problem(("base", key), "not a train.py key")
        elif key in STUDY_SETS:
            problem(("base", key), "set by the study for each run; leave it out")
    arms = mapping_of(raw, "arms", problem)
    for arm, overrides in list(arms.items()):
        arms[arm] = overrides = overrides or {}
        if not isinstance(overrides, dict):
            problem(("arms", arm), "an arm is a mapping of train.py keys (or {} for the base as it is)")
            arms[arm] = {}
        for key in arms[arm]:
            if key not in known:
                problem(("arms", arm, key), "not a train.py key")
            elif key in STUDY_SETS:
                problem(("arms", arm, key), "set by the study for each run; leave it out")
    if len(arms) < 2:
        problem(("arms",), f"a comparison needs two arms or more, got {len(arms)}")
    baseline = raw.get("baseline")
    if baseline not in arms:
        problem(("baseline",), f"{baseline!r} is not one of the arms ({', '.join(map(str, arms))})")
    return base, arms


def seeds_of(raw: dict, problem) -> list[int]:
    seeds = raw.get("seeds")
    if not isinstance(seeds, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        problem(("seeds",), "a list of integer seeds, one per paired replicate")
        seeds = []
    elif len(seeds) < 2:
        problem(("seeds",), f"a list of one seed cannot show a difference from seed noise; give 2 to "
                f"{MAX_EXACT_SEEDS}")  # fmt: skip
    elif len(set(seeds)) != len(seeds):
        problem(("seeds",), "a seed appears twice; the runs are paired by seed")
    elif len(seeds) > MAX_EXACT_SEEDS:
        problem(("seeds",), f"{len(seeds)} seeds; the exact sign-flip test takes at most {MAX_EXACT_SEEDS}")
    return seeds


def evaluation_of(path: str, raw: dict, eval_options: set[str] | None, problem) -> tuple[dict, str]:
    """The evaluation's flags and the endpoint, a score the report will have."""
    evaluation = mapping_of(raw, "evaluation", problem)
    for key in evaluation:
        if eval_options is not None and key not in eval_options:
            problem(("evaluation", key), "not an eval/sts.py flag")
        elif key in EVAL_SETS:
            problem(("evaluation", key), "set by the study for each run; leave it out")
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
        why = geometry_unmeasured(os.path.dirname(os.path.abspath(path)), evaluation)
        if why:
            problem(("endpoint",), f"{endpoint!r}: eval/sts.py will not measure it: {why}")
    return evaluation, endpoint


def statistics_of(raw: dict, problem) -> tuple:
    """The test, correction, level, smallest effect and assumed spread, as given (checked)."""
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
    return alpha, effect, spread


def pilot_of(raw: dict, known: set[str], problem):
    """The pilot's section, its train.py keys checked."""
    pilot = raw.get("pilot")
    if pilot is not None and not isinstance(pilot, dict):
        problem(("pilot",), "a mapping (see docs/studies.md)")
    sections = [(("pilot", part), pilot.get(part) or {}) for part in ("overrides", "reference")] \
        if isinstance(pilot, dict) else []  # fmt: skip
    tune = pilot.get("tune") if isinstance(pilot, dict) else None
    sections += [(("pilot", "tune", arm), grid) for arm, grid in (tune.items() if isinstance(tune, dict) else ())
                 if isinstance(grid, dict)]  # fmt: skip
    for where, keys in sections:
        for key in keys:
            if key not in known:
                problem((*where, key), "not a train.py key")
            elif key in STUDY_SETS:
                problem((*where, key), "set by the study for each run; leave it out")
    return pilot


def geometry_unmeasured(folder: str, evaluation: dict) -> str | None:
    """Why eval/sts.py under these flags measures no alignment and uniformity (it needs STS-B's dev pairs), or None."""
    if evaluation.get("no_alignment_uniformity"):
        return "evaluation.no_alignment_uniformity turns them off"
    if evaluation.get("data_dir"):
        source = os.path.join(folder, str(evaluation["data_dir"]), STS_FILES["STS-B"])
        if not os.path.isfile(source) or not any(r.get("split") == "dev" for r in read_sts_jsonl(source)):
            return f"{source} has no split 'dev' rows (alignment and uniformity are measured on STS-B dev)"
    return None


def mapping_of(raw: dict, key: str, problem) -> dict:
    value = raw.get(key) or {}
    if not isinstance(value, dict):
        problem((key,), f"a mapping, got {type(value).__name__}")
        return {}
    return dict(value)
