"""What a saved model folder holds besides the encoder: sentence-transformers files, model card, Hub upload.

* `write_sentence_transformers_files`: modules.json + the modules that reproduce the evaluation pooler, so
  `SentenceTransformer(folder)` gives `SimCSEModel.encode`'s embeddings (called by `SimCSEModel.save_pretrained`).
* `write_model_card`: README.md with Hub metadata (ModelCardData, model-index of STS results), the objective
  and its settings, the STS table in the SimCSE paper's layout, usage for sentence-transformers and transformers.
* `push_to_hub` / `push_sts_results`: one upload through `huggingface_hub`; failures become a one-line `HubError`.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import re
import tempfile

import torch
from torch import nn

logger = logging.getLogger(__name__)

SIMCSE_CONFIG = "simcse_config.json"  # written by SimCSEModel.save_pretrained
HEAD_WEIGHTS = "simcse_head.safetensors"
STS_RESULTS = "sts_results.json"
CARD = "README.md"
# The last line of every card write_model_card writes: a README.md without it is someone else's and is never replaced.
CARD_MARKER = "<!-- model card written by simcse-hn; it is rewritten on each save -->"

# SimCSE's pooler -> sentence-transformers Pooling mode, applied to the tokens of `_LAYER_POOLERS` or the last layer.
ST_POOLING = {"cls": "cls", "cls_before_pooler": "cls", "avg": "mean", "avg_first_last": "mean", "avg_top2": "mean"}
_LAYER_POOLERS = ("avg_first_last", "avg_top2")

STS_TASKS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R")  # the SimCSE paper's column order
STS_DATASETS = {  # Hub ids of the same test sets, for the model-index
    "STS12": "mteb/sts12-sts",
    "STS13": "mteb/sts13-sts",
    "STS14": "mteb/sts14-sts",
    "STS15": "mteb/sts15-sts",
    "STS16": "mteb/sts16-sts",
    "STS-B": "mteb/stsbenchmark-sts",
    "SICK-R": "mteb/sickr-sts",
}
STS_METRIC = "spearman_cosine"
_STS_BEGIN, _STS_END = "<!-- simcse-hn:sts-results -->", "<!-- /simcse-hn:sts-results -->"

LOSS_DESCRIPTIONS = {
    "infonce": "InfoNCE over in-batch negatives, as in SimCSE (arXiv:2104.08821): "
    "`L_i = -log( e^{s_ip/t} / (e^{s_ip/t} + sum_j e^{s_ij/t}) )` with cosine similarities `s`.",
    "dcl": "Debiased contrastive loss (Chuang et al., arXiv:2007.00224): the negative term is corrected for "
    "false negatives with the class prior `tau_plus`; `tau_plus = 0` is InfoNCE (up to a lower clamp).",
    "hcl": "Hard-negative contrastive loss (Robinson et al., arXiv:2010.04592): negatives weighted by "
    "`w_ij ∝ exp(beta * s_ij / t)` (mean one), then debiased with `tau_plus`; `beta = tau_plus = 0` is InfoNCE.",
    "progcl": "ProGCL (Xia et al., arXiv:2110.02027): a two-component Beta mixture fitted to negative "
    "similarities gives each negative's probability of being a true negative; `weight` re-weights negatives by "
    "it, `mix` adds synthesised hard negatives. Plain InfoNCE during the warm-up.",
    "unremix": "UnReMix (Tabassum et al., arXiv:2206.01197): negatives weighted by a mixture of anchor "
    "similarity, model uncertainty (per-sample gradients) and representativeness.",
}

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

SIMCSE_BIBTEX = """@inproceedings{gao2021simcse,
  title = {{SimCSE}: Simple Contrastive Learning of Sentence Embeddings},
  author = {Gao, Tianyu and Yao, Xingcheng and Chen, Danqi},
  booktitle = {Empirical Methods in Natural Language Processing (EMNLP)},
  year = {2021}
}"""


class HubError(RuntimeError):
    """The Hub could not be reached or refused the upload; the message is one line. Local files are untouched."""


# --- sentence-transformers files ---


def _st_modules():
    try:
        from sentence_transformers.sentence_transformer import modules
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers import models as modules
    return modules


def _read_json(path: str) -> dict | None:
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _write_json(path: str, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")


def _layer_weights(pooler: str, num_layers: int):
    """WeightedLayerPooling over hidden_states[layer_start:] that equals SimCSE's average of two layers."""
    if pooler == "avg_first_last":  # (hidden_states[1] + hidden_states[-1]) / 2
        layer_start, weights = 1, torch.zeros(num_layers)
        weights[0] += 1
        weights[-1] += 1
    else:  # avg_top2: (hidden_states[-2] + hidden_states[-1]) / 2
        layer_start, weights = num_layers - 1, torch.ones(2)
    return layer_start, weights


