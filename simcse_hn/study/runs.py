"""The study's runs: each an ordinary train.py run and an eval/sts.py report of it, in <study>/runs/<arm>-s<seed>/
and <arm>-s<seed>-sts/ (what a user gets by hand with the commands the record names), started from the plan's folder.

A run holds <arm>-s<seed>.lock while it works, and so does every process it starts (child.py: they die with the
runner, and hold its lock as long as they live), so two workers, two machines or a runner started again after a
`kill -9` never train one folder at once. A run stopped part-way continues from its newest complete checkpoint. A
run is done when its record <arm>-s<seed>.json is written, bound to its model and scores (records.py), which is
written only once the run's files pass the check every reader of records applies: `run` adopts no model, scores
file or record it has not checked."""

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
from typing import IO

import yaml

from simcse_hn.errors import UserError
from simcse_hn.evaluation.curves import load_curves
from simcse_hn.files import MANIFEST, RUN_MARKER, ReportFolder, safetensors_problem
from simcse_hn.study import binding
from simcse_hn.study.files import read_json, write_atomic, write_json
from simcse_hn.study.lock import check_locked
from simcse_hn.study.plan import Plan, eval_flags, load_plan
from simcse_hn.study.records import (
    Checker,
    model_folder,
    record_path,
    run_key,
    scores_folder,
    spec,
    spec_sha256,
)
from simcse_hn.training.checkpoints import last_complete_checkpoint, read_run_id

DIAGNOSTICS = (
    "loss",
    "pos_sim",
    "neg_sim",
    "harder_than_positive",
    "top1pct_weight_share",
    "neg_weight_max",
    "clamp_frac",
    "est_false_neg_frac",
    "nonfinite_fallback",
)
SCORE_FILES = ("results.json", "results.md", "results.png", "predictions.npz")  # what eval/sts.py writes there


def pending(plan: Plan, version: dict) -> list[tuple[str, int]]:
    """The runs the plan still lacks, seed by seed, every arm within a seed; a record that fails the check (another
    version's settings, code or data; numbers, hashes, arm or seed that do not match) is refused by name (its folder
    is the user's: moved away by them, never overwritten here)."""
    checker = Checker(plan, version)
    todo = []
    for seed in plan.seeds:
        for arm in plan.arms:
            key = run_key(arm, seed)
            path = record_path(plan, key)
            if not os.path.isfile(path):
                todo.append((arm, seed))
                continue
            problem = checker.problem(key, read_json(path))
            if problem:
                raise UserError(
                    f"{os.path.relpath(path)}: {problem}; move runs/{key}* away to run it again under this version"
                )
    return todo


def commands(plan: Plan, arm: str, seed: int) -> tuple[list[str], list[str]]:
    """The train.py and eval/sts.py command lines of a run (after the interpreter), paths relative to the plan."""
    study = os.path.relpath(plan.study_dir, plan.folder)
    folder = os.path.join(study, "runs", run_key(arm, seed))
    train = ["--config", os.path.join(study, "configs", f"{arm}.yaml"), "--seed", str(seed), "--output_dir", folder]
    score = ["--model", folder, "--output", folder + "-sts", "--no_progress_bar", "--no_save_to_model"]
    score += eval_flags(plan.evaluation)
    return train, score


def run_module(module: str, args: list[str], cwd: str, log: str, env: dict, hold: IO | None = None) -> float:
    """`python -m module args` from `cwd`, its output appended to `log`, in a process that dies with this one and
    holds `hold` (the run's lock) while it lives (child.py). -> its wall seconds; a UserError when it fails."""
    start = time.time()
    command = [sys.executable, "-m", "simcse_hn.study.child", str(os.getpid()), module, *args]
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"$ {module} {shlex.join(args)}\n")
        f.flush()
        done = subprocess.run(
            command,
            cwd=cwd,
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            check=False,
            pass_fds=(hold.fileno(),) if hold is not None else (),
        )
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
    trained = binding.trained_as(config)
    return {
        "train_data_sha256": trained["train_data_sha256"],
        "source_sha256": trained["source_sha256"],
        "scored_by_source_sha256": (results.get("settings", {}).get("code") or {}).get("source_sha256"),
    }


def scores(results: dict) -> dict:
    """The scores of an eval/sts.py results.json the report can read: the average, each task, the geometry."""
    out = {"average": results["average"], "tasks": {t: v["spearman"] for t, v in results["tasks"].items()}}
    geometry = results.get("alignment_uniformity") or {}
    out.update({k: v for k, v in geometry.items() if k in ("alignment", "uniformity")})
    return out


def run_one(
    plan_path: str, arm: str, seed: int, threads: int | None = None, device: str | None = None, engine: str = "local"
) -> dict | None:
    """Train and score one run, unless it is done or another worker holds it. -> its record, or None (skipped)."""
    plan = load_plan(plan_path, check_arms=False)
    version = check_locked(plan, stage="confirmatory")
    key = run_key(arm, seed)
    runs = os.path.join(plan.study_dir, "runs")
    os.makedirs(runs, exist_ok=True)
    if os.path.isfile(record_path(plan, key)):
        return None
    with held(os.path.join(runs, f"{key}.lock")) as lock:
        if lock is None or os.path.isfile(record_path(plan, key)):  # another worker has it, or finished it meanwhile
            return None
        return _train_and_score(plan, version, arm, seed, Where(threads, device, engine), lock)


