"""What does a hard-negative loss cost over InfoNCE? Two measurements, each as ratios within one run.

1. The loss alone: forward + backward of every loss on random float32 embeddings (leaf tensors with
   requires_grad), symmetric form, 2N rows x d, called the way SimCSETrainer calls it
   (simcse_hn.trainer.contrastive_loss itself). Ratio to InfoNCE; targets at 2N = 1024:
   DCL/HCL <= 1.5x, ProGCL/UnReMix <= 2.5x.
2. A full training step on all-MiniLM-L6-v2 (pooler `cls`, 64 sentences = 128 rows, max length 32): encoder
   forward, loss, backward, AdamW step. Ratio to InfoNCE; target <= 1.03.
3. For every loss over its target at 2N = 1024: a torch.profiler table of where its time goes.

Repetitions are interleaved (every loss once per round, the order rotated each round) and reported as medians,
because the machine may be shared.

    python bench/loss_overhead.py                 # results: bench/results/loss_overhead.{json,md}
    python bench/loss_overhead.py --quick         # a smoke run, results under the name loss_overhead_quick
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import RESULTS, environment, minilm_path, shuffled_corpus, write_json  # noqa: E402

from simcse_hn.data import SimCSECollator, contrastive_targets  # noqa: E402
from simcse_hn.losses import build_loss  # noqa: E402
from simcse_hn.targets import LossContext  # noqa: E402
from simcse_hn.trainer import contrastive_loss  # noqa: E402

# name -> build_loss arguments; the first is the baseline. Class defaults otherwise (DCL tau+ 1e-3, HCL beta 0.1,
# ProGCL 10 EM iterations, refit every step, mix over all negatives; UnReMix beta 1).
LOSSES = {
    "infonce": ("infonce", {}),
    "dcl": ("dcl", {}),
    "hcl": ("hcl", {}),
    "progcl-weight": ("progcl", {"mode": "weight"}),
    "progcl-mix": ("progcl", {"mode": "mix"}),
    "unremix-embedding": ("unremix", {"gradient": "embedding"}),
    "unremix-head": ("unremix", {"gradient": "head"}),
}
TARGETS_1024 = {"dcl": 1.5, "hcl": 1.5, "progcl-weight": 2.5, "progcl-mix": 2.5, "unremix-embedding": 2.5,
                "unremix-head": 2.5}
TRAIN_STEP_TARGET = 1.03
MAX_STEPS = 1000  # ProGCL is timed after its warm-up: step = max_steps
ROOT = Path(__file__).resolve().parents[1]


def loss_sources() -> dict:
    """Which loss code was measured: a hash per file and whether it differs from the commit (others edit it too)."""
    files = sorted((ROOT / "simcse_hn" / "losses").glob("*.py"))
    changed = subprocess.run(["git", "status", "--porcelain", "--", "simcse_hn/losses"], cwd=ROOT,
                             capture_output=True, text=True).stdout.split()
    return {"sha256": {f.name: hashlib.sha256(f.read_bytes()).hexdigest()[:12] for f in files},
            "uncommitted": [x for x in changed if x.endswith(".py")]}


def interleaved(runs: dict[str, Callable[[], None]], rounds: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per call of each function, `rounds` times, every function once per round in a rotated order."""
    names = list(runs)
    for _ in range(warmup):
        for name in names:
            runs[name]()
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            start = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - start)
    return times


def summarise(times: dict[str, list[float]], baseline: str = "infonce") -> dict[str, dict]:
    """Median seconds, ratio of medians to the baseline, and the median of the per-round ratios."""
    base = times[baseline]
    base_median = statistics.median(base)
    out = {}
    for name, values in times.items():
        paired = [v / b for v, b in zip(values, base)]
        out[name] = {
            "median_ms": 1000 * statistics.median(values),
            "ratio": statistics.median(values) / base_median,
            "paired_ratio_median": statistics.median(paired),
            "times_ms": [round(1000 * v, 3) for v in values],
        }
    return out


# --- 1. the loss alone ---


def trainer_loss(loss_fn) -> Callable[..., object]:
    """simcse_hn.trainer.contrastive_loss (symmetric form, one process, after warm-up): each loss is called exactly as
    the trainer calls it. -> f(embeddings, head_inputs)"""
    return lambda embeddings, head_inputs=None: contrastive_loss(
        loss_fn, embeddings, form="symmetric", head_inputs=head_inputs, step=MAX_STEPS, max_steps=MAX_STEPS
    )


