"""Locking a plan: what every run will run, written to <study>/lock.json before any run, with the plan's bytes as
versions/v<N>.yaml and what they resolve to as versions/v<N>.resolved.json.

What is locked is what runs, not a file's text: the plan as read (its base's `config:` file merged in), each arm's
config as train.py resolves it (every default filled in), the code (simcse-hn's sources and every file the
objectives' imports load from outside installed packages) and the data (training, model selection, evaluation, the
pilot's dev set). A comment-only edit changes none of these and is no change. A run, a pilot or a report under
anything else is refused in one line that names each changed key with its locked and its present value. A change is
recorded as a new version (`simcse-hn-study plan PLAN --amend REASON`), never made in place. The lock has two
stages: a plan with a pilot is locked first for the pilot (stage "pilot"); the pilot's picks go into a new version
(stage "confirmatory"), locked before the first confirmatory run.

Versions locked before the lock held the resolved plan (no "schema") are compared by their locked YAML instead."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os

import yaml

from simcse_hn.errors import UserError
from simcse_hn.provenance import code_identity, data_sha256
from simcse_hn.study.files import read_json, text_sha256, write_atomic, write_json
from simcse_hn.study.plan import Plan, pilot_configs
from simcse_hn.study.resolved import objective_sources, resolve_config, settings_sha256

LOCK = "lock.json"
SCHEMA = 2  # versions that lock the resolved plan, arms and objective imports; their runs' records are bound


class LockError(UserError):
    """A plan, code or data that is not the locked one; one line."""


def lock_path(plan: Plan) -> str:
    return os.path.join(plan.study_dir, LOCK)


def versions(plan: Plan) -> list[dict]:
    path = lock_path(plan)
    return read_json(path)["versions"] if os.path.isfile(path) else []


def plan_text(plan: Plan) -> str:
    with open(plan.path, encoding="utf-8") as f:
        return f.read()


def canonical(plan: Plan) -> dict:
    """The plan as read: every field the study uses (the base's `config:` file merged in), not the file's text."""
    fields = dataclasses.asdict(plan)
    for derived in ("path", "family_comparisons"):  # where it was read from; what its family's own plans hold
        fields.pop(derived)
    if not fields["starts"]:  # a plan without starts reads as one locked before they existed: the same hash
        fields.pop("starts")
    return json.loads(json.dumps(fields, default=str))


def configs(plan: Plan, picks: dict | None) -> list[dict]:
    """Every config a run of this version trains: the arms (with the picks), the pilot's reference and grid."""
    return [plan.config(arm, picks) for arm in plan.arms] + [config for _, _, config in pilot_configs(plan)]


def current_code(plan: Plan, picks: dict | None) -> dict:
    """The code every run of the plan runs: simcse-hn's sources (hash, commit, dirty) and every file the objectives'
    imports load from outside installed packages (`file.py:Class`, `package.module:Class`, their helpers)."""
    losses = [str(c["loss"]) for c in configs(plan, picks) if c.get("loss")]
    identity = code_identity()
    code = {
        "source_sha256": identity["source_sha256"],
        "git_commit": identity["git_commit"],
        "git_dirty": identity["git_dirty"],
        "objectives": objective_sources(plan.folder, losses),
    }
    code["sha256"] = text_sha256(json.dumps([code["source_sha256"], code["objectives"]], sort_keys=True))
    return code


def current_data(plan: Plan) -> dict:
    """sha256 of the training data of each arm, the evaluation data (eval/sts.py's --data_dir), the dev files of
    model selection (eval_file) and of the pilot's tuning; a Hub name is hashed by its id."""

    def digest(name) -> str:
        path = os.path.join(plan.folder, str(name))
        return data_sha256(path) if os.path.exists(path) else data_sha256([str(name)])

    arms = [plan.config(a) for a in plan.arms]
    train = {str(c.get("train_file") or c.get("dataset_name")) for c in arms}
    dev = {str(c["eval_file"]) for c in arms if c.get("eval_file")}
    data = {
        "train": {name: digest(name) for name in sorted(train)},
        "evaluation": digest(plan.evaluation["data_dir"]) if plan.evaluation.get("data_dir") else "hub",
        "model_selection": {name: digest(name) for name in sorted(dev)},
    }
    pilot_dev = ((plan.pilot or {}).get("dev") or {}).get("file")
    if pilot_dev:
        data["pilot_dev"] = digest(pilot_dev)
    data["sha256"] = text_sha256(json.dumps(data, sort_keys=True))
    return data


def resolved(plan: Plan, picks: dict | None) -> dict:
    """The plan as read and each arm's config as train.py resolves it: what versions/v<N>.resolved.json holds."""
    return {
        "plan": canonical(plan),
        "arms": {arm: resolve_config(plan.folder, plan.config(arm, picks)) for arm in plan.arms},
    }


def current(plan: Plan, picks: dict | None, scope: str = "run") -> dict:
    """What the plan, code and data are now, in a version's fields. scope "report": the plan and the evaluation data
    only (what a report reads; the runs carry the code and data they were trained by)."""
    now = {
        "schema": SCHEMA,
        "picks": picks,
        "resolved": resolved(plan, picks) if scope == "run" else None,
        "plan_sha256": text_sha256(json.dumps(canonical(plan), sort_keys=True)),
        "plan_text_sha256": text_sha256(plan_text(plan)),
    }
    if scope == "run":
        now["arms"] = {arm: settings_sha256(s) for arm, s in now["resolved"]["arms"].items()}
        now["code"], now["data"] = current_code(plan, picks), current_data(plan)
    else:
        now["data"] = {"evaluation": current_data(plan)["evaluation"]}
    return now


def flat(value, prefix: str = "") -> dict[str, object]:
    """{"a": {"b": 1}} -> {"a.b": 1}: the keys a diff names."""
    if isinstance(value, dict) and value:
        out: dict[str, object] = {}
        for key, inner in value.items():
            out |= flat(inner, f"{prefix}.{key}" if prefix else str(key))
        return out
    return {prefix: value}


def _show(value) -> str:
    if value is _ABSENT:
        return "(absent)"
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


_ABSENT = object()


def diff(locked, now, prefix: str = "") -> list[str]:
    """Each key whose value differs, with both values: `key: locked -> now`."""
    old, new = flat(locked, prefix), flat(now, prefix)
    return [
        f"{key}: {_show(old.get(key, _ABSENT))} -> {_show(new.get(key, _ABSENT))}"
        for key in sorted(set(old) | set(new))
        if old.get(key, _ABSENT) != new.get(key, _ABSENT)
    ]


def locked_plan(plan: Plan, version: dict) -> dict | None:
    """What a version locked of the plan as read: its resolved file (checked against its hash), or for a version
    locked before the lock held one, its YAML (checked against its text hash). None: the file is not what was
    locked."""
    if version.get("schema"):
        path = os.path.join(plan.study_dir, version["resolved_file"])
        if not os.path.isfile(path) or text_sha256(open(path, encoding="utf-8").read()) != version["resolved_sha256"]:
            return None
        return read_json(path)
    path = os.path.join(plan.study_dir, version["plan_file"])
    if not os.path.isfile(path):
        return None
    text = open(path, encoding="utf-8").read()
    return {"raw": yaml.safe_load(text)} if text_sha256(text) == version["plan_sha256"] else None


def changes(plan: Plan, locked: dict, now: dict) -> list[str]:
    """What differs between a locked version and the plan, code and data now, one entry per key with both values."""
    out = []
    before = locked_plan(plan, locked)
    if before is None:
        out.append(
            f"{locked.get('resolved_file') or locked['plan_file']}: not the file version {locked['version']} locked"
        )
    elif "raw" in before:  # an old version: its YAML as read, against the plan's YAML as read now
        out += diff(before["raw"], yaml.safe_load(plan_text(plan)), "plan")
    elif before["plan"] != canonical(plan):
        out += diff(before["plan"], canonical(plan), "plan")
    elif now.get("resolved") and before["arms"] != now["resolved"]["arms"]:  # the plan reads alike, train.py not
        out += diff(before["arms"], now["resolved"]["arms"], "resolved")
    if "code" in now and locked["code"]["sha256"] != now["code"]["sha256"]:
        if locked["code"]["source_sha256"] != now["code"]["source_sha256"]:
            out.append(
                f"code: simcse-hn's sources {locked['code']['source_sha256'][:12]} -> "
                f"{now['code']['source_sha256'][:12]}"
            )
        objectives = {k: v[:12] for k, v in locked["code"]["objectives"].items()}
        out += diff(objectives, {k: v[:12] for k, v in now["code"]["objectives"].items()}, "code")
    held, present = flat(locked["data"], "data"), flat(now["data"], "data")
    if "code" not in now:  # a report's scope: the data it reads
        held = {key: value for key, value in held.items() if key in present}
    out += diff(
        {k: v for k, v in held.items() if k != "data.sha256"}, {k: v for k, v in present.items() if k != "data.sha256"}
    )
    if (locked.get("picks") or None) != (now.get("picks") or None):
        out.append(f"the pilot's picks: {_show(locked.get('picks'))} -> {_show(now.get('picks'))}")
    return out


def lock(plan: Plan, reason: str | None = None, picks: dict | None = None, stage: str | None = None) -> dict:
    """Lock the plan as it is now; -> the version. The first lock needs no reason; a plan, code or data that differs
    from the latest version is refused without one; the same plan, code and data lock nothing new."""
    history = versions(plan)
    latest = history[-1] if history else None
    picks = picks if picks is not None else (latest or {}).get("picks")
    now = current(plan, picks)
    version = {
        "version": len(history) + 1,
        "schema": SCHEMA,
        "stage": stage or _stage(plan, picks),
        "plan_sha256": now["plan_sha256"],
        "plan_text_sha256": now["plan_text_sha256"],
        "picks": picks,
        "reason": reason,
        "arms": now["arms"],
        "code": now["code"],
        "data": now["data"],
    }
    if latest is not None:
        changed = changes(plan, latest, now)
        if latest["stage"] != version["stage"]:  # a pilot that tunes nothing: the same picks ({}), a new stage
            changed.append(f"the stage: {latest['stage']} -> {version['stage']}")
        elif not changed:
            return latest
        if reason is None:
            raise LockError(
                f"{plan.path}: changed since version {latest['version']} was locked: "
                f"{'; '.join(changed)}; record the change as a new version: simcse-hn-study plan "
                f"{plan.path} --amend 'why'"
            )
    version["locked_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    version["plan_file"] = f"versions/v{version['version']}.yaml"
    version["resolved_file"] = f"versions/v{version['version']}.resolved.json"
    text = json.dumps(now["resolved"], indent=1, sort_keys=True) + "\n"
    version["resolved_sha256"] = text_sha256(text)
    write_atomic(os.path.join(plan.study_dir, version["plan_file"]), plan_text(plan))
    write_atomic(os.path.join(plan.study_dir, version["resolved_file"]), text)
    write_json(lock_path(plan), {"study": plan.name, "versions": [*history, version]})
    return version


def _stage(plan: Plan, picks: dict | None) -> str:
    return "pilot" if plan.pilot and picks is None else "confirmatory"


def check_locked(plan: Plan, stage: str | None = None, scope: str = "run") -> dict:
    """The latest locked version, when what it locked is what would run now; else a LockError naming each change.
    `stage` "confirmatory": refused while the pilot's picks are not locked yet. `scope` "report": only what a report
    reads (the plan as read, the evaluation data)."""
    history = versions(plan)
    if not history:
        raise LockError(f"{plan.path}: not locked; lock it first: simcse-hn-study plan {plan.path}")
    latest = history[-1]
    changed = changes(plan, latest, current(plan, latest.get("picks"), scope))
    if changed:
        raise LockError(
            f"{plan.path}: changed since version {latest['version']} was locked: {'; '.join(changed)}; "
            f"nothing runs under a changed plan (record it: simcse-hn-study plan {plan.path} --amend "
            "'why')"
        )
    if stage == "confirmatory" and latest["stage"] != "confirmatory":
        raise LockError(
            f"{plan.path}: version {latest['version']} is the pilot's stage; the confirmatory runs wait "
            f"for the pilot's picks: simcse-hn-study pilot {plan.path}"
        )
    return latest
