"""The model card (README.md) of a saved folder: Hub metadata (ModelCardData with base_model, a model-index of the
STS results), the objective and its settings, the training budget, the STS table in the SimCSE paper's layout, and
usage for sentence-transformers and transformers. `update_card_sts` replaces the STS part of an existing card."""

from __future__ import annotations

import logging
import os
import re

from simcse_hn.data import STS_TASKS
from simcse_hn.files import (
    CARD,
    HEAD_WEIGHTS,
    SIMCSE_CONFIG,
    STS_RESULTS,
    is_hub_id,
    read_json,
    record_files,
    source_record,
    write_json,
)
from simcse_hn.losses import BASELINE, BUILTIN

logger = logging.getLogger(__name__)

STS_METRIC = "spearman_cosine"
# The last line of every card write_model_card writes: a README.md without it is someone else's and is never replaced.
CARD_MARKER = "<!-- model card written by simcse-hn; it is rewritten on each save -->"
_STS_BEGIN, _STS_END = "<!-- simcse-hn:sts-results -->", "<!-- /simcse-hn:sts-results -->"

# Licenses of common base encoders, used when the base model's own card is not available offline.
KNOWN_LICENSES = {
    "bert-base-uncased": "apache-2.0",
    "bert-base-cased": "apache-2.0",
    "bert-large-uncased": "apache-2.0",
    "bert-large-cased": "apache-2.0",
    "google-bert/bert-base-uncased": "apache-2.0",
    "google-bert/bert-base-cased": "apache-2.0",
    "google-bert/bert-large-uncased": "apache-2.0",
    "google-bert/bert-large-cased": "apache-2.0",
    "roberta-base": "mit",
    "roberta-large": "mit",
    "FacebookAI/roberta-base": "mit",
    "FacebookAI/roberta-large": "mit",
}

SIMCSE_BIBTEX = BUILTIN[BASELINE].citation  # SimCSE's paper, which the baseline objective cites


def base_model_license(base_model: str | None) -> str | None:
    """The base model's license from its card (a local folder, or the Hub cache; never the network), else from
    KNOWN_LICENSES, else None."""
    from huggingface_hub import ModelCard, try_to_load_from_cache

    if not base_model:
        return None
    try:  # a malformed id or card only costs the license line
        path = os.path.join(base_model, CARD) if os.path.isdir(base_model) else None
        if path is None and is_hub_id(base_model):
            cached = try_to_load_from_cache(base_model, CARD)
            path = cached if isinstance(cached, str) else None
        if path and os.path.isfile(path):
            license_ = ModelCard.load(path, ignore_metadata_errors=True).data.license
            if license_:
                return license_
    except (OSError, ValueError) as e:
        logger.warning("could not read the license of %s: %s", base_model, e)
    return KNOWN_LICENSES.get(base_model)


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
    from huggingface_hub import EvalResult

    from simcse_hn.mteb_results import HF_SUBSET, MTEB_TASKS, SPLIT

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


def sts_section(sts_results: dict | None, model_name: str, command_model: str = "PATH_OR_HUB_ID") -> str:
    """The STS results between markers, so `push_sts_results` can replace it in an existing card."""
    if not sts_results or not sts_results.get("tasks"):
        body = f"Not evaluated on the STS benchmarks yet (`python eval/sts.py --model {command_model} --output DIR`)."
        return f"{_STS_BEGIN}\n{body}\n{_STS_END}"
    scores, average = _sts_scores(sts_results)
    header = "| Model | " + " | ".join(STS_TASKS) + " | Avg. |"
    rule = "|:--|" + "--:|" * (len(STS_TASKS) + 1)
    row = f"| {model_name} | " + " | ".join(_fmt(scores.get(t)) for t in STS_TASKS) + f" | {_fmt(average)} |"
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
    body = (
        "Spearman correlation x 100 between the cosine similarity of the two sentences' embeddings and the gold "
        "score, on the test sets (SimCSE's evaluation; the full numbers are in `sts_results.json`).\n\n"
        f"{header}\n{rule}\n{row}\n\n" + "; ".join(notes) + "."
    )
    return f"{_STS_BEGIN}\n{body}\n{_STS_END}"


