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
from simcse_hn.data.sts import STS_DATA_HINT, STS_FILES, load_sts_pairs, read_sts_jsonl
from simcse_hn.errors import UserError
from simcse_hn.evaluation.encoding import load_encoder
from simcse_hn.evaluation.scoring import sts_spearman
from simcse_hn.losses.base import TOP_SHARE
from simcse_hn.study.files import read_json, write_atomic, write_json
from simcse_hn.study.lock import check_locked, lock
from simcse_hn.study.plan import Plan, PlanError, grid_points, problem_line, read_plan
from simcse_hn.study.runs import last_window, on_devices, run_module

PILOT_KEYS = ("overrides", "seeds", "reference", "criteria", "dev", "tune", "untuned")


def measured_spread(plan: Plan) -> float | None:
    """The pilot's largest sd of paired dev-score differences against the baseline (two pilot seeds or more)."""
    path = os.path.join(plan.study_dir, "pilot", "pilot.json")
    return read_json(path).get("spread") if os.path.isfile(path) else None


CRITERIA = {"loss_ratio": (), "weight_share": ("arms", "ratio"), "clamp": ("arms", "below")}


def check(plan: Plan) -> list[str]:
    """The pilot section's problems, one line each (file:line: pilot.key: what), before any run."""
    _, lines = read_plan(plan.path)
    pilot, out = plan.pilot or {}, []

    def problem(where: tuple, message: str) -> None:
        out.append(problem_line(plan.path, lines, ("pilot", *where), message))

    for key in pilot:
        if key not in PILOT_KEYS:
            problem((key,), f"unknown key; the keys are {', '.join(PILOT_KEYS)}")
    seeds = pilot.get("seeds")
    if seeds is not None and (not isinstance(seeds, list) or not seeds
                              or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):  # fmt: skip
        problem(("seeds",), f"a list of integer seeds, got {seeds!r}")
    for part in ("overrides", "reference"):
        if pilot.get(part) is not None and not isinstance(pilot[part], dict):
            problem((part,), "a mapping of train.py keys")
    problem_criteria(plan, pilot, problem)
    tune, untuned = pilot.get("tune") or {}, pilot.get("untuned") or {}
    sizes = {}
    for arm, grid in tune.items():
        if arm not in plan.arms:
            problem(("tune", arm), "not an arm of the plan")
        elif not isinstance(grid, dict) or not grid or not all(isinstance(v, list) and v for v in grid.values()):
            problem(("tune", arm), "options and their grids, e.g. {temperature: [0.04, 0.05]} (several options: "
                    "every combination is a grid point)")  # fmt: skip
        else:
            sizes[arm] = math.prod(len(v) for v in grid.values())
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{a} {n}" for a, n in sizes.items())
        problem(("tune",), f"grids of unequal size ({listed}); every arm gets the same tuning budget")
    for arm in untuned:
        if arm not in plan.arms:
            problem(("untuned", arm), "not an arm of the plan")
        elif arm in tune:
            problem(("untuned", arm), "also in pilot.tune; an arm is tuned or left as it is")
    if tune:
        for arm in plan.arms:
            if arm not in tune and arm not in untuned:
                problem(("tune",), f"arm {arm} is neither tuned nor in pilot.untuned with a reason")
    dev = pilot.get("dev") or {}
    if tune and not dev.get("file"):
        problem(("dev", "file"), "tuning picks on a dev set; name it (never the endpoint's test data)")
    if dev.get("file") and not os.path.isfile(os.path.join(plan.folder, str(dev["file"]))):
        problem(("dev", "file"), f"{dev['file']}: no such file (relative to the plan; {STS_DATA_HINT})")
    if dev.get("file") and not isinstance(dev.get("shares_with_test"), int):
        problem(("dev", "shares_with_test"), "state how many sentence pairs the dev set shares with the endpoint's "
                "test files")  # fmt: skip
    return out