def _copy_head_into_encoder_pooler(auto_model, mlp) -> bool:
    """Store the MLP head as the encoder's own pooler (dense + tanh over the first token), as SimCSE's released
    checkpoints do, so `AutoModel(...).pooler_output` is the sentence embedding. SimCSEModel never uses (and freezes)
    that pooler, so this changes nothing for training or resuming."""
    pooler = getattr(auto_model, "pooler", None)
    dense = getattr(pooler, "dense", None)
    if not (isinstance(dense, nn.Linear) and isinstance(getattr(pooler, "activation", None), nn.Tanh)):
        return False
    if dense.weight.shape != mlp.dense.weight.shape or dense.bias is None:
        return False
    dense.load_state_dict(mlp.dense.state_dict())
    return True


def write_sentence_transformers_files(output_dir: str, model, tokenizer, max_seq_length: int | None = None) -> None:
    """modules.json, the modules matching the evaluation pooler and sentence_bert_config.json, written by
    sentence-transformers itself into a folder that already holds the encoder and tokenizer.

    * `max_seq_length`: default the training `max_seq_length` from simcse_config.json (saved as the tokenizer's
      `model_max_length`, which is what sentence-transformers truncates to).
    * `cls` with `mlp_only_train=False` adds a Dense(tanh) module carrying the MLP head; the head is also stored as
      the encoder's pooler when the architecture has a dense+tanh one (BERT, RoBERTa).
    * `avg_first_last` / `avg_top2` have no Pooling mode: a WeightedLayerPooling with weights 1 on the two layers
      and 0 elsewhere averages them, then mean pooling; the encoder is told to return hidden states through
      `config_args` in sentence_bert_config.json (config.json is left as it is).
    """
    if tokenizer is None:
        logger.warning("no tokenizer given: sentence-transformers files not written to %s", output_dir)
        return
    from sentence_transformers import SentenceTransformer

    modules = _st_modules()
    if max_seq_length is None:
        max_seq_length = (_read_json(os.path.join(output_dir, SIMCSE_CONFIG)) or {}).get("max_seq_length")
    transformer = modules.Transformer(output_dir, max_seq_length=max_seq_length)
    hidden_size = model.config.hidden_size
    stack = [transformer]
    if model.pooler in _LAYER_POOLERS:
        layer_start, weights = _layer_weights(model.pooler, model.config.num_hidden_layers)
        stack.append(
            modules.WeightedLayerPooling(
                hidden_size,
                num_hidden_layers=model.config.num_hidden_layers,
                layer_start=layer_start,
                layer_weights=nn.Parameter(weights),
            )
        )
    stack.append(modules.Pooling(hidden_size, pooling_mode=ST_POOLING[model.pooler]))
    if model.pooler == "cls" and not model.mlp_only_train:
        dense = modules.Dense(hidden_size, model.mlp.dense.out_features, activation_function=nn.Tanh())
        dense.linear.load_state_dict(model.mlp.dense.state_dict())
        stack.append(dense)
        _copy_head_into_encoder_pooler(transformer.auto_model, model.mlp)
    SentenceTransformer(modules=stack, device="cpu").save(output_dir, create_model_card=False)
    _write_classic_module_configs(output_dir, model, max_seq_length)


# The configuration keys of each module as sentence-transformers 2.x-5.x read them (the format of the models on the
# Hub). sentence-transformers 6 writes a new format (module paths under sentence_transformers.base/..., renamed keys)
# that 5.x cannot load ("No module named 'sentence_transformers.base'"); 6 still reads the classic one.
_CLASSIC_TYPE = "sentence_transformers.models.{}"
_CLASSIC_POOLING_MODES = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens",
                          "lasttoken")  # fmt: skip
