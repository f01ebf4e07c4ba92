"""The pilot (`simcse-hn-study pilot PLAN`): short runs of every arm and of a random-batch reference, read against
the plan's go criteria, and the tuning of each arm's options on a dev set the plan names, never the endpoint's test
data. Its picks go into a new version of the plan, locked before the first confirmatory run.

    pilot:
      overrides: {max_steps: 50}            # train.py keys of the pilot's short runs
      seeds: [1]                            # every arm and every grid point: the same seeds
      reference: {queue_size: 0}            # the reference: the baseline arm with these keys (random batches)
      criteria:
        loss_ratio: 10                      # the baseline's last-window loss >= 10 x the reference's
        weight_share: {arms: [hcl], ratio: 2}   # share of weight on the nearest 1 % >= 2 x uniform's
        clamp: {arms: [dcl], below: 0.5}    # DCL's clamped anchors below half
      dev: {file: dev.jsonl, split: dev, shares_with_test: 0}   # pairs it shares with the endpoint's test files
      tune:                                 # grids of one size (equal budget); several options: every combination
        infonce: {temperature: [0.03, 0.04, 0.05, 0.06]}
        hcl: {temperature: [0.04, 0.05], hcl_beta: [0.1, 0.2]}
        focal: {loss_options: [{gamma: 0.5}, {gamma: 1.0}, {gamma: 2.0}, {gamma: 4.0}]}
      untuned: {}                           # {arm: why} for an arm the pilot leaves as it is

`harder_than_positive` is reported, not a criterion. The uniform share of the nearest 1 % over n negatives is
ceil(n / 100) / n, n = 2B - 2 (symmetric form) or B - 1 (SimCSE's), + queue_size."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import yaml

from simcse_hn.configuration.resolved import sentence_negatives
from simcse_hn.configuration.training_arguments import SimCSETrainingArguments
from simcse_hn.data.sts import load_sts_pairs
from simcse_hn.errors import UserError
from simcse_hn.evaluation.encoding import load_encoder
from simcse_hn.evaluation.scoring import sts_spearman
from simcse_hn.losses.base import TOP_SHARE
from simcse_hn.study.binding import model_files
from simcse_hn.study.files import read_json, write_atomic, write_json
from simcse_hn.study.lock import check_locked, lock
from simcse_hn.study.pilot_checks import DEV_COUNTS, check
from simcse_hn.study.plan import Plan, PlanError, grid_points
from simcse_hn.study.power import power_lines
from simcse_hn.study.runs import Where, held, last_window, on_devices, run_module
from simcse_hn.study.tuning import choose, dimension_notes, dimension_rows, overlap, show, tuning, tuning_notes


def measured_spread(plan: Plan) -> float | None:
    """The pilot's largest sd of paired dev-score differences against the baseline (two pilot seeds or more)."""
    path = os.path.join(plan.study_dir, "pilot", "pilot.json")
    return read_json(path).get("spread") if os.path.isfile(path) else None


def pilot_runs(plan: Plan) -> list[dict]:
    """Every run of the pilot: {name, arm, seed, change, config}; the reference first in each seed."""
    pilot = plan.pilot or {}
    tune = pilot.get("tune") or {}
    runs = []
    for seed in pilot.get("seeds") or plan.seeds[:1]:
        if "reference" in pilot:
            runs.append(
                {
                    "name": f"reference-s{seed}",
                    "arm": "reference",
                    "seed": seed,
                    "change": None,
                    "config": plan.reference_config(),
                }
            )
        for arm in plan.arms:
            for change in grid_points(tune[arm]) if arm in tune else [None]:
                label = "" if change is None else "-" + ",".join(f"{k}={json.dumps(v)}" for k, v in change.items())
                runs.append(
                    {
                        "name": f"{arm}{label}-s{seed}".replace(" ", "").replace('"', ""),
                        "arm": arm,
                        "seed": seed,
                        "change": change,
                        "config": plan.pilot_config(arm, change),
                    }
                )
    return runs