def problem_criteria(plan: Plan, pilot: dict, problem) -> None:
    """pilot.criteria's problems: a criterion the pilot does not know (a misspelt one would pass by never being
    read), an arm that is not the plan's, a threshold that is not a positive number."""
    criteria = pilot.get("criteria") or {}
    if not isinstance(criteria, dict):
        problem(("criteria",), f"a mapping of go criteria ({', '.join(CRITERIA)})")
        return

    def positive(where: tuple, value) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            problem(where, f"a number > 0, got {value!r}")

    for name, value in criteria.items():
        if name not in CRITERIA:
            problem(("criteria", name), f"unknown criterion; the criteria are {', '.join(CRITERIA)}")
        elif name == "loss_ratio":
            positive(("criteria", name), value)
            if pilot.get("reference") is None:
                problem(("criteria", name), "compares the baseline with the reference run; add pilot.reference "
                        "(e.g. {queue_size: 0})")  # fmt: skip
        elif not isinstance(value, dict):
            problem(("criteria", name), f"a mapping with the keys {', '.join(CRITERIA[name])}")
        else:
            for key in value:
                if key not in CRITERIA[name]:
                    problem(("criteria", name, key), f"unknown key; the keys are {', '.join(CRITERIA[name])}")
            arms = value.get("arms")
            if not isinstance(arms, list) or not arms:
                problem(("criteria", name, "arms"), "a list of the arms it reads")
            else:
                for arm in arms:
                    if arm not in plan.arms:
                        problem(("criteria", name, "arms"), f"{arm!r} is not an arm of the plan")
            threshold = CRITERIA[name][1]
            if threshold in value:
                positive(("criteria", name, threshold), value[threshold])


def pair_key(s1: str, s2: str) -> frozenset:
    """A sentence pair as the dev-test overlap counts it: either order, case and spacing aside."""
    return frozenset((" ".join(s1.lower().split()), " ".join(s2.lower().split())))


def shared_pairs(plan: Plan) -> int | None:
    """How many of the dev set's pairs the endpoint's test files also hold (either order, case and spacing aside);
    None when the test data is on the Hub (no data_dir)."""
    dev = plan.pilot["dev"]
    if not plan.evaluation.get("data_dir"):
        return None
    tests = set()
    for task in plan.tasks():
        path = os.path.join(plan.folder, str(plan.evaluation["data_dir"]), STS_FILES[task])
        if os.path.isfile(path):
            rows = [r for r in read_sts_jsonl(path) if r.get("split") == "test"]
            tests |= {pair_key(r["sentence1"], r["sentence2"]) for r in rows}
    pairs = load_sts_pairs(os.path.join(plan.folder, dev["file"]), dev.get("split"))
    return sum(pair_key(a, b) in tests for a, b in zip(pairs.sentence1, pairs.sentence2))


def pilot_runs(plan: Plan) -> list[dict]:
    """Every run of the pilot: {name, arm, seed, change, config}; the reference first in each seed."""
    pilot = plan.pilot or {}
    tune = pilot.get("tune") or {}
    runs = []
    for seed in pilot.get("seeds") or plan.seeds[:1]:
        if "reference" in pilot:
            runs.append({"name": f"reference-s{seed}", "arm": "reference", "seed": seed, "change": None,
                         "config": plan.reference_config()})
        for arm in plan.arms:
            for change in grid_points(tune[arm]) if arm in tune else [None]:
                label = "" if change is None else "-" + ",".join(f"{k}={json.dumps(v)}" for k, v in change.items())
                runs.append({"name": f"{arm}{label}-s{seed}".replace(" ", "").replace('"', ""), "arm": arm,
                             "seed": seed, "change": change,
                             "config": plan.pilot_config(arm, change)})  # fmt: skip
    return runs


