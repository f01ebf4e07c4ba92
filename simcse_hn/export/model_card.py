"""The model card (README.md) of a saved folder: Hub metadata (ModelCardData with base_model, a model-index of the
STS results), the objective and its settings, the training budget, the STS table in the SimCSE paper's layout, and
usage for sentence-transformers and transformers. `update_card_sts` replaces the STS part of an existing card."""

from __future__ import annotations

import json
import logging
import os
import re

from huggingface_hub import ModelCard, ModelCardData, try_to_load_from_cache

from simcse_hn.data.sts import STS_TASKS
from simcse_hn.export.card_sections import (
    STS_BEGIN,
    STS_END,
    STS_METRIC,
    citations,
    hub_name,
    objective_section,
    source_cell,
    sts_eval_results,
    sts_section,
    training_section,
    usage_section,
)
from simcse_hn.files import (
    CARD,
    HEAD_WEIGHTS,
    SIMCSE_CONFIG,
    STS_RESULTS,
    is_hub_id,
    read_json,
    record_files,
    recorded_files,
    write_json,
)
from simcse_hn.losses import BASELINE
from simcse_hn.run_record import RunRecord

logger = logging.getLogger(__name__)


# The last line of every card write_model_card writes: a README.md without it is someone else's and is never replaced.
CARD_MARKER = "<!-- model card written by simcse-hn; it is rewritten on each save -->"

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


def base_model_license(base_model: str | None) -> str | None:
    """The base model's license from its card (a local folder, or the Hub cache; never the network), else from
    KNOWN_LICENSES, else None."""
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


def card_data(record: RunRecord, sts_results: dict | None, model_name: str):
    base, data = hub_name(record.model.base_model), hub_name(record.data.source)
    loss = record.method.objective_name or record.method.loss or BASELINE
    tags = ["sentence-transformers", "sentence-similarity", "feature-extraction", "simcse", loss]
    eval_results = sts_eval_results(sts_results) if sts_results else []
    return ModelCardData(
        library_name="sentence-transformers",
        pipeline_tag="sentence-similarity",
        tags=list(dict.fromkeys(tags)),
        base_model=base,
        datasets=[data] if data else None,
        license=record.model.license or base_model_license(base),
        eval_results=eval_results or None,
        model_name=model_name if eval_results else None,
    )


def model_card(
    simcse_config: dict | RunRecord,
    sts_results: dict | None = None,
    *,
    model_name: str,
    model_id: str | None = None,
    dev_spearman: float | None = None,
    output_dir: str | None = None,
):
    """The `huggingface_hub.ModelCard` of a trained model (see `write_model_card`); `simcse_config`: its record, or
    the folder's simcse_config.json as read (of any version)."""
    record = simcse_config if isinstance(simcse_config, RunRecord) else RunRecord.from_json(simcse_config)
    loss = record.method.objective_name or record.method.loss or BASELINE
    base = source_cell(record.model.base_model)
    intro = (
        f"A sentence encoder trained with unsupervised [SimCSE](https://arxiv.org/abs/2104.08821) (two dropout views "
        f"of a sentence are its positive pair){f' from {base}' if base else ''}, with the `{loss}` objective, "
        f"by simcse-hn. Sentences map to vectors compared by cosine "
        f"similarity (pooler `{record.model.pooler or 'cls'}`); the folder loads in sentence-transformers and "
        f"in transformers."
    )
    body = f"""
# {model_name}

{intro}

## Training objective

{objective_section(record)}

## Training

{training_section(record, dev_spearman)}

## STS results

{sts_section(sts_results, model_name, command_model=model_id or f"path/to/{model_name}")}

## Usage

{usage_section(record, model_id, model_name, output_dir)}

## Files

`simcse_config.json` (pooler, loss and hyper-parameters), `{HEAD_WEIGHTS}` (SimCSE's MLP head), the encoder and
tokenizer in transformers format, the sentence-transformers modules (`modules.json`), and `{STS_RESULTS}` when
evaluated.

## Citation

```bibtex
{citations(record)}
```
"""
    data = card_data(record, sts_results, model_name)
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


def sts_card_is_ours(folder: str) -> bool:
    """Whether eval/sts.py writes its results into `folder` by itself: a model folder simcse-hn trained, whose
    README.md simcse-hn wrote, and whose sts_results.json (if any) its manifest lists (a checkpoint, without a card,
    and a user's file are left alone)."""
    card, results = os.path.join(folder, CARD), os.path.join(folder, STS_RESULTS)
    if not (os.path.isfile(os.path.join(folder, SIMCSE_CONFIG)) and os.path.isfile(card) and card_is_ours(folder)):
        return False
    return not os.path.exists(results) or STS_RESULTS in (recorded_files(folder) or [])


def update_card_sts(card_text: str, results: dict, model_name: str | None = None) -> str:
    """An existing card with its STS section and STS model-index entries replaced by `results` (other metadata and
    other evaluation results are kept; a card without the section gets it appended)."""
    card = ModelCard(card_text, ignore_metadata_errors=True)
    model_name = card.data.model_name or model_name or "model"
    kept = [
        r for r in (card.data.eval_results or []) if not (r.metric_type == STS_METRIC and r.dataset_name in STS_TASKS)
    ]
    card.data.eval_results = kept + sts_eval_results(results)
    card.data.model_name = model_name
    section = sts_section(results, model_name)
    pattern = re.compile(re.escape(STS_BEGIN) + r".*?" + re.escape(STS_END), flags=re.DOTALL)
    if pattern.search(card.text):
        card.text = pattern.sub(lambda _: section, card.text, count=1)
    else:
        card.text = card.text.rstrip("\n") + f"\n\n## STS results\n\n{section}\n"
    return card.content


def save_sts_results(folder: str, results: dict) -> None:
    """sts_results.json into the model folder (listed in its manifest, so a push uploads it) and the card updated:
    its STS table (with the rows of `results["baselines"]` and the command of `results["settings"]`) and
    model-index (the model's own scores) replaced, the rest kept; a card simcse-hn did not write is left alone."""
    with open(os.path.join(folder, STS_RESULTS), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    record_files(folder, [STS_RESULTS])
    card = os.path.join(folder, CARD)
    if not os.path.isfile(card):
        write_model_card(folder, sts_results=results)
    elif card_is_ours(folder):
        with open(card, encoding="utf-8") as f:
            text = update_card_sts(f.read(), results, model_name=os.path.basename(os.path.normpath(folder)))
        with open(card, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        logger.warning("%s was not written by simcse-hn: its STS results are not updated", card)