def _train(plan: Plan, run: dict, threads: int | None, device: str | None) -> dict:
    """Train one pilot run (holding its folder's lock, its trainer dying with this process) and score it on the dev
    set; a run an earlier sitting finished with this config is taken once its weights are the ones it recorded and
    its dev score is what they give again."""
    folder = os.path.join(plan.study_dir, "pilot", run["name"])
    done = folder + ".json"
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    with held(folder + ".lock") as lock:
        if lock is None:
            raise UserError(f"pilot/{run['name']}: another worker is training it; run the pilot again once it ends")
        if os.path.isfile(done) and read_json(done)["config"] == run["config"]:
            return _checked(plan, read_json(done), folder)  # trained by an earlier sitting with this config
        config = os.path.join(plan.study_dir, "pilot", "configs", f"{run['name']}.yaml")
        write_atomic(config, yaml.safe_dump(run["config"], sort_keys=False))
        args = [
            "--config",
            os.path.relpath(config, plan.folder),
            "--seed",
            str(run["seed"]),
            "--output_dir",
            os.path.relpath(folder, plan.folder),
            "--overwrite_output_dir",
            "true",
        ]
        run_module(
            "simcse_hn.cli.train", args, plan.folder, folder + ".log", Where(threads, device, "local").env(), lock
        )
        out = {**run, "last": last_window(folder), "dev": dev_score(plan, folder), "files": model_files(folder)}
        write_json(done, out)
        return out


def dev_score(plan: Plan, folder: str) -> float | None:
    """The pilot's dev score of a trained folder: Spearman x 100 on the plan's dev set, None without one."""
    dev = (plan.pilot or {}).get("dev")
    if not dev or not dev.get("file"):
        return None
    pairs = load_sts_pairs(os.path.join(plan.folder, dev["file"]), dev.get("split"))
    encode, _ = load_encoder(folder)
    return sts_spearman(encode, pairs.sentence1, pairs.sentence2, pairs.scores)


def _checked(plan: Plan, record: dict, folder: str) -> dict:
    """An earlier sitting's pilot run, taken only when its model folder holds the files it recorded and scores its
    recorded dev score again (a UserError naming the run otherwise)."""
    name = f"pilot/{record['name']}"
    if record.get("files") is None or model_files(folder) != record["files"]:
        raise UserError(
            f"{name}: its model folder is not the one its record names; move {name}* away to train it again"
        )
    again = dev_score(plan, folder)
    if record["dev"] != again and not (again is not None and abs(record["dev"] - again) <= 1e-9 * (1 + abs(again))):
        raise UserError(f"{name}.json: its dev score {record['dev']} is not what its model gives ({again!r})")
    return record


def negatives_per_anchor(config: dict) -> int:
    """The negatives of an anchor of a pilot run (one process): a batch of B sentences gives 2B - 2 in the symmetric
    form and B - 1 in SimCSE's, plus the queue's entries once it is full; train.py's defaults where the config is
    silent."""
    defaults = SimCSETrainingArguments.__dataclass_fields__
    batch = int(config.get("per_device_train_batch_size") or defaults["per_device_train_batch_size"].default)
    form = str(config.get("contrast_form") or defaults["contrast_form"].default)
    return sentence_negatives(batch, 1, form) + int(config.get("queue_size") or 0)


def uniform_top_share(negatives: int) -> float:
    """The `top1pct_weight_share` of uniform weights over n negatives (the loss's diagnostic: the nearest
    ceil(1 % of n)): ceil(n / 100) / n."""
    return math.ceil(TOP_SHARE * negatives) / negatives


def loss_check(value: float | None, reference: float | None, ratio: float) -> dict:
    """The objectives act: the last-window loss at least `ratio` x a reference's (a random-batch run's); ok is None
    while either is missing."""
    needed = None if reference is None else ratio * reference
    return {
        "value": value,
        "reference": reference,
        "needed": needed,
        "ok": None if value is None or needed is None else value >= needed,
    }


def share_check(share: float | None, negatives: int, ratio: float) -> dict:
    """The weights are at work: `top1pct_weight_share` at least `ratio` x uniform's over that many negatives."""
    needed = ratio * uniform_top_share(negatives)
    return {"value": share, "needed": needed, "ok": None if share is None else share >= needed}


