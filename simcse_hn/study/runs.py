"""The study's runs: each an ordinary train.py run and an eval/sts.py report of it, in <study>/runs/<arm>-s<seed>/
and <arm>-s<seed>-sts/ (what a user gets by hand with the commands the record names), started from the plan's folder.

A run holds <arm>-s<seed>.lock while it works (two workers or two machines never train one folder); a run stopped
part-way continues from its newest complete checkpoint; a run is done when its record <arm>-s<seed>.json is written,
which names the plan version, the data and code hashes, the machine and the times."""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import platform
import queue
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import yaml

from simcse_hn.errors import UserError
from simcse_hn.evaluation.curves import load_curves
from simcse_hn.files import MANIFEST, RUN_MARKER
from simcse_hn.run_record import RunRecord
from simcse_hn.study.files import read_json, text_sha256, write_atomic, write_json
from simcse_hn.study.lock import check_locked
from simcse_hn.study.plan import Plan, eval_flags, load_plan
from simcse_hn.training.checkpoints import last_complete_checkpoint, read_run_id

DIAGNOSTICS = ("loss", "pos_sim", "neg_sim", "harder_than_positive", "top1pct_weight_share", "neg_weight_max",
               "clamp_frac", "est_false_neg_frac", "nonfinite_fallback")  # fmt: skip


def run_key(arm: str, seed: int) -> str:
    return f"{arm}-s{seed}"


def record_path(plan: Plan, key: str) -> str:
    return os.path.join(plan.study_dir, "runs", f"{key}.json")


def spec(plan: Plan, version: dict, arm: str) -> dict:
    """What a run of `arm` trains and scores under `version`: its train.py config and eval/sts.py flags."""
    return {"config": plan.config(arm, version.get("picks")), "evaluation": eval_flags(plan.evaluation)}


def spec_sha256(run_spec: dict) -> str:
    return text_sha256(yaml.safe_dump(run_spec, sort_keys=True))


def mismatch(record: dict, version: dict, plan: Plan) -> str | None:
    """Why a finished run is not a run of this version of the plan, or None: other settings, code or data."""
    if record["spec_sha256"] != spec_sha256(spec(plan, version, record["arm"])):
        return f"trained under other settings (plan version {record['plan_version']})"
    for field, verb in (("code", "by"), ("data", "on")):
        if record[f"{field}_sha256"] != version[field]["sha256"]:
            return (f"trained {verb} other {field} ({field} {record[f'{field}_sha256'][:12]}, the plan's "
                    f"{version[field]['sha256'][:12]})")  # fmt: skip
    return None


def pending(plan: Plan, version: dict) -> list[tuple[str, int]]:
    """The runs the plan still lacks, seed by seed, every arm within a seed; a finished run of other settings, code
    or data is refused by name (its folder is the user's: moved away by them, never overwritten here)."""
    todo = []
    for seed in plan.seeds:
        for arm in plan.arms:
            path = record_path(plan, run_key(arm, seed))
            if not os.path.isfile(path):
                todo.append((arm, seed))
                continue
            problem = mismatch(read_json(path), version, plan)
            if problem:
                raise UserError(f"{os.path.relpath(path)}: {problem}; move runs/{run_key(arm, seed)}* away to run "
                                "it again under this version")  # fmt: skip
    return todo


def commands(plan: Plan, arm: str, seed: int) -> tuple[list[str], list[str]]:
    """The train.py and eval/sts.py command lines of a run (after the interpreter), paths relative to the plan."""
    study = os.path.relpath(plan.study_dir, plan.folder)
    folder = os.path.join(study, "runs", run_key(arm, seed))
    train = ["--config", os.path.join(study, "configs", f"{arm}.yaml"), "--seed", str(seed), "--output_dir", folder]
    score = ["--model", folder, "--output", folder + "-sts", "--no_progress_bar", *eval_flags(plan.evaluation)]
    return train, score


