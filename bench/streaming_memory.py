"""Peak memory of a short training run as the corpus grows, with and without `--streaming`.

For corpora of 10^4, 10^5 and 10^6 generated lines (random words, ~60 characters a line), each configuration runs
train.py in a fresh process: the tiny built-in BERT (configs/debug_tiny.yaml), 5 steps of 16 sentences, no
evaluation or checkpoints. The peak resident set size of that process is the kernel's (ru_maxrss of os.wait4 for that
child alone). In memory, the corpus is read whole (a Python list, then an Arrow table); streamed, datasets reads it as
the steps need it, through the shuffle buffer (10,000 sentences, the default).

    python -m bench.streaming_memory            # results: bench/results/streaming_memory.{json,md}
    python -m bench.report bench/results/streaming_memory.json   # the Markdown again from the JSON
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import RESULTS, ROOT, environment, environment_line, write_report

SIZES = (10_000, 100_000, 1_000_000)
STEPS = 5


def write_corpus(path: Path, lines: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(5000)]
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(lines):
            f.write(" ".join(rng.choices(words, k=10)).capitalize() + ".\n")


def run(corpus: Path, streaming: bool, out: Path) -> dict:
    """One train.py run in a fresh process -> its peak RSS (MiB), wall time, exit code."""
    command = [sys.executable, "train.py", "--config", "configs/debug_tiny.yaml", "--train_file", str(corpus),
               "--output_dir", str(out), "--max_steps", str(STEPS), "--eval_strategy", "no", "--save_strategy", "no",
               "--load_best_model_at_end", "false", "--disable_tqdm", "true", "--streaming", str(streaming).lower()]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    with open(out.with_suffix(".log"), "w") as log:
        start = time.perf_counter()
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)  # this child's own rusage
        seconds = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({code}); see {out.with_suffix('.log')}")
    return {"peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "seconds": round(seconds, 1)}


def main() -> None:
    results, load = [], {"before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        for lines in SIZES:
            corpus = Path(tmp) / f"corpus_{lines}.txt"
            write_corpus(corpus, lines)
            size = corpus.stat().st_size
            for streaming in (False, True):
                name = f"{lines}_{'stream' if streaming else 'memory'}"
                measured = run(corpus, streaming, Path(tmp) / name)
                results.append({"lines": lines, "file_mib": round(size / 2**20, 1), "streaming": streaming,
                                **measured})  # fmt: skip
                print(results[-1], flush=True)
            corpus.unlink()
    load["after"] = os.getloadavg()
    record = {"settings": {"model": "builtin:tiny-bert", "steps": STEPS, "batch": 16, "shuffle_buffer": 10_000,
                           "sizes": list(SIZES)}, "load_average_1_5_15": load, "results": results,
              **environment()}  # fmt: skip
    write_report(RESULTS / "streaming_memory", record, markdown)


def markdown(record: dict) -> str:
    """bench/results/streaming_memory.md from the measurements."""
    results, load = record["results"], record["load_average_1_5_15"]
    header = ("| lines | file (MiB) | peak RSS in memory (MiB) | peak RSS streamed (MiB) | in memory (s) "
              "| streamed (s) |")
    rows = [header, "|---:|---:|---:|---:|---:|---:|"]
    for lines in record["settings"]["sizes"]:
        found = {r["streaming"]: r for r in results if r["lines"] == lines}
        memory, stream = found[False], found[True]
        rows.append(f"| {lines:,} | {memory['file_mib']} | {memory['peak_rss_mib']} | {stream['peak_rss_mib']} | "
                    f"{memory['seconds']} | {stream['seconds']} |")  # fmt: skip
    before, after = (", ".join(f"{x:.2f}" for x in load[k]) for k in ("before", "after"))
    text = (f"# Peak memory with and without --streaming\n\n{__doc__.split(chr(10) + chr(10))[1]}\n\n"
            + "\n".join(rows) + f"\n\nLoad average (1, 5, 15 min) before: {before}; after: {after} (a shared "
            f"machine). {environment_line(record, load=False)}\n")  # fmt: skip
    return text


if __name__ == "__main__":
    main()