def clamp_check(clamp: float | None, below: float) -> dict:
    """DCL's clamp is off for most anchors: `clamp_frac` below `below`."""
    return {"value": clamp, "needed": below, "ok": None if clamp is None else clamp < below}


def verdict(plan: Plan, runs: list[dict], picks: dict) -> dict:
    """The go criteria on the runs that stand for each arm (its pick's, else its own), mean over the pilot seeds."""
    criteria = (plan.pilot or {}).get("criteria") or {}

    def last(arm: str, key: str) -> float | None:
        values = [
            r["last"][key]
            for r in runs
            if r["arm"] == arm
            and key in r["last"]
            and (arm == "reference" or r["change"] == (picks.get(arm) or r["change"]))
        ]
        return float(np.mean(values)) if values else None

    checks = {}
    if "loss_ratio" in criteria:
        checks["loss"] = loss_check(last(plan.baseline, "loss"), last("reference", "loss"), criteria["loss_ratio"])
    for arm in (criteria.get("weight_share") or {}).get("arms", []):
        negatives = negatives_per_anchor(plan.config(arm) | (plan.pilot.get("overrides") or {}))
        check = share_check(last(arm, "top1pct_weight_share"), negatives, criteria["weight_share"].get("ratio", 2))
        checks[f"{arm} weight share"] = check | {"ok": bool(check["ok"])}  # a missing share fails the criterion
    for arm in (criteria.get("clamp") or {}).get("arms", []):
        check = clamp_check(last(arm, "clamp_frac"), criteria["clamp"].get("below", 0.5))
        checks[f"{arm} clamp"] = check | {"ok": bool(check["ok"])}
    harder = {arm: last(arm, "harder_than_positive") for arm in plan.arms}
    return {"checks": checks, "go": all(c["ok"] for c in checks.values()), "harder_than_positive": harder}


def overlap_problems(plan: Plan, found: dict | None) -> list[str]:
    """The dev set's overlap with the test files against what the plan states of it, one line per count that
    differs (nothing to compare with the evaluation data on the Hub: not counted)."""
    dev = (plan.pilot or {}).get("dev") or {}
    if found is None:
        return []
    counts = {"shares_with_test": found["pairs"], "shares_sentences_with_test": found["with_sentence"]}
    return [
        f"{plan.path}: pilot.dev.{key}: the plan states {dev.get(key)}, but {counted} {DEV_COUNTS[key]} (of its "
        f"{found['of']}; case, punctuation and spacing aside)"
        for key, counted in counts.items()
        if dev.get(key) != counted
    ]


def run_pilot(plan: Plan, jobs: int, threads: int | None, devices: list[str] | None) -> str:
    """Train what the pilot lacks, read it, write <study>/pilot/pilot.{json,md}; on go, lock the picks, after saying
    what the planned seeds can detect at the spread the pilot measured."""
    problems = check(plan)
    if problems:
        raise PlanError(problems)
    version = check_locked(plan)
    if version.get("picks") is not None:
        raise UserError(
            f"{plan.path}: the pilot's picks are locked in version {version['version']}; a new pilot needs a new plan"
        )
    dev = (plan.pilot or {}).get("dev") or {}
    shared = overlap(plan) if dev.get("file") else None
    problems = overlap_problems(plan, shared)
    if problems:
        raise UserError("\n".join(problems))
    todo = pilot_runs(plan)
    trained = on_devices(jobs, devices, lambda run, device: _train(plan, run, threads, device), todo)
    runs = [f.result() for f in trained]
    picks, spread = choose(plan, runs)
    record = {
        "study": plan.name,
        "plan_version": version["version"],
        "runs": runs,
        "picks": picks,
        "spread": spread,
        "shared": shared,
        "dev": dev.get("file"),
        "tuning": tuning(plan, runs, picks),
        "dimensions": dimension_rows(plan),
        "power": power_lines(plan, spread),
        **verdict(plan, runs, picks),
    }
    if record["go"]:
        locked = lock(plan, reason="the pilot's picks", picks=picks, stage="confirmatory")
        record["locked_version"] = locked["version"]
    write_json(os.path.join(plan.study_dir, "pilot", "pilot.json"), record)
    page = markdown(record)
    write_atomic(os.path.join(plan.study_dir, "pilot", "pilot.md"), page)
    return page