_CLASSIC_POOLING_NAMES = {"cls": "cls_token", "mean": "mean_tokens"}
_CLASSIC_DENSE_KEYS = ("in_features", "out_features", "bias", "activation_function")


def _write_classic_module_configs(output_dir: str, model, max_seq_length: int | None) -> None:
    """Rewrite modules.json and the module configs that sentence-transformers just saved in the classic format,
    so that every sentence-transformers version from 2.x on loads the folder (the weights files are the same)."""
    hidden_size = model.config.hidden_size
    entries = _read_json(os.path.join(output_dir, "modules.json"))
    for entry in entries:
        name = entry["type"].rsplit(".", 1)[-1]
        entry["type"] = _CLASSIC_TYPE.format(name)
        config_path = os.path.join(output_dir, entry["path"], "config.json")
        if name == "Pooling":
            mode = _CLASSIC_POOLING_NAMES[ST_POOLING[model.pooler]]
            config = {"word_embedding_dimension": hidden_size, "include_prompt": True}
            config.update({f"pooling_mode_{m}": m == mode for m in _CLASSIC_POOLING_MODES})
            _write_json(config_path, config)
        elif name == "Dense":
            config = _read_json(config_path)
            _write_json(config_path, {key: config[key] for key in _CLASSIC_DENSE_KEYS})
        elif name == "WeightedLayerPooling":
            layer_start, _ = _layer_weights(model.pooler, model.config.num_hidden_layers)
            config = {"word_embedding_dimension": hidden_size, "layer_start": layer_start,
                      "num_hidden_layers": model.config.num_hidden_layers}  # fmt: skip
            _write_json(config_path, config)
    _write_json(os.path.join(output_dir, "modules.json"), entries)

    config = {"do_lower_case": False}
    if max_seq_length is not None:
        config["max_seq_length"] = int(max_seq_length)
    if model.pooler in _LAYER_POOLERS:  # the encoder must return every layer's hidden states
        config["config_args"] = {"output_hidden_states": True}
    _write_json(os.path.join(output_dir, "sentence_bert_config.json"), config)


# --- model card ---


def _is_hub_id(name: str | None) -> bool:
    """'owner/name' or 'name' that is not a local path, a file or a builtin."""
    if not name or ":" in name or os.path.exists(name) or name.startswith((".", "/", "~")):
        return False
    return os.path.splitext(name)[1] == "" and name.count("/") <= 1


def base_model_license(base_model: str | None) -> str | None:
    """The base model's license from its card (a local folder, or the Hub cache; never the network), else from
    KNOWN_LICENSES, else None."""
    from huggingface_hub import ModelCard, try_to_load_from_cache

    if not base_model:
        return None
    try:  # a malformed id or card only costs the license line
        path = os.path.join(base_model, CARD) if os.path.isdir(base_model) else None
        if path is None and _is_hub_id(base_model):
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
    """One `EvalResult` per STS task (Spearman x 100 of cosine similarities) for the card's model-index."""
    from huggingface_hub import EvalResult

    scores, _ = _sts_scores(sts_results)
    metric_args = {"aggregation": sts_results.get("aggregation", "all"), "scale": 100}
    return [
        EvalResult(
            task_type="sentence-similarity",
            task_name="Semantic Textual Similarity",
            dataset_type=STS_DATASETS[name],
            dataset_name=name,
            dataset_split="test",
            metric_type=STS_METRIC,
            metric_name="Spearman (cosine) x 100",
            metric_value=round(score, 2),
            metric_args=metric_args,
        )
        for name, score in scores.items()
    ]


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
    loss = config.get("loss", "infonce")
    lines = [LOSS_DESCRIPTIONS.get(loss, f"`{loss}`"), "", "| setting | value |", "|:--|:--|", f"| loss | `{loss}` |"]
    for key, value in sorted((config.get("loss_kwargs") or {}).items()):
        lines.append(f"| {key} | `{value}` |")
    if "contrast_form" in config:
        form = config["contrast_form"]
        meaning = "first views against second views" if form == "simcse" else "every row against all 2N-2 others"
        lines.append(f"| contrast_form | `{form}` ({meaning}) |")
    return "\n".join(lines)