def loss_runs(rows: int, dim: int, names=tuple(LOSSES), copy_anchors: bool = False) -> dict[str, Callable[[], None]]:
    """One closure per loss: forward + backward on fixed random embeddings through simcse_hn.trainer.contrastive_loss
    (symmetric form: the embeddings tensor itself is passed as the anchors). `copy_anchors`: call the loss directly
    with anchors = embeddings[anchor_rows], a copy (what the trainer did before 5304af6)."""
    generator = torch.Generator().manual_seed(rows * 7 + dim)
    h = torch.randn(rows, dim, generator=generator)  # (2N, d) head inputs
    weight = torch.randn(dim, dim, generator=generator) / dim**0.5
    bias = 0.1 * torch.randn(dim, generator=generator)
    z = torch.tanh(h @ weight + bias).requires_grad_()  # (2N, d) leaf: only the loss is timed
    anchor_rows, positive_index, negative_mask = contrastive_targets(rows, "symmetric")
    runs = {}
    for name in names:
        loss_name, kwargs = LOSSES[name]
        loss_fn = build_loss(loss_name, temperature=0.05, **kwargs)
        head_inputs = h if name == "unremix-head" else None
        if copy_anchors:
            features = {} if head_inputs is None else {"anchor_features": h[anchor_rows], "candidate_features": h}
            context = LossContext(step=MAX_STEPS, max_steps=MAX_STEPS, **features)

            def call(embeddings, head_inputs, loss_fn=loss_fn, context=context):
                return loss_fn(embeddings[anchor_rows], embeddings, positive_index, negative_mask, context)
        else:
            call = trainer_loss(loss_fn)

        def run(call=call, head_inputs=head_inputs):
            z.grad = None
            call(z, head_inputs).loss.backward()

        runs[name] = run
    return runs


def measure_losses(rows_list, dims, rounds: dict[int, int]) -> list[dict]:
    results = []
    for rows in rows_list:
        for dim in dims:
            gc.collect()
            start = time.time()
            times = interleaved(loss_runs(rows, dim), rounds[rows], warmup=0 if rows >= 4096 else 2)
            entry = {"rows": rows, "dim": dim, "rounds": rounds[rows], "losses": summarise(times)}
            results.append(entry)
            ratios = ", ".join(f"{k} {v['ratio']:.2f}" for k, v in entry["losses"].items())
            print(f"2N={rows} d={dim} ({time.time() - start:.0f} s): infonce "
                  f"{entry['losses']['infonce']['median_ms']:.2f} ms; {ratios}", flush=True)
    return results


# --- 2. a full MiniLM training step ---


def train_step_runs(batches: list[dict], model, optimizer) -> dict[str, Callable[[], None]]:
    """One closure per loss; each call trains on the next batch of its own cycle, so every loss sees the same
    batches in the same order. Embedding and loss as SimCSETrainer (_embed, contrastive_loss)."""
    runs = {}
    for name, (loss_name, kwargs) in LOSSES.items():
        loss_fn = build_loss(loss_name, temperature=0.05, **kwargs)
        call = trainer_loss(loss_fn)
        counter = iter(range(10**9))

        def run(loss_fn=loss_fn, call=call, counter=counter):
            batch = batches[next(counter) % len(batches)]
            output = model(**batch, return_head_inputs=getattr(loss_fn, "needs_head_inputs", False))
            call(output.embeddings, output.head_inputs).loss.backward()  # embeddings (2B, D)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        runs[name] = run
    return runs


def measure_train_step(rounds: int, batch_size: int, max_length: int, work_dir: Path) -> dict:
    from simcse_hn.modeling import SimCSEModel, load_tokenizer

    torch.manual_seed(0)
    path = minilm_path()
    tokenizer = load_tokenizer(path)
    model = SimCSEModel.from_pretrained(path, pooler="cls")
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-5)
    corpus = shuffled_corpus(work_dir / "corpus_shuffled.txt").read_text(encoding="utf-8").splitlines()
    collator = SimCSECollator(tokenizer, max_length)
    batches = [collator(corpus[i * batch_size:(i + 1) * batch_size]) for i in range(4)]
    runs = train_step_runs(batches, model, optimizer)
    runs["infonce"]()  # warm-up: the losses share the model and optimizer; a loss's own first call is ms
    times = interleaved(runs, rounds, warmup=0)
    result = {"rounds": rounds, "batch_sentences": batch_size, "rows": 2 * batch_size, "max_length": max_length,
              "padded_lengths": [b["input_ids"].shape[1] for b in batches], "losses": summarise(times)}
    ratios = ", ".join(f"{k} {v['ratio']:.3f}" for k, v in result["losses"].items())
    print(f"MiniLM step: infonce {result['losses']['infonce']['median_ms']:.0f} ms; {ratios}", flush=True)
    return result


# --- 3. where the time goes, for every loss over its target at 2N = 1024 ---


