"""What an STS report records beside its scores: the evaluating code's identity and the model's training record
(eval/sts.py, simcse_hn/cli/sts.py)."""

from __future__ import annotations

import json
import logging
import os

from simcse_hn.errors import UserError
from simcse_hn.evaluation.reports import model_label
from simcse_hn.files import SIMCSE_CONFIG
from simcse_hn.provenance import code_identity
from simcse_hn.run_record import RunRecord

logger = logging.getLogger("eval.sts")


def code_settings(model: str, other_code: str | None, require_same: bool = False) -> dict:
    """The evaluating code's identity, the model's recorded training code (None for a model simcse-hn did not train)
    and whether they agree (None when there is no record to compare)."""
    ours = code_identity()
    config = training_config(model)
    recorded = dict(RunRecord.from_json(config).provenance.code) if isinstance(config, dict) else {}
    theirs = recorded or None  # a record (of any version) without the code's identity compares with nothing
    same = None if theirs is None else theirs.get("source_sha256") == ours["source_sha256"]
    if require_same and same is not True:
        why = (
            "records no training code"
            if same is None
            else (
                f"was trained by code {theirs['source_sha256'][:12]}, "
                f"this evaluation runs {ours['source_sha256'][:12]}"
            )
        )
        raise UserError(f"--require_same_code: {model_label(model)} {why}")
    return {"code": ours, "training_code": theirs, "same_code": same, "other_code": other_code}


def training_config(model: str) -> dict | None:
    """The model's simcse_config.json (what it was trained with), from its folder or the Hub cache; None when it
    has none (a model this project did not train) or it cannot be read."""
    path = os.path.join(model, SIMCSE_CONFIG)
    if not os.path.isdir(model):
        try:
            from huggingface_hub import hf_hub_download

            path = hf_hub_download(model, SIMCSE_CONFIG)
        except Exception:  # no such file, repo or network: the results stand without it
            return None
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        logger.warning("%s: unreadable (%s); results.json gets no 'training' record", path, e)
        return None
    return config if isinstance(config, dict) else None
