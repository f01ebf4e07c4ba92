"""Reliability, class 7: settings that pass every range check yet silently disable the objective are rejected with
the other configuration errors: a non-finite value in any float field (an `inf` temperature or tilt makes every
step fall back to InfoNCE, or train nothing), and a ProGCL-mix K above the negatives an anchor has."""

from __future__ import annotations

import pytest
from test_hub import train_args

from simcse_hn.cli import train
from simcse_hn.configuration.parser import parse_args
from simcse_hn.errors import ConfigError
from simcse_hn.modeling.model import SimCSEModel


@pytest.mark.parametrize(
    "name, value",
    [
        ("temperature", "inf"),
        ("temperature", "nan"),
        ("hcl_beta", "inf"),
        ("unremix_beta", "inf"),
        ("unremix_beta", "-inf"),
        ("progcl_warmup_ratio", "nan"),
        ("dropout", "nan"),  # ModelArguments
        ("learning_rate", "inf"),  # TrainingArguments' own fields too
        ("weight_decay", "nan"),
        ("max_grad_norm", "inf"),
    ],
)
def test_a_non_finite_float_setting_is_a_config_error(tmp_path, name, value):
    with pytest.raises(ConfigError) as error:
        parse_args([f"--{name}={value}", "--output_dir", str(tmp_path)])  # `=`: argparse takes "-inf" for a flag
    assert str(error.value) == f"{name}: must be a finite number, got {float(value)}"


def test_a_non_finite_yaml_value_names_the_field_and_file(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("loss: hcl\nhcl_beta: .inf\n", encoding="utf-8")
    with pytest.raises(ConfigError) as error:
        parse_args(["--config", str(config), "--output_dir", str(tmp_path)])
    assert str(error.value) == f"hcl_beta: must be a finite number, got inf (in {config})"


def test_progcl_mix_k_above_the_negatives_per_anchor_is_a_config_error(tmp_path):
    base = ["--loss", "progcl", "--progcl_mode", "mix", "--per_device_train_batch_size", "16", "--output_dir",
            str(tmp_path)]  # fmt: skip
    args = parse_args(base + ["--progcl_mix_k", "30"])[2]
    assert args.negatives_per_anchor() == 30  # 2 x 16 rows, less the anchor and its positive
    with pytest.raises(ConfigError) as error:
        parse_args(base + ["--progcl_mix_k", "31"])
    assert str(error.value) == (
        "progcl_mix_k: must be <= the 30 negatives per anchor (2 x 16 sentences x 1 processes - 2), got 31"
    )


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--loss", "unremix", "--unremix_beta", "inf"], "unremix_beta: must be a finite number, got inf"),
        (["--loss", "progcl", "--progcl_mode", "mix", "--progcl_mix_k", "64"], "progcl_mix_k: must be <= the 30"),
    ],
)
def test_train_reports_them_before_any_model_loads(tmp_path, monkeypatch, capsys, extra, message):
    def no_model_loads(*args, **kwargs):
        raise AssertionError("a model was loaded before the configuration was validated")

    monkeypatch.setattr(SimCSEModel, "from_pretrained", no_model_loads)
    assert train.main(train_args(tmp_path / "out", *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1