@contextlib.contextmanager
def held(path: str) -> Iterator[IO | None]:
    """An exclusive lock on the file `path` while the block runs, released however the process ends (and held on by
    each process the block hands it to, run_module's `hold`). -> the open lock file when this worker holds it, None
    when another worker, machine or a trainer of an earlier runner does (nothing waits)."""
    with open(path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        yield lock


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


class Where:
    """Where a run goes: its torch threads, its GPU and the engine that started it."""

    def __init__(self, threads: int | None, device: str | None, engine: str):
        self.threads, self.device, self.engine = threads, device, engine

    def env(self) -> dict:
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        if self.threads:
            env["OMP_NUM_THREADS"] = str(self.threads)
        if self.device is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.device
        return env

    def record(self) -> dict:
        return {"machine": platform.node(), "engine": self.engine, "threads": self.threads, "device": self.device}


def adoptable(folder: str, seed: int, objective: dict) -> str | None:
    """Why a finished model folder with no record is not one this run may score: not whole (a weights file cut
    short), or trained with another seed or objective than the arm's. None: it is."""
    for name in binding.model_files(folder) or {}:
        if name.endswith(".safetensors"):
            problem = safetensors_problem(os.path.join(folder, name))
            if problem:
                return problem
    return binding.check_model(folder, {}, seed, objective)


def _train_and_score(plan: Plan, version: dict, arm: str, seed: int, where: Where, lock: IO) -> dict:
    key = run_key(arm, seed)
    checker = Checker(plan, version)
    run_spec = spec(plan, version, arm)
    config_path = os.path.join(plan.study_dir, "configs", f"{arm}.yaml")
    text = yaml.safe_dump(run_spec["config"], sort_keys=False)
    if not os.path.isfile(config_path) or open(config_path, encoding="utf-8").read() != text:
        write_atomic(config_path, text)
    train_args, score_args = commands(plan, arm, seed)
    folder, scored = model_folder(plan, key), scores_folder(plan, key)
    flags, resumed = resume_flags(folder)
    log = os.path.join(plan.study_dir, "runs", f"{key}.log")
    started, train_seconds = utc_now(), None
    if os.path.isfile(os.path.join(folder, MANIFEST)):  # trained, not recorded: taken only once checked
        problem = adoptable(folder, seed, checker.objectives[arm])
        if problem:
            raise UserError(f"runs/{key}: {problem}; move it away to train it again")
    else:
        train_seconds = run_module("simcse_hn.cli.train", train_args + flags, plan.folder, log, where.env(), lock)
    ReportFolder(scored).check(SCORE_FILES)  # a scores file changed since eval/sts.py wrote it: one line, not replaced
    eval_seconds = run_module("simcse_hn.cli.sts", score_args, plan.folder, log, where.env(), lock)
    results = read_json(os.path.join(scored, "results.json"))
    record = {
        "arm": arm,
        "seed": seed,
        "plan_version": version["version"],
        "plan_sha256": version["plan_sha256"],
        "spec_sha256": spec_sha256(run_spec),
        "config_sha256": version.get("arms", {}).get(arm),
        "code_sha256": version["code"]["sha256"],
        "data_sha256": version["data"]["sha256"],
        "bound": {"model": {"files": binding.model_files(folder)}, "scores": binding.scores_files(scored)},
        "trained": trained_by(read_json(os.path.join(folder, "simcse_config.json")), results),
        "commands": {
            "train": "simcse-hn-train " + shlex.join(train_args),
            "score": "simcse-hn-sts " + shlex.join(score_args),
        },
        "folders": {"model": f"runs/{key}", "scores": f"runs/{key}-sts"},
        "resumed_from": resumed,
        "scores": scores(results),
        "diagnostics": last_window(folder),
        "where": where.record(),
        "times": {
            "started": started,
            "finished": utc_now(),
            "train_seconds": train_seconds,
            "eval_seconds": eval_seconds,
        },
    }
    problem = checker.problem(key, record)
    if problem:
        raise UserError(f"runs/{key}: {problem}")
    write_json(record_path(plan, key), record)
    return record


def utc_now() -> str:
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


def run_local(
    plan: Plan,
    todo: list[tuple[str, int]],
    jobs: int,
    threads: int | None,
    devices: list[str] | None,
    echo: Callable[[str], None] = print,
) -> list[str]:
    """The runs on this machine, `jobs` at a time, in the order given (seed by seed); worker k uses devices[k] (a GPU
    each) or `threads` CPU threads. -> one line per failed run."""

    def work(item: tuple[str, int], device: str | None) -> None:
        arm, seed = item
        record = run_one(plan.path, arm, seed, threads, device)
        if record is not None:  # no score: the runs stay blind until the report has them all
            echo(f"{run_key(arm, seed)}: done")
        elif not os.path.isfile(record_path(plan, run_key(arm, seed))):
            echo(f"{run_key(arm, seed)}: held by another worker (or a trainer still ending); run again later")

    futures = on_devices(jobs, devices, work, todo)
    return [
        f"{run_key(arm, seed)}: {f.exception()}" for (arm, seed), f in zip(todo, futures) if f.exception() is not None
    ]


def endpoint_value(record: dict, endpoint: str) -> float:
    found = record["scores"]
    if endpoint not in found and endpoint not in found["tasks"]:
        raise UserError(
            f"runs/{run_key(record['arm'], record['seed'])}.json: no {endpoint!r} score; its eval/sts.py "
            "report did not measure it"
        )
    return found[endpoint] if endpoint in found else found["tasks"][endpoint]
