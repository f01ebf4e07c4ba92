"""Reliability, class 5: user mistakes that used to end in a traceback (or in a message naming neither field nor
file) are one line, `error: ...`, exit 2, before any model is loaded and, where the config alone tells, before any
data is read."""

from __future__ import annotations

import datasets
import pytest
import torch
from safetensors.torch import save_file
from test_hub import train_args
from transformers import BertConfig, DebertaV2Config, MPNetConfig, RobertaConfig

from simcse_hn.cli import run_data, train
from simcse_hn.files import CODE_MODELS
from simcse_hn.modeling.loading import model_max_length
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.testing.models import BUILTIN_MODELS


@pytest.fixture
def nothing_loads(monkeypatch):
    def fail(what):
        def refuse(*args, **kwargs):
            raise AssertionError(f"{what} before the mistake was reported")

        return refuse

    monkeypatch.setattr(SimCSEModel, "from_pretrained", fail("a model was loaded"))
    monkeypatch.setattr(run_data, "load_sentences", fail("the training data was read"))


def _roberta_folder(path):
    RobertaConfig(max_position_embeddings=34, pad_token_id=1, hidden_size=32, num_hidden_layers=1,
                  num_attention_heads=2, intermediate_size=64).save_pretrained(path)  # fmt: skip
    return path


def _case(tmp_path, name):
    """-> (extra argv, the one line on stderr)"""
    config = tmp_path / "list.yaml"
    config.write_text("temperature: [0.05, 0.1]\n", encoding="utf-8")
    (tmp_path / "a_file").write_text("", encoding="utf-8")
    unwritable = tmp_path / "a_file" / "out"
    roberta = _roberta_folder(tmp_path / "roberta")
    save_file({"x": torch.zeros(1)}, roberta / "model.safetensors")  # weights, for the config-only checks to pass
    config_only = _roberta_folder(tmp_path / "config_only")
    truncated = _roberta_folder(tmp_path / "truncated")
    save_file({"x": torch.zeros(64)}, truncated / "model.safetensors")
    with open(truncated / "model.safetensors", "r+b") as f:
        f.truncate(100)
    return {
        "missing model folder": (
            ["--model_name_or_path", "/no/such/model"],
            "model_name_or_path: no such model folder: /no/such/model",
        ),
        "missing hub model": (
            ["--model_name_or_path", "nobody-xyz/no-such-model"],
            "model_name_or_path: nobody-xyz/no-such-model is neither a folder here nor a Hub model that loads (",
        ),
        "a model folder without weights": (
            ["--model_name_or_path", str(config_only)],
            f"model_name_or_path: {config_only} has no weights (model.safetensors, model.safetensors.index.json, ",
        ),
        "truncated base-model weights": (
            ["--model_name_or_path", str(truncated)],
            f"model_name_or_path: {truncated}: ",
        ),
        "optimizer rejects the learning rate": (
            ["--learning_rate=-1e-5"],
            "learning_rate: Invalid learning rate: -1e-05",
        ),
        "optimizer rejects a beta": (
            ["--adam_beta1", "1.5"],
            "adam_beta1: Invalid beta parameter at index 0: 1.5",
        ),
        "paired data streamed": (
            ["--streaming", "true", "--max_steps", "2", "--data_format", "pairs"],
            "streaming: streams single-sentence corpora only; paired data (data_format pairs, hard_negative_weight) ",
        ),
        "loss rejects a value": (
            ["--loss", "unremix", "--unremix_beta", "-1"],
            "unremix_beta: must be >= 0, got -1.0",
        ),
        "beyond the positions": (
            ["--max_seq_length", "129"],
            "max_seq_length: 129 is above the 128 positions of builtin:tiny-bert",
        ),
        "beyond roberta's positions": (  # 34 position rows, the first two (padding index + 1) never used
            ["--model_name_or_path", str(roberta), "--max_seq_length", "33"],
            f"max_seq_length: 33 is above the 32 positions of {roberta}",
        ),
        "unwritable output folder": (
            ["--output_dir", str(unwritable)],
            f"output_dir: cannot write {unwritable} (NotADirectoryError: Not a directory)",
        ),
        "output folder is a file": (
            ["--output_dir", str(tmp_path / "a_file")],
            f"output_dir: {tmp_path / 'a_file'} exists and is not a folder",
        ),
        "a yaml list for one number": (
            ["--config", str(config)],
            f"temperature: expected one value, got a list [0.05, 0.1] (in {config})",
        ),
        "invalid hub repo id": (
            ["--push_to_hub", "true", "--hub_model_id", "me/not a name"],
            "hub_model_id: Repo id must use alphanumeric chars, '-', '_' or '.'.",
        ),
        # the Trainer's settings it takes unchecked: a traceback once the model had loaded, or a run of no step
        "accumulation of no step": (
            ["--gradient_accumulation_steps", "0"],
            "gradient_accumulation_steps: must be >= 1, got 0",
        ),
        "an evaluation batch of none": (["--per_device_eval_batch_size", "0"], "per_device_eval_batch_size: must be"),
        "negative data workers": (["--dataloader_num_workers", "-1"], "dataloader_num_workers: must be >= 0, got -1"),
        "a seed numpy refuses": (["--seed", "-1"], "seed: must be in [0, 2**32 - 1] (numpy's seeds), got -1"),
        "zero max_steps": (["--max_steps", "0"], "max_steps: must be > 0, or -1 (the default) for num_train_epochs"),
        "zero epochs": (
            ["--max_steps", "-1", "--num_train_epochs", "0"],
            "num_train_epochs: must be > 0 when max_steps is not set, got 0 (the run would train no step)",
        ),
        "a misspelt report_to": (
            ["--report_to", "tensorbord"],
            "report_to: unknown integration 'tensorbord' (did you mean 'tensorboard'?); choose from none, all, ",
        ),
        "a Trainer check names its field": (
            ["--warmup_steps", "-1"],
            "warmup_steps: Got warmup_steps = -1.0, Expected value warmup_steps >= 0",
        ),
        "a misspelt builtin model": (
            ["--model_name_or_path", "builtin:tiny-brt"],
            "model_name_or_path: builtin:tiny-brt is not a builtin model (did you mean builtin:tiny-bert?); ",
        ),
        "a folder for the train file": (["--train_file", str(tmp_path)], f"train_file: {tmp_path} is a folder; "),
    }[name]