def _train(plan: Plan, run: dict, threads: int | None, device: str | None) -> dict:
    folder = os.path.join(plan.study_dir, "pilot", run["name"])
    done = os.path.join(folder + ".json")
    if os.path.isfile(done) and read_json(done)["config"] == run["config"]:
        return read_json(done)  # trained by an earlier sitting with this config
    config = os.path.join(plan.study_dir, "pilot", "configs", f"{run['name']}.yaml")
    write_atomic(config, yaml.safe_dump(run["config"], sort_keys=False))
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    args = ["--config", os.path.relpath(config, plan.folder), "--seed", str(run["seed"]), "--output_dir",
            os.path.relpath(folder, plan.folder), "--overwrite_output_dir", "true"]  # fmt: skip
    run_module("simcse_hn.cli.train", args, plan.folder, folder + ".log", env)
    out = {**run, "last": last_window(folder), "dev": None}
    dev = (plan.pilot or {}).get("dev")
    if dev and dev.get("file"):
        pairs = load_sts_pairs(os.path.join(plan.folder, dev["file"]), dev.get("split"))
        encode, _ = load_encoder(folder)
        out["dev"] = sts_spearman(encode, pairs.sentence1, pairs.sentence2, pairs.scores)
    write_json(done, out)
    return out


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
    return {"value": value, "reference": reference, "needed": needed,
            "ok": None if value is None or needed is None else value >= needed}  # fmt: skip


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
        values = [r["last"][key] for r in runs if r["arm"] == arm and key in r["last"]
                  and (arm == "reference" or r["change"] == (picks.get(arm) or r["change"]))]  # fmt: skip
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


def choose(plan: Plan, runs: list[dict]) -> tuple[dict, float | None]:
    """Each tuned arm's grid point with the best mean dev score over the pilot seeds; the largest sd of paired dev
    differences against the baseline's pick (None below two seeds)."""
    picks = {}
    for arm, grid in ((plan.pilot or {}).get("tune") or {}).items():
        means = [(float(np.mean([r["dev"] for r in runs if r["arm"] == arm and r["change"] == change])), i, change)
                 for i, change in enumerate(grid_points(grid))]  # fmt: skip
        picks[arm] = max(means, key=lambda m: (m[0], -m[1]))[2]  # a tie: the first in the plan's grid
    seeds = (plan.pilot or {}).get("seeds") or plan.seeds[:1]
    if len(seeds) < 2 or not all(r["dev"] is not None for r in runs):
        return picks, None

    def dev(arm: str, seed: int) -> float:
        return next(r["dev"] for r in runs if r["arm"] == arm and r["seed"] == seed
                    and r["change"] == picks.get(arm, r["change"]))  # fmt: skip

    spreads = [np.std([dev(a, s) - dev(plan.baseline, s) for s in seeds], ddof=1) for a in plan.comparisons]
    return picks, float(max(spreads))


def tuning(plan: Plan, runs: list[dict], picks: dict) -> dict[str, dict]:
    """Each tuned arm's grid as the pilot saw it: every point's mean dev score and sd over the pilot seeds, the options
    whose picked value is the lowest or highest of a numeric grid (the best may then lie beyond what was tried), and
    the pick's lead over the next best point."""
    out = {}
    for arm, grid in ((plan.pilot or {}).get("tune") or {}).items():
        points = []
        for change in grid_points(grid):
            dev = [r["dev"] for r in runs if r["arm"] == arm and r["change"] == change and r["dev"] is not None]
            points.append({"change": change, "mean": float(np.mean(dev)) if dev else None,
                           "sd": float(np.std(dev, ddof=1)) if len(dev) > 1 else None})  # fmt: skip
        pick, edges = picks[arm], {}
        for option, values in grid.items():
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values) and len(set(values)) > 1:
                edge = "lowest" if pick[option] == min(values) else "highest" if pick[option] == max(values) else None
                if edge:
                    edges[option] = edge
        means = sorted((p["mean"] for p in points if p["mean"] is not None), reverse=True)
        at_pick = next(p for p in points if p["change"] == pick)
        out[arm] = {"points": points, "pick": pick, "edges": edges,
                    "lead": means[0] - means[1] if len(means) > 1 else None, "sd_at_pick": at_pick["sd"]}  # fmt: skip
    return out


def tuning_notes(tuned: dict[str, dict]) -> list[str]:
    """One line per doubt a reader should have of a pick: an option at the edge of its grid, a lead over the next
    best point smaller than the seeds' spread."""
    notes = []
    for arm, t in tuned.items():
        for option, edge in t["edges"].items():
            beyond = "below" if edge == "lowest" else "above"
            notes.append(f"{arm}: the pick, {option} {_value(t['pick'][option])}, is the {edge} value of its grid: "
                         f"the best may lie {beyond} it, which this pilot did not try.")  # fmt: skip
        if t["lead"] is not None and t["sd_at_pick"] is not None and t["lead"] < t["sd_at_pick"]:
            notes.append(f"{arm}: the pick leads the next best point by {t['lead']:.3g}, less than the sd of its dev "
                         f"score over the seeds ({t['sd_at_pick']:.3g}): within the seeds' noise.")  # fmt: skip
    return notes


