"""Where a training step's time goes: collator, encoder forward, loss, backward, gradient clipping, optimizer, and
what runs between steps; then the operators inside the step (torch.profiler), split into matrix products and the
rest, and the allocator's share.

One process, train.py's `run()` (SimCSE's unsupervised recipe: pooler `cls` with the MLP head, InfoNCE, symmetric
form, batch 64, max length 32, AdamW), on all-MiniLM-L6-v2 by default, 1 torch thread (as bench/train_throughput.py
section 2). Phases are wall-clock intervals around the Trainer's own calls, means over the steps after the warm-up:
* collate: the data collator (the loader calls it one batch ahead, in this process: num_workers 0);
* forward: the encoder's forward inside compute_loss (a forward pre-hook and hook on the model);
* loss: the rest of compute_loss (the contrastive loss, its metrics and diagnostics);
* backward: `accelerator.backward`;
* clip + optimizer + scheduler + zero_grad: from the end of the backward to the step's end callback, with the
  optimizer step itself apart (on_pre_optimizer_step to on_optimizer_step);
* between steps: the rest of the step's wall time (the Trainer's loop, callbacks, logging, the loader's Python).
Then torch.profiler over `--profile_steps` steps: self CPU time per operator, the matrix products (mm, addmm, bmm,
linear's kernels, the attention kernel) against everything else, and the allocator's calls (empty/resize).

    python -m bench.step_profile            # results: bench/results/step_profile.{json,md}
    python -m bench.step_profile --quick    # a tiny encoder, a smoke run (step_profile_quick)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import (
    RESULTS,
    environment,
    environment_line,
    trainer_module,
    training_bench_inputs,
    write_report,
)
from simcse_hn.losses.registry import BASELINE

PHASES = ("collate", "forward", "loss", "backward", "clip_and_zero_grad", "optimizer", "between_steps")
ATTENTION = "aten::_scaled_dot_product_flash_attention_for_cpu"
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", ATTENTION, ATTENTION + "_backward")
ALLOCATOR_OPS = ("aten::empty", "aten::empty_strided", "aten::empty_like", "aten::resize_", "aten::zeros",
                 "aten::zeros_like", "aten::zero_", "aten::fill_")  # fmt: skip


def run(model: str, corpus: Path, steps: int, warmup: int, profile_steps: int, threads: int) -> dict:
    import torch
    from transformers import TrainerCallback

    from simcse_hn.cli import train

    torch.set_num_threads(threads)
    marks: dict[str, list[float]] = {name: [] for name in PHASES}
    step_ends: list[float] = []
    state = {"step": 0, "backward_end": None, "opt_start": None}
    profiler_box: dict = {}

    def counted() -> bool:  # the phases of timed steps only
        return warmup <= state["step"] < steps - profile_steps

    class Phases(TrainerCallback):
        def on_pre_optimizer_step(self, args, trainer_state, control, **kwargs):
            state["opt_start"] = time.perf_counter()

        def on_optimizer_step(self, args, trainer_state, control, **kwargs):
            if counted():
                marks["optimizer"].append(time.perf_counter() - state["opt_start"])

        def on_step_end(self, args, trainer_state, control, **kwargs):
            now = time.perf_counter()
            if counted():
                optimizer = marks["optimizer"][-1]
                marks["clip_and_zero_grad"].append(now - state["backward_end"] - optimizer)
            step_ends.append(now)
            state["step"] += 1
            if state["step"] == steps - profile_steps:
                profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                profiler.__enter__()
                profiler_box["profiler"] = profiler
            if state["step"] == steps and "profiler" in profiler_box:
                profiler_box["profiler"].__exit__(None, None, None)

    builder = trainer_module()
    base = builder.SimCSETrainer

    class Timed(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback(Phases())
            collate = self.data_collator

            def timed_collate(features):
                start = time.perf_counter()
                out = collate(features)
                # the loader collates one batch ahead: this batch belongs to the step after the one running
                if warmup <= state["step"] + 1 < steps - profile_steps and len(marks["collate"]) < steps:
                    marks["collate"].append(time.perf_counter() - start)
                return out

            self.data_collator = timed_collate
            forward = {}
            self.model.register_forward_pre_hook(lambda module, args: forward.update(start=time.perf_counter()))
            self.model.register_forward_hook(lambda module, args, out: forward.update(end=time.perf_counter()))
            self._forward = forward
            backward = self.accelerator.backward

            def timed_backward(loss, **kwargs):
                start = time.perf_counter()
                backward(loss, **kwargs)
                state["backward_end"] = time.perf_counter()
                if counted():
                    marks["backward"].append(state["backward_end"] - start)

            self.accelerator.backward = timed_backward

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            start = time.perf_counter()
            out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            if model.training and counted():
                forward = self._forward["end"] - self._forward["start"]
                marks["forward"].append(forward)
                marks["loss"].append(time.perf_counter() - start - forward)
            return out

    with tempfile.TemporaryDirectory() as output_dir:
        argv = ["--model_name_or_path", model, "--train_file", str(corpus), "--max_seq_length", "32",
                "--per_device_train_batch_size", "64", "--max_steps", str(steps), "--temperature", "0.05",
                "--learning_rate", "3e-5", "--seed", "42", "--output_dir", output_dir, "--logging_steps", "1000",
                "--report_to", "none", "--disable_tqdm", "true", "--pooler", "cls", "--loss", BASELINE,
                "--contrast_form", "symmetric"]  # fmt: skip
        builder.SimCSETrainer = Timed  # run() builds the trainer from there
        try:
            train.run(argv)
        finally:
            builder.SimCSETrainer = base

    step_times = [b - a for a, b in zip(step_ends[warmup - 1 :], step_ends[warmup:])][: steps - warmup - profile_steps]
    # means, which add up (medians of the phases need not sum to the median step)
    phases = {name: statistics.mean(values) for name, values in marks.items() if values and name != "between_steps"}
    step = statistics.mean(step_times)
    phases["between_steps"] = step - sum(phases.values())
    out = {"mean_step_s": step, "median_step_s": statistics.median(step_times), "step_seconds": step_times,
           "phases_s": phases,
           "phase_samples": {k: len(v) for k, v in marks.items()}}  # fmt: skip
    if "profiler" in profiler_box:
        out["profile"] = operator_table(profiler_box["profiler"], profile_steps)
    return out


def operator_table(profiler, steps: int, rows: int = 20) -> dict:
    events = profiler.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    table = sorted(events, key=lambda e: -e.self_cpu_time_total)
    matmul = sum(e.self_cpu_time_total for e in events if e.key in MATMUL_OPS)
    allocator = sum(e.self_cpu_time_total for e in events if e.key in ALLOCATOR_OPS)
    return {
        "steps": steps,
        "self_cpu_ms_per_step": total / 1000 / steps,
        "matmul_share": matmul / total,
        "allocator_share": allocator / total,
        "top": [{"op": e.key, "calls_per_step": e.count / steps, "ms_per_step": e.self_cpu_time_total / 1000 / steps,
                 "share": e.self_cpu_time_total / total} for e in table[:rows]],  # fmt: skip
    }


def markdown(report: dict) -> str:
    r = report["result"]
    step = r["mean_step_s"]
    lines = ["# Where a training step's time goes", "", environment_line(report["environment"]), "",
             f"Model {report['model_label']}, pooler cls + MLP head, InfoNCE (symmetric form), batch 64 sentences "
             f"(128 rows), max length 32, AdamW, {report['threads']} torch thread(s); {report['steps']} steps, "
             f"{report['warmup']} warm-up, the last {report['profile_steps']} under torch.profiler (not in the "
             "phases). Means over the timed steps (they add up).", "",
             f"Mean step: **{step:.3f} s** (median {r['median_step_s']:.3f} s).", "",
             "| phase | mean s | share of the step |", "|---|---|---|"]  # fmt: skip
    for name in PHASES:
        if name in r["phases_s"]:
            seconds = r["phases_s"][name]
            lines.append(f"| {name} | {seconds:.4f} | {seconds / step:.1%} |")
    if "profile" in r:
        p = r["profile"]
        lines += ["", f"## Operators (torch.profiler, self CPU time, {p['steps']} steps, the profiler's own overhead "
                  f"included: {p['self_cpu_ms_per_step']:.0f} ms per step)", "",
                  f"Matrix products and the attention kernel: **{p['matmul_share']:.1%}** of the self CPU time; "
                  f"everything else (element-wise kernels: GELU, layer norm, softmax, dropout, the optimizer's "
                  f"updates, copies): {1 - p['matmul_share']:.1%}; the allocator's calls: {p['allocator_share']:.1%}.",
                  "", "| op | calls per step | ms per step | share |", "|---|---|---|---|"]  # fmt: skip
        for e in p["top"]:
            lines.append(f"| {e['op']} | {e['calls_per_step']:.0f} | {e['ms_per_step']:.1f} | {e['share']:.1%} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny encoder, a smoke run")
    parser.add_argument("--model", default=None, help="default all-MiniLM-L6-v2 (the bench extra)")
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile_steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    corpus, model, label = training_bench_inputs(args.quick, args.model)
    if args.quick:
        args.steps, args.warmup, args.profile_steps = 8, 2, 2
    if args.steps - args.warmup - args.profile_steps < 2:
        parser.error("--steps must leave at least 2 timed steps after --warmup and --profile_steps")
    report = {"environment": environment(), "model_label": label, "steps": args.steps, "warmup": args.warmup,
              "profile_steps": args.profile_steps, "threads": args.threads}  # fmt: skip
    start = time.time()
    report["result"] = run(str(model), corpus, args.steps, args.warmup, args.profile_steps, args.threads)
    report["seconds"] = round(time.time() - start)
    name = "step_profile_quick" if args.quick else "step_profile"
    write_report(RESULTS / name, report, markdown, echo=True)


if __name__ == "__main__":
    main()
