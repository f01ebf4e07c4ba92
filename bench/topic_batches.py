"""What topic batches cost and what they buy: k-means time and memory on the wiki slice, and how hard the batches are.

The corpus is shared/data/corpus/wiki1m_subset.txt (21,368 Wikipedia sentences), embedded once by all-MiniLM-L6-v2
(mean pooling, its sentence-transformers modules) on the CPU. For k = 24, 48 and 96 clusters,
simcse_hn.data.topic_batches. kmeans clusters the embeddings by torch (seeded k-means++ and 20 Lloyd iterations) and,
when faiss-cpu is installed, by faiss (faiss.Kmeans, spherical, the same iterations), each in a fresh process that
loads the embeddings first: wall time, and the peak resident memory above the resident size before the call (the
kernel's VmHWM, reset first; torch's allocations are invisible to tracemalloc, and a fresh heap keeps freed blocks of
earlier work from hiding them). Then a whole epoch of batches of 64: TopicBatchSampler's windows on the torch clusters
at share 1.0 and 0.5, against random batches (a seeded permutation cut in 64s). Per batch, on the eval-mode
embeddings: the mean cosine of an anchor to the other 63 (its negatives) and the hardest negative per anchor (its
largest such cosine), both averaged over anchors and batches; and SimCSE's unsupervised InfoNCE at temperature 0.05 on
two dropout views of each sentence (MiniLM in train mode, dropout 0.1, no gradient): cross-entropy of view 1 against
the batch's view 2 rows.

    python -m bench.topic_batches            # results: bench/results/topic_batches.{json,md}
    python -m bench.report bench/results/topic_batches.json   # the Markdown again from the JSON
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
import time

from bench.common import (
    RESULTS,
    SHARED_DATA,
    environment,
    environment_line,
    minilm_path,
    peak_rss_mib,
    reset_peak_rss,
    rss_mib,
    write_report,
)

CLUSTERS = (24, 48, 96)
BATCH = 64
SHARES = (1.0, 0.5)
TEMPERATURE = 0.05
SEED = 0


def dropout_views(model, texts: list[str], dim: int, seed: int, batch: int = 128):
    """(n, D) sentence embeddings of `texts` by a sentence-transformers `model` in train mode (dropout on)."""
    import torch

    torch.manual_seed(seed)
    model.train()
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths together: less padding
    rows = torch.empty(len(texts), dim)
    preprocess = getattr(model, "preprocess", None) or model.tokenize
    with torch.no_grad():
        for start in range(0, len(order), batch):
            index = order[start : start + batch]
            features = preprocess([texts[i] for i in index])
            rows[index] = model(features)["sentence_embedding"].float()
    model.eval()
    return rows


def kmeans_child(path: str, clusters: int, backend: str) -> None:
    """In a fresh process: load the embeddings, then time and measure one k-means; prints its JSON line."""
    import torch

    from simcse_hn.data.topic_batches import kmeans

    embeddings = torch.load(path)
    run = functools.partial(kmeans, embeddings, clusters, seed=SEED, use_faiss=backend == "faiss")
    assignment, seconds, mib = measured(run)
    sizes = torch.bincount(assignment, minlength=clusters)
    torch.save(assignment, f"{path}.{clusters}.{backend}")
    print(json.dumps({"clusters": clusters, "backend": backend, "seconds": seconds, "peak_extra_rss_mib": mib,
                      "smallest": int(sizes.min()), "largest": int(sizes.max())}))  # fmt: skip


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


def hardness(unit, views, windows) -> dict:
    """unit (n, D) normalised embeddings, views two (n, D) normalised dropout views; windows: lists of BATCH indices ->
    the means described in the docstring."""
    import torch

    index = torch.tensor(windows)  # (W, B)
    x = unit[index]  # (W, B, D)
    sim = x @ x.transpose(1, 2)  # (W, B, B)
    eye = torch.eye(index.shape[1], dtype=torch.bool)
    negatives = sim.masked_fill(eye, float("nan"))
    mean_negative = negatives.nanmean(dim=2)  # (W, B)
    hardest = sim.masked_fill(eye, -2.0).amax(dim=2)  # (W, B)
    z1, z2 = views[0][index], views[1][index]  # (W, B, D) each, unit rows
    logits = z1 @ z2.transpose(1, 2) / TEMPERATURE  # (W, B, B): anchor i's positive is column i
    targets = torch.arange(index.shape[1]).expand(index.shape[0], -1)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    return {"batches": len(windows), "mean_negative_cosine": round(float(mean_negative.mean()), 4),
            "hardest_negative_cosine": round(float(hardest.mean()), 4), "infonce_dropout_views": round(float(loss), 4)}


def main(limit: int | None = None) -> None:
    import torch

    from simcse_hn.data.topic_batches import TopicBatchSampler, faiss
    from simcse_hn.evaluation.encoding import load_encoder
    from simcse_hn.files import portable_name

    env = environment()
    corpus = SHARED_DATA / "corpus" / "wiki1m_subset.txt"
    texts = [line.strip() for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()][:limit]
    encode, info = load_encoder(minilm_path(), device="cpu")
    embeddings, encode_seconds, encode_mib = measured(lambda: encode(texts))  # (n, 384)
    print(f"encoded {len(texts)} sentences in {encode_seconds}s", flush=True)
    unit = torch.nn.functional.normalize(embeddings.float(), dim=-1)
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(minilm_path(), device="cpu")
    start = time.perf_counter()
    views = [dropout_views(model, texts, unit.shape[1], seed) for seed in (1, 2)]
    views = [torch.nn.functional.normalize(view, dim=-1) for view in views]
    print(f"two dropout views in {time.perf_counter() - start:.1f}s", flush=True)
    clustering, hard = [], []
    full = len(texts) // BATCH
    permutation = torch.randperm(len(texts), generator=torch.Generator().manual_seed(SEED))
    random_windows = permutation[: full * BATCH].view(full, BATCH).tolist()
    hard.append({"batches_from": "random", "clusters": None, "share": None, "mixed_windows": None,
                 **hardness(unit, views, random_windows)})  # fmt: skip
    print(hard[-1], flush=True)
    saved = RESULTS.parent.parent / "outputs" / "bench" / "topic_embeddings.pt"
    saved.parent.mkdir(parents=True, exist_ok=True)
    torch.save(embeddings, saved)
    for k in CLUSTERS:
        backends = ("torch", "faiss") if faiss is not None else ("torch",)
        for backend in backends:
            child = subprocess.run([sys.executable, "-m", "bench.topic_batches", "--kmeans-child", str(saved), str(k),
                                    backend], capture_output=True, text=True, check=True)  # fmt: skip
            clustering.append(json.loads(child.stdout.strip().splitlines()[-1]))
            print(clustering[-1], flush=True)
            assignment = torch.load(f"{saved}.{k}.{backend}")
            if backend != "torch":
                continue
            for share in SHARES:
                sampler = TopicBatchSampler(assignment, BATCH, share=share, seed=SEED)
                windows, order_seconds, _ = measured(sampler.epoch_windows)
                hard.append({"batches_from": "clusters", "clusters": k, "share": share,
                             "mixed_windows": sampler.mixed_windows, "order_seconds": order_seconds,
                             **hardness(unit, views, windows)})  # fmt: skip
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
    write_report(RESULTS / "topic_batches", record, markdown)


def _cell(value) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def markdown(record: dict) -> str:
    """bench/results/topic_batches.md from the measurements."""
    s = record["settings"]
    rows = ["| k | backend | seconds | peak extra RSS (MiB) | smallest cluster | largest cluster |",
            "|---:|---|---:|---:|---:|---:|"]  # fmt: skip
    for c in record["clustering"]:
        rows.append(f"| {c['clusters']} | {c['backend']} | {c['seconds']} | {c['peak_extra_rss_mib']} | "
                    f"{c['smallest']} | {c['largest']} |")  # fmt: skip
    hard = ["| batches | k | share | mixed windows | mean negative cosine | hardest negative | InfoNCE (dropout "
            "views) | ordering (s) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for h in record["hardness"]:
        hard.append(f"| {h['batches_from']} | {_cell(h['clusters'])} | {_cell(h['share'])} | "
                    f"{_cell(h['mixed_windows'])} | {h['mean_negative_cosine']} | {h['hardest_negative_cosine']} | "
                    f"{h['infonce_dropout_views']} | {_cell(h.get('order_seconds'))} |")  # fmt: skip
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
    return text


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, help="the first N sentences only (a quick look)")
    parser.add_argument("--kmeans-child", nargs=3, metavar=("EMBEDDINGS", "K", "BACKEND"), help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.kmeans_child:
        kmeans_child(arguments.kmeans_child[0], int(arguments.kmeans_child[1]), arguments.kmeans_child[2])
    else:
        main(arguments.sentences)