def run_module(module: str, args: list[str], cwd: str, log: str, env: dict) -> float:
    start = time.time()
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"$ {module} {shlex.join(args)}\n")
        f.flush()
        done = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, stdout=f, stderr=subprocess.STDOUT,
                              env=env, check=False)  # fmt: skip
    if done.returncode != 0:
        raise UserError(f"{module} exited {done.returncode}; see {os.path.relpath(log)}")
    return round(time.time() - start, 1)


def last_window(folder: str) -> dict:
    """The training diagnostics of a run's last logging window (trainer_state.json's log history)."""
    return last_values(load_curves(folder).series)


def last_values(series: dict[str, dict[int, float]], keys: Sequence[str] = DIAGNOSTICS) -> dict[str, float]:
    """Each of `keys` at the last step it was logged ({key: {step: value}}, evaluation.curves' series)."""
    return {key: series[key][max(series[key])] for key in keys if series.get(key)}


def trained_by(config: dict, results: dict) -> dict:
    """What a run's own files say made it: the data and code hashes its training recorded (simcse_config.json) and
    the code that scored it (results.json's settings); None where a file predates them."""
    record = RunRecord.from_json(config or {})
    return {"train_data_sha256": record.data.sha256, "source_sha256": record.provenance.code.get("source_sha256"),
            "scored_by_source_sha256": (results.get("settings", {}).get("code") or {}).get("source_sha256")}


def scores(results: dict) -> dict:
    """The scores of an eval/sts.py results.json the report can read: the average, each task, the geometry."""
    out = {"average": results["average"], "tasks": {t: v["spearman"] for t, v in results["tasks"].items()}}
    out.update({k: v for k, v in (results.get("alignment_uniformity") or {}).items() if k in ("alignment",
                                                                                             "uniformity")})
    return out


def run_one(plan_path: str, arm: str, seed: int, threads: int | None = None, device: str | None = None,
            engine: str = "local") -> dict | None:  # fmt: skip
    """Train and score one run, unless it is done or another worker holds it. -> its record, or None (skipped)."""
    plan = load_plan(plan_path, check_arms=False)
    version = check_locked(plan, stage="confirmatory")
    key = run_key(arm, seed)
    runs = os.path.join(plan.study_dir, "runs")
    os.makedirs(runs, exist_ok=True)
    if os.path.isfile(record_path(plan, key)):
        return None
    with held(os.path.join(runs, f"{key}.lock")) as mine:
        if not mine or os.path.isfile(record_path(plan, key)):  # another worker has it, or finished it meanwhile
            return None
        return _train_and_score(plan, version, arm, seed, threads, device, engine)


