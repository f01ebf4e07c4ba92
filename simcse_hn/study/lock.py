"""Locking a plan: its hash, the code's commit and hash (the user's objective files included, wherever they live) and
the data's hashes, written to <study>/lock.json before any run, with the plan's bytes as versions/v<N>.yaml.

A run, a pilot or a report under a plan, code or data that differs from the latest locked version is refused in one
line. A change is recorded as a new version (`simcse-hn-study plan PLAN --amend REASON`), never made in place. The
lock has two stages: a plan with a pilot is locked first for the pilot (stage "pilot"); the pilot's picks go into a
new version (stage "confirmatory"), locked before the first confirmatory run."""

from __future__ import annotations

import datetime
import json
import os

from simcse_hn.errors import UserError
from simcse_hn.files import file_sha256
from simcse_hn.provenance import code_identity, data_sha256
from simcse_hn.study.files import read_json, text_sha256, write_atomic, write_json
from simcse_hn.study.plan import Plan, grid_points

LOCK = "lock.json"


class LockError(UserError):
    """A plan, code or data that is not the locked one; one line."""


def lock_path(plan: Plan) -> str:
    return os.path.join(plan.study_dir, LOCK)


def versions(plan: Plan) -> list[dict]:
    path = lock_path(plan)
    return read_json(path)["versions"] if os.path.isfile(path) else []


def objective_files(plan: Plan, configs: list[dict]) -> dict[str, str]:
    """{path as the plan names it: sha256} of every objective loaded from a file (`--loss path.py:Class`)."""
    out = {}
    for config in configs:
        loss = str(config.get("loss", ""))
        path, _, cls = loss.rpartition(":")
        if path.endswith(".py") and cls:
            full = os.path.join(plan.folder, path)
            out[path] = file_sha256(full) if os.path.isfile(full) else "missing"
    return dict(sorted(out.items()))


def current_code(plan: Plan, picks: dict | None = None) -> dict:
    """The code every run of the plan runs: simcse-hn's sources (hash, commit, dirty) and the objective files."""
    configs = [plan.config(arm, picks) for arm in plan.arms] + tuned_configs(plan)
    identity = code_identity()
    code = {"source_sha256": identity["source_sha256"], "git_commit": identity["git_commit"],
            "git_dirty": identity["git_dirty"], "objectives": objective_files(plan, configs)}  # fmt: skip
    code["sha256"] = text_sha256(json.dumps([code["source_sha256"], code["objectives"]], sort_keys=True))
    return code


def tuned_configs(plan: Plan) -> list[dict]:
    """The configs the pilot's grid trains (their objective files are code of the study too)."""
    tune = (plan.pilot or {}).get("tune") or {}
    return [plan.config(arm) | dict(change) for arm, grid in tune.items() if arm in plan.arms
            for change in grid_points(grid)]  # fmt: skip


def _local(plan: Plan, name) -> str | None:
    if name is None:
        return None
    path = os.path.join(plan.folder, str(name))
    return path if os.path.exists(path) else None


def current_data(plan: Plan) -> dict:
    """sha256 of the training data of each arm, the evaluation data (eval/sts.py's --data_dir), the dev files of
    model selection (eval_file) and of the pilot's tuning; a Hub name is hashed by its id."""
    def digest(name) -> str:
        local = _local(plan, name)
        return data_sha256(local) if local else data_sha256([str(name)])

    train = {str(c.get("train_file") or c.get("dataset_name")) for c in (plan.config(a) for a in plan.arms)}
    dev = {str(c["eval_file"]) for c in (plan.config(a) for a in plan.arms) if c.get("eval_file")}
    data = {"train": {name: digest(name) for name in sorted(train)},
            "evaluation": digest(plan.evaluation["data_dir"]) if plan.evaluation.get("data_dir") else "hub",
            "model_selection": {name: digest(name) for name in sorted(dev)}}  # fmt: skip
    pilot_dev = ((plan.pilot or {}).get("dev") or {}).get("file")
    if pilot_dev:
        data["pilot_dev"] = digest(pilot_dev)
    data["sha256"] = text_sha256(json.dumps(data, sort_keys=True))
    return data


def plan_text(plan: Plan) -> str:
    with open(plan.path, encoding="utf-8") as f:
        return f.read()