def _objective_section(config: dict) -> str:
    """The objective as the run recorded it (`simcse_config["objective"]`, its own summary): nothing is imported."""
    loss = config.get("loss", BASELINE)
    # a built-in's own text for a record without it (nothing of the user's is imported)
    builtin = BUILTIN.get(loss)
    summary = (config.get("objective") or {}).get("summary") or (builtin.summary if builtin else f"`{loss}`")
    lines = [summary, "", "| setting | value |", "|:--|:--|", f"| loss | `{loss}` |"]
    for key, value in sorted((config.get("loss_kwargs") or {}).items()):
        lines.append(f"| {key} | `{value}` |")
    if "contrast_form" in config:
        form = config["contrast_form"]
        meaning = "first views against second views" if form == "simcse" else "every row against all 2N-2 others"
        lines.append(f"| contrast_form | `{form}` ({meaning}) |")
    return "\n".join(lines)


def _source(value) -> dict | None:
    """simcse_config's record of a source ({"name", "local"}, files.source_record); a bare string from an older
    folder is taken as it is."""
    if value is None or isinstance(value, dict):
        return value
    return source_record(str(value))


def _source_cell(value) -> str | None:
    source = _source(value)
    if source is None:
        return None
    kind = "file" if os.path.splitext(source["name"])[1] else "folder"
    return f"local {kind} `{source['name']}`" if source["local"] else f"`{source['name']}`"


def _hub_name(value) -> str | None:
    source = _source(value)
    return None if source is None or source["local"] or not is_hub_id(source["name"]) else source["name"]


def _budget(config: dict) -> str | None:
    steps = config.get("steps")
    if steps is None:
        return None
    epochs, seen = config.get("epochs"), config.get("sentences_seen")
    text = f"{steps:,} steps"
    if epochs is not None:
        text += f" ({epochs:.2f} epochs)"
    if seen is not None:
        text += f", {seen:,} sentences seen"
    return text


def _training_section(config: dict, dev_spearman: float | None) -> str:
    pooler = config.get("pooler", "cls")
    head = ""
    if pooler == "cls":
        head = " (MLP head in training only)" if config.get("mlp_only_train", True) else " + MLP head (dense+tanh)"
    rows = [("base model", _source_cell(config.get("base_model")))]
    rows.append(("pooler", f"`{pooler}`{head}"))
    rows.append(("max_seq_length (training)", config.get("max_seq_length")))
    rows.append(("max_seq_length (inference)", config.get("inference_max_seq_length")))
    batch, world = config.get("per_device_train_batch_size"), config.get("world_size", 1)
    accumulation = config.get("gradient_accumulation_steps", 1)
    if batch:
        total = batch * world * accumulation
        steps = f" x {accumulation} accumulation steps" if accumulation > 1 else ""
        rows.append(("batch size", f"{batch} per device x {world} process(es){steps} = {total} sentences"))
    rows.append(("training budget", _budget(config)))
    rows.append(("learning rate", config.get("learning_rate")))
    rows.append(("training data", _source_cell(config.get("train_file"))))
    if dev_spearman is not None:
        rows.append(("STS-B dev Spearman x 100 (model selection)", f"{dev_spearman:.2f}"))
    shown = {"base_model", "pooler", "mlp_only_train", "max_seq_length", "per_device_train_batch_size", "world_size"}
    shown |= {"learning_rate", "train_file", "loss", "loss_kwargs", "objective", "contrast_form",
              "inference_max_seq_length"}  # fmt: skip
    shown |= {"steps", "epochs", "sentences_seen", "gradient_accumulation_steps"}
    rows += [(key, f"`{value}`") for key, value in sorted(config.items()) if key not in shown]
    return "\n".join(["| | |", "|:--|:--|"] + [f"| {k} | {v} |" for k, v in rows if v is not None])