def run_pilot(plan: Plan, jobs: int, threads: int | None, devices: list[str] | None) -> str:
    """Train what the pilot lacks, read it, write <study>/pilot/pilot.{json,md}; on go, lock the picks."""
    problems = check(plan)
    if problems:
        raise PlanError(problems)
    version = check_locked(plan)
    if version.get("picks") is not None:
        raise UserError(f"{plan.path}: the pilot's picks are locked in version {version['version']}; a new pilot "
                        "needs a new plan")  # fmt: skip
    dev = (plan.pilot or {}).get("dev") or {}
    shared = shared_pairs(plan) if dev.get("file") else None
    if shared is not None and shared != dev["shares_with_test"]:
        raise UserError(f"{plan.path}: pilot.dev.shares_with_test: the plan states {dev['shares_with_test']}, but "
                        f"{shared} of the dev set's pairs are in the endpoint's test files")  # fmt: skip
    todo = pilot_runs(plan)
    trained = on_devices(jobs, devices, lambda run, device: _train(plan, run, threads, device), todo)
    runs = [f.result() for f in trained]
    picks, spread = choose(plan, runs)
    record = {"study": plan.name, "plan_version": version["version"], "runs": runs, "picks": picks,
              "spread": spread, "shared_pairs": shared, "dev": dev.get("file"), "tuning": tuning(plan, runs, picks),
              **verdict(plan, runs, picks)}  # fmt: skip
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
    return json.dumps(value) if isinstance(value, (dict, list)) else _show(value)


def _show(value) -> str:
    return "–" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def markdown(record: dict) -> str:
    lines = [f"# Study {record['study']}: pilot (plan version {record['plan_version']})", "",
             "| criterion | value | needed | ok |", "|---|---|---|---|",
             *[f"| {name} | {_show(c['value'])} | {_show(c['needed'])} | {'yes' if c['ok'] else 'no'} |"
               for name, c in record["checks"].items()],
             "", f"**{'go' if record['go'] else 'no go'}**"]  # fmt: skip
    if record.get("dev"):
        shared = record["shared_pairs"]
        lines += ["", f"Tuned on {record['dev']}, " + (
            "whose pairs were not counted against the endpoint's test files (the evaluation data is on the Hub)"
            if shared is None else f"which shares {shared} sentence pairs with the endpoint's test files"
        ) + ". Picks: " + ("; ".join(f"{a} {json.dumps(c)}" for a, c in record["picks"].items()) or "none") + "."]
        if shared:
            lines += ["", f"The picks saw {shared} pairs that the endpoint's test files hold: the tests read scores "
                      "of models tuned in part on their own data."]  # fmt: skip
    if record.get("tuning"):
        lines += ["", "Mean dev score over the pilot's seeds, each tuned arm's grid (sd over the seeds):", "",
                  "| arm | grid point | mean dev | sd | |", "|---|---|---|---|---|",
                  *[f"| {arm} | {_point(p['change'])} | {_show(p['mean'])} | {_show(p['sd'])} | "
                    f"{'pick' if p['change'] == t['pick'] else ''} |"
                    for arm, t in record["tuning"].items() for p in t["points"]]]  # fmt: skip
        notes = tuning_notes(record["tuning"])
        if notes:
            lines += ["", *[f"* {note}" for note in notes]]
    if record.get("locked_version"):
        lines += ["", f"The picks are locked as plan version {record['locked_version']} (confirmatory stage)."]
    lines += ["", "| run | dev | loss | top1pct_weight_share | clamp_frac | harder_than_positive |",
              "|---|---|---|---|---|---|",
              *[f"| {r['name']} | {_show(r['dev'])} | " + " | ".join(_show(r["last"].get(k)) for k in (
                  "loss", "top1pct_weight_share", "clamp_frac", "harder_than_positive")) + " |"
                for r in record["runs"]]]  # fmt: skip
    return "\n".join(lines) + "\n"
