"""Training throughput against the machine's limit: our trainer against sentence-transformers' SimCSE recipe, every
objective against InfoNCE, peak memory (plain and GradCache), and whether `--torch_compile` trains every objective.

Every run goes through train.py's `run()` (or SentenceTransformerTrainer), so the collator, the Trainer's loop, the
optimizer and what runs between steps all count. Times: step-end timestamps from a TrainerCallback (after a CUDA
synchronisation on a GPU; the Trainer synchronises every step anyway for its NaN filter), over the steps after the
warm-up; sentences/s = timed steps x batch / their time.

FLOPs (common.encoder_flops), per step and forward batch: 3 x (2 x matrix weights x tokens + attention's two T x T
products, 4 T^2 H per sequence and layer) + the MLP head's rows, i.e. "6 x non-embedding matrix parameters x tokens
+ attention"; embeddings, biases, norms, softmax, GELU, dropout and the loss are not counted. *Useful* counts the
sentences' own tokens (the attention mask), *computed* the padded positions the forwards ran on: the collated batch,
or with length groups (ours' default on a CPU, SimCSEModel.length_groups) each group cut to its longest row, or
packed (a BERT encoder's length groups: the layers' products on the tokens alone, attention in the groups; the
padding share is the products' and is reported); GradCache's extra no-grad forward is not useful work. The limit
(common.matmul_rates): measured in the same worker process, on its threads, device and dtype, before and after its
runs (the better kept): the reference product and the model's own products at the batch's token count (forward and
both backward products). Fraction = useful FLOP/s / limit.

1. *ours vs sentence-transformers*, whole processes (a fresh one per configuration and round; rounds interleaved,
   order rotated): st-mnrl (SentenceTransformerTrainer + MultipleNegativesRankingLoss(scale=20), the unsupervised
   SimCSE recipe of its docs: (anchor, positive) = (sentence, same sentence), two forwards of B rows, mean pooling),
   ours-avg (InfoNCE, `simcse` form, temperature 0.05, one forward of 2B rows, mean pooling: the same model
   function), ours-cls (SimCSE's recipe: `cls` with its MLP head), ours-cls-1group (ours-cls in one padded forward
   per batch, --length_groups 1: what length groups gain), ours-cls-gradcache (ours-cls with --cache_minibatch_size).
   Ours run with the trainer's default length groups (8 on a CPU). Ratios: per round, median.
2. *every objective vs InfoNCE*, same-process alternation: one process runs `run()` for each objective in turn,
   round after round (order rotated), pooler `cls`, symmetric form (the hard-negative objectives' form; InfoNCE too);
   ratio of each run's median step time to the same round's InfoNCE run, median over rounds.
3. *memory*, from section 1's whole processes: the peak resident set while training (VmHWM, reset when training
   begins) minus the resident size then (what training adds: activations, gradients, optimizer state), and the
   process's whole peak (ru_maxrss); on CUDA torch.cuda.max_memory_allocated.
4. *--torch_compile*, per objective: a run with --torch_compile (and --torch_compile_backend) against the eager run
   in the same process, same seed and data, dropout on with inductor's fallback_random (compiled dropout then draws
   from torch's generator as eager does); the Trainer compiles the model's forward, the loss runs eager. Per-step
   losses and final weights are compared (weights in units of lr x steps, the most AdamW moves one: `compare_runs`);
   where it cannot run, the error's first line is recorded.

    python -m bench.train_throughput            # all of it on all-MiniLM-L6-v2: results/train_throughput.{json,md}
    python -m bench.train_throughput --quick    # a tiny encoder, one round: results/train_throughput_quick.*
    python -m bench.train_throughput --sections objectives compile --compile_backend inductor
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

from bench.common import (
    RESULTS,
    ROOT,
    EncoderShape,
    best_rates,
    encoder_flops,
    environment,
    environment_line,
    limit_fraction,
    limit_sentence,
    matmul_rates,
    peak_rss_mib,
    reset_peak_rss,
    rss_mib,
    timed_settings,
    trainer_module,
    training_bench_inputs,
    write_json,
    write_report,
)
from simcse_hn.files import portable_name
from simcse_hn.losses.registry import BASELINE, setting_flags

BATCH = 64
MAX_LENGTH = 32
LEARNING_RATE = 3e-5
SEED = 42
CACHE_MINIBATCH = 16
# objective -> train.py arguments (class defaults otherwise, as bench/loss_overhead.py's LOSSES; ProGCL without its
# InfoNCE warm-up, so that every timed step is ProGCL's)
OBJECTIVES = {setting: setting_flags(name, options) for setting, (name, options) in timed_settings().items()}
VERSUS = ("st-mnrl", "ours-avg", "ours-cls", "ours-cls-1group", "ours-cls-gradcache")
SECTIONS = ("versus", "objectives", "compile")
OBJECTIVE_TARGET = 1.03  # issue 15: every objective within 3 % of InfoNCE per step


def versus_spec(name: str, base: dict, cache_minibatch: int = CACHE_MINIBATCH) -> dict:
    spec = {**base, "name": name, "kind": "st" if name == "st-mnrl" else "ours"}
    if name == "ours-avg":
        spec["args"] = ["--pooler", "avg", "--loss", BASELINE, "--contrast_form", "simcse"]
    elif name.startswith("ours-cls"):
        spec["args"] = ["--pooler", "cls", "--loss", BASELINE, "--contrast_form", "simcse"]
        if name.endswith("1group"):  # one padded forward per batch, as before length groups
            spec["args"] += ["--length_groups", "1"]
        if name.endswith("gradcache"):
            spec["args"] += ["--cache_minibatch_size", str(cache_minibatch)]
            spec["cache_minibatch"] = cache_minibatch
    return spec


def objective_spec(name: str, base: dict) -> dict:
    return {**base, "name": name, "kind": "ours", "args": ["--pooler", "cls", "--contrast_form", "symmetric",
                                                           *OBJECTIVES[name]]}  # fmt: skip


# --- the worker: runs specs in this process ---


def forward_rows(spec: dict) -> int:
    """Rows of one forward batch: st-mnrl B per column, ours 2B (or GradCache's 2 x mini-batch)."""
    if spec["kind"] == "st":
        return spec["batch"]
    return 2 * spec.get("cache_minibatch", spec["batch"])


class RecordingCollator:
    """The collator, recording each batch's token counts and padded width per forward input (every *attention_mask
    key: ours one, sentence-transformers' one per column), on the CPU before the batch moves; its other attributes
    are the collator's (sentence-transformers reads some)."""

    def __init__(self, collate, batches: list[dict]):
        self._collate, self._batches = collate, batches

    def __call__(self, features):
        batch = self._collate(features)
        self._batches.append({key: (value.sum(dim=1).tolist(), int(value.shape[1])) for key, value in batch.items()
                              if key.endswith("attention_mask")})  # fmt: skip
        return batch

    def __getattr__(self, name):
        return getattr(self._collate, name)


def recording_callback(marks: list[float], memory: dict, sync_warn_from: int | None = None):
    """Step-end times and memory; with `sync_warn_from` (CUDA) each step from that one on runs under
    set_sync_debug_mode("warn") and memory["host_syncs"] counts the warnings per "file:line: message" of the caller."""
    import resource
    import warnings

    import torch
    from transformers import TrainerCallback

    cuda = torch.cuda.is_available()
    watch = {"on": cuda and sync_warn_from is not None, "context": None}

    class Record(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if watch["on"] and state.global_step >= sync_warn_from:
                watch["context"] = warnings.catch_warnings(record=True)
                watch["caught"] = watch["context"].__enter__()
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")

        def on_train_begin(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            memory["rss_at_train_begin_mib"] = rss_mib()
            memory["peak_reset"] = reset_peak_rss()

        def on_step_end(self, args, state, control, **kwargs):
            if watch["context"] is not None:
                torch.cuda.set_sync_debug_mode("default")
                watch["context"].__exit__(None, None, None)
                watch["context"] = None
                syncs = memory.setdefault("host_syncs", {})
                for w in watch["caught"]:
                    key = f"{os.path.basename(w.filename)}:{w.lineno}: {str(w.message).splitlines()[0][:80]}"
                    syncs[key] = syncs.get(key, 0) + 1
            if cuda:
                torch.cuda.synchronize()
            marks.append(time.perf_counter())

        def on_train_end(self, args, state, control, **kwargs):
            peak = peak_rss_mib()
            memory["train_peak_rss_mib"] = peak
            memory["train_added_rss_mib"] = peak - memory["rss_at_train_begin_mib"]
            memory["process_maxrss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            if cuda:
                memory["cuda_max_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
                memory["cuda_max_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20

    return Record()


def run_ours(spec: dict, corpus: Path, output_dir: str, callback, batches: list, losses: list):
    from simcse_hn.cli import train

    builder = trainer_module()
    base = builder.SimCSETrainer

    class Recorded(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback(callback)
            self.data_collator = RecordingCollator(self.data_collator, batches)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            if model.training:
                losses.append((out[0] if return_outputs else out).detach())  # a tensor: no host sync
            return out

    argv = [
        "--model_name_or_path", spec["model"], "--train_file", str(corpus),
        "--max_seq_length", str(spec["max_length"]), "--per_device_train_batch_size", str(spec["batch"]),
        "--max_steps", str(spec["steps"]), "--temperature", "0.05", "--learning_rate", str(LEARNING_RATE),
        "--seed", str(SEED), "--output_dir", output_dir, "--logging_steps", "1000", "--report_to", "none",
        "--disable_tqdm", "true", *spec["args"],
    ]  # fmt: skip
    if spec.get("bf16"):
        argv += ["--bf16", "true"]
    if spec.get("compile"):
        argv += ["--torch_compile", "true", "--torch_compile_backend", spec["compile"]]
    builder.SimCSETrainer = Recorded  # run() builds the trainer from there
    try:
        trainer = train.run(argv)
    finally:
        builder.SimCSETrainer = base
    from torch._dynamo.eval_frame import OptimizedModule

    compiled = any(isinstance(m, OptimizedModule) for m in (trainer.model_wrapped, trainer.model))
    return trainer.accelerator.unwrap_model(trainer.model), compiled


def run_sentence_transformers(spec: dict, corpus: Path, output_dir: str, callback, batches: list):
    import datasets
    import torch
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
        losses,
    )

    sentences = [s.strip() for s in corpus.read_text(encoding="utf-8").splitlines()]
    sentences = [s for s in sentences if s]  # as our load_sentences
    dataset = datasets.Dataset.from_dict({"anchor": sentences, "positive": sentences})
    model = SentenceTransformer(spec["model"], device="cuda" if torch.cuda.is_available() else "cpu")
    model.max_seq_length = spec["max_length"]
    args = SentenceTransformerTrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=spec["batch"], max_steps=spec["steps"],
        learning_rate=LEARNING_RATE, seed=SEED, logging_steps=1000, report_to="none", save_strategy="no",
        disable_tqdm=True, dataloader_drop_last=True, use_cpu=not torch.cuda.is_available(),
        bf16=bool(spec.get("bf16")), **spec.get("st_arguments", {}),
    )  # fmt: skip
    trainer = SentenceTransformerTrainer(
        model=model, args=args, train_dataset=dataset, loss=losses.MultipleNegativesRankingLoss(model, scale=20.0),
        callbacks=[callback],
    )
    trainer.data_collator = RecordingCollator(trainer.data_collator, batches)
    trainer.train()
    return model


def forward_pieces(lengths: list[int], width: int, groups: int, rows: int | None) -> list[tuple[list[int], int]]:
    """The (lengths, width) of each encoder forward a batch of (lengths, width) runs as: GradCache's mini-batches of
    `rows` rows (each as wide as the batch), each in its length groups (SimCSEModel.length_groups_of)."""
    import torch

    from simcse_hn.modeling.batching import length_groups_of

    pieces = []
    for start in range(0, len(lengths), rows or len(lengths)):
        chunk = lengths[start : start + (rows or len(lengths))]
        mask = (torch.arange(width) < torch.tensor(chunk)[:, None]).long()  # right padding, as the collators pad
        parts = length_groups_of(mask, groups) if groups > 1 else None
        if parts is None:
            pieces.append((chunk, width))
        else:
            pieces += [([chunk[i] for i in part.tolist()], part_width) for part, part_width in parts]
    return pieces


def step_flops(
    batch: dict, shape: EncoderShape, head: bool, groups: int = 1, rows: int | None = None, packed: bool = False
) -> dict:
    """encoder_flops of one step's forward inputs (training: 3 x forward), useful and computed: "computed" counts
    the positions the forwards ran on (`forward_pieces`: length groups cut padding; `packed`: the layers' products
    ran on the tokens alone, attention in the length groups)."""
    total = {"useful": 0, "computed": 0, "tokens": 0, "padded_tokens": 0}
    for lengths, width in batch.values():
        for piece, piece_width in forward_pieces(lengths, width, groups, rows):
            counted = encoder_flops(shape, piece, piece_width, training=True, head_rows=len(piece) if head else 0,
                                    packed=packed)  # fmt: skip
            total = {k: total[k] + counted[k] for k in total}
    return total


def run_spec(spec: dict, corpus: Path, shape: EncoderShape, states: dict) -> dict:
    """One training run in this process. -> sentences/s, step times, FLOPs, memory, per-step losses (ours)."""
    import torch
    from torch._dynamo.utils import counters

    try:
        from simcse_hn.modeling.packing import packs
    except ImportError:  # a revision before packed forwards

        def packs(encoder) -> bool:
            return False

    marks, batches, losses, memory = [], [], [], {}
    callback = recording_callback(marks, memory, spec.get("sync_warn_from"))
    counters.clear()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as output_dir:
        if spec["kind"] == "st":
            model, compiled = run_sentence_transformers(spec, corpus, output_dir, callback, batches), False
        else:
            model, compiled = run_ours(spec, corpus, output_dir, callback, batches, losses)
    steps, warmup = spec["steps"], spec["warmup"]
    if len(marks) != steps:
        raise RuntimeError(f"{spec['name']}: {len(marks)} step ends recorded, expected {steps}")
    timed = marks[warmup - 1 :]  # from the end of the last warm-up step to the end of the last step
    seconds = timed[-1] - timed[0]
    head = spec["kind"] == "ours" and "cls" in spec["args"]
    flops = {"useful": 0, "computed": 0, "tokens": 0, "padded_tokens": 0}
    groups = getattr(model, "length_groups", 1)  # what the trainer set on our model; sentence-transformers': 1
    rows = 2 * spec["cache_minibatch"] if "cache_minibatch" in spec else None
    packed = spec["kind"] == "ours" and groups > 1 and packs(model.encoder)
    for batch in batches[warmup:steps]:  # the loader collates one batch ahead: batches[i] is step i's
        counted = step_flops(batch, shape, head, groups, rows, packed)
        flops = {k: flops[k] + counted[k] for k in flops}
    flops["padding_share"] = 1 - flops["tokens"] / max(flops["padded_tokens"], 1)
    step_seconds = [b - a for a, b in zip(timed, timed[1:])]
    result = {
        "name": spec["name"], "sentences_per_s": (steps - warmup) * spec["batch"] / seconds, "timed_seconds": seconds,
        "length_groups": groups, "packed": packed,
        "median_step_s": statistics.median(step_seconds), "step_seconds": [round(s, 5) for s in step_seconds],
        "flops": flops, "memory": memory, "process_seconds": time.perf_counter() - start,
        "losses": [float(x) for x in torch.stack(losses).float().cpu()] if losses else None,
        "compiled": compiled,  # the Trainer trained a torch.compile'd model
        "compiled_graphs": counters["stats"]["unique_graphs"],  # graphs made in this run (0: all from the cache)
    }  # fmt: skip
    if spec.get("keep_weights") or spec.get("compare_with"):
        state = {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()}
        if spec.get("keep_weights"):
            states[spec["name"]] = state
        if spec.get("compare_with") in states:
            result["compared_with"] = compare_runs(states[spec["compare_with"]], state, LEARNING_RATE * steps)
    return result


def compare_runs(reference: dict, state: dict, update: float) -> dict:
    """Weight differences in units of `update` = lr x steps, the most AdamW can move a weight (about lr a step):
    the largest and the mean over all weights, and where the largest is. Relative to the weights themselves would
    flag weights whose gradient is rounding noise (attention's key bias: softmax ignores it), which AdamW moves by
    +-lr whatever the noise's size."""
    worst, name, total, count = 0.0, None, 0.0, 0
    for key, ref in reference.items():
        other = state.get(key, state.get(f"_orig_mod.{key}"))
        if other is None or ref.numel() == 0:
            continue
        diff = (other - ref).abs()
        total, count = total + float(diff.sum()), count + diff.numel()
        if float(diff.max()) > worst:
            worst, name = float(diff.max()), key
    mean = total / max(count, 1) / update
    return {"max_weight_diff_in_updates": worst / update, "mean_weight_diff_in_updates": mean, "worst_tensor": name}


def worker(spec_file: Path, out_file: Path) -> None:
    import torch

    from simcse_hn.modeling.loading import load_encoder_config

    job = json.loads(spec_file.read_text())
    torch.set_num_threads(job["threads"])
    if torch.cuda.is_available() and "LOCAL_RANK" in os.environ:  # under torchrun: this process's own device
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    specs, corpus = job["specs"], Path(job["corpus"])
    if any(spec.get("compile") == "inductor" for spec in specs):
        import torch._inductor.config

        torch._inductor.config.fallback_random = True  # compiled dropout draws from torch's generator, as eager
    shape = EncoderShape.of(load_encoder_config(specs[0]["model"]))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if specs[0].get("bf16") and device == "cuda" else torch.float32
    token_counts = sorted({forward_rows(s) * s["max_length"] for s in specs})

    def rates():
        return {t: matmul_rates(shape, t, training=True, device=device, dtype=dtype) for t in token_counts}

    before = rates()
    results, states = [], {}
    for spec in specs:
        try:
            result = run_spec(spec, corpus, shape, states)
        except Exception as error:  # a configuration that cannot run (torch.compile) is recorded, not fatal
            if not spec.get("may_fail"):
                raise
            lines = [line for line in str(error).splitlines() if line.strip()]
            result = {"name": spec["name"], "error": f"{type(error).__name__}: {lines[0] if lines else ''}"[:500]}
        result["round"] = spec.get("round", 0)
        results.append(result)
        print(f"  {spec['name']} (round {result['round']}): "
              + (result["error"] if "error" in result else f"{result['sentences_per_s']:.1f} sentences/s"),
              flush=True)  # fmt: skip
    after = rates()
    limits = {t: best_rates(before[t], after[t]) for t in token_counts}
    for spec, result in zip(specs, results):
        if "error" not in result:
            rate = limits[forward_rows(spec) * spec["max_length"]]
            result["limit"] = limit_fraction(result["flops"]["useful"], result["timed_seconds"], rate)
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        write_json(out_file, {"results": results, "rates": {str(t): r for t, r in limits.items()},
                              "torch_threads": torch.get_num_threads(), "device": device,
                              "world_size": int(os.environ.get("WORLD_SIZE", "1"))})  # fmt: skip


def launch(specs: list[dict], corpus: Path, threads: int, processes: int = 1, timeout: float | None = None) -> dict:
    """Run `specs` in one fresh worker process (or `processes` of them under torchrun: DDP). -> the worker's JSON"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_DISABLED": "true",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        spec_file, out_file = Path(tmp) / "specs.json", Path(tmp) / "out.json"
        spec_file.write_text(json.dumps({"specs": specs, "corpus": str(corpus), "threads": threads}))
        command = [sys.executable, "-m", "bench.train_throughput", "--worker", str(spec_file),
                   "--worker_out", str(out_file)]
        if processes > 1:
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                       str(processes), *command[1:]]  # fmt: skip
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode or not out_file.is_file():
            raise RuntimeError(f"worker failed (rc {proc.returncode}) on {[s['name'] for s in specs]}:\n"
                               f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")  # fmt: skip
        print(proc.stdout, end="", flush=True)
        return json.loads(out_file.read_text())


# --- the sections ---


def rotated(names: list[str], r: int) -> list[str]:
    return names[r % len(names) :] + names[: r % len(names)]


def versus_specs(base: dict, rounds: int, cache_minibatch: int = CACHE_MINIBATCH, configs=VERSUS) -> list[dict]:
    """Section 1 (and 3): each configuration once per round, the order rotated."""
    return [{**versus_spec(name, base, cache_minibatch), "round": r, "section": "versus"}
            for r in range(rounds) for name in rotated(list(configs), r)]  # fmt: skip


def objectives_specs(base: dict, rounds: int, names=tuple(OBJECTIVES)) -> list[dict]:
    """Section 2: every objective once per round, the order rotated."""
    return [{**objective_spec(name, base), "round": r, "section": "objectives"}
            for r in range(rounds) for name in rotated(list(names), r)]  # fmt: skip


def compile_specs(base: dict, backend: str, names=tuple(OBJECTIVES)) -> list[dict]:
    """Section 4: per objective an eager run, then a --torch_compile run compared with it; both in one forward per
    batch (a compiled run has no length groups, and grouped forwards draw other dropout masks)."""
    specs = []
    for name in names:
        spec = objective_spec(name, base)
        spec = {**spec, "args": [*spec["args"], "--length_groups", "1"], "section": "compile"}
        specs += [{**spec, "name": f"{name}/eager", "keep_weights": True},
                  {**spec, "name": f"{name}/compiled", "compile": backend, "compare_with": f"{name}/eager",
                   "may_fail": True}]  # fmt: skip
    return specs


def summarise_versus(runs: list[dict], mode: str) -> dict:
    summary = {}
    for name in dict.fromkeys(x["name"] for x in runs):
        mine = [x for x in runs if x["name"] == name]
        entry = {"sentences_per_s": statistics.median(x["sentences_per_s"] for x in mine),
                 "fraction_of_limit": statistics.median(x["limit"]["fraction_of_limit"] for x in mine),
                 "padding_share": statistics.median(x["flops"]["padding_share"] for x in mine)}  # fmt: skip
        for key in ("train_added_rss_mib", "process_maxrss_mib", "cuda_max_allocated_mib"):
            values = [x["memory"][key] for x in mine if key in x["memory"]]
            if values:
                entry[key] = statistics.median(values)
        for baseline in ("st-mnrl", "ours-cls"):
            base_runs = {x["round"]: x for x in runs if x["name"] == baseline}
            if name != baseline and base_runs:
                entry[f"throughput_vs_{baseline}"] = statistics.median(
                    x["sentences_per_s"] / base_runs[x["round"]]["sentences_per_s"] for x in mine)
        summary[name] = entry
    return {"mode": mode, "runs": runs, "summary": summary}


def summarise_objectives(runs: list[dict], mode: str, rates: dict) -> dict:
    summary = {}
    reference = {x["round"]: x for x in runs if x["name"] == BASELINE}
    for name in dict.fromkeys(x["name"] for x in runs):
        mine = [x for x in runs if x["name"] == name]
        summary[name] = {"median_step_s": statistics.median(x["median_step_s"] for x in mine),
                         "sentences_per_s": statistics.median(x["sentences_per_s"] for x in mine),
                         "fraction_of_limit": statistics.median(x["limit"]["fraction_of_limit"] for x in mine)}
        if reference and name in OBJECTIVES:
            summary[name]["step_vs_infonce"] = statistics.median(
                x["median_step_s"] / reference[x["round"]]["median_step_s"] for x in mine)
    return {"mode": mode, "runs": runs, "summary": summary, "rates": rates}


def summarise_compile(runs: list[dict], backend: str) -> dict:
    by_name = {x["name"]: x for x in runs}
    summary = {}
    for name in dict.fromkeys(x["name"].split("/")[0] for x in runs):
        eager, compiled = by_name[f"{name}/eager"], by_name[f"{name}/compiled"]
        if "error" in compiled or not compiled["compiled"]:
            summary[name] = {"runs": False, "error": compiled.get("error", "the Trainer's model was not compiled")}
            continue
        loss_diff = max(abs(a - b) for a, b in zip(eager["losses"], compiled["losses"]))
        summary[name] = {"runs": True, "max_abs_loss_diff": loss_diff,
                         "compiled_graphs": compiled["compiled_graphs"], **compiled["compared_with"],
                         "median_step_s": {"eager": eager["median_step_s"], "compiled": compiled["median_step_s"]},
                         "process_seconds": {"eager": eager["process_seconds"],
                                             "compiled": compiled["process_seconds"]}}  # fmt: skip
        summary[name]["matches"] = loss_diff <= 1e-4 and summary[name]["mean_weight_diff_in_updates"] <= 1e-2
    return {"backend": backend, "runs": runs, "summary": summary}


WHOLE = "whole processes, one per configuration and round, order rotated"
ALTERNATION = "same-process alternation: one process, each run in turn, order rotated per round"


def run_sections(sections, base: dict, corpus: Path, rounds: int, cache_minibatch: int, backend: str,
                 compile_names, one_process: bool = False) -> dict:
    """The sections' runs: section 1 in whole processes (all in one with `one_process`), sections 2 and 4 in one
    process each (`one_process`: everything in one, the quick smoke run). -> {section: summary}"""
    groups = []  # lists of specs, one worker process each
    if "versus" in sections:
        specs = versus_specs(base, rounds, cache_minibatch)
        groups += [specs] if one_process else [[spec] for spec in specs]
    if "objectives" in sections:
        groups.append(objectives_specs(base, rounds))
    if "compile" in sections:
        groups.append(compile_specs(base, backend, compile_names))
    if one_process:
        groups = [[spec for group in groups for spec in group]]
    runs, rates = [], {}
    for group in groups:
        out = launch(group, corpus, base["threads"])
        for spec, result in zip(group, out["results"]):
            runs.append({**result, "section": spec["section"]})
        rates.update(out["rates"])
    report = {}
    if "versus" in sections:
        report["versus"] = summarise_versus([x for x in runs if x["section"] == "versus"],
                                            ALTERNATION if one_process else WHOLE)  # fmt: skip
    if "objectives" in sections:
        report["objectives"] = summarise_objectives([x for x in runs if x["section"] == "objectives"], ALTERNATION,
                                                    rates)  # fmt: skip
    if "compile" in sections:
        report["compile"] = summarise_compile([x for x in runs if x["section"] == "compile"], backend)
    return report


# --- report ---


def _memory_cells(entry: dict) -> str:
    cuda = entry.get("cuda_max_allocated_mib")
    nan = float("nan")
    return (f"{entry.get('train_added_rss_mib', nan):.0f} | {entry.get('process_maxrss_mib', nan):.0f}"
            + (f" | {cuda:.0f}" if cuda is not None else ""))


def _packed(report: dict) -> bool:
    """Whether any of the record's runs trained packed (simcse_hn.modeling.packing; records before it have none)."""
    sections = [value for value in report.values() if isinstance(value, dict) and "runs" in value]
    return any(run.get("packed") for section in sections for run in section["runs"])


def markdown(report: dict) -> str:
    base = report["settings"]
    lines = [
        "# Training throughput against the machine's limit",
        "",
        environment_line(report["environment"]) + f" {report['seconds']} s in all.",
        "",
        f"Model {base['model_label']}, batch {base['batch']} sentences, max length {base['max_length']}, AdamW lr "
        f"{LEARNING_RATE}, seed {SEED}, {base['steps']} steps of which {base['warmup']} warm-up, device "
        f"{report.get('device', 'cpu')}{', bf16' if base.get('bf16') else ''}, {base['threads']} torch thread(s). "
        "FLOPs: 3 x (2 x matrix weights x tokens + 4 T^2 H per sequence and layer) per forward batch + the MLP "
        "head; useful = the sentences' own tokens, the padding share is what the forwards computed beyond them "
        "(ours: in length groups, 8 on a CPU, unless the name says 1group"
        + ("; packed, so the share is the layers' products', attention ran in the groups" if _packed(report) else "")
        + "). "
        "Fraction = useful FLOP/s / the matmul limit measured in the same process (bench/train_throughput.py's "
        "docstring).",
    ]
    if "versus" in report:
        section = report["versus"]
        cuda = any("cuda_max_allocated_mib" in e for e in section["summary"].values())
        lines += ["", f"## 1. Ours against sentence-transformers' SimCSE recipe ({section['mode']})", "",
                  "| configuration | sentences/s | vs st-mnrl | vs ours-cls | of the limit | padding | train adds MiB "
                  "| process peak MiB |" + (" CUDA peak MiB |" if cuda else ""),
                  "|---|---|---|---|---|---|---|---|" + ("---|" if cuda else "")]  # fmt: skip
        for name, e in section["summary"].items():
            lines.append(f"| {name} | {e['sentences_per_s']:.1f} | {e.get('throughput_vs_st-mnrl', 1.0):.3f} | "
                         f"{e.get('throughput_vs_ours-cls', 1.0):.3f} | {e['fraction_of_limit']:.1%} | "
                         f"{e['padding_share']:.1%} | {_memory_cells(e)} |")
        lines += ["", "Section 3 (memory) is the last columns: 'train adds' = peak resident set while training "
                  "minus the resident set when training began (VmHWM reset then); 'process peak' = ru_maxrss. "
                  f"GradCache: mini-batches of {base.get('cache_minibatch', CACHE_MINIBATCH)} sentences."
                  + (" All runs shared one process here, so a later run reuses the memory of earlier ones: these "
                     "memory columns mean something only in whole processes." if section["mode"] != WHOLE else "")]
    if "objectives" in report:
        section = report["objectives"]
        lines += ["", f"## 2. Every objective against InfoNCE ({section['mode']}; pooler cls, symmetric form)", "",
                  f"Target: step time <= {OBJECTIVE_TARGET}x InfoNCE's.", "",
                  "| objective | median step s | vs InfoNCE (median per round) | sentences/s | of the limit |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for name, e in section["summary"].items():
            ratio = e.get("step_vs_infonce", float("nan"))
            flag = "" if ratio <= OBJECTIVE_TARGET else " (over)"
            lines.append(f"| {name} | {e['median_step_s']:.4f} | {ratio:.3f}{flag} | {e['sentences_per_s']:.1f} | "
                         f"{e['fraction_of_limit']:.1%} |")
        rates = section["rates"]
        rate = rates.get(str(2 * base["batch"] * base["max_length"])) or next(iter(rates.values()))
        lines += ["", "Limit: " + limit_sentence(rate) + "."]
    if "compile" in report:
        section = report["compile"]
        lines += ["", f"## 4. --torch_compile (backend {section['backend']}) against eager, per objective", "",
                  "| objective | runs | new graphs | max loss diff | weight diff in updates: mean, max | median step "
                  "s eager / compiled |", "|---|---|---|---|---|---|"]  # fmt: skip
        for name, e in section["summary"].items():
            if not e["runs"]:
                lines.append(f"| {name} | no: {e['error']} | | | | |")
                continue
            steps = e["median_step_s"]
            lines.append(f"| {name} | {'yes, matches' if e['matches'] else 'yes, DIFFERS'} | {e['compiled_graphs']} | "
                         f"{e['max_abs_loss_diff']:.2e} | {e['mean_weight_diff_in_updates']:.1e}, "
                         f"{e['max_weight_diff_in_updates']:.1e} ({e['worst_tensor']}) | "
                         f"{steps['eager']:.4f} / {steps['compiled']:.4f} |")
    return "\n".join(lines) + "\n"


def settings(args) -> dict:
    return {"model": portable_name(args.model), "model_label": args.model_label, "batch": args.batch,
            "max_length": MAX_LENGTH, "steps": args.steps, "warmup": args.warmup, "threads": args.threads,
            "bf16": args.bf16, "cache_minibatch": args.cache_minibatch}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny encoder, 1 round, 5 steps: a smoke run")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--model", default=None, help="default all-MiniLM-L6-v2 (the bench extra)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=13)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--cache_minibatch", type=int, default=CACHE_MINIBATCH)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads in every run")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--compile_backend", default=None, help="torch.compile backend (default inductor; --quick: "
                        "aot_eager, graph capture and AOT autograd without the C++ compile)")
    parser.add_argument("--compile_objectives", nargs="+", choices=list(OBJECTIVES), default=None,
                        help="default all (--quick: the first two)")
    parser.add_argument("--name", default=None, help="results file stem (default train_throughput[_quick])")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--worker_out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.worker_out)
        return

    corpus, args.model, args.model_label = training_bench_inputs(args.quick, args.model)
    if args.quick:
        args.rounds, args.steps, args.warmup = 1, 5, 2
        args.compile_backend = args.compile_backend or "aot_eager"
        args.compile_objectives = args.compile_objectives or list(OBJECTIVES)[:2]
    args.compile_backend = args.compile_backend or "inductor"
    args.compile_objectives = args.compile_objectives or list(OBJECTIVES)
    base = {"model": args.model, "batch": args.batch, "max_length": MAX_LENGTH, "steps": args.steps,
            "warmup": args.warmup, "threads": args.threads, "bf16": args.bf16}  # fmt: skip
    report = {"environment": environment(), "settings": settings(args)}
    start = time.time()
    report.update(run_sections(args.sections, base, corpus, args.rounds, args.cache_minibatch, args.compile_backend,
                               args.compile_objectives, one_process=args.quick))
    report["seconds"] = round(time.time() - start)
    name = args.name or ("train_throughput_quick" if args.quick else "train_throughput")
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_report(RESULTS / name, report, markdown, echo=True)


if __name__ == "__main__":
    main()