CASES = [
    "missing model folder",
    "missing hub model",
    "a model folder without weights",
    "truncated base-model weights",
    "optimizer rejects the learning rate",
    "optimizer rejects a beta",
    "paired data streamed",
    "loss rejects a value",
    "beyond the positions",
    "beyond roberta's positions",
    "unwritable output folder",
    "output folder is a file",
    "a yaml list for one number",
    "invalid hub repo id",
    "accumulation of no step",
    "an evaluation batch of none",
    "negative data workers",
    "a seed numpy refuses",
    "zero max_steps",
    "zero epochs",
    "a misspelt report_to",
    "a Trainer check names its field",
    "a misspelt builtin model",
    "a folder for the train file",
]


@pytest.mark.parametrize("name", CASES)
def test_a_mistake_is_one_line_before_any_model_or_data_loads(tmp_path, name, nothing_loads, capsys):
    extra, message = _case(tmp_path, name)
    argv = train_args(tmp_path / "out")
    if "--config" in extra:  # a second --config: the YAML under test, with the rest of the tiny run on the CLI
        argv = argv[2:]
    assert train.main(argv + extra) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1, err


def test_a_report_to_whose_package_is_missing_and_a_name_no_file_or_dataset_has(tmp_path, nothing_loads, capsys,
                                                                                monkeypatch):  # fmt: skip
    from transformers.integrations import integration_utils

    monkeypatch.setattr(integration_utils, "get_available_reporting_integrations", lambda: [])
    assert train.main(train_args(tmp_path / "out", "--report_to", "tensorboard")) == 2
    err = capsys.readouterr().err
    assert err == "error: report_to: 'tensorboard' needs its Python package, which is not installed here\n"

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'wiki1m' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)  # a local file's name without its suffix, taken for an id
    assert train.main(train_args(tmp_path / "out", "--train_file", "wiki1m")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: train_file: wiki1m is neither a file here nor a Hub dataset that loads (Connection")
    assert err.count("\n") == 1
    streamed = train_args(tmp_path / "out", "--train_file", "wiki1m", "--streaming", "true")  # read by another path
    assert train.main(streamed) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: train_file: wiki1m is neither a file here nor a Hub dataset that loads (Connection")
    assert err.count("\n") == 1, err


def test_the_builtin_names_the_light_checks_know_are_the_models_built_in_code():
    assert CODE_MODELS == BUILTIN_MODELS


def test_position_limits_from_the_config():
    assert model_max_length(BertConfig()) == 512
    assert model_max_length(RobertaConfig(max_position_embeddings=514, pad_token_id=1)) == 512
    assert model_max_length(MPNetConfig(max_position_embeddings=514, pad_token_id=1)) == 512  # RoBERTa's offset too
    assert model_max_length(DebertaV2Config(position_biased_input=False)) is None  # relative positions only
