"""Training throughput: our trainer (train.py / SimCSETrainer, InfoNCE `simcse` form, temperature 0.05) against
sentence-transformers' SentenceTransformerTrainer + MultipleNegativesRankingLoss(scale=20) on all-MiniLM-L6-v2.

Same model, same data (the shuffled wiki slice), batch 64 sentences, max length 32, AdamW lr 3e-5, seed 42.
sentence-transformers gets the unsupervised SimCSE recipe of its docs: (anchor, positive) = (sentence, same
sentence), two text columns; the two dropout views come from two forward passes of 64 rows (ours: one pass of 128
rows [a, a', b, b', ...]). Each configuration runs in a fresh subprocess (`--worker`): sentences/s over the steps
after the warm-up (step-end timestamps from a TrainerCallback, so data loading and collation count), and peak
memory = the subprocess's ru_maxrss at the end of training (peak resident set of the whole process: Python,
libraries, model, optimizer state, activations). Rounds interleave the configurations (order rotated) and results
are medians, because the machine may be shared.

    python bench/train_throughput.py              # results: bench/results/train_throughput.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, environment, minilm_path, shuffled_corpus, write_json  # noqa: E402

BATCH = 64
MAX_LENGTH = 32
LEARNING_RATE = 3e-5
SEED = 42
# name -> what runs; "ours-avg" pools like the sentence-transformers model (mean), "ours-cls" is SimCSE's recipe
CONFIGS = ("st-mnrl", "ours-avg", "ours-cls")


def timing_callback(marks: list[float]):
    from transformers import TrainerCallback

    class StepTimes(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            marks.append(time.perf_counter())

        def on_train_end(self, args, state, control, **kwargs):
            marks.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux

    return StepTimes()


def run_ours(pooler: str, corpus: Path, steps: int, output_dir: str, marks: list[float]) -> None:
    sys.path.insert(0, str(ROOT))
    import train

    class TimedTrainer(train.SimCSETrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback(timing_callback(marks))

    train.SimCSETrainer = TimedTrainer  # run() looks the class up in its module
    train.run([
        "--model_name_or_path", minilm_path(), "--pooler", pooler, "--train_file", str(corpus),
        "--max_seq_length", str(MAX_LENGTH), "--per_device_train_batch_size", str(BATCH),
        "--max_steps", str(steps), "--loss", "infonce", "--contrast_form", "simcse", "--temperature", "0.05",
        "--learning_rate", str(LEARNING_RATE), "--seed", str(SEED), "--output_dir", output_dir,
        "--logging_steps", "1000", "--report_to", "none", "--disable_tqdm", "true",
    ])


def run_sentence_transformers(corpus: Path, steps: int, output_dir: str, marks: list[float]) -> None:
    import datasets
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
        losses,
    )

    sentences = [s.strip() for s in corpus.read_text(encoding="utf-8").splitlines()]
    sentences = [s for s in sentences if s]  # as our load_sentences
    dataset = datasets.Dataset.from_dict({"anchor": sentences, "positive": sentences})
    model = SentenceTransformer(minilm_path(), device="cpu")
    model.max_seq_length = MAX_LENGTH
    args = SentenceTransformerTrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=BATCH, max_steps=steps, learning_rate=LEARNING_RATE,
        seed=SEED, logging_steps=1000, report_to="none", save_strategy="no", disable_tqdm=True,
        dataloader_drop_last=True, use_cpu=True,
    )
    trainer = SentenceTransformerTrainer(
        model=model, args=args, train_dataset=dataset, loss=losses.MultipleNegativesRankingLoss(model, scale=20.0),
        callbacks=[timing_callback(marks)],
    )
    trainer.train()


def worker(config: str, corpus: Path, steps: int, warmup: int, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    marks: list[float] = []
    with tempfile.TemporaryDirectory() as output_dir:
        start = time.perf_counter()
        if config == "st-mnrl":
            run_sentence_transformers(corpus, steps, output_dir, marks)
        else:
            run_ours(config.removeprefix("ours-"), corpus, steps, output_dir, marks)
        total = time.perf_counter() - start
    step_ends, max_rss_kib = marks[:-1], marks[-1]
    if len(step_ends) != steps:
        raise RuntimeError(f"{config}: {len(step_ends)} step ends recorded, expected {steps}")
    timed = step_ends[warmup - 1:]  # from the end of the last warm-up step to the end of the last step
    step_seconds = [b - a for a, b in zip(timed, timed[1:])]
    seconds = timed[-1] - timed[0]
    return {
        "config": config,
        "sentences_per_s": (steps - warmup) * BATCH / seconds,
        "timed_seconds": seconds,
        "median_step_s": statistics.median(step_seconds),
        "step_seconds": [round(s, 4) for s in step_seconds],
        "max_rss_mib": max_rss_kib / 1024,
        "process_seconds": total,
        "torch_threads": torch.get_num_threads(),
    }


def padded_width_check(corpus: Path, batches: int) -> dict:
    """How often a batch of 64 shuffled sentences reaches the 32-token cap (then both sides pad to exactly 32)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    lines = [s for s in corpus.read_text(encoding="utf-8").splitlines() if s.strip()]
    widths = [min(MAX_LENGTH, max(len(ids) for ids in tokenizer(lines[i * BATCH:(i + 1) * BATCH])["input_ids"]))
              for i in range(batches)]
    return {"batches": batches, "at_cap": sum(w == MAX_LENGTH for w in widths), "min_width": min(widths)}


