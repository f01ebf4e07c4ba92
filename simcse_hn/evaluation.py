"""Encoding and STS scoring, shared by the trainer (STS-B dev) and eval/sts.py (the full suite).

The suite follows SentEval as SimCSE runs it: cosine similarity of the two sentence embeddings, Spearman x 100
against the gold scores. STS12-16 are several sub-files each, combined by `aggregation`:
  all    SimCSE: the sub-files' pairs pooled into one correlation (the paper's numbers; the default)
  mean   SentEval: the mean of the sub-files' correlations
  wmean  SentEval: their mean weighted by the number of pairs
STS-B and SICK-R are one file each, so every aggregation gives the same number. Every distinct sentence of the
whole suite is encoded once, in one call, so the encoder can batch the union by length.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from simcse_hn.data import STS_TASKS, DataError, STSPairs, STSTask

logger = logging.getLogger(__name__)

EncodeFn = Callable[[list[str]], Tensor]
AGGREGATIONS = ("all", "mean", "wmean")
AGGREGATION_HELP = {
    "all": "all (SimCSE: sub-files pooled, one correlation)",
    "mean": "mean (SentEval: mean of the sub-file correlations)",
    "wmean": "wmean (SentEval: mean of the sub-file correlations weighted by pairs)",
}
TASK_ALIASES = {name.lower().replace("-", ""): name for name in STS_TASKS} | {
    "stsbenchmark": "STS-B",
    "sick": "SICK-R",
    "sickrelatedness": "SICK-R",
}


def encode_unique(encode: EncodeFn, sentences: list[str]) -> dict[str, Tensor]:
    """Encode each distinct sentence once. -> {sentence: (D,) embedding}"""
    unique = list(dict.fromkeys(sentences))
    embeddings = encode(unique)  # (U, D)
    return dict(zip(unique, embeddings))


def cosine_scores(lookup: dict[str, Tensor], sentence1: list[str], sentence2: list[str]) -> Tensor:
    a = torch.stack([lookup[s] for s in sentence1]).double()
    b = torch.stack([lookup[s] for s in sentence2]).double()
    return F.cosine_similarity(a, b, dim=-1, eps=1e-12)


def spearman_x100(predictions, gold) -> float:
    from scipy.stats import spearmanr  # here, so that eval/sts.py reports a bad task file before SciPy loads

    return float(spearmanr(predictions, gold).statistic) * 100


def sts_spearman(encode: EncodeFn, sentence1: list[str], sentence2: list[str], scores: list[float]) -> float:
    """Spearman x 100 between gold scores and the cosine similarity of the two sentences' embeddings."""
    lookup = encode_unique(encode, sentence1 + sentence2)
    return spearman_x100(cosine_scores(lookup, sentence1, sentence2).numpy(), scores)


# --- the full suite ---


def parse_tasks(spec: str) -> list[str]:
    """'all' or a comma-separated list ('sts12,stsb,sick-r', any case) -> task names in the paper's order."""
    if spec.strip().lower() == "all":
        return list(STS_TASKS)
    names = set()
    for item in spec.split(","):
        key = item.strip().lower().replace("-", "").replace("_", "")
        if key not in TASK_ALIASES:
            raise ValueError(f"unknown STS task {item.strip()!r}; choose from all, {', '.join(STS_TASKS)}")
        names.add(TASK_ALIASES[key])
    return [name for name in STS_TASKS if name in names]


