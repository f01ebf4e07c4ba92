"""A study's run records, <study>/runs/<arm>-s<seed>.json, and the one check every reader of them applies (`run`
before it skips a run, `report` before it counts one): the record is the run its name says, of this version's
settings, code and data, bound to its model folder and scores folder (binding.py), its numbers those its predictions
give, and no copy of another run's. Anything else is refused in one line naming the run and what is wrong."""

from __future__ import annotations

import os

import yaml

from simcse_hn.files import file_sha256
from simcse_hn.study import binding
from simcse_hn.study.files import read_json, text_sha256
from simcse_hn.study.lock import SCHEMA, locked_plan
from simcse_hn.study.plan import Plan, eval_flags
from simcse_hn.study.resolved import FILE_KEYS, resolve_config


def run_key(arm: str, seed: int) -> str:
    return f"{arm}-s{seed}"


def record_path(plan: Plan, key: str) -> str:
    return os.path.join(plan.study_dir, "runs", f"{key}.json")


def model_folder(plan: Plan, key: str) -> str:
    return os.path.join(plan.study_dir, "runs", key)


def scores_folder(plan: Plan, key: str) -> str:
    return os.path.join(plan.study_dir, "runs", f"{key}-sts")


def spec(plan: Plan, version: dict, arm: str) -> dict:
    """What a run of `arm` trains and scores under `version`: its train.py config and eval/sts.py flags."""
    return {"config": plan.config(arm, version.get("picks")), "evaluation": eval_flags(plan.evaluation)}


def spec_sha256(run_spec: dict) -> str:
    return text_sha256(yaml.safe_dump(run_spec, sort_keys=True))


def mismatch(record: dict, version: dict, plan: Plan) -> str | None:
    """Why a finished run is not a run of this version of the plan, or None: other settings, code or data."""
    if record.get("spec_sha256") != spec_sha256(spec(plan, version, record["arm"])):
        return f"trained under other settings (plan version {record.get('plan_version')})"
    for field, verb in (("code", "by"), ("data", "on")):
        if record.get(f"{field}_sha256") != version[field]["sha256"]:
            return (
                f"trained {verb} other {field} ({field} {str(record.get(f'{field}_sha256'))[:12]}, the plan's "
                f"{version[field]['sha256'][:12]})"
            )
    if version.get("schema") and record.get("config_sha256") != version["arms"][record["arm"]]:
        return f"its resolved train.py config is not the one version {version['version']} locked"
    return None


class Checker:
    """The check of every record of one version of a plan (the gold scores and the arms' objectives read once)."""

    def __init__(self, plan: Plan, version: dict):
        self.plan, self.version = plan, version
        data_dir = plan.evaluation.get("data_dir")
        folder = os.path.join(plan.folder, str(data_dir)) if data_dir else None
        self.gold = binding.Gold(folder, bool(plan.evaluation.get("sickr_all")))
        self.aggregation = str(plan.evaluation.get("aggregation", "all"))
        self.objectives = self._objectives()

    def _objectives(self) -> dict[str, dict]:
        """Each arm's objective as train.py resolves it: from the version's resolved file, or (a version locked
        before it held one) read again now."""
        locked = locked_plan(self.plan, self.version) if self.version.get("schema") else None
        if locked is not None and "arms" in locked:
            return {arm: settings["objective"] for arm, settings in locked["arms"].items()}
        picks = self.version.get("picks")
        configs = {arm: self.plan.config(arm, picks) for arm in self.plan.arms}  # its data need not be here
        return {
            arm: resolve_config(self.plan.folder, {k: v for k, v in c.items() if k not in FILE_KEYS})["objective"]
            for arm, c in configs.items()
        }

    def run_of(self, key: str) -> tuple[str, int] | None:
        return next(((a, s) for s in self.plan.seeds for a in self.plan.arms if run_key(a, s) == key), None)

    def problem(self, key: str, record: dict) -> str | None:
        """Why the record at runs/<key>.json is not taken, or None."""
        run = self.run_of(key)
        if run is None:
            return "not a run of the plan (no arm and seed of it has this name)"
        arm, seed = run
        problem = binding.run_problem(record, key, arm, seed) or mismatch(record, self.version, self.plan)
        if problem:
            return problem
        if self.version.get("schema", 0) >= SCHEMA and "bound" not in record:
            return f"no hashes of its model and scores (version {self.version['version']}'s runs carry them)"
        trained = record.get("trained") or {}
        if trained.get("source_sha256") != trained.get("scored_by_source_sha256"):
            return "scored by other code than trained it"
        objective = self.objectives[arm]
        if "bound" not in record:  # a record written before records were bound: the options it states are checked
            objective = {**objective, "loss_kwargs": _shared(objective["loss_kwargs"], record, self.plan, arm)}
        return binding.check_scores(
            scores_folder(self.plan, key), record, seed, objective, self.gold, self.aggregation
        ) or binding.check_model(model_folder(self.plan, key), record, seed, objective)

    def gather(self) -> tuple[dict[str, dict], dict[str, str]]:
        """-> (the records taken {key: record}, in the plan's order; the records refused {key: why})."""
        runs = os.path.join(self.plan.study_dir, "runs")
        names = sorted(f[:-5] for f in os.listdir(runs) if f.endswith(".json")) if os.path.isdir(runs) else []
        order = [run_key(a, s) for s in self.plan.seeds for a in self.plan.arms]
        taken, refused = {}, {}
        for key in [k for k in order if k in names] + [k for k in names if k not in order]:
            try:
                record = read_json(record_path(self.plan, key))
            except ValueError:
                refused[key] = "not a JSON record"
                continue
            problem = self.problem(key, record) if isinstance(record, dict) else "not a record"
            if problem:
                refused[key] = problem
            else:
                taken[key] = record
        for found, name in (("predictions", self._predictions), ("weights", self._weights)):
            for key, original in binding.copies(taken, name, _identity).items():
                refused[key] = f"its {found} are {original}'s: a copy"
                taken.pop(key)
        return taken, refused

    def _predictions(self, record: dict) -> str:
        return file_sha256(
            os.path.join(scores_folder(self.plan, run_key(record["arm"], record["seed"])), binding.PREDICTIONS)
        )

    def _weights(self, record: dict) -> str | None:
        files = ((record.get("bound") or {}).get("model") or {}).get("files") or {}
        weights = sorted(v for name, v in files.items() if name.endswith(".safetensors"))
        return " ".join(weights) or None


def _identity(record: dict) -> str:
    """One run: its settings and seed (two arms that train alike give the same files on one seed)."""
    return f"{record['spec_sha256']} {record['seed']}"


def _shared(kwargs: dict, record: dict, plan: Plan, arm: str) -> dict:
    """An old record's objective options as the arm's resolved config states them, for each option its scored model
    records (one today's code does not know cannot be checked: it stands as recorded)."""
    results = read_json(os.path.join(scores_folder(plan, run_key(arm, record["seed"])), binding.RESULTS)) or {}
    trained = binding.trained_as(results.get("training"))["loss_kwargs"] or {}
    return {k: kwargs.get(k, value) for k, value in trained.items()}
