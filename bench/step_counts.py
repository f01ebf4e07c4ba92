"""What one training step does, counted rather than timed: operator calls, host reads and the Python functions that
run, for this checkout's code and another revision's, on the same model, data and settings.

Counts do not depend on the machine's load, so a change's cost per step can be found while other work runs, where the
step times of bench/train_throughput.py cannot. train.py's `run()` trains `--steps` steps (SimCSE's recipe: `cls`
with the MLP head, InfoNCE, the `--contrast_form` given, batch 64, max length 32, length groups as the CPU default);
steps 3 and 4 are counted, each from the end of the step before it (so the next batch's fetch and collation count,
as in the step times of bench/train_throughput.py):

* operators: every aten call but views, detach and alias (TorchDispatchMode), per step, and by operator;
* host reads: calls that read a tensor's value on the host (`item`, `tolist`, `bool`, `float`, `int`, `equal`,
  `nonzero`, ...; simcse_hn.testing.recorder.SYNCS), per step, by the file and line outside torch that made them (on
  an accelerator each waits for the device);
* Python: cProfile over step 4, the functions of simcse_hn, transformers, accelerate and torch.optim by their own
  calls, and the whole step's Python function calls.

    python -m bench.step_counts --before 918833d            # results: bench/results/step_counts.{json,md}
    python -m bench.step_counts --quick                      # the tiny test encoder, 6 steps
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import importlib
import json
import os
import pstats
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COUNTED_STEPS = (3, 4)  # 1-based optimizer steps: after the first steps' lazy set-up
PROFILED_STEP = 4


def count_steps(model: str, corpus: str, steps: int, form: str, work: str) -> dict:
    """Train with the simcse_hn that `import simcse_hn` finds and count COUNTED_STEPS. -> the counts (JSON-able)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import TrainerCallback

    import simcse_hn.cli.train as train

    # simcse_hn.testing.recorder.SYNCS, written out: the revisions counted beside this one may predate it
    syncs = {
        torch.Tensor.item,
        torch.Tensor.tolist,
        torch.Tensor.cpu,
        torch.Tensor.numpy,
        torch.Tensor.__bool__,
        torch.Tensor.__int__,
        torch.Tensor.__float__,
        torch.Tensor.__index__,
        torch.nonzero,
        torch.Tensor.nonzero,
        torch.masked_select,
        torch.Tensor.masked_select,
        torch.unique,
        torch.equal,
    }

    skipped = {"aten::detach", "aten::alias", "aten::lift_fresh"}
    ops: collections.Counter = collections.Counter()
    reads: collections.Counter = collections.Counter()

    class Operators(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not (func.is_view or func._schema.name in skipped):
                ops[func._schema.name] += 1
            return func(*args, **(kwargs or {}))

    class HostReads(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in syncs:
                reads[_caller()] += 1
            return func(*args, **(kwargs or {}))

    profiler = cProfile.Profile()
    modes: list = []

    class Count(TrainerCallback):
        """Counts from the end of the step before a counted one to the end of the counted one: the Trainer fetches
        (collates) the next batch between the two, as the step times of bench/train_throughput.py see it."""

        def on_step_end(self, args, state, control, **kwargs):
            if modes:  # the end of a counted step
                profiler.disable()
                for mode in reversed(modes):
                    mode.__exit__(None, None, None)
                modes.clear()
            if state.global_step + 1 in COUNTED_STEPS:
                modes[:] = [Operators(), HostReads()]
                for mode in modes:
                    mode.__enter__()
                if state.global_step + 1 == PROFILED_STEP:
                    profiler.enable()

    # the module whose SimCSETrainer run() builds (bench.common.trainer_module, which this subprocess cannot import)
    builder = getattr(importlib.import_module("simcse_hn.cli"), "run_builder", None)
    builder = builder if builder is not None and hasattr(builder, "SimCSETrainer") else train
    base = builder.SimCSETrainer

    class Counted(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback(Count())

    options = {
        "model_name_or_path": model,
        "train_file": corpus,
        "max_seq_length": 32,
        "per_device_train_batch_size": 64,
        "max_steps": steps,
        "temperature": 0.05,
        "learning_rate": 3e-5,
        "seed": 42,
        "output_dir": os.path.join(work, "run"),
        "logging_steps": 1000,
        "report_to": "none",
        "disable_tqdm": "true",
        "pooler": "cls",
        "loss": "infonce",
        "contrast_form": form,
    }
    argv = [item for key, value in options.items() for item in (f"--{key}", str(value))]
    builder.SimCSETrainer = Counted
    try:
        train.run(argv)
    finally:
        builder.SimCSETrainer = base
    stats = pstats.Stats(profiler)
    functions = collections.Counter()
    for (file, _line, name), (_, calls, *_rest) in stats.stats.items():  # type: ignore[attr-defined]
        for package in ("simcse_hn", "transformers", "accelerate", "torch/optim"):
            if f"/{package}/" in file:
                functions[f"{package}: {name}"] += calls
    per_step = len(COUNTED_STEPS)
    return {
        "operators_per_step": sum(ops.values()) / per_step,
        "operators": {k: v / per_step for k, v in ops.most_common()},
        "host_reads_per_step": sum(reads.values()) / per_step,
        "host_reads": {k: v / per_step for k, v in reads.most_common()},
        "python_calls_in_step": stats.total_calls,  # type: ignore[attr-defined]
        "python_functions": dict(functions.most_common(60)),
    }


def _caller() -> str:
    """file:line of the innermost frame outside torch (and this file) that made the call."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "/torch/" not in frame.filename and not frame.filename.endswith("step_counts.py"):
            parts = Path(frame.filename).parts
            if "site-packages" in parts:  # the package's own path: transformers/trainer.py
                tail = "/".join(parts[parts.index("site-packages") + 1 :])
            else:
                tail = "/".join(parts[-2:])
            return f"{tail}:{frame.lineno} {frame.name}"
    return "?"


def counts_at(revision: str, model: str, corpus: str, steps: int, form: str) -> dict:
    """count_steps with another revision's package and train.py (`git archive` into a temporary folder)."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "archive", revision, "simcse_hn", "train.py"], cwd=ROOT, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        env = {**os.environ, "PYTHONPATH": tmp}
        command = [
            sys.executable,
            __file__,
            "--emit",
            "--model",
            model,
            "--corpus",
            corpus,
            "--steps",
            str(steps),
            "--contrast_form",
            form,
        ]
        out = subprocess.run(command, cwd=tmp, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def markdown(record: dict) -> str:
    from bench.common import environment_line

    now, before = record["counts"], record.get("before")
    revision = record.get("before_revision")
    lines = [
        "# What one training step does, counted",
        "",
        environment_line(record["environment"], load=False) + f" Model {record['model']}, batch 64, max length 32, "
        f"`cls` + MLP head, InfoNCE, {record['contrast_form']} form, {record['steps']} steps; steps "
        f"{', '.join(map(str, COUNTED_STEPS))} counted (bench/step_counts.py). Counts, not times: the machine's load "
        "does not change them." + (f" Beside: the code at {revision}." if before else ""),
        "",
        "| per step | " + (f"{revision} | " if before else "") + "this checkout |",
        "|---|" + ("---|" if before else "") + "---|",
    ]
    for key, label in (
        ("operators_per_step", "operators"),
        ("host_reads_per_step", "host reads"),
        ("python_calls_in_step", f"Python function calls (step {PROFILED_STEP})"),
    ):
        lines.append(f"| {label} | " + (f"{before[key]:g} | " if before else "") + f"{now[key]:g} |")
    for key, title in (
        ("host_reads", "Host reads per step, by caller"),
        ("operators", "Operators per step that changed"),
        ("python_functions", f"Python functions called in step {PROFILED_STEP} that changed"),
    ):
        rows = _changed(now[key], before[key] if before else None)
        if rows:
            lines += [
                "",
                f"## {title}",
                "",
                "| | " + (f"{revision} | " if before else "") + "this checkout |",
                "|---|" + ("---|" if before else "") + "---|",
            ]
            lines += [f"| {name} | " + (f"{was:g} | " if before else "") + f"{is_:g} |" for name, was, is_ in rows]
    return "\n".join(lines) + "\n"


def _changed(now: dict, before: dict | None, limit: int = 30) -> list[tuple[str, float, float]]:
    """The entries that differ (all of them without `before`), largest difference first."""
    names = set(now) | set(before or {})
    rows = [(n, (before or {}).get(n, 0), now.get(n, 0)) for n in names]
    if before is not None:
        rows = [r for r in rows if r[1] != r[2]]
    return sorted(rows, key=lambda r: -abs(r[2] - r[1]))[:limit]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=None, help="a git revision whose code is counted beside this checkout's")
    parser.add_argument("--model", default=None, help="default: all-MiniLM-L6-v2 (--quick: the tiny test encoder)")
    parser.add_argument("--corpus", default=None)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--contrast_form", default="symmetric", choices=("simcse", "symmetric"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--name", default=None, help="results file stem (default step_counts)")
    parser.add_argument("--emit", action="store_true", help=argparse.SUPPRESS)  # counts_at's subprocess
    args = parser.parse_args()
    if args.emit:
        with tempfile.TemporaryDirectory() as work:
            print(json.dumps(count_steps(args.model, args.corpus, args.steps, args.contrast_form, work)))
        return
    sys.path.insert(0, str(ROOT))
    from bench.common import RESULTS, environment, training_bench_inputs, write_report

    with tempfile.TemporaryDirectory() as work:
        corpus, model, label = training_bench_inputs(args.quick, args.model)
        corpus = args.corpus or str(corpus)
        record = {
            "environment": environment(),
            "model": label,
            "steps": args.steps,
            "contrast_form": args.contrast_form,
            "counts": count_steps(model, corpus, args.steps, args.contrast_form, work),
        }
        if args.before:
            record["before_revision"] = args.before
            record["before"] = counts_at(args.before, model, corpus, args.steps, args.contrast_form)
    name = args.name or ("step_counts_quick" if args.quick else "step_counts")
    write_report(RESULTS / name, record, markdown, echo=True)


if __name__ == "__main__":
    main()