def check_aggregation(tasks: Sequence[STSTask], aggregation: str) -> None:
    """Fail before encoding when `aggregation` cannot be computed on these tasks."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    for task in tasks:
        if aggregation != "all" and task.multi_file and not task.labelled:
            raise DataError(
                f"{task.source}: {task.name} pairs carry no 'subset' (sub-file) labels, so --aggregation "
                f"{aggregation} cannot be computed; use --aggregation all or a local data folder"
            )


def encode_union(encode: EncodeFn, tasks: Sequence[STSTask]) -> tuple[Tensor, dict[str, int]]:
    """One `encode` call over every distinct sentence of `tasks`. -> embeddings (U, D), {sentence: row}"""
    index: dict[str, int] = {}
    for task in tasks:
        for pairs in task.subsets.values():
            for sentence in pairs.sentence1 + pairs.sentence2:
                index.setdefault(sentence, len(index))
    embeddings = encode(list(index))  # (U, D)
    if embeddings.shape[0] != len(index):
        raise ValueError(f"encode returned {embeddings.shape[0]} embeddings for {len(index)} sentences")
    return embeddings, index


def pair_cosines(embeddings: Tensor, index: dict[str, int], pairs: STSPairs) -> np.ndarray:
    """Cosine similarity of each pair, in float64 so that near-ties rank as the exact values do. -> (n,)"""
    a = embeddings[[index[s] for s in pairs.sentence1]].double()  # (n, D)
    b = embeddings[[index[s] for s in pairs.sentence2]].double()  # (n, D)
    return F.cosine_similarity(a, b, dim=-1, eps=1e-12).numpy()


def score_sts_tasks(encode: EncodeFn, tasks: Sequence[STSTask], aggregation: str = "all") -> dict:
    """Score `tasks` with one encode call over their union.

    -> {"aggregation", "tasks": {name: {"spearman", "pairs", "subsets": {sub-file: {"spearman", "pairs"}}}},
        "average"}: the scoring part of results.json (see `sts_results`).
    """
    check_aggregation(tasks, aggregation)
    embeddings, index = encode_union(encode, tasks)
    scored = {}
    for task in tasks:
        cosines = {name: pair_cosines(embeddings, index, pairs) for name, pairs in task.subsets.items()}
        subsets = {
            name: {"spearman": spearman_x100(cosines[name], pairs.scores), "pairs": len(pairs.scores)}
            for name, pairs in task.subsets.items()
        }
        if aggregation == "all" or not task.multi_file:
            gold = [score for pairs in task.subsets.values() for score in pairs.scores]
            spearman = spearman_x100(np.concatenate(list(cosines.values())), gold)
        elif aggregation == "mean":
            spearman = float(np.mean([s["spearman"] for s in subsets.values()]))
        else:
            values = [s["spearman"] for s in subsets.values()]
            spearman = float(np.average(values, weights=[s["pairs"] for s in subsets.values()]))
        scored[task.name] = {"spearman": spearman, "pairs": task.pairs, "subsets": subsets}
    average = float(np.mean([t["spearman"] for t in scored.values()])) if scored else float("nan")
    return {"aggregation": aggregation, "tasks": scored, "average": average}


def package_versions() -> dict[str, str]:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    versions = {"python": platform.python_version()}
    for name in ("simcse-hn", "torch", "transformers", "sentence-transformers", "datasets", "scipy", "numpy"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def sts_results(
    scores: dict, model: str, pooler: str | None, sickr_all: bool = False, settings: dict | None = None
) -> dict:
    """The results.json record (also the model folder's sts_results.json; hub.py's model card reads it)."""
    from datetime import datetime, timezone

    return {
        "model": model,
        "pooler": pooler,
        "aggregation": scores["aggregation"],
        "sickr_pairs": "all" if sickr_all else "test",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": package_versions(),
        "settings": settings or {},
        "tasks": scores["tasks"],
        "average": scores["average"],
    }


# --- encoders: a SimCSEModel (saved folder, Hub id, builtin) or any sentence-transformers model ---


def _has_file(name_or_path: str, filename: str) -> bool:
    if os.path.isdir(name_or_path):
        return os.path.isfile(os.path.join(name_or_path, filename))
    try:  # a Hub id: the cache offline, the Hub online
        from huggingface_hub import hf_hub_download

        hf_hub_download(name_or_path, filename)
        return True
    except Exception:
        return False


def encoder_backend(name_or_path: str, pooler: str | None = None) -> str:
    """'simcse' when a pooler is given or the model was saved by SimCSEModel (its own pooler, any of the five);
    'sentence-transformers' for other folders or Hub ids with modules.json; otherwise 'simcse' (pooler `cls`)."""
    from simcse_hn.modeling import SIMCSE_CONFIG, TINY_MODEL

    if pooler is not None or name_or_path == TINY_MODEL or _has_file(name_or_path, SIMCSE_CONFIG):
        return "simcse"
    if _has_file(name_or_path, "modules.json"):
        return "sentence-transformers"
    logger.warning("%s: neither simcse_config.json nor modules.json; using SimCSEModel's default pooler", name_or_path)
    return "simcse"


def token_length_batches(
    encode_batch: EncodeFn,
    tokenizer,
    batch_size: int,
    max_length: int | None = None,
    show_progress_bar: bool = False,
) -> EncodeFn:
    """An encoder that feeds `encode_batch` batches of equal token length, longest first, and restores the order.

    Encoders sort by character count (SimCSEModel.encode, SentenceTransformer.encode); on the STS suite that leaves
    a third of the tokens in a batch as padding (MiniLM's tokenizer, batch 32), token counts under 1 %. Tokenising
    twice costs a few seconds on the whole suite.
    """

    def encode(sentences: list[str]) -> Tensor:
        if not sentences:
            return encode_batch(sentences)
        input_ids = tokenizer(sentences, truncation=True, max_length=max_length)["input_ids"]
        order = sorted(range(len(sentences)), key=lambda i: -len(input_ids[i]))
        batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
        if show_progress_bar:
            from tqdm.auto import tqdm

            batches = tqdm(batches, desc="encoding", unit="batch")
        embeddings = torch.cat([encode_batch([sentences[i] for i in batch]) for batch in batches])  # (n, D), sorted
        out = torch.empty_like(embeddings)
        out[torch.tensor(order)] = embeddings
        return out

    return encode


def simcse_encode_fn(
    model, tokenizer, batch_size: int = 128, max_length: int | None = None, show_progress_bar: bool = False
) -> EncodeFn:
    def encode_batch(sentences: list[str]) -> Tensor:
        return model.encode(sentences, tokenizer, batch_size=max(len(sentences), 1), max_length=max_length)

    return token_length_batches(encode_batch, tokenizer, batch_size, max_length, show_progress_bar)


def sentence_transformers_encode_fn(model, batch_size: int = 128, show_progress_bar: bool = False) -> EncodeFn:
    def encode_batch(sentences: list[str]) -> Tensor:
        embeddings = model.encode(
            sentences, batch_size=max(len(sentences), 1), show_progress_bar=False, convert_to_tensor=True
        )  # (n, D)
        return embeddings.float().cpu()

    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:  # a model without a text tokenizer: its own batching
        return lambda sentences: (
            model.encode(sentences, batch_size=batch_size, show_progress_bar=show_progress_bar, convert_to_tensor=True)
            .float()
            .cpu()
        )
    return token_length_batches(encode_batch, tokenizer, batch_size, model.max_seq_length, show_progress_bar)


def load_encoder(
    name_or_path: str,
    pooler: str | None = None,
    device: str | None = None,
    batch_size: int = 128,
    max_seq_length: int | None = None,
    show_progress_bar: bool = False,
) -> tuple[EncodeFn, dict]:
    """-> (encode, info): info holds "backend", "pooler" (None for sentence-transformers) and "modules"."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if encoder_backend(name_or_path, pooler) == "sentence-transformers":
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(name_or_path, device=device)
        if max_seq_length is not None:
            model.max_seq_length = max_seq_length
        modules = [type(module).__name__ for module in model]
        info = {"backend": "sentence-transformers", "pooler": None, "modules": modules, "device": device}
        return sentence_transformers_encode_fn(model, batch_size, show_progress_bar), info

    from simcse_hn.modeling import SimCSEModel, load_tokenizer

    model = SimCSEModel.from_pretrained(name_or_path, pooler=pooler).to(device)
    tokenizer = load_tokenizer(name_or_path)
    info = {"backend": "simcse", "pooler": model.pooler, "modules": None, "device": device}
    return simcse_encode_fn(model, tokenizer, batch_size, max_seq_length, show_progress_bar), info


# --- reports: the SimCSE paper's table and a bar chart, for one run or several side by side ---


def _task_columns(runs: Sequence[tuple[str, dict]]) -> list[str]:
    present = {name for _, results in runs for name in results["tasks"]}
    return [name for name in STS_TASKS if name in present]


def model_label(name_or_path: str) -> str:
    """A short row label: a local folder's name, or the Hub id."""
    return os.path.basename(os.path.normpath(name_or_path)) if os.path.isdir(name_or_path) else name_or_path


def protocol(results: dict) -> str:
    sickr = "SICK-R all 9,927 pairs (MTEB)" if results.get("sickr_pairs") == "all" else "SICK-R test (SimCSE)"
    return f"aggregation {results['aggregation']}, {sickr}"


def results_table(runs: Sequence[tuple[str, dict]]) -> str:
    """Markdown table in the SimCSE paper's layout: one row per (label, results), Spearman x 100, two decimals."""
    columns = _task_columns(runs)
    protocols = {protocol(results) for _, results in runs}
    header = ["Model", *columns, "Avg."] + (["Protocol"] if len(protocols) > 1 else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join([":---"] + ["---:"] * (len(columns) + 1)) + "|"]
    if len(protocols) > 1:
        lines[1] += ":---|"
    for label, results in runs:
        cells = [f"{results['tasks'][c]['spearman']:.2f}" if c in results["tasks"] else "–" for c in columns]
        row = [label, *cells, f"{results['average']:.2f}"] + ([protocol(results)] if len(protocols) > 1 else [])
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def results_markdown(results: dict, label: str | None = None) -> str:
    """results.md: the paper-layout table, the protocol, and each task's sub-file scores."""
    label = label or model_label(results["model"])
    aggregation = AGGREGATION_HELP[results["aggregation"]]
    pooler = results.get("pooler") or "the model's own sentence-transformers modules"
    sickr = (
        "all 9,927 pairs (MTEB's protocol, not SimCSE's)"
        if results.get("sickr_pairs") == "all"
        else "the 4,927 test pairs (SimCSE)"
    )
    lines = [
        f"# STS results: {label}",
        "",
        results_table([(label, results)]),
        f"Spearman x 100 of cosine similarities. Aggregation of STS12-16 sub-files: {aggregation}. "
        f"STS-B: test. SICK-R: {sickr}. Pooler: {pooler}. "
        f"Date: {results['date']}.",
        "",
    ]
    for name, task in results["tasks"].items():
        lines += [f"## {name}: {task['spearman']:.2f} ({task['pairs']:,} pairs)", ""]
        lines += ["| Sub-file | Pairs | Spearman |", "|:---|---:|---:|"]
        lines += [f"| {sub} | {s['pairs']:,} | {s['spearman']:.2f} |" for sub, s in task["subsets"].items()]
        lines.append("")
    return "\n".join(lines)


def plot_results(runs: Sequence[tuple[str, dict]], path: str, title: str | None = None) -> None:
    """Grouped bar chart (tasks + Avg. on the x axis, one bar per run), written with the Agg canvas so that no
    pyplot state or display backend is touched."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    columns = _task_columns(runs)
    labels = [
        c + (" (all)" if c == "SICK-R" and any(r.get("sickr_pairs") == "all" for _, r in runs) else "")
        for c in columns
    ] + ["Avg."]
    x = np.arange(len(labels))
    width = 0.8 / len(runs)
    figure = Figure(figsize=(max(8, 1.1 * len(labels) + 0.4 * len(runs)), 4.5))
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    for k, (label, results) in enumerate(runs):
        values = [results["tasks"][c]["spearman"] if c in results["tasks"] else np.nan for c in columns]
        bars = ax.bar(x + (k - (len(runs) - 1) / 2) * width, values + [results["average"]], width, label=label)
        if len(runs) <= 3:
            ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
    ax.set_xticks(x, labels)
    ax.set_ylabel("Spearman x 100")
    finite = [r["tasks"][c]["spearman"] for _, r in runs for c in columns if c in r["tasks"]]
    low = min([0.0] + [v for v in finite if np.isfinite(v)])
    ax.set_ylim(low, 100)
    ax.set_title(title or f"STS ({', '.join(sorted({protocol(r) for _, r in runs}))})", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    if len(runs) > 1:
        ax.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
