"""The encoders a study's arms start from (the plan's `starts: {label: MODEL[:POOLER]}`, read as eval/sts.py's
--baseline reads one), each scored once, untrained, with the plan's own evaluation flags: an ordinary eval/sts.py
report in <study>/starts/<label>-sts/ and its record <study>/starts/<label>.json, bound to the scores file and the
predictions as a run's record is (binding.py).

`run` scores the starts before the arms' runs, one at a time on the runner's machine, each holding <label>.lock, by a
scorer that dies with the runner and holds that lock while it lives (child.py); a start cut short is scored again
whole. Every reader checks a start record first (`StartChecker.problem`): the start its name says, of this version's
settings, code and data, its files those it binds, the model its scores file names the start's, its numbers those
its predictions give. Anything else is refused in one line naming the start."""

from __future__ import annotations

import os
import shlex

from simcse_hn.errors import UserError
from simcse_hn.evaluation.reports import split_pooler
from simcse_hn.files import PACKAGED_MODELS, ReportFolder, portable_name
from simcse_hn.study import binding
from simcse_hn.study.files import read_json, working_dir, write_json
from simcse_hn.study.plan import Plan, eval_flags
from simcse_hn.study.records import spec_sha256
from simcse_hn.study.runs import SCORE_FILES, Where, held, run_module, scores, utc_now


def start_key(label: str) -> str:
    return f"starts/{label}"


def record_path(plan: Plan, label: str) -> str:
    return os.path.join(plan.study_dir, "starts", f"{label}.json")


def scores_folder(plan: Plan, label: str) -> str:
    return os.path.join(plan.study_dir, "starts", f"{label}-sts")


def command(plan: Plan, label: str) -> list[str]:
    """The eval/sts.py command line of a start (after the interpreter), paths relative to the plan: the plan's
    evaluation flags, the start's pooler (after ':') in place of theirs."""
    model, pooler = split_pooler(plan.starts[label])
    evaluation = {**plan.evaluation, **({"pooler": pooler} if pooler else {})}
    output = os.path.join(os.path.relpath(plan.study_dir, plan.folder), "starts", f"{label}-sts")
    # a start's folder is the user's: its card and sts_results.json are left as they are
    return ["--model", model, "--output", output, "--no_progress_bar", "--no_save_to_model", *eval_flags(evaluation)]


def spec(plan: Plan, label: str) -> dict:
    """What scoring a start means under the plan: its model and the eval/sts.py flags (its output aside)."""
    flags = command(plan, label)
    return {"start": plan.starts[label], "evaluation": flags[:2] + flags[4:]}  # the output aside


class StartChecker:
    """The check of every start record of one version of a plan (the gold scores read once)."""

    def __init__(self, plan: Plan, version: dict):
        self.plan, self.version = plan, version
        data_dir = plan.evaluation.get("data_dir")
        folder = os.path.join(plan.folder, str(data_dir)) if data_dir else None
        self.gold = binding.Gold(folder, bool(plan.evaluation.get("sickr_all")))
        self.aggregation = str(plan.evaluation.get("aggregation", "all"))

    def problem(self, label: str, record: dict) -> str | None:
        """Why the record at starts/<label>.json is not taken, or None."""
        plan, version = self.plan, self.version
        if label not in plan.starts:
            return f"not a start of the plan (its starts: {', '.join(plan.starts) or 'none'})"
        if (record.get("start"), record.get("model")) != (label, plan.starts[label]):
            said = f"{record.get('start')!r} of {record.get('model')!r}"
            return f"names start {said}, not {label} of {plan.starts[label]!r}"
        if record.get("spec_sha256") != spec_sha256(spec(plan, label)):
            return f"scored under other settings (plan version {record.get('plan_version')})"
        for part, verb in (("code", "by"), ("data", "on")):
            if record.get(f"{part}_sha256") != version[part]["sha256"]:
                return f"scored {verb} other {part} ({part} {str(record.get(f'{part}_sha256'))[:12]})"
        if "bound" not in record:
            return "no hashes of its scores file and predictions"
        folder = scores_folder(plan, label)
        problem = binding.bound_problem(folder, record)
        if problem:
            return problem
        results = read_json(os.path.join(folder, binding.RESULTS))
        problem = self._scored(label, record, results)
        return problem or binding.recomputed_problem(folder, record, results, self.gold, self.aggregation)

    def _scored(self, label: str, record: dict, results: dict) -> str | None:
        """Whether results.json scored the start's model (with its pooler) by the locked code."""
        model, pooler = split_pooler(self.plan.starts[label])
        if model in PACKAGED_MODELS:  # eval/sts.py scores a pip package's copy, named by its Hub id
            expected = PACKAGED_MODELS[model][2]
        else:
            with working_dir(self.plan.folder):
                expected = portable_name(model)
        said = results.get("model")
        if not isinstance(said, str) or os.path.normpath(said) != os.path.normpath(expected):
            return f"its {binding.RESULTS} scored {said!r}, not the start's {expected!r}"
        if pooler is not None and results.get("pooler") != pooler:
            return f"its {binding.RESULTS} pooled with {results.get('pooler')!r}, not the start's {pooler!r}"
        source = ((results.get("settings") or {}).get("code") or {}).get("source_sha256")
        if source != self.version["code"]["source_sha256"] or record.get("scored_by_source_sha256") != source:
            return "scored by other code than the plan locked"
        return None

    def gather(self) -> tuple[dict[str, dict], dict[str, str]]:
        """-> (the start records taken {label: record}, in the plan's order; those refused {starts/<label>: why})."""
        folder = os.path.join(self.plan.study_dir, "starts")
        names = sorted(f[:-5] for f in os.listdir(folder) if f.endswith(".json")) if os.path.isdir(folder) else []
        taken, refused = {}, {}
        for label in [k for k in self.plan.starts if k in names] + [k for k in names if k not in self.plan.starts]:
            try:
                record = read_json(record_path(self.plan, label))
            except ValueError:
                refused[start_key(label)] = "not a JSON record"
                continue
            problem = self.problem(label, record) if isinstance(record, dict) else "not a record"
            if problem:
                refused[start_key(label)] = problem
            else:
                taken[label] = record
        return taken, refused


