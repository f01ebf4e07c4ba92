"""Encoding and STS scoring, shared by the trainer (STS-B dev) and eval/sts.py (the full suite).

The suite follows SentEval as SimCSE runs it: cosine similarity of the two sentence embeddings, Spearman x 100
against the gold scores. STS12-16 are several sub-files each, combined by `aggregation`:
  all    SimCSE: the sub-files' pairs pooled into one correlation (the paper's numbers; the default)
  mean   SentEval: the mean of the sub-files' correlations
  wmean  SentEval: their mean weighted by the number of pairs
STS-B and SICK-R are one file each, so every aggregation gives the same number. Every distinct sentence of the
whole suite is encoded once, in one call, so the encoder can batch the union by length.

Every correlation goes through the project's `evaluate` metric (sts_metric.py; `evaluate.load(STS_METRIC)` gives it
to anyone). eval/sts.py also measures alignment and uniformity on STS-B dev (analysis.py) from the same encode call
and saves each pair's cosine (`save_predictions`) for paired tests between runs (eval/compare.py).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from simcse_hn.data import STS_TASKS, DataError, STSPairs, STSTask
from simcse_hn.files import is_generic_folder, portable_name

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


STS_METRIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sts_metric.py")


@functools.cache
def sts_metric():
    """The project's STS metric, an `evaluate.Metric` (sts_metric.py), made once per process and kept in memory.

    The class is instantiated from the package rather than through `evaluate.load(STS_METRIC)` (which gives the same
    metric, offline too): load copies the script into the modules cache and imports the copy, a writable cache the
    suite does not need. Imported here, not at the top, so that eval/sts.py reports a bad task file before `evaluate`
    (and `datasets`) load.
    """
    from simcse_hn.sts_metric import STSMetric

    return STSMetric(keep_in_memory=True)


def spearman_x100(predictions, gold) -> float:
    """Spearman x 100 of predictions (float64 kept) against gold scores, through `sts_metric()`, each side passed as
    one row (the metric's list form) so that `evaluate` converts the arrays whole."""
    predictions = np.asarray(predictions, dtype=np.float64)
    gold = np.asarray(gold, dtype=np.float64)
    return sts_metric().compute(predictions=[predictions], references=[gold])["spearman"]


def sts_spearman(encode: EncodeFn, sentence1: list[str], sentence2: list[str], scores: list[float]) -> float:
    """Spearman x 100 between gold scores and the cosine similarity of the two sentences' embeddings."""
    lookup = encode_unique(encode, sentence1 + sentence2)
    return spearman_x100(cosine_scores(lookup, sentence1, sentence2).numpy(), scores)


def sts_dev_metrics(
    embeddings: Tensor, index: dict[str, int], pairs: STSPairs, device: str | torch.device | None = None
) -> dict[str, float]:
    """What an in-training evaluation logs, from the dev sentences' embeddings (U, D) and {sentence: row}:
    {"stsb_spearman", "alignment", "uniformity"}, the last two under SimCSE's protocol (analysis.py, computed on
    `device`), left out when no dev pair is above its threshold."""
    from simcse_hn.analysis import alignment_uniformity_encoded, positive_pairs

    metrics = {"stsb_spearman": spearman_x100(pair_cosines(embeddings, index, pairs), pairs.scores)}
    if positive_pairs(pairs):
        geometry = alignment_uniformity_encoded(embeddings, index, pairs, device=device)
        metrics.update(alignment=geometry["alignment"], uniformity=geometry["uniformity"])
    return metrics


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


def encode_union(
    encode: EncodeFn, tasks: Sequence[STSTask], extra: Iterable[str] = ()
) -> tuple[Tensor, dict[str, int]]:
    """One `encode` call over every distinct sentence of `tasks`, then those of `extra` not among them (e.g. STS-B
    dev for alignment and uniformity: most of its sentences recur in the suite). -> embeddings (U, D), {sentence: row}
    """
    index: dict[str, int] = {}
    for task in tasks:
        for pairs in task.subsets.values():
            for sentence in pairs.sentence1 + pairs.sentence2:
                index.setdefault(sentence, len(index))
    for sentence in extra:
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
    return score_encoded_tasks(embeddings, index, tasks, aggregation)[0]


def score_encoded_tasks(
    embeddings: Tensor, index: dict[str, int], tasks: Sequence[STSTask], aggregation: str = "all"
) -> tuple[dict, dict[str, dict[str, np.ndarray]]]:
    """`score_sts_tasks` on embeddings (U, D) already computed (`encode_union`), plus every pair's prediction.

    -> (scores as score_sts_tasks, predictions {task: {"cosine": (n,) float64, "gold": (n,) float64, "subset": (n,)
    str}}), a task's pairs in the order of its sub-files (see `save_predictions`).
    """
    scored, predictions = {}, {}
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
        predictions[task.name] = {
            "cosine": np.concatenate(list(cosines.values())),
            "gold": np.asarray([score for pairs in task.subsets.values() for score in pairs.scores], np.float64),
            "subset": np.asarray([name for name, pairs in task.subsets.items() for _ in pairs.scores], dtype=str),
        }
    average = float(np.mean([t["spearman"] for t in scored.values()])) if scored else float("nan")
    return {"aggregation": aggregation, "tasks": scored, "average": average}, predictions


# predictions.npz beside results.json: for each task T, three arrays of its n pairs, in the order of its sub-files
# in results.json ("T/cosine" float64, "T/gold" float64, "T/subset" unicode: the pair's sub-file), nothing pickled.
PREDICTIONS = "predictions.npz"


def save_predictions(path: str, predictions: dict[str, dict[str, np.ndarray]]) -> None:
    arrays = {f"{task}/{key}": value for task, columns in predictions.items() for key, value in columns.items()}
    np.savez_compressed(path, **arrays)


def load_predictions(path: str) -> dict[str, dict[str, np.ndarray]]:
    """-> {task: {"cosine", "gold", "subset"}} as `score_encoded_tasks` returns them."""
    predictions: dict[str, dict[str, np.ndarray]] = {}
    with np.load(path, allow_pickle=False) as data:
        for key in data.files:
            task, _, column = key.rpartition("/")
            predictions.setdefault(task, {})[column] = data[key]
    for task, columns in predictions.items():
        if set(columns) != {"cosine", "gold", "subset"} or len({len(v) for v in columns.values()}) != 1:
            raise DataError(f"{path}: {task}: expected cosine, gold and subset arrays of one length")
    return predictions


def package_versions() -> dict[str, str]:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    versions = {"python": platform.python_version()}
    names = ("simcse-hn", "torch", "transformers", "sentence-transformers", "datasets", "evaluate", "scipy", "numpy")
    for name in names:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def sts_results(
    scores: dict,
    model: str,
    pooler: str | None,
    sickr_all: bool = False,
    settings: dict | None = None,
    alignment_uniformity: dict | None = None,
    training: dict | None = None,
) -> dict:
    """The results.json record (also the model folder's sts_results.json; hub.py's model card reads it).

    `alignment_uniformity`: analysis.alignment_uniformity_encoded's record (None when STS-B dev was not there);
    `training`: the evaluated folder's simcse_config.json (loss, loss_kwargs, contrast_form, seed, ...), None for
    a model this project did not train, so that a results file says what it measures by itself. Models, data and
    files are named as `files.portable_name` names them (no machine's absolute path).
    """
    from datetime import datetime, timezone

    settings = dict(settings or {})
    if "data" in settings:
        settings["data"] = portable_name(settings["data"])
    if "sources" in settings:
        settings["sources"] = {task: portable_name(source) for task, source in settings["sources"].items()}
    if alignment_uniformity and "source" in alignment_uniformity:
        alignment_uniformity = {**alignment_uniformity, "source": portable_name(alignment_uniformity["source"])}
    return {
        "model": portable_name(model),
        "pooler": pooler,
        "aggregation": scores["aggregation"],
        "sickr_pairs": "all" if sickr_all else "test",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": package_versions(),
        "settings": settings,
        "training": training,
        "tasks": scores["tasks"],
        "average": scores["average"],
        "alignment_uniformity": alignment_uniformity,
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
    from simcse_hn.modeling import BUILTIN_MODELS, SIMCSE_CONFIG

    if pooler is not None or name_or_path in BUILTIN_MODELS or _has_file(name_or_path, SIMCSE_CONFIG):
        return "simcse"
    if _has_file(name_or_path, "modules.json"):
        return "sentence-transformers"
    logger.warning("%s: neither simcse_config.json nor modules.json; using SimCSEModel's default pooler", name_or_path)
    return "simcse"


def token_length_batches(
    encode_batch: Callable[[list[str]], Tensor],
    tokenizer,
    batch_size: int,
    max_length: int | None = None,
    show_progress_bar: bool = False,
) -> EncodeFn:
    """An encoder that feeds `encode_batch` batches of equal token length, longest first, and restores the order.

    Encoders sort by character count (SentenceTransformer.encode); on the STS suite that leaves a third of the tokens
    in a batch as padding (MiniLM's tokenizer, batch 32), token counts under 1 %. This tokenises once for the order,
    and `encode_batch` tokenises again: the price of calling an encoder that takes text.
    """
    from simcse_hn.modeling import map_batches, restore_order, token_length_order

    def encode(sentences: list[str]) -> Tensor:
        if not sentences:
            return encode_batch(sentences)
        _, batches = token_length_order(tokenizer, sentences, batch_size, max_length)
        texts = [[sentences[i] for i in batch] for batch in batches]
        pieces = map_batches(encode_batch, texts, None, show_progress_bar)  # one batch after the other
        return restore_order(torch.cat(pieces), [i for batch in batches for i in batch])

    return encode


def trim_padding(features: dict, rows: Tensor, width: int, side: str, group: int, padded: int) -> dict:
    """The features of `rows` of a batch of `group` texts padded to `padded` positions, cut to `width` positions on
    the padding `side`: what the tokenizer gives for those rows alone when `width` is their longest. A tensor is
    (group, padded, ...) -> (len(rows), width, ...) or (group, ...) -> (len(rows), ...); anything else is shared."""
    out = {}
    for key, value in features.items():
        if isinstance(value, Tensor) and value.dim() >= 2 and value.shape[:2] == (group, padded):
            value = value[rows]
            out[key] = value[:, :width] if side == "right" else value[:, padded - width :]
        elif isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == group:
            out[key] = value[rows]
        else:
            out[key] = value
    return out


def _padding_side(mask: Tensor, lengths: Tensor) -> str | None:
    """'right' or 'left' when every row of an attention mask (B, T) is its real tokens on one side and padding on the
    other; None otherwise (a mask with holes, a packed batch), so that the features are not cut."""
    positions = torch.arange(mask.shape[1])  # (T,)
    if torch.equal(mask.bool(), positions < lengths[:, None]):
        return "right"
    if torch.equal(mask.bool(), positions >= mask.shape[1] - lengths[:, None]):
        return "left"
    return None


def iter_prepared_batches(
    prepare: Callable[[list[str]], dict], sentences: list[str], batch_size: int, group_size: int = 4096
) -> Iterator[tuple[list[int], dict]]:
    """Features for batches of equal token length, each text tokenised once by the model's own `prepare` (e.g. a
    SentenceTransformer's `preprocess`), one batch at a time. -> (the sentence index of each row, features) per batch

    Texts go to `prepare` in groups of about `group_size` (whole batches), taken in order of character count; within
    a group the rows are sorted by their token count (the attention mask) and cut into batches, each cut to its own
    longest row. A cut batch is what `prepare` gives for those texts alone, since padding only fills the positions
    after (or before) each row's tokens. A group whose features cannot be cut (no attention mask, or one with holes)
    is prepared again batch by batch, in the order of character count.

    On the STS suite (26,126 distinct sentences, MiniLM, batch 32) this tokenises in about half the time of a
    token-count pass followed by `preprocess` per batch, and computes 0.9 % more tokens than the exact token-count
    order (padding +0.9 % against +0.4 %); groups of 256 would leave +6.7 %, one group of everything +0.4 % at a
    1.5x slower tokenisation.
    """
    by_chars = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))
    group_size = max(group_size // batch_size, 1) * batch_size
    for start in range(0, len(by_chars), group_size):
        indices = by_chars[start : start + group_size]
        features = prepare([sentences[i] for i in indices])
        mask = features.get("attention_mask")
        side = None
        if isinstance(mask, Tensor) and mask.dim() == 2 and mask.shape[0] == len(indices):
            lengths = mask.sum(dim=1)  # (g,)
            side = _padding_side(mask, lengths)
        if side is None:
            for k in range(0, len(indices), batch_size):
                yield indices[k : k + batch_size], prepare([sentences[i] for i in indices[k : k + batch_size]])
            continue
        rows = torch.sort(lengths, descending=True, stable=True).indices  # (g,)
        for k in range(0, len(indices), batch_size):
            batch = rows[k : k + batch_size]
            width = int(lengths[batch].max())
            yield [indices[r] for r in batch.tolist()], trim_padding(features, batch, width, side, len(indices),
                                                                      mask.shape[1])  # fmt: skip


def simcse_encode_fn(
    model, tokenizer, batch_size: int = 128, max_length: int | None = None, show_progress_bar: bool = False
) -> EncodeFn:
    """SimCSEModel.encode: tokenised once, batches of equal token length."""

    def encode(sentences: list[str]) -> Tensor:
        return model.encode(sentences, tokenizer, batch_size, max_length, show_progress_bar)

    return encode


# Modules whose forward is all `encode` adds to the tokenizer's features (no routing by task, no prompt handling)
PLAIN_MODULES = frozenset({"Transformer", "Pooling", "Normalize", "Dense", "LayerNorm", "Dropout"})


def _plain_sentence_transformer(model) -> bool:
    """A text model whose `encode` is its modules' forward over its tokenizer's features: only PLAIN_MODULES, no
    default prompt, no truncated dimension."""
    prompts = getattr(model, "prompts", None) or {}
    default = getattr(model, "default_prompt_name", None)
    return (
        callable(getattr(model, "tokenize", None))
        and all(type(module).__name__ in PLAIN_MODULES for module in model)
        and not (default and prompts.get(default))
        and getattr(model, "truncate_dim", None) is None
    )


def sentence_transformers_encode_fn(
    model, batch_size: int = 128, show_progress_bar: bool = False, side_by_side: bool = True
) -> EncodeFn:
    """A SentenceTransformer's embeddings in batches of equal token length. A plain text model (`_plain_sentence_
    transformer`) runs its own modules' forward on features its own `preprocess` made in this thread, each text
    tokenised once (`iter_prepared_batches`), so the batches can run side by side on a CPU's cores (unless
    `side_by_side` is False); anything else goes through `encode`, one batch after the other."""

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
    if not _plain_sentence_transformer(model):
        return token_length_batches(encode_batch, tokenizer, batch_size, model.max_seq_length, show_progress_bar)

    from sentence_transformers.util import batch_to_device

    from simcse_hn.modeling import map_batches, restore_order

    prepare = getattr(model, "preprocess", None) or model.tokenize  # sentence-transformers < 6: `tokenize`

    def forward(features: dict[str, Tensor]) -> Tensor:
        with torch.inference_mode():
            return model(batch_to_device(features, model.device))["sentence_embedding"].float().cpu()  # (n, D)

    def encode(sentences: list[str]) -> Tensor:
        if not sentences:
            return encode_batch(sentences)
        model.eval()
        order: list[int] = []

        def batches():  # tokenised in this thread while the first batches already run (map_batches)
            for indices, features in iter_prepared_batches(prepare, sentences, batch_size):
                order.extend(indices)
                yield features

        device = model.device if side_by_side else None
        total = -(-len(sentences) // batch_size)  # every group but the last is whole batches
        pieces = map_batches(forward, batches(), device, show_progress_bar, total=total)
        return restore_order(torch.cat(pieces), order)

    return encode


def load_encoder(
    name_or_path: str,
    pooler: str | None = None,
    device: str | None = None,
    batch_size: int = 128,
    max_seq_length: int | None = None,
    show_progress_bar: bool = False,
) -> tuple[EncodeFn, dict]:
    """-> (encode, info): info holds "backend", "pooler" (None for sentence-transformers), "modules", "device" and
    "max_seq_length", the length inputs are truncated to. Without `max_seq_length` both backends use the model's own
    inference length (a sentence-transformers model's max_seq_length, else the encoder's limit), so a base model and
    a model trained from it are scored alike."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if encoder_backend(name_or_path, pooler) == "sentence-transformers":
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(name_or_path, device=device)
        if max_seq_length is not None:
            model.max_seq_length = max_seq_length
        modules = [type(module).__name__ for module in model]
        info = {"backend": "sentence-transformers", "pooler": None, "modules": modules, "device": device,
                "max_seq_length": model.max_seq_length}  # fmt: skip
        return sentence_transformers_encode_fn(model, batch_size, show_progress_bar), info

    from simcse_hn.modeling import SimCSEModel, inference_max_length, load_tokenizer

    model = SimCSEModel.from_pretrained(name_or_path, pooler=pooler).to(device)
    tokenizer = load_tokenizer(name_or_path)
    length = max_seq_length or inference_max_length(name_or_path, model.config, tokenizer)
    info = {"backend": "simcse", "pooler": model.pooler, "modules": None, "device": device, "max_seq_length": length}
    return simcse_encode_fn(model, tokenizer, batch_size, length, show_progress_bar), info


# --- reports: the SimCSE paper's table and a chart, for one run or several side by side ---


def _task_columns(runs: Sequence[tuple[str, dict]]) -> list[str]:
    present = {name for _, results in runs for name in results["tasks"]}
    return [name for name in STS_TASKS if name in present]




def model_label(name_or_path: str) -> str:
    """A short label: a local folder's name (its parent's too for `checkpoint-N` and generic names such as `model`),
    else the Hub id.

    A path that is not a folder here (results read on another machine) is recognised by its form: absolute,
    relative with ./ or ../, or more than one '/' (a Hub id has one)."""
    local = os.path.isdir(name_or_path) or os.path.isabs(name_or_path) or name_or_path.startswith(".")
    if not local and name_or_path.count("/") <= 1:
        return name_or_path
    path = os.path.normpath(name_or_path)
    name = os.path.basename(path)
    generic = is_generic_folder(name)
    if generic and os.path.basename(os.path.dirname(path)):
        return f"{os.path.basename(os.path.dirname(path))}/{name}"
    return name


def unique_labels(labels: Sequence[str], paths: Sequence[str]) -> list[str]:
    """Labels made distinct where two coincide: each of those gets the nearest folder above its path that tells
    them apart (…/run_a/sts/results.json and …/run_b/sts/results.json: "run_a/x", "run_b/x"), else a number."""
    out = list(labels)
    for label in set(labels):
        same = [k for k, other in enumerate(labels) if other == label]
        if len(same) < 2:
            continue
        parts = {k: os.path.normpath(os.path.abspath(paths[k])).split(os.sep)[:-1] for k in same}
        for depth in range(1, max(len(p) for p in parts.values()) + 1):
            names = [parts[k][-depth] if depth <= len(parts[k]) else "" for k in same]
            if len(set(names)) == len(names):
                for k, name in zip(same, names):
                    out[k] = f"{name}/{label}"
                break
        else:
            for number, k in enumerate(same, start=1):
                out[k] = f"{label} ({number})"
    return out


def protocol(results: dict) -> str:
    """How a results record was scored, in words: two records with other protocols are not one measurement."""
    if results.get("aggregation") == "mteb":  # an MTEB result folder (simcse_hn.mteb_results.load_run)
        return "MTEB protocol (each task alone, SICK-R all 9,927 pairs)"
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


def training_summary(training: dict | None) -> str:
    """One line for the objective a results file was trained with (its simcse_config.json), or ''."""
    if not training:
        return ""
    parts = [f"loss `{training.get('loss', '?')}`"]
    if training.get("contrast_form"):
        parts.append(f"contrast form `{training['contrast_form']}`")
    kwargs = training.get("loss_kwargs") or {}
    parts += [f"{key} {value}" for key, value in kwargs.items()]
    for key in ("seed", "base_model", "max_seq_length", "per_device_train_batch_size", "learning_rate"):
        if training.get(key) is not None:
            parts.append(f"{key} {training[key]}")
    return ", ".join(parts)


def results_markdown(results: dict, label: str | None = None) -> str:
    """results.md: the paper-layout table, the protocol, alignment and uniformity, and each task's sub-files."""
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
    if results.get("training"):
        lines += [f"Trained with {training_summary(results['training'])}.", ""]
    geometry = results.get("alignment_uniformity")
    if geometry:
        lines += [
            "## Alignment and uniformity (STS-B dev)",
            "",
            "| Alignment | Uniformity | Positive pairs | Sentences |",
            "|---:|---:|---:|---:|",
            f"| {geometry['alignment']:.4f} | {geometry['uniformity']:.4f} | {geometry['positive_pairs']:,} | "
            f"{geometry['sentences']:,} |",
            "",
            f"Lower is better for both. Protocol: {geometry['protocol']}."
            + (f" Data: {geometry['source']}." if geometry.get("source") else ""),
            "",
        ]
    for name, task in results["tasks"].items():
        lines += [f"## {name}: {task['spearman']:.2f} ({task['pairs']:,} pairs)", ""]
        lines += ["| Sub-file | Pairs | Spearman |", "|:---|---:|---:|"]
        lines += [f"| {sub} | {s['pairs']:,} | {s['spearman']:.2f} |" for sub, s in task["subsets"].items()]
        lines.append("")
    return "\n".join(lines)


# Charts are drawn one paper column wide (3.4 in; ACL and ICML columns are 3.25-3.3 in) at 300 dpi, in 6-7 pt type,
# with the Agg canvas, so that no pyplot state or display backend is touched.
COLUMN_WIDTH = 3.4
PAPER_RC = {
    "font.size": 7,
    "axes.titlesize": 7,
    "axes.labelsize": 7,
    "xtick.labelsize": 6.5,
    "ytick.labelsize": 6.5,
    "legend.fontsize": 6.5,
    "axes.linewidth": 0.6,
    "lines.linewidth": 1.0,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")


def paper_style():
    import matplotlib

    return matplotlib.rc_context(PAPER_RC)


def new_figure(width: float = COLUMN_WIDTH, height: float = 2.4, nrows: int = 1, ncols: int = 1):
    """-> (figure, axes): one Axes, or an (nrows, ncols) array of them; constrained layout."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    if nrows == ncols == 1:
        return figure, figure.add_subplot()
    return figure, figure.subplots(nrows, ncols, squeeze=False)


def save_figure(figure, path: str) -> None:
    figure.savefig(path, dpi=300, bbox_inches="tight", pad_inches=0.03)


def legend_below(figure_or_ax, entries: int, handles=None, labels=None) -> None:
    """A legend under the axes (it never covers data); nothing for a single entry (the title names it)."""
    if entries < 2:
        return
    from matplotlib.figure import Figure

    kwargs = {"ncol": min(entries, 3), "frameon": False}
    if handles is not None:
        kwargs.update(handles=handles, labels=labels)
    if isinstance(figure_or_ax, Figure):
        figure_or_ax.legend(loc="outside lower center", **kwargs)
    else:
        figure_or_ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), **kwargs)


def fitted_limits(lows: Sequence[float], highs: Sequence[float], top_room: float = 0.0) -> tuple[float, float]:
    """y limits around the data (not 0-100): differences of tenths stay visible. `top_room` adds a share of the
    span above, for value labels."""
    finite = [v for v in list(lows) + list(highs) if np.isfinite(v)]
    if not finite:
        return 0.0, 1.0
    low, high = min(finite), max(finite)
    span = max(high - low, 0.2)
    return low - 0.12 * span, high + (0.12 + top_room) * span


def wrap(text: str, width: int = 72) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def plot_results(
    runs: Sequence[tuple[str, dict]],
    path: str,
    title: str | None = None,
    intervals: dict[str, dict[str, tuple[float, float]]] | None = None,
    interval_label: str | None = None,
) -> None:
    """STS scores as points (Spearman x 100), the protocol in the title, y fitted to the data.

    One run: the tasks and their average on one axis, each point labelled with its value. Several runs: one panel
    per task (and Avg.), each with its own fitted axis and the runs side by side in the same colour and marker in
    every panel, the legend under the panels. `intervals` {label: {task or "Avg.": (low, high)}} draws error bars,
    described by `interval_label` (e.g. "95% t-interval over 3 seeds").
    """
    columns = _task_columns(runs) + ["Avg."]
    sickr_all = any(r.get("sickr_pairs") == "all" for _, r in runs)
    names = {c: c + (" (all)" if c == "SICK-R" and sickr_all else "") for c in columns}

    def value(results, column):
        if column == "Avg.":
            return results["average"]
        return results["tasks"][column]["spearman"] if column in results["tasks"] else np.nan

    def interval(label, column, v):
        low, high = (intervals or {}).get(label, {}).get(column, (v, v))
        return low, high

    heading = title or (runs[0][0] if len(runs) == 1 else "STS")
    caption = f"{heading}: Spearman x 100 of cosines; {'; '.join(sorted({protocol(r) for _, r in runs}))}"
    if interval_label:
        caption += f"; error bars: {interval_label}"
    with paper_style():
        if len(runs) == 1:
            label, results = runs[0]
            figure, ax = new_figure(height=2.3)
            x = np.arange(len(columns))
            values = [value(results, c) for c in columns]
            bounds = [interval(label, c, v) for c, v in zip(columns, values)]
            ax.errorbar(x, values, yerr=_yerr(values, bounds), fmt="o", ms=4, capsize=2, color="C0")
            for xi, v, (_, high) in zip(x, values, bounds):
                if np.isfinite(v):
                    ax.annotate(f"{v:.2f}", (xi, high), xytext=(0, 3), textcoords="offset points", ha="center",
                                fontsize=5.5)  # fmt: skip
            ax.axvline(len(columns) - 1.5, color="0.6", lw=0.6, ls=":")  # the average is not a task
            ax.set_xticks(x, [names[c] for c in columns], rotation=30, ha="right")
            ax.set_ylim(*fitted_limits([b[0] for b in bounds], [b[1] for b in bounds], top_room=0.12))
            ax.set_ylabel("Spearman x 100")
            ax.grid(axis="y", alpha=0.3)
            ax.set_title(wrap(caption), loc="left")
        else:
            ncols = 2
            nrows = -(-len(columns) // ncols)
            figure, axes = new_figure(height=1.05 * nrows + 0.7, nrows=nrows, ncols=ncols)
            handles = []
            for k, column in enumerate(columns):
                ax = axes[k // ncols][k % ncols]
                values = [value(r, column) for _, r in runs]
                bounds = [interval(label, column, v) for (label, _), v in zip(runs, values)]
                for j, ((label, _), v, b) in enumerate(zip(runs, values, bounds)):
                    handle = ax.errorbar([j], [v], yerr=_yerr([v], [b]), fmt=MARKERS[j % len(MARKERS)], ms=3.5,
                                         capsize=1.5, color=f"C{j % 10}", label=label)  # fmt: skip
                    if k == 0:
                        handles.append(handle)
                ax.set_xlim(-0.7, len(runs) - 0.3)
                ax.set_xticks([])
                ax.set_ylim(*fitted_limits([b[0] for b in bounds], [b[1] for b in bounds]))
                ax.yaxis.set_major_locator(_locator())
                ax.grid(axis="y", alpha=0.3)
                ax.set_title(names[column], pad=2)
            for k in range(len(columns), nrows * ncols):
                axes[k // ncols][k % ncols].set_visible(False)
            figure.supylabel("Spearman x 100", fontsize=7)
            figure.suptitle(wrap(caption, 80), fontsize=7, x=0.02, ha="left")
            legend_below(figure, len(runs), handles, [label for label, _ in runs])
        save_figure(figure, path)


def _yerr(values, bounds) -> np.ndarray:
    """(2, n) distances below and above each value, as errorbar wants them (0 where there is no interval)."""
    v = np.asarray(values, dtype=float)
    return np.stack([v - np.asarray([b[0] for b in bounds]), np.asarray([b[1] for b in bounds]) - v]).clip(min=0)


def _locator():
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(nbins=4, min_n_ticks=3)