def profile_losses(names: list[str], rows: int, dim: int, calls: int = 3) -> dict[str, dict]:
    """torch.profiler over `calls` forward+backward calls: the top operators (with input shapes) by self CPU time,
    in ms per call and as a share of the loss's total."""
    from torch.profiler import ProfilerActivity, profile

    out = {}
    runs = loss_runs(rows, dim, ["infonce", *names])
    for name in ["infonce", *names]:
        runs[name]()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(calls):
                runs[name]()
        events = prof.key_averages(group_by_input_shape=True)
        total = sum(e.self_cpu_time_total for e in events)
        top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:8]
        out[name] = {
            "total_ms_per_call": total / 1000 / calls,
            "top_ops": [{"op": e.key, "shapes": str(e.input_shapes)[:80], "calls_per_call": e.count / calls,
                         "ms_per_call": e.self_cpu_time_total / 1000 / calls,
                         "share": e.self_cpu_time_total / total} for e in top],
        }
    return out


def same_tensor_check(rows: int, dim: int, rounds: int) -> dict:
    """UnReMix with anchors = the embeddings tensor itself (its `anchors is candidates` path, which skips the
    candidates' own similarities and gradients; SimCSETrainer since 5304af6) vs anchors = embeddings[anchor_rows]."""
    same = loss_runs(rows, dim, ["infonce", "unremix-embedding", "unremix-head"])
    copy = loss_runs(rows, dim, ["unremix-embedding", "unremix-head"], copy_anchors=True)
    runs = {**same, "unremix-embedding-copy": copy["unremix-embedding"], "unremix-head-copy": copy["unremix-head"]}
    return {"rows": rows, "dim": dim, "rounds": rounds, "losses": summarise(interleaved(runs, rounds, warmup=1))}


# --- report ---


def missed_1024(loss_alone: list[dict]) -> dict[str, float]:
    """Worst ratio over d at 2N = 1024 of every loss over its target."""
    worst = {name: max(e["losses"][name]["ratio"] for e in loss_alone if e["rows"] == 1024) for name in TARGETS_1024}
    return {name: ratio for name, ratio in worst.items() if ratio > TARGETS_1024[name]}