def markdown(report: dict) -> str:
    env = report["environment"]
    s = report["summary"]
    lines = [
        "# Training throughput: SimCSETrainer vs sentence-transformers (MNRL)",
        "",
        f"Commit {env['commit']}, {env['machine']}, "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items())
        + f", {env['date']}. The machine was shared with other jobs (a background quality study, other engineers' "
        "tests and benchmarks), so absolute numbers are noisy: configurations were interleaved round by round (order "
        "rotated), each run in a fresh subprocess, and medians are reported.",
        "",
        f"all-MiniLM-L6-v2 (CPU, {report['torch_threads']} torch thread(s) in both: with 2 threads on the 2 busy "
        f"cores OpenMP threads wait on each other and steps ran several times slower), batch {BATCH} sentences, "
        f"max length {MAX_LENGTH}, AdamW lr {LEARNING_RATE}, seed {SEED}, {report['steps']} steps of which the first "
        f"{report['warmup']} are warm-up; sentences/s over the remaining {report['steps'] - report['warmup']} steps "
        "(including data loading and tokenisation). Ours: train.py `run()`, loss `infonce`, contrast form `simcse`, "
        "temperature 0.05, one forward of 128 rows. sentence-transformers: SentenceTransformerTrainer + "
        "MultipleNegativesRankingLoss(scale=20), dataset columns (anchor, positive) = (sentence, same sentence), two "
        "forwards of 64 rows; its model pools by mean and normalises, like ours-avg. Peak memory: ru_maxrss of the "
        f"fresh subprocess at the end of training. {report['padding']['at_cap']} of the first "
        f"{report['padding']['batches']} batches reach the 32-token cap, so both sides pad to the same width.",
        "",
        "| configuration | sentences/s (median) | per round | median step s | peak RSS MiB (median) |",
        "|---|---|---|---|---|",
    ]
    for config in CONFIGS:
        runs = [r for r in report["runs"] if r["config"] == config]
        lines.append(
            f"| {config} | {s[config]['sentences_per_s']:.1f} | "
            + ", ".join(f"{r['sentences_per_s']:.1f}" for r in runs)
            + f" | {s[config]['median_step_s']:.3f} | {s[config]['max_rss_mib']:.0f} |"
        )
    lines += ["", "Ratios to sentence-transformers (median of the per-round ratios; throughput target >= 1.0):", ""]
    base = [r for r in report["runs"] if r["config"] == "st-mnrl"]
    for config in CONFIGS[1:]:
        r = s[config]
        runs = [x for x in report["runs"] if x["config"] == config]
        per_round = ", ".join(f"{x['sentences_per_s'] / b['sentences_per_s']:.2f}" for x, b in zip(runs, base))
        lines.append(f"* {config}: throughput {r['throughput_ratio']:.3f}x (per round {per_round}), peak memory "
                     f"{r['memory_ratio']:.3f}x")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=13)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads in every configuration")
    parser.add_argument("--name", default="train_throughput")
    parser.add_argument("--worker", choices=CONFIGS, help=argparse.SUPPRESS)
    parser.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = worker(args.worker, args.corpus, args.steps, args.warmup, args.threads)
        print("RESULT " + json.dumps(result), flush=True)
        return

    work_dir = ROOT / "outputs" / "bench"
    work_dir.mkdir(parents=True, exist_ok=True)
    corpus = shuffled_corpus(work_dir / "corpus_shuffled.txt")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_DISABLED": "true"}
    report = {"environment": environment(), "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds,
              "batch_sentences": BATCH, "max_length": MAX_LENGTH, "padding": padded_width_check(corpus, 50),
              "runs": []}
    configs = list(args.configs)
    for r in range(args.rounds):
        for config in configs[r % len(configs):] + configs[: r % len(configs)]:
            command = [sys.executable, __file__, "--worker", config, "--corpus", str(corpus),
                       "--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads)]
            proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if proc.returncode or line is None:
                sys.exit(f"{config} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
            result = {"round": r, **json.loads(line.removeprefix("RESULT "))}
            report["runs"].append(result)
            print(f"round {r} {config}: {result['sentences_per_s']:.1f} sentences/s, "
                  f"{result['max_rss_mib']:.0f} MiB, {result['process_seconds']:.0f} s", flush=True)

    report["torch_threads"] = report["runs"][0]["torch_threads"]
    summary = {}
    base = [x for x in report["runs"] if x["config"] == "st-mnrl"]
    for config in configs:
        runs = [x for x in report["runs"] if x["config"] == config]
        entry = {key: statistics.median(x[key] for x in runs) for key in ("sentences_per_s", "median_step_s",
                                                                           "max_rss_mib")}
        if config != "st-mnrl" and base:
            entry["throughput_ratio"] = statistics.median(x["sentences_per_s"] / b["sentences_per_s"]
                                                          for x, b in zip(runs, base))
            entry["memory_ratio"] = statistics.median(x["max_rss_mib"] / b["max_rss_mib"] for x, b in zip(runs, base))
        summary[config] = entry
    report["summary"] = summary
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_json(RESULTS / f"{args.name}.json", report)
    (RESULTS / f"{args.name}.md").write_text(markdown(report), encoding="utf-8")
    print(markdown(report))


if __name__ == "__main__":
    main()
