"""Combinations of the scaling features that cannot work are one-line errors before anything loads: GradCache with
DeepSpeed, ZeRO-3 without gathered weights for the saved folder, UnReMix's learned mixture with ZeRO-3, a DeepSpeed
launch without deepspeed, streaming without max_steps, LoRA settings without LoRA or without peft, a first-token
pooler on a decoder-only model."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from simcse_hn.cli import train
from simcse_hn.configuration.parser import parse_args
from simcse_hn.errors import ConfigError
from simcse_hn.modeling.model import SimCSEModel

HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None

# The DeepSpeed plugin TrainingArguments builds from accelerate launch's environment registers itself globally
# (transformers' deepspeed weakref): each case runs in a subprocess, as train.py would under `accelerate launch`.
DEEPSPEED_CASES = """
import json, os, sys
from simcse_hn.configuration.parser import parse_args
from simcse_hn.errors import ConfigError
out = {}
for name, env, extra in json.loads(sys.argv[1]):
    os.environ.update(env)
    try:
        parse_args(["--config", "configs/debug_tiny.yaml", "--output_dir", sys.argv[2], *extra])
        out[name] = None
    except ConfigError as e:
        out[name] = str(e)
print(json.dumps(out))
"""


def deepspeed_errors(cases: list, tmp_path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", DEEPSPEED_CASES, json.dumps(cases), str(tmp_path)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def zero(stage: int, save_16bit: bool = True) -> dict:
    """What `accelerate launch --config_file configs/accelerate/deepspeed_zero{stage}.yaml` puts in the environment."""
    return {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": str(stage),
            "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": str(save_16bit).lower()}  # fmt: skip


@pytest.mark.skipif(not HAS_DEEPSPEED, reason="needs deepspeed (without it: the next test)")
def test_deepspeed_combinations_that_cannot_work_are_config_errors(tmp_path):
    errors = deepspeed_errors(
        [
            ["gradcache_zero2", zero(2), ["--cache_minibatch_size", "4"]],
            ["zero3_without_16bit_save", zero(3, save_16bit=False), []],
            ["unremix_learned_zero3", zero(3), ["--loss", "unremix", "--unremix_learn_mixture", "true"]],
            ["unremix_learned_zero2", zero(2), ["--loss", "unremix", "--unremix_learn_mixture", "true"]],
            ["zero3", zero(3), []],
        ],
        tmp_path,
    )
    assert errors["gradcache_zero2"].startswith("cache_minibatch_size: GradCache does not work with DeepSpeed ZeRO-2")
    assert errors["zero3_without_16bit_save"].startswith(
        "deepspeed: ZeRO-3 saves no model weights without stage3_gather_16bit_weights_on_model_save"
    )
    assert errors["unremix_learned_zero3"].startswith("unremix_learn_mixture: not with DeepSpeed ZeRO-3")
    assert errors["unremix_learned_zero2"] is None and errors["zero3"] is None  # these work (tests/test_sharded.py)


@pytest.mark.skipif(HAS_DEEPSPEED, reason="deepspeed is installed")
def test_a_deepspeed_launch_without_deepspeed_is_one_line(tmp_path):
    errors = deepspeed_errors([["zero2", zero(2), []]], tmp_path)
    assert errors["zero2"].startswith("deepspeed: ") and errors["zero2"].endswith("(pip install deepspeed)")
    assert "\n" not in errors["zero2"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--streaming", "true"], "max_steps: required with streaming"),
        (["--streaming", "true", "--max_steps", "5", "--drop_duplicates", "true"],
         "drop_duplicates: not available with streaming"),
        (["--lora_target_modules", "query", "value"], "lora_target_modules: needs lora_r"),
        (["--lora_r", "0"], "lora_r: must be >= 1, got 0"),
        (["--lora_r", "4", "--lora_dropout", "1"], "lora_dropout: must be in [0, 1), got 1.0"),
        (["--pooler", "last2"], "pooler:"),
    ],
)  # fmt: skip
def test_scaling_settings_are_checked_with_the_configuration(tmp_path, argv, message):
    with pytest.raises(ConfigError) as error:
        parse_args(["--config", str(ROOT / "configs" / "debug_tiny.yaml"), "--output_dir", str(tmp_path),
                    "--max_steps", "-1", *argv])  # fmt: skip
    assert str(error.value).startswith(message), str(error.value)


def test_lora_without_peft_is_one_line(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else find_spec(name, *a))
    with pytest.raises(ConfigError) as error:
        parse_args(["--lora_r", "8", "--output_dir", str(tmp_path)])
    assert str(error.value) == "lora_r: LoRA needs peft, which is not installed (pip install 'simcse-hn[lora]')"


def test_a_first_token_pooler_on_a_decoder_only_model_is_refused_before_loading(tiny_args, capsys, monkeypatch):
    monkeypatch.setattr(SimCSEModel, "from_pretrained", None)  # nothing may load
    code = train.main(tiny_args + ["--model_name_or_path", "builtin:tiny-llama", "--pooler", "cls"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0
    assert err.startswith("error: pooler: 'cls' reads the first token, which in the decoder-only llama model")


def test_an_encoder_without_dropout_is_warned_about(tiny_args, caplog):
    """SimCSE's two views differ only by dropout: without any, the positives are the anchors themselves."""
    with caplog.at_level("WARNING", logger="simcse_hn"):
        train.run(tiny_args + ["--dropout", "0", "--max_steps", "1", "--eval_strategy", "no", "--save_strategy", "no",
                               "--load_best_model_at_end", "false"])  # fmt: skip
    assert "builtin:tiny-bert has no dropout: SimCSE's two views of a sentence are identical" in caplog.text


def test_fsdp_requested_where_accelerate_cannot_run_it_is_warned_about(tmp_path, monkeypatch, caplog):
    """accelerate runs FSDP on accelerators only; on a CPU the run is plain data parallel, which the user is told."""
    from dist_worker_common import make_loss, make_model, make_trainer

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with caplog.at_level("WARNING", logger="simcse_hn"):
        trainer = make_trainer(make_model(), make_loss("infonce", "infonce"), tmp_path)
    assert not trainer.is_fsdp_enabled
    assert "FSDP was requested, but accelerate runs it on GPUs (or other accelerators) only" in caplog.text
