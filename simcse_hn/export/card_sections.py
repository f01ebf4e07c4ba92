"""The model card's sections as markdown: the STS table in the SimCSE paper's layout and its model-index entries,
the objective and its settings, the training budget, usage for sentence-transformers and transformers, citations."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from huggingface_hub import EvalResult
from safetensors import safe_open

from simcse_hn.data.sts import STS_TASKS
from simcse_hn.evaluation.mteb_results import HF_SUBSET, MTEB_TASKS, SPLIT
from simcse_hn.files import (
    HEAD_WEIGHTS,
    is_hub_id,
)
from simcse_hn.losses import BASELINE, BUILTIN
from simcse_hn.record_compare import record_paths
from simcse_hn.run_record import RunRecord, Source

logger = logging.getLogger(__name__)

STS_METRIC = "spearman_cosine"
STS_BEGIN, STS_END = "<!-- simcse-hn:sts-results -->", "<!-- /simcse-hn:sts-results -->"

SIMCSE_BIBTEX = BUILTIN[BASELINE].citation  # SimCSE's paper, which the baseline objective cites


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _sts_scores(sts_results: dict) -> tuple[dict[str, float], float | None]:
    tasks = sts_results.get("tasks", {})
    scores = {name: float(tasks[name]["spearman"]) for name in STS_TASKS if name in tasks}
    average = sts_results.get("average")
    if average is None and scores:
        average = sum(scores.values()) / len(scores)
    return scores, None if average is None else float(average)


def sts_eval_results(sts_results: dict) -> list:
    """One `EvalResult` per STS task (Spearman x 100 of cosine similarities, the report's SimCSE protocol) for the
    card's model-index, filed under the dataset MTEB scores that task on, at the revision its task metadata pins
    (mteb_results.MTEB_TASKS): the local files and the Hub copies eval/sts.py reads hold those pairs (the data
    README; eval/mteb_check.py scores them with MTEB's own evaluator). SICK-R on SimCSE's test split is 4,927 of that
    dataset's 9,927 test pairs: its metric_args say so."""
    scores, _ = _sts_scores(sts_results)
    tasks = sts_results.get("tasks", {})
    out = []
    for name, score in scores.items():
        meta = MTEB_TASKS[name]
        args = {"aggregation": sts_results.get("aggregation", "all"), "scale": 100, "protocol": "SimCSE"}
        if tasks[name].get("pairs") is not None:
            args["pairs"] = tasks[name]["pairs"]
        if name == "SICK-R" and sts_results.get("sickr_pairs") != "all":
            args["protocol"] = "SimCSE: the SICK test split, not all of the dataset's test pairs (MTEB)"
        out.append(EvalResult(
            task_type="sentence-similarity",
            task_name="Semantic Textual Similarity",
            dataset_type=meta.dataset,
            dataset_name=name,
            dataset_config=HF_SUBSET,
            dataset_split=SPLIT,
            dataset_revision=meta.revision,
            metric_type=STS_METRIC,
            metric_name="Spearman (cosine) x 100",
            metric_value=round(score, 2),
            metric_args=args,
        ))  # fmt: skip
    return out


def _sts_row(label: str, sts_results: dict) -> str:
    scores, average = _sts_scores(sts_results)
    return f"| {label} | " + " | ".join(_fmt(scores.get(t)) for t in STS_TASKS) + f" | {_fmt(average)} |"


def sts_section(sts_results: dict | None, model_name: str, command_model: str = "PATH_OR_HUB_ID") -> str:
    """The STS results between markers, so `push_sts_results` can replace it in an existing card: the model's row,
    one row per encoder eval/sts.py scored beside it (`baselines`, e.g. the one it started from) and the command."""
    if not sts_results or not sts_results.get("tasks"):
        body = f"Not evaluated on the STS benchmarks yet (`python eval/sts.py --model {command_model}`)."
        return f"{STS_BEGIN}\n{body}\n{STS_END}"
    header = "| Model | " + " | ".join(STS_TASKS) + " | Avg. |"
    rule = "|:--|" + "--:|" * (len(STS_TASKS) + 1)
    baselines = [b for b in sts_results.get("baselines") or [] if isinstance(b, dict) and b.get("tasks")]
    label = f"{model_name} ({sts_results['pooler']})" if baselines and sts_results.get("pooler") else model_name
    row = "\n".join([_sts_row(label, sts_results), *(_sts_row(b.get("label", "baseline"), b) for b in baselines)])
    notes = [
        f"aggregation `{sts_results.get('aggregation', 'all')}`",
        f"pooler `{sts_results.get('pooler', '?')}`",
    ]
    sickr = sts_results.get("sickr_pairs")  # eval/sts.py writes "test" (SimCSE's 4,927 pairs) or "all" (MTEB's 9,927)
    if sickr:
        notes.append({"test": "SICK-R: test split, 4,927 pairs", "all": "SICK-R: all 9,927 pairs (MTEB)"}.get(
            str(sickr), f"SICK-R: {sickr} pairs"))
    if sts_results.get("date"):
        notes.append(f"evaluated {sts_results['date']}")
    below = ""
    if baselines:
        below = (
            " The rows below the model's are encoders scored in the same run, with the same tasks, protocol and "
            "input length (the one it was trained from, say)."
        )
    command = (sts_results.get("settings") or {}).get("command")
    body = (
        "Spearman correlation x 100 between the cosine similarity of the two sentences' embeddings and the gold "
        f"score, on the test sets (SimCSE's evaluation; the full numbers are in `sts_results.json`).{below}\n\n"
        f"{header}\n{rule}\n{row}\n\n" + "; ".join(notes) + "." + (f" Made by `{command}`." if command else "")
    )
    return f"{STS_BEGIN}\n{body}\n{STS_END}"


def objective_section(record: RunRecord) -> str:
    """The objective as the run recorded it (its own summary, in the record): nothing is imported."""
    method = record.method
    loss = method.loss or BASELINE
    # a built-in's own text for a record without it (nothing of the user's is imported)
    builtin = BUILTIN.get(loss)
    summary = method.objective_summary or (builtin.summary if builtin else f"`{loss}`")
    lines = [summary, "", "| setting | value |", "|:--|:--|", f"| loss | `{loss}` |"]
    options = dict(method.options)
    if method.temperature is not None:
        options["temperature"] = method.temperature
    for key, value in sorted(options.items()):
        lines.append(f"| {key} | {plain_value(value)} |")
    if method.contrast_form is not None:
        form = method.contrast_form
        meaning = "first views against second views" if form == "simcse" else "every row against all 2N-2 others"
        lines.append(f"| contrast_form | `{form}` ({meaning}) |")
    return "\n".join(lines)


def source_cell(source: Source | None) -> str | None:
    if source is None:
        return None
    kind = "file" if os.path.splitext(source.name)[1] else "folder"
    return f"local {kind} `{source.name}`" if source.local else f"`{source.name}`"


def hub_name(source: Source | None) -> str | None:
    return None if source is None or source.local or not is_hub_id(source.name) else source.name


def _budget(record: RunRecord) -> str | None:
    if record.budget is None:
        return None
    steps, epochs, seen = record.budget.steps, record.budget.epochs, record.budget.sentences_seen
    text = f"{steps:,} steps"
    if epochs is not None:
        text += f" ({epochs:.2f} epochs)"
    if seen is not None:
        text += f", {seen:,} sentences seen"
    return text


# settings the card shows, by their flags, when the run set them (the whole record is simcse_config.json)
CARD_SETTINGS = (
    "data.negatives_per_example",
    "data.max_train_samples",
    "data.drop_duplicates",
    "data.word_repetition",
    "data.streaming",
    "method.hard_negative_weight",
    "method.no_duplicates",
    "method.guide.model",
    "method.guide.margin",
    "method.topic_batches.clusters",
    "method.topic_batches.share",
    "method.topic_batches.encoder",
    "method.topic_batches.recluster_steps",
    "method.queue.size",
    "method.queue.momentum",
    "model.dropout",
    "model.lora.r",
    "model.lora.alpha",
    "model.lora.dropout",
    "model.lora.target_modules",
    "optimisation.seed",
    "optimisation.data_seed",
)
CARD_ARGUMENTS = ("lr_scheduler_type", "warmup_steps", "weight_decay", "bf16", "fp16")


def training_section(record: RunRecord, dev_spearman: float | None) -> str:
    model, optimisation = record.model, record.optimisation
    pooler = model.pooler or "cls"
    head = ""
    if pooler == "cls":
        head = " (MLP head in training only)" if model.mlp_only_train is not False else " + MLP head (dense+tanh)"
    rows = [("base model", source_cell(model.base_model))]
    if record.provenance.command:
        rows.append(("training command", f"`{record.provenance.command}`"))
    rows.append(("pooler", f"`{pooler}`{head}"))
    rows.append(("max_seq_length (training: tokens per sentence)", model.max_seq_length))
    inference = model.inference_max_seq_length
    rows.append(("max_seq_length (inference: what sentence-transformers truncates to)", inference))
    if model.eval_max_seq_length is not None:
        rows.append(("eval_max_seq_length (the STS-B dev evaluation during training)", model.eval_max_seq_length))
    batch, world = optimisation.per_device_train_batch_size, optimisation.processes or 1
    accumulation = optimisation.gradient_accumulation_steps or 1
    if batch:
        steps = f" x {accumulation} accumulation steps" if accumulation > 1 else ""
        total = f"{record.global_batch} sentences"
        rows.append(("batch size", f"{batch} per device x {world} process(es){steps} = {total}"))
    rows.append(("training budget", _budget(record)))
    rows.append(("learning rate", optimisation.learning_rate))
    rows.append(("training data", source_cell(record.data.source)))
    if record.data.format == "pairs":
        rows.append(("data_format", "`pairs`"))
    if dev_spearman is not None:
        rows.append(("STS-B dev Spearman x 100 (the saved model)", f"{dev_spearman:.2f}"))
    flags = dict(record_paths())
    for path in CARD_SETTINGS:
        value = _field(record, path)
        if value not in (None, False, 0, 0.0, ()):
            rows.append((flags[path], plain_value(value)))
    arguments = optimisation.arguments
    rows += [(key, plain_value(arguments[key])) for key in CARD_ARGUMENTS if key in arguments]
    return "\n".join(["| | |", "|:--|:--|"] + [f"| {k} | {v} |" for k, v in rows if v is not None])


def _field(record: RunRecord, path: str):
    value = record
    for name in path.split("."):
        value = getattr(value, name, None)
        if value is None:
            return None
    return list(value) if isinstance(value, tuple) else value


def plain_value(value) -> str | None:
    """A record's value as a card or report shows it, never a Python repr: a source (a Source, or {"name", "local"})
    as source_cell says it, a mapping as `key value` pairs, a list comma-separated; None for no value."""
    if value is None or value == {} or value == []:
        return None
    if isinstance(value, Mapping) and set(value) == {"name", "local"}:
        value = Source(value["name"], bool(value["local"]))
    if isinstance(value, Source):
        return source_cell(value)
    if isinstance(value, Mapping):
        parts = [f"{key} {plain_value(item)}" for key, item in value.items() if plain_value(item) is not None]
        return ", ".join(parts) or None
    if isinstance(value, (list, tuple)):
        return ", ".join(str(plain_value(item)) for item in value)
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _head_in_encoder_pooler(output_dir: str | None) -> bool:
    """True when the saved encoder's pooler holds the MLP head (see st_format.head_as_encoder_pooler)."""
    if output_dir is None:
        return False

    head, weights = os.path.join(output_dir, HEAD_WEIGHTS), os.path.join(output_dir, "model.safetensors")
    if not (os.path.isfile(head) and os.path.isfile(weights)):
        return False
    with safe_open(head, "pt") as h, safe_open(weights, "pt") as w:
        key = next((k for k in w.keys() if k.endswith("pooler.dense.weight")), None)
        return key is not None and w.get_tensor(key).equal(h.get_tensor("dense.weight"))


def _transformers_pooling(record: RunRecord, output_dir: str | None, local: bool = False) -> tuple[str, str]:
    """(forward keyword arguments, code that turns `out`/`mask` into `embeddings`) for the card's snippet."""
    pooler = record.model.pooler or "cls"
    mean = 'mask = batch["attention_mask"].unsqueeze(-1).float()\nembeddings = (hidden * mask).sum(1) / mask.sum(1)'
    if pooler == "avg":
        return "", f"hidden = out.last_hidden_state\n{mean}"
    if pooler == "avg_first_last":
        return ", output_hidden_states=True", f"hidden = (out.hidden_states[1] + out.hidden_states[-1]) / 2\n{mean}"
    if pooler == "avg_top2":
        return ", output_hidden_states=True", f"hidden = (out.hidden_states[-2] + out.hidden_states[-1]) / 2\n{mean}"
    if pooler == "last":
        return "", (
            'mask = batch["attention_mask"]\n'
            "last = (mask * torch.arange(mask.shape[1])).argmax(1)  # the last real token, either padding side\n"
            "embeddings = out.last_hidden_state[torch.arange(len(last)), last]"
        )
    if pooler == "cls" and record.model.mlp_only_train is False:
        if _head_in_encoder_pooler(output_dir):
            return "", "embeddings = out.pooler_output  # SimCSE's MLP head over [CLS], stored as the encoder's pooler"
        imports = "import os\n" if local else "from huggingface_hub import hf_hub_download\n"
        where = (
            f'os.path.join(model_id, "{HEAD_WEIGHTS}")' if local else f'hf_hub_download(model_id, "{HEAD_WEIGHTS}")'
        )
        return "", (
            f"{imports}from safetensors.torch import load_file\n\n"
            f"head = load_file({where})  # SimCSE's MLP head (dense + tanh)\n"
            'embeddings = torch.tanh(out.last_hidden_state[:, 0] @ head["dense.weight"].T + head["dense.bias"])'
        )
    return "", "embeddings = out.last_hidden_state[:, 0]  # [CLS]"


def usage_section(record: RunRecord, model_id: str | None, model_name: str, output_dir: str | None) -> str:
    """Snippets for both libraries; without a Hub id they load `path/to/<model_name>`, this folder (a placeholder a
    reader replaces, not an id that would fail on the Hub)."""
    forward_kwargs, pooling = _transformers_pooling(record, output_dir, local=model_id is None)
    model_id = model_id or f"path/to/{model_name}"
    try:
        # a slow import: only where its models are used
        from sentence_transformers import __version__

        saved_with = f"\n\nSaved with sentence-transformers {__version__}."
    except ImportError:
        saved_with = ""
    return f"""### sentence-transformers{saved_with}

```python
from sentence_transformers import SentenceTransformer

model = SentenceTransformer("{model_id}")
embeddings = model.encode(["A man is playing a guitar.", "Someone plays an instrument."])
print(model.similarity(embeddings, embeddings))
```

### transformers

```python
import torch
import torch.nn.functional as F
from transformers import AutoModel, AutoTokenizer

model_id = "{model_id}"
tokenizer = AutoTokenizer.from_pretrained(model_id)
model = AutoModel.from_pretrained(model_id).eval()
batch = tokenizer(["A man is playing a guitar.", "Someone plays an instrument."],
                  padding=True, truncation=True, return_tensors="pt")
with torch.inference_mode():
    out = model(**batch{forward_kwargs})
{pooling}
print(F.cosine_similarity(embeddings[0], embeddings[1], dim=0))
```"""


def citations(record: RunRecord) -> str:
    """SimCSE's BibTeX, and the objective's own when it has one of another paper."""
    builtin = BUILTIN.get(record.method.loss or "")
    own = (record.method.objective_citation or (builtin.citation if builtin else "")).strip()
    return SIMCSE_BIBTEX if not own or own == SIMCSE_BIBTEX.strip() else f"{SIMCSE_BIBTEX}\n\n{own}"