def _training_section(config: dict, dev_spearman: float | None) -> str:
    pooler = config.get("pooler", "cls")
    head = ""
    if pooler == "cls":
        head = " (MLP head in training only)" if config.get("mlp_only_train", True) else " + MLP head (dense+tanh)"
    rows = [("base model", f"`{config['base_model']}`" if config.get("base_model") else None)]
    rows.append(("pooler", f"`{pooler}`{head}"))
    rows.append(("max_seq_length", config.get("max_seq_length")))
    batch, world = config.get("per_device_train_batch_size"), config.get("world_size", 1)
    if batch:
        rows.append(("batch size", f"{batch} per device x {world} process(es) = {batch * world} sentences"))
    rows.append(("learning rate", config.get("learning_rate")))
    rows.append(("training data", f"`{config['train_file']}`" if config.get("train_file") else None))
    if dev_spearman is not None:
        rows.append(("STS-B dev Spearman x 100 (model selection)", f"{dev_spearman:.2f}"))
    shown = {"base_model", "pooler", "mlp_only_train", "max_seq_length", "per_device_train_batch_size", "world_size"}
    shown |= {"learning_rate", "train_file", "loss", "loss_kwargs", "contrast_form"}
    rows += [(key, f"`{value}`") for key, value in sorted(config.items()) if key not in shown]
    return "\n".join(["| | |", "|:--|:--|"] + [f"| {k} | {v} |" for k, v in rows if v is not None])


def _head_in_encoder_pooler(output_dir: str | None) -> bool:
    """True when the saved encoder's pooler holds the MLP head (see `_copy_head_into_encoder_pooler`)."""
    if output_dir is None:
        return False
    from safetensors import safe_open

    head, weights = os.path.join(output_dir, HEAD_WEIGHTS), os.path.join(output_dir, "model.safetensors")
    if not (os.path.isfile(head) and os.path.isfile(weights)):
        return False
    with safe_open(head, "pt") as h, safe_open(weights, "pt") as w:
        key = next((k for k in w.keys() if k.endswith("pooler.dense.weight")), None)
        return key is not None and w.get_tensor(key).equal(h.get_tensor("dense.weight"))


def _transformers_pooling(config: dict, output_dir: str | None) -> tuple[str, str]:
    """(forward keyword arguments, code that turns `out`/`mask` into `embeddings`) for the card's snippet."""
    pooler = config.get("pooler", "cls")
    mean = 'mask = batch["attention_mask"].unsqueeze(-1).float()\nembeddings = (hidden * mask).sum(1) / mask.sum(1)'
    if pooler == "avg":
        return "", f"hidden = out.last_hidden_state\n{mean}"
    if pooler == "avg_first_last":
        return ", output_hidden_states=True", f"hidden = (out.hidden_states[1] + out.hidden_states[-1]) / 2\n{mean}"
    if pooler == "avg_top2":
        return ", output_hidden_states=True", f"hidden = (out.hidden_states[-2] + out.hidden_states[-1]) / 2\n{mean}"
    if pooler == "cls" and not config.get("mlp_only_train", True):
        if _head_in_encoder_pooler(output_dir):
            return "", "embeddings = out.pooler_output  # SimCSE's MLP head over [CLS], stored as the encoder's pooler"
        return "", (
            "from huggingface_hub import hf_hub_download\n"
            "from safetensors.torch import load_file\n\n"
            f'head = load_file(hf_hub_download(model_id, "{HEAD_WEIGHTS}"))  # SimCSE\'s MLP head (dense + tanh)\n'
            'embeddings = torch.tanh(out.last_hidden_state[:, 0] @ head["dense.weight"].T + head["dense.bias"])'
        )
    return "", "embeddings = out.last_hidden_state[:, 0]  # [CLS]"


def _usage_section(config: dict, model_id: str, output_dir: str | None) -> str:
    forward_kwargs, pooling = _transformers_pooling(config, output_dir)
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