def _point(change: dict) -> str:
    return ", ".join(f"{option} {_value(value)}" for option, value in change.items())


def _value(value) -> str:
    return json.dumps(value) if isinstance(value, (dict, list)) else show(value)


def dev_lines(record: dict) -> list[str]:
    """What the picks were tuned on, and what of it the endpoint's test files hold."""
    shared = record.get("shared")
    picks = "; ".join(f"{a} {json.dumps(c)}" for a, c in record["picks"].items()) or "none"
    if shared is None:
        said = "whose pairs were not counted against the endpoint's test files (the evaluation data is on the Hub)"
    else:
        said = (
            f"which shares {shared['pairs']} of its {shared['of']} sentence pairs with the endpoint's test files "
            f"(either order), and {shared['with_sentence']} pairs ({shared['sentences']} distinct sentences) have a "
            "sentence a test file holds (case, punctuation and spacing aside)"
        )
    lines = ["", f"Tuned on {record['dev']}, {said}. Picks: {picks}."]
    if shared and (shared["pairs"] or shared["with_sentence"]):
        lines += [
            "",
            f"The picks saw {shared['pairs']} pairs and {shared['sentences']} sentences that the endpoint's "
            "test files hold: the tests read scores of models tuned in part on their own data.",
        ]
    return lines


def tuning_lines(record: dict) -> list[str]:
    """Each arm's tuned dimensions side by side, every grid point's mean dev score, and the doubts of each pick."""
    rows = record.get("dimensions") or []
    lines = [
        "",
        "How each arm is tuned:",
        "",
        "| arm | dimensions (values each) | grid points | |",
        "|---|---|---|---|",
        *[
            f"| {r['arm']} | "
            + (", ".join(f"{d} ({n})" for d, n in r["dimensions"].items()) or "none")
            + f" | {r['points']} | {r['why'] or ''} |"
            for r in rows
        ],
    ]
    lines += [f"* {note}" for note in dimension_notes(rows)]
    lines += [
        "",
        "Mean dev score over the pilot's seeds, each tuned arm's grid (sd over the seeds):",
        "",
        "| arm | grid point | mean dev | sd | |",
        "|---|---|---|---|---|",
        *[
            f"| {arm} | {_point(p['change'])} | {show(p['mean'])} | {show(p['sd'])} | "
            f"{'pick' if p['change'] == t['pick'] else ''} |"
            for arm, t in record["tuning"].items()
            for p in t["points"]
        ],
    ]
    notes = tuning_notes(record["tuning"])
    return lines + (["", *[f"* {note}" for note in notes]] if notes else [])


def markdown(record: dict) -> str:
    lines = [
        f"# Study {record['study']}: pilot (plan version {record['plan_version']})",
        "",
        "| criterion | value | needed | ok |",
        "|---|---|---|---|",
        *[
            f"| {name} | {show(c['value'])} | {show(c['needed'])} | {'yes' if c['ok'] else 'no'} |"
            for name, c in record["checks"].items()
        ],
        "",
        f"**{'go' if record['go'] else 'no go'}**",
    ]
    if record.get("dev"):
        lines += dev_lines(record)
    if record.get("tuning"):
        lines += tuning_lines(record)
    if record.get("power"):
        lines += [
            "",
            "What the planned seeds can detect, said before the confirmatory lock:",
            "",
            *[f"* {line}" for line in record["power"]],
        ]
    if record.get("locked_version"):
        lines += ["", f"The picks are locked as plan version {record['locked_version']} (confirmatory stage)."]
    lines += [
        "",
        "| run | dev | loss | top1pct_weight_share | clamp_frac | harder_than_positive |",
        "|---|---|---|---|---|---|",
        *[
            f"| {r['name']} | {show(r['dev'])} | "
            + " | ".join(
                show(r["last"].get(k)) for k in ("loss", "top1pct_weight_share", "clamp_frac", "harder_than_positive")
            )
            + " |"
            for r in record["runs"]
        ],
    ]
    return "\n".join(lines) + "\n"