@contextlib.contextmanager
def held(path: str) -> Iterator[bool]:
    """An exclusive lock on the file `path` while the block runs, released however the process ends. -> True when
    this worker holds it, False when another worker or machine does (nothing waits)."""
    with open(path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def resume_flags(folder: str) -> tuple[list[str], str | None]:
    """How train.py continues a run stopped part-way in `folder` (its run marker written, its final save not): from
    its newest complete checkpoint (one half-written when killed is not), else over the partial folder from the start.
    -> (flags, the checkpoint's name or None); no flags for a folder no run started or one that finished."""
    if not os.path.isfile(os.path.join(folder, RUN_MARKER)) or os.path.isfile(os.path.join(folder, MANIFEST)):
        return [], None
    newest = last_complete_checkpoint(folder, read_run_id(folder))
    if newest is None:
        return ["--overwrite_output_dir", "true"], None
    return ["--resume_from_checkpoint", "true"], os.path.basename(newest)


def _train_and_score(plan: Plan, version: dict, arm: str, seed: int, threads: int | None, device: str | None,
                     engine: str) -> dict:  # fmt: skip
    key = run_key(arm, seed)
    run_spec = spec(plan, version, arm)
    config_path = os.path.join(plan.study_dir, "configs", f"{arm}.yaml")
    text = yaml.safe_dump(run_spec["config"], sort_keys=False)
    if not os.path.isfile(config_path) or open(config_path, encoding="utf-8").read() != text:
        write_atomic(config_path, text)
    train_args, score_args = commands(plan, arm, seed)
    folder = os.path.join(plan.study_dir, "runs", key)
    flags, resumed = resume_flags(folder)
    train_args += flags
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    log = os.path.join(plan.study_dir, "runs", f"{key}.log")
    started = _now()
    train_seconds = eval_seconds = None
    if not os.path.isfile(os.path.join(folder, MANIFEST)):  # no final save yet
        train_seconds = run_module("simcse_hn.cli.train", train_args, plan.folder, log, env)
    results_path = os.path.join(folder + "-sts", "results.json")
    if not os.path.isfile(results_path):
        eval_seconds = run_module("simcse_hn.cli.sts", score_args, plan.folder, log, env)
    trained = read_json(os.path.join(folder, "simcse_config.json"))
    results = read_json(results_path)
    record = {
        "arm": arm, "seed": seed, "plan_version": version["version"], "plan_sha256": version["plan_sha256"],
        "spec_sha256": spec_sha256(run_spec), "code_sha256": version["code"]["sha256"],
        "data_sha256": version["data"]["sha256"],
        "trained": trained_by(trained, results),
        "commands": {"train": "simcse-hn-train " + shlex.join(train_args[:6]),
                     "score": "simcse-hn-sts " + shlex.join(score_args)},
        "folders": {"model": f"runs/{key}", "scores": f"runs/{key}-sts"},
        "resumed_from": resumed, "scores": scores(results), "diagnostics": last_window(folder),
        "where": {"machine": platform.node(), "engine": engine, "threads": threads, "device": device},
        "times": {"started": started, "finished": _now(), "train_seconds": train_seconds,
                  "eval_seconds": eval_seconds},
    }  # fmt: skip
    write_json(record_path(plan, key), record)
    return record


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def on_devices(jobs: int, devices: list[str] | None, work: Callable, items: list) -> list[Future]:
    """work(item, device) for each item, `jobs` at a time, in order; a job holds its device (devices[k], a GPU each,
    or None) from start to end, so no two jobs share one whichever ends first. -> the futures, in the items' order."""
    slots: queue.Queue = queue.Queue()
    for k in range(jobs):
        slots.put(devices[k] if devices else None)

    def held_device(item):
        device = slots.get()
        try:
            return work(item, device)
        finally:
            slots.put(device)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(held_device, item) for item in items]
    return futures


def run_local(plan: Plan, todo: list[tuple[str, int]], jobs: int, threads: int | None, devices: list[str] | None,
              echo: Callable[[str], None] = print) -> list[str]:  # fmt: skip
    """The runs on this machine, `jobs` at a time, in the order given (seed by seed); worker k uses devices[k] (a GPU
    each) or `threads` CPU threads. -> one line per failed run."""

    def work(item: tuple[str, int], device: str | None) -> None:
        arm, seed = item
        record = run_one(plan.path, arm, seed, threads, device)
        if record is not None:  # no score: the runs stay blind until the report has them all
            echo(f"{run_key(arm, seed)}: done")

    futures = on_devices(jobs, devices, work, todo)
    return [f"{run_key(arm, seed)}: {f.exception()}" for (arm, seed), f in zip(todo, futures)
            if f.exception() is not None]


def endpoint_value(record: dict, endpoint: str) -> float:
    found = record["scores"]
    if endpoint not in found and endpoint not in found["tasks"]:
        raise UserError(f"runs/{run_key(record['arm'], record['seed'])}.json: no {endpoint!r} score; its eval/sts.py "
                        "report did not measure it")  # fmt: skip
    return found[endpoint] if endpoint in found else found["tasks"][endpoint]
