"""How long a command takes to answer --help, a bad flag or a missing file: whole processes, as a user waits for them,
in another checkout (before: --before, e.g. the main branch's worktree) and in this one (after), taking turns.

Each case is one command line of train.py or eval/sts.py run from its checkout's root with that checkout's simcse_hn
(PYTHONPATH), offline (HF_HUB_OFFLINE); the wall time is the child's, from its start to its exit, read with
time.perf_counter around subprocess.run; each round runs every case before, then after. The record keeps each
case's answer (exit code, the last line of its output, --help's line count) beside the times, so that a faster
answer that said something else is seen.

    python -m bench.answer_time --before ../main --rounds 5

Writes bench/results/answer_time.{json,md} (--name to change the stem).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import (
    RESULTS,
    ROOT,
    cpu_counters,
    environment,
    environment_line,
    load_average,
    steal_percent,
    write_report,
)

CORPUS = "tests/fixtures/tiny_corpus.txt"
CASES = {
    "train.py --help": ["train.py", "--help"],
    "train.py --bogus 1": ["train.py", "--bogus", "1"],
    "train.py --train_file missing.txt": ["train.py", "--train_file", "missing.txt"],
    "train.py --model_name_or_path ./missing": [
        "train.py",
        "--train_file",
        CORPUS,
        "--model_name_or_path",
        "./missing",
    ],
    "eval/sts.py --help": ["eval/sts.py", "--help"],
    "eval/sts.py --model m --bogus": ["eval/sts.py", "--model", "m", "--bogus"],
    "eval/sts.py --model ./missing": ["eval/sts.py", "--model", "./missing"],
}


def commit(checkout: Path) -> str:
    found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True)
    return found.stdout.strip() or "unknown"


def answer(checkout: Path, argv: list[str]) -> dict:
    """One whole process: its wall seconds, exit code, the last line it printed and how many lines."""
    env = {
        **os.environ,
        "PYTHONPATH": str(checkout),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "COLUMNS": "100",
    }
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *argv], cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    lines = (done.stdout + done.stderr).strip().splitlines()
    return {
        "seconds": round(seconds, 3),
        "code": done.returncode,
        "last": lines[-1][:200] if lines else "",
        "lines": len(lines),
    }


def measure(before: Path, rounds: int) -> dict:
    runs: dict[str, dict[str, list[dict]]] = {case: {"before": [], "after": []} for case in CASES}
    for _ in range(rounds):
        for case, argv in CASES.items():
            runs[case]["before"].append(answer(before, argv))
            runs[case]["after"].append(answer(ROOT, argv))
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the checkout to compare with (its root)")
    parser.add_argument("--rounds", type=int, default=5, help="runs of each case in each checkout")
    parser.add_argument("--name", default="answer_time", help="the results' stem in bench/results/")
    args = parser.parse_args(argv)
    env, load, counters = environment(), load_average(), cpu_counters()
    started = time.perf_counter()
    runs = measure(args.before.resolve(), args.rounds)
    record = {
        "bench": "answer_time",
        "environment": env,
        "before_commit": commit(args.before),
        "after_commit": env["commit"],
        "rounds": args.rounds,
        "cases": {case: CASES[case] for case in CASES},
        "runs": runs,
        "seconds": round(time.perf_counter() - started, 1),
        "load_start": load,
        "load_end": load_average(),
        "steal_percent": steal_percent(counters),
    }
    write_report(RESULTS / args.name, record, markdown, echo=True)
    return 0


def median(runs: list[dict]) -> float:
    return statistics.median(run["seconds"] for run in runs)


def markdown(record: dict) -> str:
    lines = [
        "# Answer times: --help, a bad flag, a missing file",
        "",
        "`python -m bench.answer_time --before ../main`: each command line as a whole process (start to exit, "
        "wall seconds), in the checkout before (commit "
        f"{record['before_commit']}) and after (commit {record['after_commit']}), taking turns, "
        f"{record['rounds']} runs each; offline.",
        environment_line(record["environment"], load=False),
        "",
        f"1-minute load {record['load_start']} at the start and {record['load_end']} at the end, CPU steal over the "
        f"run {record['steal_percent']} %; {record['seconds']} s in all.",
        "",
        "| command line | before: median s (min-max) | after: median s (min-max) | before / after | before's answer "
        "| after's answer |",
        "|---|---|---|---|---|---|",
    ]
    for case, runs in record["runs"].items():
        cells = []
        for side in ("before", "after"):
            seconds = [run["seconds"] for run in runs[side]]
            cells.append(f"{median(runs[side]):.2f} ({min(seconds):.2f}-{max(seconds):.2f})")
        ratio = median(runs["before"]) / median(runs["after"])
        answers = []
        for side in ("before", "after"):
            first = runs[side][0]
            said = f"{first['lines']} lines" if first["code"] == 0 else f"`{first['last']}`".replace("|", "\\|")
            answers.append(f"exit {first['code']}: {said}")
        lines.append(f"| `{case}` | {cells[0]} | {cells[1]} | {ratio:.1f}x | {answers[0]} | {answers[1]} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