def _card_data(config: dict, sts_results: dict | None, model_name: str):
    from huggingface_hub import ModelCardData

    base, loss = config.get("base_model"), config.get("loss", "infonce")
    tags = ["sentence-transformers", "sentence-similarity", "feature-extraction", "simcse", loss]
    eval_results = sts_eval_results(sts_results) if sts_results else []
    return ModelCardData(
        library_name="sentence-transformers",
        pipeline_tag="sentence-similarity",
        tags=list(dict.fromkeys(tags)),
        base_model=base if _is_hub_id(base) else None,
        datasets=[config["train_file"]] if _is_hub_id(config.get("train_file")) else None,
        license=base_model_license(base),
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

    model_id = model_id or model_name
    config = simcse_config
    loss = config.get("loss", "infonce")
    base = config.get("base_model")
    intro = (
        f"A sentence encoder trained with unsupervised [SimCSE](https://arxiv.org/abs/2104.08821) (two dropout views "
        f"of a sentence are its positive pair){f' from `{base}`' if base else ''}, with the `{loss}` objective, "
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

{sts_section(sts_results, model_name, command_model=model_id)}

## Usage

{_usage_section(config, model_id, output_dir)}

## Files

`simcse_config.json` (pooler, loss and hyper-parameters), `{HEAD_WEIGHTS}` (SimCSE's MLP head), the encoder and
tokenizer in transformers format, the sentence-transformers modules (`modules.json`), and `{STS_RESULTS}` when
evaluated.

## Citation

```bibtex
{SIMCSE_BIBTEX}
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
    HubError, before anything is written, unless `overwrite`.
    """
    if not overwrite and not card_is_ours(output_dir):
        raise HubError(
            f"{os.path.join(output_dir, CARD)} was not written by simcse-hn: not replacing it with the model card"
        )
    if simcse_config is None:
        simcse_config = _read_json(os.path.join(output_dir, SIMCSE_CONFIG)) or {}
    if sts_results is None:
        sts_results = _read_json(os.path.join(output_dir, STS_RESULTS))
    else:
        _write_json(os.path.join(output_dir, STS_RESULTS), sts_results)
    name = repo_id.split("/")[-1] if repo_id else os.path.basename(os.path.abspath(output_dir))
    card = model_card(
        simcse_config,
        sts_results,
        model_name=name,
        model_id=repo_id or output_dir,
        dev_spearman=dev_spearman,
        output_dir=output_dir,
    )
    card.text = card.text.rstrip("\n") + f"\n\n{CARD_MARKER}\n"
    path = os.path.join(output_dir, CARD)
    card.save(path)
    return path


def card_is_ours(output_dir: str) -> bool:
    """Whether write_model_card may write output_dir's README.md: there is none, or simcse-hn wrote it."""
    path = os.path.join(output_dir, CARD)
    if not os.path.exists(path):
        return True
    with open(path, encoding="utf-8", errors="replace") as f:
        return CARD_MARKER in f.read()


# --- the Hub ---


def find_token(token: str | None = None) -> str | None:
    """The explicit token, else HF_TOKEN, else the one saved by `hf auth login`."""
    from huggingface_hub import get_token

    return token or get_token()


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection-level errors: the HTTP client's base error (httpx2 under huggingface_hub 2.x, httpx under 1.x)."""
    from huggingface_hub.errors import LocalEntryNotFoundError  # hf_hub_download's "could not reach the Hub"

    errors: list[type[BaseException]] = [ConnectionError, TimeoutError, LocalEntryNotFoundError]
    for name in ("httpx2", "httpx"):
        with contextlib.suppress(ImportError):
            errors.append(importlib.import_module(name).HTTPError)
    return tuple(errors)


@contextlib.contextmanager
def _hub_errors(action: str):
    """Turn what huggingface_hub raises (HTTP status, connection, offline mode, bad metadata) into a HubError."""
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    try:
        yield
    except OfflineModeIsEnabled:
        raise HubError(f"{action}: offline mode is on (HF_HUB_OFFLINE=1); unset it to reach the Hub") from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        hint = " (check the token's write access)" if status in (401, 403) else ""
        raise HubError(f"{action}: HTTP {status}{hint}: {_first_line(e)}") from None
    except _transport_errors() as e:
        raise HubError(f"{action}: cannot reach {constants.ENDPOINT} ({_first_line(e)})") from None
    except ValueError as e:  # e.g. README metadata rejected by /api/validate-yaml
        raise HubError(f"{action}: {_first_line(e)}") from None


def _require_token(token: str | None, action: str) -> str:
    token = find_token(token)
    if token is None:
        raise HubError(f"{action}: no Hugging Face token; run `hf auth login` or set HF_TOKEN")
    return token


def push_to_hub(
    output_dir: str,
    repo_id: str,
    token: str | None = None,
    private: bool | None = None,
    commit_message: str = "Upload SimCSE sentence encoder",
) -> str:
    """Create `repo_id` if needed and upload the saved model folder (not its checkpoints) in one commit; returns the
    commit URL. Raises HubError (one line) without credentials, network or permission."""
    from huggingface_hub import HfApi

    action = f"push {output_dir} to {repo_id}"
    if not os.path.isfile(os.path.join(output_dir, SIMCSE_CONFIG)):
        raise HubError(f"{action}: not a saved model folder (no {SIMCSE_CONFIG})")
    api = HfApi(token=_require_token(token, action))
    with _hub_errors(action):
        repo = api.create_repo(repo_id, private=private, exist_ok=True)
        info = api.upload_folder(
            repo_id=repo.repo_id,
            folder_path=output_dir,
            commit_message=commit_message,
            # Trainer state that is not the model: checkpoints, logs, pickled arguments.
            ignore_patterns=["checkpoint-*", "runs/*", "_*", "training_args.bin", "*.pt", "*.pth"],
        )
    logger.info("pushed %s to %s", output_dir, info.commit_url)
    return info.commit_url


def update_card_sts(card_text: str, results: dict, model_name: str | None = None) -> str:
    """An existing card with its STS section and STS model-index entries replaced by `results` (other metadata and
    other evaluation results are kept; a card without the section gets it appended)."""
    from huggingface_hub import ModelCard

    card = ModelCard(card_text, ignore_metadata_errors=True)
    model_name = card.data.model_name or model_name or "model"
    ours = set(STS_DATASETS.values())
    kept = [r for r in (card.data.eval_results or []) if r.dataset_type not in ours]
    card.data.eval_results = kept + sts_eval_results(results)
    card.data.model_name = model_name
    section = sts_section(results, model_name)
    pattern = re.compile(re.escape(_STS_BEGIN) + r".*?" + re.escape(_STS_END), flags=re.DOTALL)
    if pattern.search(card.text):
        card.text = pattern.sub(lambda _: section, card.text, count=1)
    else:
        card.text = card.text.rstrip("\n") + f"\n\n## STS results\n\n{section}\n"
    return card.content


def push_sts_results(repo_id: str, results: dict, token: str | None = None) -> str:
    """Upload sts_results.json to an existing model repo and update its card's STS table and model-index, in one
    commit; returns the commit URL. A repo without a card gets one built from its simcse_config.json."""
    from huggingface_hub import CommitOperationAdd, HfApi

    action = f"push STS results to {repo_id}"
    api = HfApi(token=_require_token(token, action))
    name = repo_id.split("/")[-1]
    with _hub_errors(action), tempfile.TemporaryDirectory() as cache:
        files = {sibling.rfilename for sibling in api.model_info(repo_id).siblings or []}
        if CARD in files:
            with open(api.hf_hub_download(repo_id, CARD, cache_dir=cache), encoding="utf-8") as f:
                content = update_card_sts(f.read(), results, model_name=name)
        else:
            config_path = (
                api.hf_hub_download(repo_id, SIMCSE_CONFIG, cache_dir=cache) if SIMCSE_CONFIG in files else None
            )
            config = (_read_json(config_path) if config_path else None) or {}
            content = str(model_card(config, results, model_name=name, model_id=repo_id))
        operations = [
            CommitOperationAdd(STS_RESULTS, (json.dumps(results, indent=2, sort_keys=True) + "\n").encode()),
            CommitOperationAdd(CARD, content.encode()),
        ]
        info = api.create_commit(repo_id, operations, commit_message="Add STS results")
    logger.info("pushed STS results to %s", info.commit_url)
    return info.commit_url