def lock(plan: Plan, reason: str | None = None, picks: dict | None = None, stage: str | None = None) -> dict:
    """Lock the plan as it is now; -> the version. The first lock needs no reason; a plan, code or data that differs
    from the latest version is refused without one; the same plan, code and data lock nothing new."""
    text = plan_text(plan)
    history = versions(plan)
    latest = history[-1] if history else None
    picks = picks if picks is not None else (latest or {}).get("picks")
    version = {"version": len(history) + 1, "stage": stage or _stage(plan, picks),
               "plan_sha256": text_sha256(text), "picks": picks, "reason": reason,
               "code": current_code(plan, picks), "data": current_data(plan)}  # fmt: skip
    if latest is not None:
        changed = differences(latest, version)
        if latest["stage"] != version["stage"]:  # a pilot that tunes nothing: the same picks ({}), a new stage
            changed.append(f"the stage ({latest['stage']} -> {version['stage']})")
        elif not changed:
            return latest
        if reason is None:
            raise LockError(f"{plan.path}: {', '.join(changed)} changed since version {latest['version']} was "
                            "locked; record the change as a new version: simcse-hn-study plan "
                            f"{plan.path} --amend 'why'")  # fmt: skip
    version["locked_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    version["plan_file"] = f"versions/v{version['version']}.yaml"
    write_atomic(os.path.join(plan.study_dir, version["plan_file"]), text)
    write_json(lock_path(plan), {"study": plan.name, "versions": [*history, version]})
    return version


def _stage(plan: Plan, picks: dict | None) -> str:
    return "pilot" if plan.pilot and picks is None else "confirmatory"


def differences(locked: dict, now: dict) -> list[str]:
    """What differs between a locked version and the plan, code and data as they are now, in words."""
    out = []
    if locked["plan_sha256"] != now["plan_sha256"]:
        out.append("the plan")
    if locked["code"]["sha256"] != now["code"]["sha256"]:
        changed = [p for p in set(locked["code"]["objectives"]) | set(now["code"]["objectives"])
                   if locked["code"]["objectives"].get(p) != now["code"]["objectives"].get(p)]  # fmt: skip
        out.append("the code (" + ", ".join(sorted(changed) or ["simcse-hn's sources"]) + ")")
    if locked["data"]["sha256"] != now["data"]["sha256"]:
        out.append("the data (" + ", ".join(changed_data(locked["data"], now["data"]) or ["its hashes"]) + ")")
    if (locked.get("picks") or None) != (now.get("picks") or None):
        out.append("the pilot's picks")
    return out


def changed_data(locked: dict, now: dict) -> list[str]:
    """Which of the data the lock hashes differ: 'train corpus.txt', 'evaluation', 'pilot_dev', ..."""
    out = []
    for part in sorted((set(locked) | set(now)) - {"sha256"}):
        old, new = locked.get(part), now.get(part)
        if isinstance(old, dict) or isinstance(new, dict):
            old, new = old or {}, new or {}
            out += [f"{part} {name}" for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)]
        elif old != new:
            out.append(part)
    return out


def check_locked(plan: Plan, stage: str | None = None) -> dict:
    """The latest locked version, when the plan, code and data are still what it locked; else a LockError naming
    what changed. `stage` "confirmatory": refused while the pilot's picks are not locked yet."""
    history = versions(plan)
    if not history:
        raise LockError(f"{plan.path}: not locked; lock it first: simcse-hn-study plan {plan.path}")
    latest = history[-1]
    now = {"plan_sha256": text_sha256(plan_text(plan)), "picks": latest.get("picks"),
           "code": current_code(plan, latest.get("picks")), "data": current_data(plan)}  # fmt: skip
    changed = differences(latest, now)
    if changed:
        raise LockError(f"{plan.path}: {', '.join(changed)} changed since version {latest['version']} was locked; "
                        f"nothing runs under a changed plan (record it: simcse-hn-study plan {plan.path} --amend "
                        "'why')")  # fmt: skip
    if stage == "confirmatory" and latest["stage"] != "confirmatory":
        raise LockError(f"{plan.path}: version {latest['version']} is the pilot's stage; the confirmatory runs wait "
                        f"for the pilot's picks: simcse-hn-study pilot {plan.path}")  # fmt: skip
    return latest