def _head_in_encoder_pooler(output_dir: str | None) -> bool:
    """True when the saved encoder's pooler holds the MLP head (see st_format.head_as_encoder_pooler)."""
    if output_dir is None:
        return False
    from safetensors import safe_open

    head, weights = os.path.join(output_dir, HEAD_WEIGHTS), os.path.join(output_dir, "model.safetensors")
    if not (os.path.isfile(head) and os.path.isfile(weights)):
        return False
    with safe_open(head, "pt") as h, safe_open(weights, "pt") as w:
        key = next((k for k in w.keys() if k.endswith("pooler.dense.weight")), None)
        return key is not None and w.get_tensor(key).equal(h.get_tensor("dense.weight"))


def _transformers_pooling(config: dict, output_dir: str | None, local: bool = False) -> tuple[str, str]:
    """(forward keyword arguments, code that turns `out`/`mask` into `embeddings`) for the card's snippet."""
    pooler = config.get("pooler", "cls")
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
    if pooler == "cls" and not config.get("mlp_only_train", True):
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


def _usage_section(config: dict, model_id: str | None, model_name: str, output_dir: str | None) -> str:
    """Snippets for both libraries; without a Hub id they load `path/to/<model_name>`, this folder (a placeholder a
    reader replaces, not an id that would fail on the Hub)."""
    forward_kwargs, pooling = _transformers_pooling(config, output_dir, local=model_id is None)
    model_id = model_id or f"path/to/{model_name}"
    try:
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


def _citations(config: dict) -> str:
    """SimCSE's BibTeX, and the objective's own when it has one of another paper."""
    builtin = BUILTIN.get(config.get("loss", ""))
    own = ((config.get("objective") or {}).get("citation") or (builtin.citation if builtin else "")).strip()
    return SIMCSE_BIBTEX if not own or own == SIMCSE_BIBTEX.strip() else f"{SIMCSE_BIBTEX}\n\n{own}"


def _card_data(config: dict, sts_results: dict | None, model_name: str):
    from huggingface_hub import ModelCardData

    base, data, loss = _hub_name(config.get("base_model")), _hub_name(config.get("train_file")), config.get("loss")
    loss = (config.get("objective") or {}).get("name") or loss or BASELINE
    tags = ["sentence-transformers", "sentence-similarity", "feature-extraction", "simcse", loss]
    eval_results = sts_eval_results(sts_results) if sts_results else []
    return ModelCardData(
        library_name="sentence-transformers",
        pipeline_tag="sentence-similarity",
        tags=list(dict.fromkeys(tags)),
        base_model=base,
        datasets=[data] if data else None,
        license=config.get("base_model_license") or base_model_license(
            config["base_model"] if isinstance(config.get("base_model"), str) else base
        ),
        eval_results=eval_results or None,
        model_name=model_name if eval_results else None,
    )


def model_card(
    simcse_config: dict,
    sts_results: dict | None = None,
    *,
    model_name: str,
    model_id: str | None = None,
    dev_spearman: float | None = None,
    output_dir: str | None = None,
):
    """The `huggingface_hub.ModelCard` of a trained model (see `write_model_card`)."""
    from huggingface_hub import ModelCard

    config = simcse_config
    loss = (config.get("objective") or {}).get("name") or config.get("loss", BASELINE)
    base = _source_cell(config.get("base_model"))
    intro = (
        f"A sentence encoder trained with unsupervised [SimCSE](https://arxiv.org/abs/2104.08821) (two dropout views "
        f"of a sentence are its positive pair){f' from {base}' if base else ''}, with the `{loss}` objective, "
        f"by simcse-hn. Sentences map to vectors compared by cosine "
        f"similarity (pooler `{config.get('pooler', 'cls')}`); the folder loads in sentence-transformers and "
        f"in transformers."
    )
    body = f"""
# {model_name}

{intro}

## Training objective

{_objective_section(config)}

## Training

{_training_section(config, dev_spearman)}

## STS results

{sts_section(sts_results, model_name, command_model=model_id or f"path/to/{model_name}")}

## Usage

{_usage_section(config, model_id, model_name, output_dir)}

## Files

`simcse_config.json` (pooler, loss and hyper-parameters), `{HEAD_WEIGHTS}` (SimCSE's MLP head), the encoder and
tokenizer in transformers format, the sentence-transformers modules (`modules.json`), and `{STS_RESULTS}` when
evaluated.

## Citation

```bibtex
{_citations(config)}
```
"""
    data = _card_data(config, sts_results, model_name)
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")