def markdown(report: dict) -> str:
    env = report["environment"]
    names = list(LOSSES)
    uncommitted = report["loss_sources"]["uncommitted"]
    sources = f"with uncommitted changes: {', '.join(uncommitted)}" if uncommitted else "as committed"
    lines = [
        "# Loss overhead: hard-negative losses vs InfoNCE",
        "",
        f"Commit {env['commit']}, {env['machine']}, torch {env['versions'].get('torch')} on the CPU with "
        f"{report['torch_threads']} intra-op thread(s), {env['date']}; {report['seconds']} s in all. Loss files "
        f"{sources} (sha256 prefixes in the JSON). The machine was shared with other jobs (a background quality "
        "study, other engineers' tests and benchmarks): absolute times are noisy and inflated, so every comparison "
        "is a ratio within one run, repetitions interleaved (each loss once per round, order rotated), medians "
        "reported. One thread, because with torch's default of 2 threads on 2 busy cores a 2N = 1024 InfoNCE step "
        "ran ~7x slower than with one (OpenMP threads waiting on each other).",
        "",
        "## 1. The loss alone: forward + backward, ratio to InfoNCE",
        "",
        "Random float32 embeddings (a leaf with requires_grad; h random, z = tanh(h W + b); unremix-head gets U from "
        "h), symmetric form (every row an anchor against 2N - 2 negatives), temperature 0.05, called as "
        "SimCSETrainer calls it (simcse_hn.trainer.contrastive_loss: anchors are the candidates). "
        "DCL tau+ 1e-3, HCL beta 0.1, "
        "UnReMix beta 1; ProGCL after warm-up (step = max_steps), refit every step, 10 EM iterations on the default "
        "fit_pairs sampled pairs (every pair where there are fewer), mix over all negatives (paired in candidate "
        "order, no sort), the posteriors scored on the upper triangle of the similarity matrix (anchors are the "
        "candidates on one process; with several processes on the full gathered matrix). "
        "Ratio = median time / median InfoNCE time; in brackets the median of the per-round ratios.",
        "",
        "| 2N | d | rounds | InfoNCE ms | " + " | ".join(names[1:]) + " |",
        "|---|---|---|---|" + "---|" * (len(names) - 1),
    ]
    for entry in report["loss_alone"]:
        cells = [f"{entry['losses'][n]['ratio']:.2f} ({entry['losses'][n]['paired_ratio_median']:.2f})"
                 for n in names[1:]]
        lines.append(f"| {entry['rows']} | {entry['dim']} | {entry['rounds']} | "
                     f"{entry['losses']['infonce']['median_ms']:.1f} | " + " | ".join(cells) + " |")
    lines += ["", "Targets at 2N = 1024 (worst of d = 384, 768):", ""]
    for name, target in TARGETS_1024.items():
        worst = max(e["losses"][name]["ratio"] for e in report["loss_alone"] if e["rows"] == 1024)
        lines.append(f"* {name}: {worst:.2f}x (target <= {target}x): {'met' if worst <= target else 'MISSED'}")

    step = report["train_step"]
    base_ms = step["losses"]["infonce"]["median_ms"]
    small = next(e for e in report["loss_alone"] if e["rows"] == step["rows"] and e["dim"] == 384)
    lines += [
        "",
        "## 2. Full training step on all-MiniLM-L6-v2, ratio to InfoNCE",
        "",
        f"Pooler `cls` (MLP head, d = 384), {step['batch_sentences']} sentences = {step['rows']} rows, max length "
        f"{step['max_length']} (padded lengths {step['padded_lengths']}), symmetric form, encoder forward + loss + "
        f"backward + AdamW step, {step['rounds']} interleaved rounds after one InfoNCE warm-up step, the same "
        f"batches for every loss. Target <= {TRAIN_STEP_TARGET}. The last column adds the loss-alone difference at "
        f"2N = {step['rows']}, d = 384 (section 1) to the InfoNCE step: the same quantity without the step-to-step "
        "noise.",
        "",
        "| loss | median ms | ratio | median per-round ratio | estimate from section 1 |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        v = step["losses"][name]
        extra = small["losses"][name]["median_ms"] - small["losses"]["infonce"]["median_ms"]
        lines.append(f"| {name} | {v['median_ms']:.0f} | {v['ratio']:.3f} | {v['paired_ratio_median']:.3f} | "
                     f"{(base_ms + extra) / base_ms:.4f} |")

    if report.get("profile"):
        diag = report["profile"]
        lines += [
            "",
            f"## 3. Where the time goes (2N = {diag['rows']}, d = {diag['dim']}, torch.profiler, self CPU time per "
            "call)",
            "",
        ]
        for name, prof in diag["losses"].items():
            lines += [f"**{name}**: {prof['total_ms_per_call']:.0f} ms per call (profiled)", "",
                      "| op | input shapes | calls | ms | share |", "|---|---|---|---|---|"]
            for op in prof["top_ops"]:
                lines.append(f"| {op['op']} | {op['shapes']} | {op['calls_per_call']:g} | {op['ms_per_call']:.1f} | "
                             f"{100 * op['share']:.0f}% |")
            lines.append("")
        same = diag["same_tensor"]
        lines += [
            f"UnReMix called with anchors = `embeddings[anchor_rows]` (-copy: a copy, so its `anchors is candidates` "
            f"path is not taken; SimCSETrainer did this before 5304af6) vs the tensor itself, 2N = {same['rows']}, "
            f"d = {same['dim']}, {same['rounds']} interleaved rounds, ratio to InfoNCE:",
            "",
            "| loss | ratio |",
            "|---|---|",
        ]
        for name, v in same["losses"].items():
            lines.append(f"| {name} | {v['ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds, small sizes; a smoke test of the script")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (see the results' note)")
    parser.add_argument("--train_rounds", type=int, default=3)
    parser.add_argument("--name", default=None, help="results file stem (default loss_overhead)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work_dir = ROOT / "outputs" / "bench"
    work_dir.mkdir(parents=True, exist_ok=True)

    if args.quick:
        rows_list, dims, rounds, train_rounds, same_rounds = (128, 1024), (384,), {128: 3, 1024: 2}, 1, 1
    else:
        rows_list, dims, rounds = (128, 1024, 4096), (384, 768), {128: 40, 1024: 30, 4096: 2}
        train_rounds, same_rounds = args.train_rounds, 5
    report = {"environment": environment(), "loss_sources": loss_sources(), "torch_threads": torch.get_num_threads(),
              "temperature": 0.05, "max_steps": MAX_STEPS,
              "losses": {k: {"name": n, **kw} for k, (n, kw) in LOSSES.items()}}
    start = time.time()
    report["loss_alone"] = measure_losses(rows_list, dims, rounds)
    report["train_step"] = measure_train_step(train_rounds, 64, 32, work_dir)
    missed = missed_1024(report["loss_alone"])
    if missed:
        print(f"over target at 2N = 1024: {missed}; profiling", flush=True)
        report["profile"] = {"rows": 1024, "dim": 384, "losses": profile_losses(list(missed), 1024, 384),
                             "same_tensor": same_tensor_check(1024, 384, same_rounds)}
    report["seconds"] = round(time.time() - start)
    name = args.name or ("loss_overhead_quick" if args.quick else "loss_overhead")
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_json(RESULTS / f"{name}.json", report)
    (RESULTS / f"{name}.md").write_text(markdown(report), encoding="utf-8")
    print(markdown(report))


if __name__ == "__main__":
    main()
