"""Kill chains: a run SIGKILLed again and again at random moments, each time restarted as a restart script would
(`--resume_from_checkpoint true` after the first start), until it finishes; its final weights against the
uninterrupted run's. The runs and their command are bench/fault_injection.py's (configs/debug_tiny.yaml, 24 steps, a
checkpoint every 4): plain, queue and topic in turn. Each start is killed at a uniform moment within the uninterrupted
run's wall time, up to `--kills` times; a start that finishes before its moment ends the chain.

    python -m bench.kill_chains --chains 30 --kills 4
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from bench.common import RESULTS, ROOT, environment, environment_line, load_average, write_report
from bench.fault_injection import ENV, RUNS, command, weights


def chain(out: Path, run: str, seconds: float, kills: int, rng: random.Random) -> dict:
    """Start, kill, restart ... until a start finishes; -> the kills that landed and each start's exit code."""
    landed, codes = 0, []
    for start in range(kills + 1):
        again = ["--resume_from_checkpoint", "true"] if start else []
        argv = command(out, run) + again
        proc = subprocess.Popen(argv, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if start < kills:
            try:
                proc.wait(timeout=rng.uniform(0.5, seconds))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
        stderr = proc.communicate(timeout=600)[1]
        codes.append(proc.returncode)
        if proc.returncode == -signal.SIGKILL:
            landed += 1
            continue
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        error = errors[-1].replace(str(out), "<out>") if errors else ""
        return {"run": run, "kills": landed, "returncodes": codes, "error": error}
    raise AssertionError("unreachable: the last start is never killed")


def markdown(data: dict) -> str:
    chains = data["chains"]
    equal = sum(c["final_equal"] for c in chains)
    lines = [
        "# Kill chains: SIGKILL again and again, resume each time, compare with the uninterrupted run",
        "",
        f"`python -m bench.kill_chains --chains {data['planned']} --kills {data['max_kills']}` (see the module "
        f"docstring); {len(chains)} chains done when this was written.",
        environment_line(data["environment"]),
        "",
        f"**{len(chains)} chains, {sum(c['kills'] for c in chains)} kills landed, {equal} of {len(chains)} ended "
        "bit-equal to the uninterrupted run** (every start after the first passes `--resume_from_checkpoint true`).",
        "",
        "| run | chains | kills landed | final weights equal | finished (exit 0) |",
        "|---|---|---|---|---|",
    ]
    for run in RUNS:
        mine = [c for c in chains if c["run"] == run]
        counts = [len(mine), sum(c["kills"] for c in mine), sum(c["final_equal"] for c in mine)]
        counts.append(sum(c["returncodes"][-1] == 0 for c in mine))
        lines.append(f"| {run} | " + " | ".join(map(str, counts)) + " |")
    lines += ["", "| run | kills | exit codes of its starts | final equal | last error |", "|---|---|---|---|---|"]
    lines += [
        f"| {c['run']} | {c['kills']} | {c['returncodes']} | {c['final_equal']} | {c['error']} |" for c in chains
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chains", type=int, default=30)
    parser.add_argument("--kills", type=int, default=4, help="the most kills in one chain")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="kill_chains")
    args = parser.parse_args(argv)
    rng, work = random.Random(args.seed), Path(tempfile.mkdtemp(prefix="kill_chains_"))
    references, seconds = {}, 0.0
    for run in RUNS:
        start = time.perf_counter()
        subprocess.run(command(work / f"reference-{run}", run), cwd=ROOT, env=ENV, check=True, capture_output=True)
        seconds = max(seconds, time.perf_counter() - start)
        references[run] = weights(work / f"reference-{run}")
    data = {"environment": environment(), "planned": args.chains, "max_kills": args.kills, "chains": []}
    for i in range(args.chains):
        run = list(RUNS)[i % len(RUNS)]
        out = work / f"chain-{i}"
        result = chain(out, run, seconds, args.kills, rng)
        got = weights(out) if (out / "simcse_config.json").exists() else {}
        reference = references[run]
        result["final_equal"] = got.keys() == reference.keys() and all(torch.equal(got[k], reference[k]) for k in got)
        data["chains"].append(result)
        data["load_average_now"] = load_average()
        write_report(RESULTS / args.name, data, markdown)
        print(result, flush=True)
    return 0 if all(c["final_equal"] for c in data["chains"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