def pending(plan: Plan, version: dict) -> list[str]:
    """The starts the study has not scored; a record that fails the check is refused by name (its folder is the
    user's: moved away by them, never overwritten here)."""
    checker, todo = StartChecker(plan, version), []
    for label in plan.starts:
        path = record_path(plan, label)
        if not os.path.isfile(path):
            todo.append(label)
            continue
        problem = checker.problem(label, read_json(path))
        if problem:
            raise UserError(f"{os.path.relpath(path)}: {problem}; move starts/{label}* away to score it again")
    return todo


def score_start(plan: Plan, version: dict, label: str, where: Where) -> dict | None:
    """Score one start, unless it is scored or another runner holds it. -> its record, or None (skipped)."""
    folder = os.path.join(plan.study_dir, "starts")
    os.makedirs(folder, exist_ok=True)
    with held(os.path.join(folder, f"{label}.lock")) as lock:
        if lock is None or os.path.isfile(record_path(plan, label)):
            return None
        scored = scores_folder(plan, label)
        ReportFolder(scored).check(SCORE_FILES)  # a scores file changed since eval/sts.py wrote it: one line
        args, started = command(plan, label), utc_now()
        log = os.path.join(folder, f"{label}.log")
        seconds = run_module("simcse_hn.cli.sts", args, plan.folder, log, where.env(), lock)
        results = read_json(os.path.join(scored, binding.RESULTS))
        record = {
            "start": label,
            "model": plan.starts[label],
            "plan_version": version["version"],
            "plan_sha256": version["plan_sha256"],
            "spec_sha256": spec_sha256(spec(plan, label)),
            "code_sha256": version["code"]["sha256"],
            "data_sha256": version["data"]["sha256"],
            "bound": {"scores": binding.scores_files(scored)},
            "scored_by_source_sha256": ((results.get("settings") or {}).get("code") or {}).get("source_sha256"),
            "command": "simcse-hn-sts " + shlex.join(args),
            "folder": f"starts/{label}-sts",
            "scores": scores(results),
            "where": where.record(),
            "times": {"started": started, "finished": utc_now(), "eval_seconds": seconds},
        }
        problem = StartChecker(plan, version).problem(label, record)
        if problem:
            raise UserError(f"{start_key(label)}: {problem}")
        write_json(record_path(plan, label), record)
        return record


def score_starts(plan: Plan, version: dict, labels: list[str], where: Where, echo) -> list[str]:
    """Each start of `labels`, one after another. -> one line per start that failed."""
    failed = []
    for label in labels:
        try:
            record = score_start(plan, version, label, where)
        except UserError as e:
            failed.append(f"{start_key(label)}: {e}")
            continue
        if record is not None:  # no score: the report stays blind until every run is in
            echo(f"{start_key(label)}: scored")
        elif not os.path.isfile(record_path(plan, label)):
            echo(f"{start_key(label)}: held by another runner (or a scorer still ending); run again later")
    return failed


def endpoint_of(record: dict, endpoint: str) -> float:
    found = record["scores"]
    if endpoint not in found and endpoint not in found["tasks"]:
        raise UserError(f"{start_key(record['start'])}.json: no {endpoint!r} score; its eval/sts.py report lacks it")
    return found[endpoint] if endpoint in found else found["tasks"][endpoint]
