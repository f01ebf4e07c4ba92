"""FSDP and DeepSpeed ZeRO-2 / ZeRO-3 on GPUs: train.py under each shipped accelerate config, on 1 GPU and on 2 when
the machine has them, with the tiny built-in BERT and a BERT-base-shaped encoder (768 wide, 12 layers, random
weights, built here), and a check of every saved folder. Run by bench/gpu_scale.sh (which installs what it needs).

Each run: configs/debug_tiny.yaml's data (400 bundled sentences, the synthetic STS dev file), 6 steps, checkpoints and
STS-B dev every 3 steps, the best checkpoint loaded at the end, bf16 autocast (the configs' mixed_precision). Checks:
* the folder loads in sentence-transformers with SimCSEModel's embeddings (max abs difference < 1e-4), and in
  transformers with no missing or unexpected keys;
* its weights are trained (not the initial ones) and are the best checkpoint's;
* GradCache (--cache_minibatch_size 4) trains under FSDP and is refused with one line under DeepSpeed; LoRA
  (--lora_r 4) trains and saves under each engine; UnReMix with a learned mixture trains under FSDP and ZeRO-2;
* resume (tiny model, constant learning rate, no evaluation): a run stopped at step 3 and resumed from its
  checkpoint-3 ends near the uninterrupted run's weights (GPU kernels are not bitwise deterministic: the difference,
  relative to the training's update, is recorded and must stay below 5%).

    bash bench/gpu_scale.sh                 # results: bench/results/gpu_scale.{json,md}; ~30 launches, ~10 min
    python -m bench.gpu_scale --quick       # tiny model only, 1 GPU
    python -m bench.gpu_scale --cpu_check --out /tmp/x   # this script's own check on a machine without GPUs
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import RESULTS, ROOT, base_shaped_model, environment, write_report

ENGINES = {"fsdp": "fsdp.yaml", "zero2": "deepspeed_zero2.yaml", "zero3": "deepspeed_zero3.yaml"}
SENTENCES = ["A man is playing a guitar.", "The weather is cold today.", "Stocks fell sharply on Monday."]
BASE = ["--config", "configs/debug_tiny.yaml", "--max_steps", "6", "--save_steps", "3", "--eval_steps", "3",
        "--disable_tqdm", "true"]  # fmt: skip


# --cpu_check: scripts/sharded_cpu.py (train.py with accelerate's engines on CPU processes)
SCRIPT = ["train.py"]


def launch(engine: str, processes: int, args: list[str], log: Path) -> tuple[int, float, str]:
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(ROOT / "configs" / "accelerate" / ENGINES[engine]), "--num_processes", str(processes),
               *SCRIPT, *args]  # fmt: skip
    start = time.perf_counter()
    with open(log, "w") as f:
        code = subprocess.run(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    text = log.read_text(errors="replace")
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    return code, round(time.perf_counter() - start, 1), errors[-1] if errors else ""


def weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state = {f"encoder.{k}": v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}
    head = folder / "simcse_head.safetensors"
    if head.is_file():
        state.update({f"mlp.{k}": v.float() for k, v in load_file(str(head)).items()})
    return state


def check_folder(folder: Path, initial: dict[str, torch.Tensor]) -> dict:
    """What a user loads: the checks of the module docstring, as numbers and booleans."""
    import json

    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    from simcse_hn.modeling.loading import load_tokenizer
    from simcse_hn.modeling.model import SimCSEModel

    expected = SimCSEModel.from_pretrained(str(folder)).encode(SENTENCES, load_tokenizer(str(folder)))
    got = SentenceTransformer(str(folder), device="cpu").encode(SENTENCES, convert_to_tensor=True).float()
    _, info = AutoModel.from_pretrained(str(folder), output_loading_info=True)
    saved = weights(folder)
    state = json.loads(sorted(folder.glob("checkpoint-*/trainer_state.json"))[-1].read_text())
    best = state.get("best_model_checkpoint")
    same_as_best = None
    if best and Path(best).is_dir():
        best_weights = weights(Path(best))
        same_as_best = all(torch.equal(saved[k], best_weights[k]) for k in saved)
    trained = any(not torch.equal(saved[k], initial[k].float()) for k in saved if k in initial)
    result = {
        "st_max_abs_diff": float((got - expected).abs().max()),
        "missing_keys": len(info["missing_keys"]),
        "unexpected_keys": len(info["unexpected_keys"]),
        "trained": trained,
        "final_is_best_checkpoint": same_as_best,
    }
    result["ok"] = (result["st_max_abs_diff"] < 1e-4 and not result["missing_keys"] and not result["unexpected_keys"]
                    and trained and same_as_best is not False)  # fmt: skip
    return result


def initial_weights(model: str) -> dict[str, torch.Tensor]:
    from simcse_hn.modeling.model import SimCSEModel

    return {k: v.detach().clone() for k, v in SimCSEModel.from_pretrained(model).state_dict().items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, 1 GPU")
    parser.add_argument("--out", default=None, help="results folder (default bench/results)")
    parser.add_argument("--cpu_check", action="store_true",
                        help="check this script without GPUs: 2 CPU processes, a tiny model (scripts/sharded_cpu.py)")
    args = parser.parse_args()
    gpus = torch.cuda.device_count()
    if args.cpu_check:
        SCRIPT[:] = ["--mixed_precision", "no", "scripts/sharded_cpu.py"]
        args.quick = True
    elif gpus == 0:
        raise SystemExit("no GPU: accelerate runs FSDP and DeepSpeed on GPUs only (--cpu_check checks this script)")
    results_dir = Path(args.out) if args.out else RESULTS
    results_dir.mkdir(parents=True, exist_ok=True)
    runs, tmp = [], Path(tempfile.mkdtemp(prefix="gpu_scale_"))
    models = {"tiny": "builtin:tiny-bert"}
    if not args.quick:
        models["bert-base-shaped"] = base_shaped_model(tmp / "bert_base_shaped")
    processes = [2] if args.cpu_check else [1] if args.quick or gpus < 2 else [1, 2]
    n_max = processes[-1]

    def record(name: str, engine: str, n: int, code: int, seconds: float, error: str, extra: dict) -> None:
        entry = {"run": name, "engine": engine, "processes": n, "exit_code": code, "seconds": seconds, **extra}
        if error:
            entry["error"] = error
        runs.append(entry)
        print(entry, flush=True)

    for engine in ENGINES:
        for n in processes:
            for label, model in models.items():
                out = tmp / f"{engine}_{n}_{label}"
                code, seconds, error = launch(engine, n, [*BASE, "--model_name_or_path", model, "--output_dir",
                                                          str(out)], out.with_suffix(".log"))  # fmt: skip
                checks = check_folder(out, initial_weights(model)) if code == 0 else {"ok": False}
                record(f"train {label}", engine, n, code, seconds, error, checks)
        extras = {
            "gradcache": ["--cache_minibatch_size", "4"],
            "lora": ["--lora_r", "4", "--learning_rate", "1e-2"],
            "unremix_learned": ["--loss", "unremix", "--unremix_learn_mixture", "true"],
        }
        for name, flags in extras.items():
            out = tmp / f"{engine}_{name}"
            code, seconds, error = launch(engine, n_max, [*BASE, "--output_dir", str(out), *flags],
                                          out.with_suffix(".log"))  # fmt: skip
            refused = (name == "gradcache" and engine != "fsdp") or (name == "unremix_learned" and engine == "zero3")
            if refused:
                # train.py exits 2; the launcher reports a failed child as 1
                ok = code != 0 and error.startswith(("error: cache_minibatch_size:", "error: unremix_learn_mixture:"))
                record(name, engine, n_max, code, seconds, error, {"expected": "one-line error", "ok": ok})
            else:
                checks = check_folder(out, initial_weights("builtin:tiny-bert")) if code == 0 else {"ok": False}
                record(name, engine, n_max, code, seconds, error, checks)
        resume = ["--config", "configs/debug_tiny.yaml", "--save_steps", "3", "--eval_strategy", "no",
                  "--load_best_model_at_end", "false", "--lr_scheduler_type", "constant", "--disable_tqdm", "true"]
        straight, stopped = tmp / f"{engine}_straight", tmp / f"{engine}_stopped"
        total = 0.0
        steps = [(straight, ["--max_steps", "6"]), (stopped, ["--max_steps", "3"]),
                 (stopped, ["--max_steps", "6", "--resume_from_checkpoint", str(stopped / "checkpoint-3")])]
        code = 0
        for out, flags in steps:
            code, seconds, error = launch(engine, n_max, [*resume, "--output_dir", str(out), *flags],
                                          out.parent / f"{out.name}_{flags[1]}.log")  # fmt: skip
            total += seconds
            if code:
                break
        extra = {"ok": False}
        if code == 0:
            want, got = weights(straight), weights(stopped)
            start = initial_weights("builtin:tiny-bert")
            diff = torch.cat([(got[k] - want[k]).flatten() for k in want]).norm()
            update = torch.cat([(want[k] - start[k].float()).flatten() for k in want]).norm()
            extra = {"relative_to_update": float(diff / update), "ok": float(diff / update) < 0.05}
        record("resume", engine, n_max, code, round(total, 1), error if code else "", extra)

    device = torch.cuda.get_device_name(0) if gpus else "CPU (--cpu_check)"
    record_ = {"gpus": gpus, "gpu": device, "processes": processes, "runs": runs, **environment()}
    write_report(results_dir / "gpu_scale", record_, markdown)
    failed = [r for r in runs if not r["ok"]]
    print(f"{len(runs) - len(failed)} of {len(runs)} runs ok; logs in {tmp}")
    sys.exit(1 if failed else 0)


def markdown(record_: dict) -> str:
    """bench/results/gpu_scale.md (or --out's) from its record."""
    gpus, runs = record_["gpus"], record_["runs"]
    lines = ["# FSDP and DeepSpeed on GPUs (bench/gpu_scale.py)", "",
             f"{gpus} x {record_['gpu']}; commit {record_['commit']}; {record_['date']}.", "",
             "| engine | processes | run | ok | exit | s | notes |", "|---|---:|---|---|---:|---:|---|"]  # fmt: skip
    for r in runs:
        notes = {k: v for k, v in r.items() if k not in ("run", "engine", "processes", "ok", "exit_code", "seconds")}
        lines.append(f"| {r['engine']} | {r['processes']} | {r['run']} | {r['ok']} | {r['exit_code']} | "
                     f"{r['seconds']} | {notes} |")  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
