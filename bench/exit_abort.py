"""Two-process CPU launches in a row, counting how each ends: the exit code of the launch, and whether any process
printed C++'s `terminate called without an active exception` (the abort at exit of issue 39).

Each launch is train.py under `accelerate launch --config_file configs/accelerate/<engine>.yaml --num_processes 2`
(through scripts/sharded_cpu.py, run as a program, which lets accelerate take its FSDP / DeepSpeed paths
on a machine without GPUs) on configs/debug_tiny.yaml: 4 steps, checkpoints and STS-B dev evaluation at 2 and 4, the
best model loaded back and saved, the card written. The engines take turns (fsdp, zero2, zero3, fsdp, ...).

    python -m bench.exit_abort --launches 40
    python -m bench.exit_abort --launches 20 --keep_cores   # a core file of each abort, for gdb

Writes bench/results/exit_abort.{json,md} (--name to change the stem).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import (
    RESULTS,
    ROOT,
    environment,
    environment_line,
    load_average,
    steal_percent,
    write_report,
)

ABORT = "terminate called without an active exception"
CONFIGS = {"fsdp": "fsdp.yaml", "zero2": "deepspeed_zero2.yaml", "zero3": "deepspeed_zero3.yaml"}
FIXTURES = ROOT / "tests" / "fixtures"


def launch_command(engine: str, output_dir: Path) -> list[str]:
    config = ROOT / "configs" / "accelerate" / CONFIGS[engine]
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), "--num_processes", "2",
            "--mixed_precision", "no", str(ROOT / "scripts" / "sharded_cpu.py"),
            "--config", str(ROOT / "configs" / "debug_tiny.yaml"), "--train_file", str(FIXTURES / "tiny_corpus.txt"),
            "--eval_file", str(FIXTURES / "sts_tiny.jsonl"), "--output_dir", str(output_dir), "--max_steps", "4",
            "--eval_steps", "2", "--save_steps", "2", "--disable_tqdm", "true", "--pooler", "avg"]  # fmt: skip


def one_launch(engine: str, work: Path, keep_cores: bool) -> dict:
    """One launch in its own folder (a process's core file, where the machine writes one, lands there)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}  # fmt: skip
    load = load_average()
    start = time.perf_counter()
    result = subprocess.run(launch_command(engine, work / "out"), cwd=work, env=env, capture_output=True, text=True,
                            timeout=900)  # fmt: skip
    seconds = time.perf_counter() - start
    text = result.stdout + result.stderr
    saved = (work / "out" / "model.safetensors").is_file() and (work / "out" / "README.md").is_file()
    record = {
        "engine": engine,
        "returncode": result.returncode,
        "aborts": text.count(ABORT),
        "saved": saved,
        "seconds": round(seconds, 1),
        "load_average_before": load[:1],
        "cores": sorted(p.name for p in work.glob("core*")),
    }
    if result.returncode != 0:  # no path of this machine in a results record
        record["tail"] = text[-4000:].replace(str(work), "<launch>").replace(str(ROOT), ".")
    if not (keep_cores and record["cores"]) and result.returncode == 0:
        shutil.rmtree(work, ignore_errors=True)
    return record


def summary(launches: list[dict]) -> dict:
    engines = sorted({r["engine"] for r in launches})
    per_engine = {e: {"launches": sum(r["engine"] == e for r in launches),
                      "failed": sum(r["engine"] == e and r["returncode"] != 0 for r in launches),
                      "aborts": sum(r["aborts"] for r in launches if r["engine"] == e)} for e in engines}  # fmt: skip
    codes: dict[str, int] = {}
    for r in launches:
        codes[str(r["returncode"])] = codes.get(str(r["returncode"]), 0) + 1
    return {
        "launches": len(launches),
        "exit_codes": codes,
        "failed_launches": sum(r["returncode"] != 0 for r in launches),
        "launches_with_abort": sum(r["aborts"] > 0 for r in launches),
        "all_saved": all(r["saved"] for r in launches),
        "per_engine": per_engine,
        "wall_seconds": round(sum(r["seconds"] for r in launches), 1),
    }


def markdown(data: dict) -> str:
    s = summary(data["launches"])
    lines = [
        "# Two-process CPU launches in a row: how each ends",
        "",
        f"`python -m bench.exit_abort --launches {s['launches']}`: train.py on configs/debug_tiny.yaml (4 steps, "
        "checkpoints and dev evaluation at 2 and 4, best model saved) under `accelerate launch --num_processes 2` "
        "with configs/accelerate/{fsdp,deepspeed_zero2,deepspeed_zero3}.yaml in turn, gloo on the CPU. "
        f"An abort is a process printing `{ABORT}`.",
        environment_line(data["environment"]),
        "",
        f"**{s['launches']} launches, {s['failed_launches']} failed, {s['launches_with_abort']} with the abort**; "
        f"exit codes {s['exit_codes']}; every folder saved: {s['all_saved']}; {s['wall_seconds']} s of launches, "
        f"1-minute load {data['load_average_start'][:1]} at the start and {data['load_average_end'][:1]} at the end, "
        f"CPU steal over the run {data.get('cpu_steal_percent')} %.",
        "",
        "| engine | launches | failed | aborts |",
        "|---|---|---|---|",
        *[f"| {e} | {v['launches']} | {v['failed']} | {v['aborts']} |" for e, v in s["per_engine"].items()],
        "",
        "| # | engine | exit code | aborts | saved | s | load before |",
        "|---|---|---|---|---|---|---|",
        *[f"| {i} | {r['engine']} | {r['returncode']} | {r['aborts']} | {r['saved']} | {r['seconds']} | "
          f"{r['load_average_before'][0] if r['load_average_before'] else '?'} |"
          for i, r in enumerate(data["launches"], 1)],  # fmt: skip
    ]
    if data.get("note"):
        lines += ["", data["note"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=int, default=40)
    parser.add_argument("--engines", default="fsdp,zero2,zero3", help="taking turns; zero* need deepspeed")
    parser.add_argument("--keep_cores", action="store_true", help="keep the folder (and core file) of each abort")
    parser.add_argument("--work_dir", default=None, help="default: a temporary folder")
    parser.add_argument("--name", default="exit_abort", help="results file stem under bench/results/")
    parser.add_argument("--note", default="", help="a line for the markdown (e.g. what changed)")
    args = parser.parse_args(argv)
    engines = [e for e in args.engines.split(",") if e == "fsdp" or importlib.util.find_spec("deepspeed")]
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="exit_abort_"))
    env = environment()
    start_counters = env["cpu_counters"]
    data = {"environment": env, "load_average_start": load_average(), "launches": [], "note": args.note}
    for i in range(args.launches):
        record = one_launch(engines[i % len(engines)], work / f"launch{i:03d}", args.keep_cores)
        data["launches"].append(record)
        print(json.dumps({k: v for k, v in record.items() if k != "tail"}), flush=True)
    data["load_average_end"] = load_average()
    data["cpu_steal_percent"] = steal_percent(start_counters)
    data["summary"] = summary(data["launches"])
    write_report(RESULTS / args.name, data, markdown)
    print(json.dumps(data["summary"]))
    return 0 if data["summary"]["failed_launches"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
