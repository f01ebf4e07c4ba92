"""Where the STS suite's encode spends its time: the operators of a sentence-transformers model's forward over the
suite's own batches (torch.profiler, self CPU time), split into matrix products, the attention kernel and the rest.

The batches are those the suite's encode runs (`modeling.batching.iter_prepared_batches` over every distinct sentence
of the seven tasks, the model's first module's `preprocess`, batches of `--batch_size`), `--batches` of them drawn at
random with a fixed seed, on `--threads` torch threads (1: what each of the encode's side-by-side threads runs). They
are timed once without the profiler (after one warm-up batch), then once under it.

    python -m bench.encode_profile            # results: bench/results/encode_profile.{json,md}
    python -m bench.encode_profile --quick    # a tiny encoder on the synthetic suite (encode_profile_quick)
"""

from __future__ import annotations

import argparse
import random
import time

from bench.common import (
    RESULTS,
    bench_work_dir,
    environment,
    environment_line,
    minilm_path,
    sts_data_dir,
    tiny_bert_folder,
    write_report,
)
from bench.step_profile import ATTENTION, MATMUL_OPS, operator_table

PRODUCTS = tuple(op for op in MATMUL_OPS if op != ATTENTION and not op.endswith("_backward"))


def suite_sentences(data_dir) -> tuple[list[str], str]:
    """Every distinct sentence of the seven tasks (the synthetic suite where the task files are absent)."""
    from bench.eval_speed import synthetic_suite
    from simcse_hn.data.sts import STS_TASKS, load_sts_task

    if data_dir is None:
        tasks, suite = synthetic_suite(), "synthetic (no task files here)"
    else:
        tasks, suite = [load_sts_task(name, str(data_dir)) for name in STS_TASKS], "full suite"
    pairs = [p for task in tasks for p in task.subsets.values()]
    return list(dict.fromkeys(s for p in pairs for s in p.sentence1 + p.sentence2)), suite


def run(model_path: str, sentences: list[str], batch_size: int, batches: int, threads: int, seed: int) -> dict:
    import torch
    from sentence_transformers import SentenceTransformer
    from torch.profiler import ProfilerActivity, profile

    from simcse_hn.modeling.batching import iter_prepared_batches

    torch.set_num_threads(threads)
    model = SentenceTransformer(model_path, device="cpu").eval()
    prepared = [features for _, features in iter_prepared_batches(model[0].preprocess, sentences, batch_size)]
    sample = random.Random(seed).sample(prepared, min(batches, len(prepared)))

    def forward_all() -> None:
        with torch.inference_mode():
            for features in sample:
                model(features)

    with torch.inference_mode():
        model(sample[0])  # warm-up
    start = time.perf_counter()
    forward_all()
    seconds = time.perf_counter() - start
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        forward_all()
    table = operator_table(profiler, len(sample))
    events = {e.key: e.self_cpu_time_total for e in profiler.key_averages()}
    total = sum(events.values())
    tokens = sum(int(features["attention_mask"].sum()) for features in sample)
    padded = sum(features["attention_mask"].numel() for features in sample)
    return {
        "batches_in_suite": len(prepared),
        "batches_profiled": len(sample),
        "tokens": tokens,
        "padding_share": 1 - tokens / padded,
        "seconds_unprofiled": seconds,
        "products_share": sum(events.get(op, 0) for op in PRODUCTS) / total,
        "attention_share": events.get(ATTENTION, 0) / total,
        "profile": table,
    }


def markdown(record: dict) -> str:
    r = record["result"]
    p = r["profile"]
    rest = 1 - r["products_share"] - r["attention_share"]
    lines = [
        "# Where the STS suite's encode spends its time",
        "",
        environment_line(record["environment"]),
        "",
        f"Model {record['model_label']} (sentence-transformers, float32, cpu); {record['suite']}, "
        f"{record['sentences']:,} distinct sentences in {r['batches_in_suite']} batches of up to "
        f"{record['batch_size']} (the encode's own batching); {r['batches_profiled']} of them drawn at random (seed "
        f"{record['seed']}), {r['tokens']:,} tokens, {r['padding_share']:.1%} padding; {record['threads']} torch "
        f"thread(s). Without the profiler they took {r['seconds_unprofiled']:.2f} s.",
        "",
        f"Matrix products (addmm, mm, bmm): **{r['products_share']:.1%}** of the self CPU time; the attention kernel "
        f"{r['attention_share']:.1%}; the rest (GELU, layer norms, copies, adds, the allocator, ...) {rest:.1%}.",
        "",
        "| op | calls per batch | ms per batch | share |",
        "|---|---|---|---|",
    ]
    for e in p["top"]:
        lines.append(f"| {e['op']} | {e['calls_per_step']:.0f} | {e['ms_per_step']:.1f} | {e['share']:.1%} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny encoder on the synthetic suite, a smoke run")
    parser.add_argument("--model", default=None, help="default all-MiniLM-L6-v2 (the bench extra)")
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        model, label, data_dir, args.batches = tiny_bert_folder(bench_work_dir()), "a tiny BERT (quick)", None, 4
    else:
        model, label, data_dir = args.model or minilm_path(), args.model or "all-MiniLM-L6-v2", sts_data_dir()
    sentences, suite = suite_sentences(data_dir)
    record = {
        "environment": environment(),
        "model_label": label,
        "suite": suite,
        "sentences": len(sentences),
        "batch_size": args.batch_size,
        "batches": args.batches,
        "threads": args.threads,
        "seed": args.seed,
    }
    record["result"] = run(model, sentences, args.batch_size, args.batches, args.threads, args.seed)
    write_report(RESULTS / ("encode_profile_quick" if args.quick else "encode_profile"), record, markdown, echo=True)


if __name__ == "__main__":
    main()
