"""The card is complete after the README's steps (issue 65): train.py writes a card that records its command and
says which length is which; eval/sts.py on the folder (step 4, no --save_to_model) writes its STS table into the
card, with the rows of the encoders scored beside it and its command; no Python repr in the card or results.md; a
card simcse-hn did not write is never touched."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT
from huggingface_hub import ModelCard
from test_sts_cli import run_cli, write_data

REPR = re.compile(r"\{'|': |\bNone\b|\bTrue\b|\bFalse\b")  # a dict's repr, or Python's constants


def train(out, *extra: str) -> None:
    command = [sys.executable, "train.py", "--config", "configs/debug_tiny.yaml", "--output_dir", str(out)]
    command += ["--max_steps", "2", "--eval_steps", "2", "--save_steps", "2", "--disable_tqdm", "true", *extra]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("trained") / "tiny"
    train(out, "--seed", "7")
    return out


def test_step_four_fills_the_card_with_its_table_the_baselines_and_both_commands(tmp_path, trained):
    out = tmp_path / "tiny"
    shutil.copytree(trained, out)
    card = (out / "README.md").read_text()
    assert "| training command | `python train.py --config configs/debug_tiny.yaml --output_dir tiny " in card
    assert "| max_seq_length (training: tokens per sentence) | 32 |" in card
    assert "| max_seq_length (inference: what sentence-transformers truncates to) | 128 |" in card
    assert "| eval_max_seq_length (the STS-B dev evaluation during training) | 128 |" in card
    assert "Not evaluated on the STS benchmarks yet (`python eval/sts.py --model path/to/tiny`)" in card
    assert not REPR.search(card.split("## Usage")[0]), REPR.search(card).group(0)

    data = write_data(tmp_path / "sts")
    baselines = ["--baseline", "builtin:tiny-bert", "--baseline", "builtin:tiny-bert:avg"]
    result = run_cli("--model", str(out), "--data_dir", str(data), *baselines, "--no_progress_bar", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "tiny-sts" / "results.json").read_text())
    command = "python eval/sts.py --model tiny --data_dir sts " + " ".join(baselines) + " --no_progress_bar"
    assert results["settings"]["command"] == command
    card = ModelCard.load(str(out / "README.md"))
    rows = [line for line in card.text.splitlines() if line.startswith("| ") and "STS12" not in line]
    labels = ("tiny (cls)", "builtin:tiny-bert (cls)", "builtin:tiny-bert (avg)")
    table = [row for row in rows if row.split(" | ")[0].lstrip("| ") in labels]
    assert len(table) == 3, rows
    for row, record in zip(table, [results, *results["baselines"]]):
        assert row.split(" | ")[1] == f"{record['tasks']['STS12']['spearman']:.2f}"
    assert f"Made by `{command}`." in card.text
    assert "| training command | `python train.py --config configs/debug_tiny.yaml" in card.text  # still there
    own = {name: round(task["spearman"], 2) for name, task in results["tasks"].items()}
    assert {r.dataset_name: r.metric_value for r in card.data.eval_results} == own  # the model's, not a baseline's
    saved = json.loads((out / "sts_results.json").read_text())
    assert saved["baselines"] == results["baselines"] and "sts_results.json" in (out / "simcse_files.json").read_text()
    assert not REPR.search(card.text.split("## Usage")[0])
    report = (tmp_path / "tiny-sts" / "results.md").read_text()
    assert f"Made by `{command}`." in report and "Training command: `python train.py --config" in report
    assert not REPR.search(report), REPR.search(report).group(0)


def test_a_card_simcse_hn_did_not_write_is_never_touched(tmp_path, trained):
    out = tmp_path / "tiny"
    shutil.copytree(trained, out)
    (out / "README.md").write_text("# my own card\n")
    data = write_data(tmp_path / "sts")
    result = run_cli("--model", str(out), "--data_dir", str(data), "--no_progress_bar", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "README.md").read_text() == "# my own card\n" and not (out / "sts_results.json").exists()


def test_no_save_to_model_leaves_a_trained_folder_as_it_is(tmp_path, trained):
    """What simcse-hn-study scores its runs with: the model folder's files stay those the run's record binds."""
    out = tmp_path / "tiny"
    shutil.copytree(trained, out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    data = write_data(tmp_path / "sts")
    flags = ["--data_dir", str(data), "--no_progress_bar", "--no_save_to_model"]
    result = run_cli("--model", str(out), *flags, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "tiny-sts" / "results.json").is_file()
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    both = run_cli("--model", str(out), "--data_dir", str(data), "--save_to_model", "--no_save_to_model", cwd=tmp_path)
    assert both.returncode == 2
    assert both.stderr.strip().splitlines()[-1] == "error: --save_to_model and --no_save_to_model: choose one"
