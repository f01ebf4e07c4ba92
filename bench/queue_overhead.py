"""The negative queue's cost: one training step with a queue of 4,096 and 16,384 entries (a memory bank, and with a
momentum encoder) against the same batch without one, side by side in one process.

Every configuration has its own `SimCSETrainer` over the same start model (pooler `cls`, so with SimCSE's MLP head),
HCL (the objective weights every queue entry), symmetric form, dropout on, and a queue filled to capacity before the
first timed step (random unit rows: a full queue is what a run pays once it has filled). A step is what the queue adds
work to: `SimCSETrainer.training_step` (forward, loss, backward; the momentum encoder's forward of the batch's
sentences) and the step's end (`QueueRun.step_end`: the momentum update and the enqueue); the optimizer step, the
same in every configuration, is not timed. The configurations take turns, one step each per round, so that a change of
the machine's load reaches all of them alike; each reports the median over rounds. Memory: the queue's tensors and
the momentum copy's parameters, counted from the tensors.

    python -m bench.queue_overhead                                 # all-MiniLM-L6-v2 on this CPU
    python -m bench.queue_overhead --model base --device cuda      # a BERT-base-shaped random encoder on a GPU
    python -m bench.queue_overhead --quick                         # tiny BERT, a smoke run (queue_overhead_quick.*)
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time

import torch

from bench.common import (
    RESULTS,
    base_shaped_model,
    bench_work_dir,
    environment,
    environment_line,
    minilm_path,
    write_report,
)

CONFIGS = {  # name -> (queue_size, momentum)
    "no queue": (0, 0.0),
    "memory bank 4096": (4096, 0.0),
    "memory bank 16384": (16384, 0.0),
    "momentum 4096": (4096, 0.995),
    "momentum 16384": (16384, 0.995),
}


def _sentences(count: int) -> list[str]:
    from bench.common import shuffled_corpus

    lines = shuffled_corpus(bench_work_dir() / "corpus_shuffled.txt").read_text(encoding="utf-8").splitlines()
    return [lines[i % len(lines)] for i in range(count)]


def _model(kind: str) -> tuple[str, str]:
    if kind == "quick":
        return base_shaped_model(bench_work_dir() / "tiny_bert_folder", layers=2, hidden=64, heads=2,
                                 intermediate=256), "a 2-layer, 64-wide BERT with random weights (quick)"  # fmt: skip
    if kind == "base":
        return base_shaped_model(bench_work_dir() / "bert_base_shape"), "a BERT-base-shaped encoder, random weights"
    return minilm_path(), "sentence-transformers/all-MiniLM-L6-v2"


def run(args) -> dict:
    from simcse_hn.configuration.training_arguments import SimCSETrainingArguments
    from simcse_hn.data.collator import SimCSECollator
    from simcse_hn.losses import build_loss
    from simcse_hn.modeling.loading import load_tokenizer
    from simcse_hn.modeling.model import SimCSEModel
    from simcse_hn.training.queue import QueueEntries
    from simcse_hn.training.trainer import SimCSETrainer

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    path, label = _model("quick" if args.quick else args.model)
    torch.manual_seed(0)
    start = SimCSEModel.from_pretrained(path, pooler="cls")
    tokenizer = load_tokenizer(path)
    collator = SimCSECollator(tokenizer, args.max_length)
    texts = _sentences(args.batch * (args.rounds + 1))
    batches = [collator(texts[i * args.batch : (i + 1) * args.batch]) for i in range(args.rounds + 1)]
    work = tempfile.mkdtemp(prefix="queue_overhead_")
    trainers = {}
    for name, (size, momentum) in CONFIGS.items():
        training = SimCSETrainingArguments(
            output_dir=os.path.join(work, name.replace(" ", "_")), use_cpu=device.type == "cpu", loss="hcl",
            temperature=0.05, per_device_train_batch_size=args.batch, eval_strategy="no", save_strategy="no",
            load_best_model_at_end=False, metric_for_best_model=None, report_to=[], queue_size=size,
            momentum=momentum, bf16=args.bf16,
        )  # fmt: skip
        trainer = SimCSETrainer(model=copy.deepcopy(start), args=training, loss_fn=build_loss("hcl", temperature=0.05))
        trainer.current_gradient_accumulation_steps = 1
        if trainer.queue is not None:  # full from the start: random unit rows with ids no batch text has
            g = torch.Generator().manual_seed(1)
            rows = torch.nn.functional.normalize(torch.randn(size, start.config.hidden_size, generator=g), dim=1)
            trainer.queue.queue.enqueue(QueueEntries(rows.to(trainer.args.device), torch.arange(size) + 2**40))
        trainers[name] = trainer
    times = {name: [] for name in CONFIGS}

    def step(trainer, inputs) -> None:
        trainer.training_step(trainer.model, inputs)
        if trainer.queue is not None:
            trainer.queue.step_end(trainer.model)
        trainer.model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()

    names = list(CONFIGS)
    for name in names:  # a first step each, untimed (allocations, the momentum copy)
        step(trainers[name], batches[0])
    for r, inputs in enumerate(batches[1:]):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # each round starts with another
            begin = time.perf_counter()
            step(trainers[name], inputs)
            times[name].append(time.perf_counter() - begin)
    runs = []
    for name, (size, momentum) in CONFIGS.items():
        queue = trainers[name].queue
        runs.append({
            "config": name, "queue_size": size, "momentum": momentum, "step_s": times[name],
            "median_step_s": statistics.median(times[name]),
            "queue_mib": 0.0 if queue is None else queue.queue.memory_bytes() / 2**20,
            "momentum_copy_mib": 0.0 if queue is None or queue.encoder is None else
            queue.encoder.memory_bytes() / 2**20,
        })  # fmt: skip
    return {"model": label, "device": str(device), "bf16": args.bf16, "batch": args.batch, "rows": 2 * args.batch,
            "max_length": args.max_length, "padded_length": int(batches[0]["input_ids"].shape[1]),
            "threads": torch.get_num_threads(), "rounds": args.rounds, "runs": runs}  # fmt: skip


def markdown(result: dict) -> str:
    env = result["environment"]
    base = result["runs"][0]
    lines = [
        "# The negative queue's cost per training step",
        "",
        f"{environment_line(env, load=False)} Load average {result['load_average']}.",
        "",
        f"Model: {result['model']}, pooler cls (+ MLP head), HCL, symmetric form, batch {result['batch']} sentences "
        f"({result['rows']} rows), max length {result['max_length']} (padded to {result['padded_length']}), "
        "dropout on, "
        f"device {result['device']}{', bf16 autocast' if result['bf16'] else ''}, {result['threads']} torch threads. "
        "A step: `training_step` (forward, loss, backward, the momentum encoder's forward) and the queue's step end "
        f"(momentum update, enqueue); the optimizer step is not timed. Median of {result['rounds']} rounds, the "
        "configurations taking turns in each.",
        "",
        "| configuration | queue | momentum | median step s | x no queue | queue MiB | momentum copy MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        lines.append(f"| {r['config']} | {r['queue_size']} | {r['momentum']:g} | {r['median_step_s']:.4f} | "
                     f"{r['median_step_s'] / base['median_step_s']:.3f} | {r['queue_mib']:.1f} | "
                     f"{r['momentum_copy_mib']:.1f} |")  # fmt: skip
    lines.append("")
    if result.get("notes"):
        lines += [result["notes"], ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny BERT (smoke run)")
    parser.add_argument("--model", choices=["minilm", "base"], default="minilm")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (a GPU's training setting)")
    parser.add_argument("--batch", type=int, default=64, help="sentences per step")
    parser.add_argument("--max_length", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=10, help="timed steps of each configuration")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--stem", default=None, help="results name (default: queue_overhead[_quick])")
    parser.add_argument("--notes", default="", help="a sentence added to the Markdown report")
    args = parser.parse_args()
    load_start = os.getloadavg()
    result = run(args)
    load_end = os.getloadavg()
    result.update(environment=environment(), notes=args.notes, method=__doc__,
                  load_average=f"{load_start[0]:.2f} at start, {load_end[0]:.2f} at end (1-minute)")  # fmt: skip
    stem = args.stem or ("queue_overhead_quick" if args.quick else "queue_overhead")
    write_report(RESULTS / stem, result, markdown, echo=True)


if __name__ == "__main__":
    main()
