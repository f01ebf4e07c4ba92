"""What topic batches cost and what they buy: k-means time and memory on the wiki slice, and how hard the batches are.

The corpus is shared/data/corpus/wiki1m_subset.txt (21,368 Wikipedia sentences), embedded once by all-MiniLM-L6-v2
(mean pooling, its sentence-transformers modules) on the CPU. For k = 24, 48 and 96 clusters, simcse_hn.topic_batches.
kmeans clusters the embeddings by torch (seeded k-means++ and 20 Lloyd iterations) and, when faiss-cpu is installed, by
faiss (faiss.Kmeans, spherical, the same iterations): wall time, and the peak resident memory above the resident size
before the call (the kernel's VmHWM, reset first; torch's allocations are invisible to tracemalloc). Then a whole
epoch of batches of 64: TopicBatchSampler's windows on the torch clusters at share 1.0 and 0.5, against random
batches (a seeded permutation cut in 64s). Per batch, on the MiniLM embeddings: the mean cosine of an anchor to the
other 63 (its negatives), the hardest negative per anchor (its largest such cosine), both averaged over anchors and
batches; and InfoNCE at temperature 0.05 with each anchor's positive at cosine 1 (a perfect positive, so the loss is
log(1 + sum_j exp((s_ij - 1) / 0.05)): the part of the loss its negatives make).

    python bench/topic_batches.py            # results: bench/results/topic_batches.{json,md}
    python bench/topic_batches.py --report   # the Markdown again from the JSON
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    RESULTS,
    SHARED_DATA,
    environment,
    environment_line,
    minilm_path,
    peak_rss_mib,
    reset_peak_rss,
    rss_mib,
    write_json,
)

CLUSTERS = (24, 48, 96)
BATCH = 64
SHARES = (1.0, 0.5)
TEMPERATURE = 0.05
SEED = 0


def measured(call):
    """call() -> (its result, wall seconds, peak resident MiB above the resident size before it)."""
    import gc

    gc.collect()
    reset_peak_rss()
    before = rss_mib()
    start = time.perf_counter()
    result = call()
    seconds = time.perf_counter() - start
    return result, round(seconds, 2), round(peak_rss_mib() - before, 1)


def hardness(unit, windows) -> dict:
    """unit (n, D) normalised embeddings; windows: lists of BATCH indices -> the means described in the docstring."""
    import torch

    index = torch.tensor(windows)  # (W, B)
    x = unit[index]  # (W, B, D)
    sim = x @ x.transpose(1, 2)  # (W, B, B)
    eye = torch.eye(index.shape[1], dtype=torch.bool)
    negatives = sim.masked_fill(eye, float("nan"))
    mean_negative = negatives.nanmean(dim=2)  # (W, B)
    hardest = sim.masked_fill(eye, -2.0).amax(dim=2)  # (W, B)
    loss = torch.logsumexp(((sim - 1.0) / TEMPERATURE).masked_fill(eye, 0.0), dim=2)  # log(1 + sum_j ...) (W, B)
    return {"batches": len(windows), "mean_negative_cosine": round(float(mean_negative.mean()), 4),
            "hardest_negative_cosine": round(float(hardest.mean()), 4),
            "infonce_perfect_positive": round(float(loss.mean()), 4)}  # fmt: skip


def main() -> None:
    import torch

    from simcse_hn.evaluation import load_encoder
    from simcse_hn.files import portable_name
    from simcse_hn.topic_batches import TopicBatchSampler, faiss, kmeans

    env = environment()
    corpus = SHARED_DATA / "corpus" / "wiki1m_subset.txt"
    texts = [line.strip() for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    encode, info = load_encoder(minilm_path(), device="cpu")
    embeddings, encode_seconds, encode_mib = measured(lambda: encode(texts))  # (n, 384)
    print(f"encoded {len(texts)} sentences in {encode_seconds}s", flush=True)
    unit = torch.nn.functional.normalize(embeddings.float(), dim=-1)
    clustering, hard = [], []
    full = len(texts) // BATCH
    permutation = torch.randperm(len(texts), generator=torch.Generator().manual_seed(SEED))
    random_windows = permutation[: full * BATCH].view(full, BATCH).tolist()
    hard.append({"batches_from": "random", "clusters": None, "share": None, "mixed_windows": None,
                 **hardness(unit, random_windows)})  # fmt: skip
    print(hard[-1], flush=True)
    for k in CLUSTERS:
        backends = ("torch", "faiss") if faiss is not None else ("torch",)
        for backend in backends:
            run = functools.partial(kmeans, embeddings, k, seed=SEED, use_faiss=backend == "faiss")
            assignment, seconds, mib = measured(run)
            sizes = torch.bincount(assignment, minlength=k)
            clustering.append({"clusters": k, "backend": backend, "seconds": seconds, "peak_extra_rss_mib": mib,
                               "smallest": int(sizes.min()), "largest": int(sizes.max())})  # fmt: skip
            print(clustering[-1], flush=True)
            if backend != "torch":
                continue
            for share in SHARES:
                sampler = TopicBatchSampler(assignment, BATCH, share=share, seed=SEED)
                windows, order_seconds, _ = measured(sampler.epoch_windows)
                hard.append({"batches_from": "clusters", "clusters": k, "share": share,
                             "mixed_windows": sampler.mixed_windows, "order_seconds": order_seconds,
                             **hardness(unit, windows)})  # fmt: skip
                print(hard[-1], flush=True)
    record = {
        "settings": {"corpus": portable_name(str(corpus)), "sentences": len(texts), "model": portable_name(
            minilm_path()), "backend": info["backend"], "max_seq_length": info["max_seq_length"], "batch": BATCH,
            "temperature": TEMPERATURE, "seed": SEED, "lloyd_iterations": 20, "faiss": faiss is not None and
            getattr(faiss, "__version__", "installed")},  # fmt: skip
        "encode": {"seconds": encode_seconds, "peak_extra_rss_mib": encode_mib},
        "clustering": clustering, "hardness": hard, "load_average_after": [round(x, 2) for x in os.getloadavg()],
        **env,
    }  # fmt: skip
    write_json(RESULTS / "topic_batches.json", record)
    write_report(record)


def _cell(value) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def write_report(record: dict) -> None:
    """bench/results/topic_batches.md from the measurements."""
    s = record["settings"]
    rows = ["| k | backend | seconds | peak extra RSS (MiB) | smallest cluster | largest cluster |",
            "|---:|---|---:|---:|---:|---:|"]  # fmt: skip
    for c in record["clustering"]:
        rows.append(f"| {c['clusters']} | {c['backend']} | {c['seconds']} | {c['peak_extra_rss_mib']} | "
                    f"{c['smallest']} | {c['largest']} |")  # fmt: skip
    hard = ["| batches | k | share | mixed windows | mean negative cosine | hardest negative | InfoNCE (perfect "
            "positive) | ordering (s) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for h in record["hardness"]:
        hard.append(f"| {h['batches_from']} | {_cell(h['clusters'])} | {_cell(h['share'])} | "
                    f"{_cell(h['mixed_windows'])} | {h['mean_negative_cosine']} | {h['hardest_negative_cosine']} | "
                    f"{h['infonce_perfect_positive']} | {_cell(h.get('order_seconds'))} |")  # fmt: skip
    encode = record["encode"]
    text = (
        "# Topic batches: clustering cost and batch hardness\n\n" + __doc__.split("\n\n")[1] + "\n\n"
        f"{s['sentences']:,} sentences of {s['corpus']}, encoded by {s['model']} ({s['backend']}, max length "
        f"{s['max_seq_length']}) in {encode['seconds']} s (peak {encode['peak_extra_rss_mib']} MiB above the "
        f"resident size before). faiss: {s['faiss'] or 'not installed'}.\n\n## Clustering\n\n" + "\n".join(rows)
        + f"\n\n## Batches of {s['batch']} (one epoch, {record['hardness'][0]['batches']} batches)\n\n"
        + "\n".join(hard) + f"\n\n{environment_line(record)} Load average after: "
        f"{', '.join(map(str, record['load_average_after']))}.\n"
    )  # fmt: skip
    (RESULTS / "topic_batches.md").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", action="store_true", help="only write the Markdown again from the JSON")
    if parser.parse_args().report:
        write_report(json.loads((RESULTS / "topic_batches.json").read_text(encoding="utf-8")))
    else:
        main()