def write_model_card(
    output_dir: str,
    simcse_config: dict | None = None,
    sts_results: dict | None = None,
    *,
    repo_id: str | None = None,
    dev_spearman: float | None = None,
    overwrite: bool = False,
) -> str:
    """Write README.md into a saved model folder; returns its path.

    `simcse_config` / `sts_results` default to the folder's simcse_config.json / sts_results.json; results passed
    in are also saved as sts_results.json, so the folder stays complete. `repo_id` names the model in the card and
    its snippets (default: the folder's name). A README.md that simcse-hn did not write (no CARD_MARKER) is a
    FileExistsError, before anything is written, unless `overwrite`.
    """
    if not overwrite and not card_is_ours(output_dir):
        raise FileExistsError(
            f"{os.path.join(output_dir, CARD)} was not written by simcse-hn: not replacing it with the model card"
        )
    if simcse_config is None:
        simcse_config = read_json(os.path.join(output_dir, SIMCSE_CONFIG)) or {}
    if sts_results is None:
        sts_results = read_json(os.path.join(output_dir, STS_RESULTS))
    else:
        write_json(os.path.join(output_dir, STS_RESULTS), sts_results)
        record_files(output_dir, [STS_RESULTS])
    name = repo_id.split("/")[-1] if repo_id else os.path.basename(os.path.abspath(output_dir))
    card = model_card(
        simcse_config,
        sts_results,
        model_name=name,
        model_id=repo_id,
        dev_spearman=dev_spearman,
        output_dir=output_dir,
    )
    card.text = card.text.rstrip("\n") + f"\n\n{CARD_MARKER}\n"
    path = os.path.join(output_dir, CARD)
    card.save(path)
    record_files(output_dir, [CARD])
    return path


def card_is_ours(output_dir: str) -> bool:
    """Whether write_model_card may write output_dir's README.md: there is none, or simcse-hn wrote it."""
    path = os.path.join(output_dir, CARD)
    if not os.path.exists(path):
        return True
    with open(path, encoding="utf-8", errors="replace") as f:
        return CARD_MARKER in f.read()


def update_card_sts(card_text: str, results: dict, model_name: str | None = None) -> str:
    """An existing card with its STS section and STS model-index entries replaced by `results` (other metadata and
    other evaluation results are kept; a card without the section gets it appended)."""
    from huggingface_hub import ModelCard

    card = ModelCard(card_text, ignore_metadata_errors=True)
    model_name = card.data.model_name or model_name or "model"
    kept = [
        r for r in (card.data.eval_results or []) if not (r.metric_type == STS_METRIC and r.dataset_name in STS_TASKS)
    ]
    card.data.eval_results = kept + sts_eval_results(results)
    card.data.model_name = model_name
    section = sts_section(results, model_name)
    pattern = re.compile(re.escape(_STS_BEGIN) + r".*?" + re.escape(_STS_END), flags=re.DOTALL)
    if pattern.search(card.text):
        card.text = pattern.sub(lambda _: section, card.text, count=1)
    else:
        card.text = card.text.rstrip("\n") + f"\n\n## STS results\n\n{section}\n"
    return card.content


