"""SIGKILL a one-process training run at chosen moments, resume it, and compare its final weights with an
uninterrupted run's.

Each trial starts train.py (configs/debug_tiny.yaml, 24 steps, a checkpoint every 4, save_total_limit 2, no dev
evaluation) as one of three runs (`--runs`): plain; queue (HCL with a 40-entry queue and a momentum encoder, whose
checkpoints hold negative_queue.pt); topic (topic batches, 4 clusters, whose checkpoints hold topic_clusters.pt). It
kills it once with SIGKILL at one moment, then runs the same command again with `--resume_from_checkpoint true`, as a
restart script that always passes it would (a run killed before any checkpoint was whole starts again from step 0:
docs/reliability.md, "No dead ends").
A checkpoint is written in this order (simcse_hn/training/checkpoints.py): the Trainer's files (model, optimizer,
scheduler, RNG, then trainer_state.json), then the run's parts (queue, topic clusters), then checkpoint_manifest.json,
last. Moments:
* random: a uniform time within the uninterrupted run's wall time;
* checkpoint: as soon as checkpoint-N (N drawn from 4, 8, ..., 24) exists without its trainer_state.json (while the
  Trainer writes its files);
* commit: as soon as checkpoint-N has its trainer_state.json and no checkpoint_manifest.json (between the Trainer's
  files and the manifest: the parts may be unwritten);
* first: as soon as the first checkpoint (checkpoint-4) exists without its manifest (anywhere in its writing): no
  checkpoint is whole yet;
* final: as soon as the final folder's model.safetensors exists and its simcse_config.json does not (the final save);
* writers: no kill; a second process starts on the same folder at once or after a delay drawn within 0.3 of the first's
  wall time, alternately a fresh run with another seed (43) and a resume; where they meet, exactly one must finish
  (exit 0) and the other be refused in one line naming the holder (exit 2); a second that came after the first had
  ended must be refused (another seed: the folder holds the earlier run's checkpoints) or finish without a step (a
  resume); the folder's final weights must be the finisher's uninterrupted run's;
* push: the run pushes every save (`--push_to_hub true --hub_strategy every_save`) to the stand-in Hub of
  simcse_hn/testing/hub_server.py on 127.0.0.1 (HF_ENDPOINT); killed as soon as the stand-in has answered the
  preupload of push number K (K drawn from 1..7: six checkpoints, then the final folder), i.e. while that upload
  is in flight, before its commit. The resume pushes too. Checks besides the ones below: the repo's model files on
  the stand-in at the end are bit-equal to the uninterrupted run's, the last commit is the final folder's, and the
  repo as every commit the stand-in stored left it holds a whole model (model.safetensors, config.json and the
  tokenizer; a commit is one request, stored only once its whole body arrived, and carries only the files that
  changed).
Checks: the checkpoint a resume names is whole and the newest whole one at that moment (both judged on a
snapshot of the checkpoint folders taken after the kill and before the resume, since the resumed run's rotation may
delete the one it resumed from); the final weights are bit-equal to the uninterrupted run's.

    python -m bench.fault_injection --trials 10   # 10 per moment
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import load_file

from bench.common import RESULTS, ROOT, environment, environment_line, load_average, write_report
from simcse_hn.training.checkpoints import (
    CHECKPOINT_MANIFEST,
    checkpoint_problem,
    last_complete_checkpoint,
    read_run_id,
)

MOMENTS = ("random", "checkpoint", "commit", "first", "final", "push", "writers")
OTHER_SEED = ["--seed", "43"]  # the second writer's other run (argparse takes the last --seed)
RUNS = {  # the run kinds and their flags
    "plain": [],
    "queue": ["--loss", "hcl", "--queue_size", "40", "--momentum", "0.9"],
    "topic": ["--topic_batches", "true", "--topic_clusters", "4"],
}
PLAIN_ONLY = ("push", "writers")  # moments run with the plain run only
SECONDS = ("other seed", "resume")  # the second writer, in turn
FINAL_SUMMARY = "Upload SimCSE sentence encoder"  # the final folder's commit (tests/test_hub.py)
WHOLE_MODEL = {"model.safetensors", "config.json", "tokenizer.json"}  # in every stored commit (push moment)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


def command(out: Path, run: str = "plain") -> list[str]:
    return [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "debug_tiny.yaml"),
            "--train_file", str(ROOT / "tests" / "fixtures" / "tiny_corpus.txt"), "--output_dir", str(out),
            "--max_steps", "24", "--save_steps", "4", "--save_total_limit", "2", "--eval_strategy", "no",
            "--load_best_model_at_end", "false", "--logging_steps", "4", "--disable_tqdm", "true",
            "--seed", "7", *RUNS[run]]  # fmt: skip


def weights(folder: Path) -> dict[str, torch.Tensor]:
    out = dict(load_file(str(folder / "model.safetensors")))
    head = folder / "simcse_head.safetensors"
    if head.is_file():
        out.update({f"head.{k}": v for k, v in load_file(str(head)).items()})
    return out


def hub_weights(files: dict[str, bytes]) -> dict[str, torch.Tensor]:
    """The same from a repo of the stand-in Hub (path -> content)."""
    if "model.safetensors" not in files:
        return {}
    out = dict(safetensors_load(files["model.safetensors"]))
    if "simcse_head.safetensors" in files:
        out.update({f"head.{k}": v for k, v in safetensors_load(files["simcse_head.safetensors"]).items()})
    return out


def push_args(repo: str) -> list[str]:
    return ["--push_to_hub", "true", "--hub_model_id", repo, "--hub_strategy", "every_save"]


def hub_env(server, home: Path) -> dict[str, str]:
    env = {k: v for k, v in ENV.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    return {**env, "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": server.url, "HF_TOKEN": server.token, "HF_HOME": str(home)}


def preuploads(server, repo: str) -> int:
    with server._lock:
        return sum(m == "POST" and p.startswith(f"/api/models/{repo}/preupload/") for m, p in server.requests)


def _in_window(moment: str, out: Path, target: str) -> bool:
    if moment == "first":
        return (out / target).is_dir() and not (out / target / CHECKPOINT_MANIFEST).exists()
    if moment == "checkpoint":
        return (out / target).is_dir() and not (out / target / "trainer_state.json").exists()
    if moment == "commit":
        return (out / target / "trainer_state.json").exists() and not (out / target / CHECKPOINT_MANIFEST).exists()
    return (out / "model.safetensors").exists() and not (out / "simcse_config.json").exists()


def killed_run(moment: str, out: Path, extra: list[str], seconds: float, rng: random.Random, env: dict | None = None,
               hub: tuple | None = None, run: str = "plain") -> dict:
    """Start the run and SIGKILL it at `moment`; -> what happened. `hub`: (server, repo) for the push moment."""
    target = f"checkpoint-{rng.choice(range(4, 25, 4))}"  # which checkpoint's writing a "checkpoint" kill hits
    if moment == "first":
        target = "checkpoint-4"
    if moment == "push":
        target = f"push-{rng.randint(1, 7)}"
    proc = subprocess.Popen(command(out, run) + extra, cwd=ROOT, env=env or ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    start, deadline = time.perf_counter(), time.perf_counter() + (rng.uniform(0.5, seconds) if moment == "random"
                                                                    else 600)  # fmt: skip
    hit = False
    while proc.poll() is None and time.perf_counter() < deadline:
        if moment == "push" and hub and preuploads(*hub) >= int(target.split("-")[1]):
            hit = True
            break
        if moment in ("checkpoint", "commit", "first", "final") and _in_window(moment, out, target):
            hit = True
            break
        time.sleep(0.002)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        hit = hit or moment == "random"
    return {"killed": hit and proc.returncode == -signal.SIGKILL,
            "target": target if moment in ("checkpoint", "commit", "first", "push") else None,
            "after_s": round(time.perf_counter() - start, 2)}


def checkpoint_snapshot(out: Path) -> dict[str, bool]:
    """Each checkpoint folder left by the kill -> whether it is whole, taken before the resume runs (the resumed
    run's save_total_limit rotation deletes old checkpoints, the one it resumed from among them)."""
    return {p.name: checkpoint_problem(str(p)) is None for p in sorted(out.glob("checkpoint-*")) if p.is_dir()}


def resume(out: Path, extra: list[str] | None = None, env: dict | None = None, run: str = "plain") -> dict:
    run_id = read_run_id(str(out))
    newest = last_complete_checkpoint(str(out), run_id) if run_id else None
    before = checkpoint_snapshot(out)
    again = ["--resume_from_checkpoint", "true"]  # always, as a restart script would
    result = subprocess.run(command(out, run) + (extra or []) + again, cwd=ROOT, env=env or ENV, capture_output=True,
                            text=True, timeout=600)  # fmt: skip
    chosen = re.search(r"resuming from (\S+)", result.stdout + result.stderr)
    chosen = chosen.group(1) if chosen else None
    return {
        "returncode": result.returncode,
        "resumed_from": os.path.basename(chosen) if chosen else None,
        "chosen_was_newest_complete": (os.path.basename(chosen) if chosen else None)
        == (os.path.basename(newest) if newest else None),
        "chosen_complete": chosen is None or before.get(os.path.basename(chosen)) is True,
        "checkpoints_after_kill": before,
        "started_again": "starting it again from step 0" in result.stdout + result.stderr
        or "starting it at step 0" in result.stdout + result.stderr,
        "tail": "" if result.returncode == 0 else (result.stdout + result.stderr)[-2000:].replace(str(out), "<out>"),
    }


def two_writers(out: Path, seconds: float, second: str, rng: random.Random, run: str = "plain") -> dict:
    """The run, and after a delay a second process on the same folder (`second`: "other seed" or "resume"); both to
    their end. -> what each did: `overlapped` when one of them was refused by the other's lock (they met), else the
    second came after the first had ended and must be what a later command on a finished folder is (another seed:
    refused, the folder holds the earlier run's checkpoints; a resume: finishes without a step)."""
    extra = OTHER_SEED if second == "other seed" else ["--resume_from_checkpoint", "true"]
    first = subprocess.Popen(
        command(out, run), cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    delay = rng.choice([0.0, rng.uniform(0.0, 0.3 * seconds)])  # at once (a race for the lock), or while it trains
    time.sleep(delay)
    later = subprocess.run(command(out, run) + extra, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    first_err = first.communicate(timeout=600)[1]
    codes = (first.returncode, later.returncode)
    errors = [[line for line in err.splitlines() if line.startswith("error:")] for err in (first_err, later.stderr)]
    locked = [len(lines) == 1 and "is in use by another run (pid " in lines[0] for lines in errors]
    overlapped = any(locked)
    if overlapped:
        ended_well = sorted(codes) == [0, 2] and locked[codes.index(2)]
    else:  # one after the other: the second on a finished folder
        ended_well = codes == ((0, 2) if second == "other seed" else (0, 0)) and all(len(e) <= 1 for e in errors)
    return {
        "second": second,
        "delay_s": round(delay, 2),
        "returncodes": list(codes),
        "overlapped": overlapped,
        "ended_well": ended_well,
        "refusal": next((lines[0].replace(str(out), "<out>") for lines in errors if lines), ""),
        "finisher_seed": 43 if codes == (2, 0) and second == "other seed" else 7,
    }


def writers_trial(out: Path, seconds: float, second: str, rng: random.Random, references: dict) -> dict:
    """A "writers" trial of the plain run: two_writers, then the folder's final weights against the finisher's."""
    trial = {"run": "plain", "moment": "writers", **two_writers(out, seconds, second, rng)}
    reference = references["plain 43"] if trial["finisher_seed"] == 43 else references["plain"]
    got = weights(out) if (out / "simcse_config.json").exists() else {}
    trial["final_equal"] = got.keys() == reference.keys() and all(torch.equal(got[k], reference[k]) for k in reference)
    landed = trial["overlapped"]
    no_resume = {"resumed_from": None, "chosen_complete": True, "chosen_was_newest_complete": True}
    return {**trial, "killed": landed, "target": None, "after_s": trial["delay_s"], **no_resume}


def kinds(args) -> list[tuple[str, str]]:
    """(run, moment) of each trial of a round: push and writers with the plain run only."""
    every = [(run, moment) for run in args.runs for moment in args.moments]
    return [(run, moment) for run, moment in every if run == "plain" or moment not in PLAIN_ONLY]


def _hub_column(trial: dict) -> str:
    return f"{trial['hub_commits']} ({trial['hub_partial_commits']})" if "hub_commits" in trial else ""


def _kind(trial: dict) -> str:
    return f"{trial.get('run', 'plain')} {trial['moment']}"


def failed(trial: dict) -> bool:
    """A trial whose run did not end as it should (see the module docstring)."""
    resumed = trial["final_equal"] and trial["chosen_complete"] and trial["chosen_was_newest_complete"]
    hub = trial.get("hub_equal", True) and trial.get("hub_last_is_final", True)
    writers = trial.get("ended_well", True)
    finished = trial.get("returncode", 0) == 0
    return not (resumed and hub and not trial.get("hub_partial_commits", 0) and writers and finished)


def write_results(args, env: dict, seconds: float, trials: list[dict]) -> tuple[dict, list[dict]]:
    """bench/results/<name>.{json,md} from the trials so far (rewritten after each trial)."""
    names = [f"{run} {moment}" for run, moment in kinds(args)]
    per = {k: {"trials": sum(_kind(t) == k for t in trials), "kills": sum(_kind(t) == k and t["killed"]
               for t in trials), "equal": sum(_kind(t) == k and t["final_equal"] for t in trials)}
           for k in names}  # fmt: skip
    bad = [t for t in trials if failed(t)]
    data = {"environment": env, "reference_seconds": round(seconds, 1), "per_moment": per, "failures": len(bad),
            "kills": sum(t["killed"] for t in trials), "load_average_now": load_average(), "trials": trials,
            "trials_per_moment": args.trials, "command": "python -m bench.fault_injection " + " ".join(sys.argv[1:])}
    write_report(RESULTS / args.name, data, markdown)
    return per, bad


def _writers_and_first(trials: list[dict]) -> list[str]:
    """What a landed kill means for the moments of two writers and of the first save, where the record has them."""
    first = [t for t in trials if t["moment"] == "first"]
    if not first and not any(t["moment"] == "writers" for t in trials):
        return []
    started_again = sum(t.get("started_again", False) for t in first)
    return [
        "For `writers` a kill landed means: the two processes met (one was refused in one line naming the other, "
        "which finished); a second that came after the first had ended must be refused (another seed) or finish "
        "without a step (a resume). For `first`, the resume started the run again from step 0 (no checkpoint was "
        f"whole): {started_again} of {len(first)} did.",
        "",
    ]


def markdown(data: dict) -> str:
    """bench/results/<name>.md from its record."""
    env, per, trials = data["environment"], data["per_moment"], data["trials"]
    planned = data.get("trials_per_moment", max((v["trials"] for v in per.values()), default=0))
    command = data.get("command", f"python -m bench.fault_injection --trials {planned}")  # older records: no command
    lines = ["# Fault injection: SIGKILL, resume, compare with the uninterrupted run", "",
             f"`{command}` (see the module docstring); "
             f"{len(trials)} of {len(per) * planned} trials done when this was written.",
             environment_line(env), "",
             f"**{data['kills']} kills landed, {data['failures']} trials failed** (final weights not bit-equal to the "
             "uninterrupted run's, a resume chose a checkpoint that was not the newest whole one, or, for push, "
             "the stand-in Hub's model differs from the uninterrupted run's, its last commit is not the final "
             "folder's, or a stored commit lacks part of a model).", "",
             *_writers_and_first(trials),
             "| run, moment | trials | kills landed | final weights equal |", "|---|---|---|---|",
             *[f"| {m} | {v['trials']} | {v['kills']} | {v['equal']} |" for m, v in per.items()], "",
             "| run, moment | target | killed after s | killed | resumed from | chosen whole | final equal "
             "| Hub equal | Hub commits (partial) |", "|---|---|---|---|---|---|---|---|---|",
             *[f"| {_kind(t)} | {t['target'] or ''} | {t['after_s']} | {t['killed']} | {t['resumed_from']} | "
               f"{t['chosen_complete']} | {t['final_equal']} | {t.get('hub_equal', '')} | "
               f"{_hub_column(t)} |"
               for t in trials]]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10, help="per moment")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="fault_injection")
    parser.add_argument("--moments", nargs="+", choices=MOMENTS, default=list(MOMENTS))
    parser.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS), help="push, writers: plain only")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="fault_injection_"))
    env = environment()
    references, seconds = {}, 0.0
    for run in args.runs:  # the uninterrupted runs
        start = time.perf_counter()
        subprocess.run(command(work / f"reference-{run}", run), cwd=ROOT, env=ENV, check=True, capture_output=True)
        seconds = max(seconds, time.perf_counter() - start)
        references[run] = weights(work / f"reference-{run}")
    if "writers" in args.moments:  # the second writer's own run, for when it is the one that finishes
        second = command(work / "reference-43", "plain") + OTHER_SEED
        subprocess.run(second, cwd=ROOT, env=ENV, check=True, capture_output=True)
        references["plain 43"] = weights(work / "reference-43")
    trials: list[dict] = []
    from simcse_hn.testing.hub_server import HubStandIn

    with HubStandIn(max_requests=10**9) as server:
        for i in range(args.trials):
            # in turn, so that results written so far cover every run and moment
            for run, moment in kinds(args):
                out, reference = work / f"{run}-{moment}{i}", references[run]
                if moment == "writers":
                    trials.append(writers_trial(out, seconds, SECONDS[i % 2], rng, references))
                    print(json.dumps(trials[-1]), flush=True)
                    shutil.rmtree(out, ignore_errors=True)
                    per, bad = write_results(args, env, seconds, trials)
                    continue
                repo = f"{server.user}/fault-{i}"
                extra = push_args(repo) if moment == "push" else []
                run_env = hub_env(server, work / "hf_home") if moment == "push" else ENV
                kill = killed_run(moment, out, extra, seconds, rng, run_env, (server, repo), run)
                if not (out / "simcse_config.json").exists() or kill["killed"]:
                    finish = resume(out, extra, run_env, run)
                else:
                    finish = {"returncode": 0, "resumed_from": None, "chosen_was_newest_complete": True,
                              "chosen_complete": True, "checkpoints_after_kill": {}, "tail": ""}  # fmt: skip
                got = weights(out) if (out / "simcse_config.json").exists() else {}
                same = got.keys() == reference.keys() and all(torch.equal(got[k], reference[k]) for k in reference)
                trial = {"run": run, "moment": moment, **kill, **finish, "final_equal": same}
                if moment == "push":
                    with server._lock:
                        files = dict(server.repos.get(repo, {}))
                        commits = [c for c in server.commits if c["repo"] == repo]
                    pushed = hub_weights(files)
                    trial["hub_equal"] = pushed.keys() == reference.keys() and all(
                        torch.equal(pushed[k], reference[k]) for k in reference
                    )
                    trial["hub_commits"] = len(commits)
                    # the repo as each commit left it: a commit holds the files that changed (the hub client drops
                    # unchanged ones, so a checkpoint's push is its weights alone), the tree is every commit so far
                    tree: set[str] = set()
                    partial = 0
                    for c in commits:
                        tree |= set(c["paths"])
                        partial += not WHOLE_MODEL <= tree
                    trial["hub_partial_commits"] = partial
                    trial["hub_commit_paths"] = [sorted(c["paths"]) for c in commits]
                    trial["hub_last_is_final"] = bool(commits) and commits[-1]["summary"] == FINAL_SUMMARY
                trials.append(trial)
                print(json.dumps({k: v for k, v in trials[-1].items() if k != "tail"}), flush=True)
                shutil.rmtree(out, ignore_errors=True)
                per, bad = write_results(args, env, seconds, trials)
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"per_moment": per, "failures": len(bad)}))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
