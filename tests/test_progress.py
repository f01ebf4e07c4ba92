"""Every long wait shows a bar naming what it does where a bar can be watched (a terminal, a notebook), and a log file
gets lines, never a bar's carriage returns or cursor-up escapes; the end of a run and its truncation warning say what
their numbers are."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from conftest import FIXTURES, ROOT
from test_sts_cli import run_cli, write_data

from simcse_hn import progress
from simcse_hn.evaluation.starting_point import start_summary

DEBRIS = ("\r", "\x1b[A")  # a bar's redraw, a nested bar's cursor-up


def test_a_live_bar_is_named_and_a_log_gets_one_line_instead(monkeypatch, capsys, caplog):
    monkeypatch.setattr(progress, "live", lambda: True)
    assert list(progress.progress(iter(range(3)), "encoding all-MiniLM-L6-v2", total=3)) == [0, 1, 2]
    assert "encoding all-MiniLM-L6-v2: 100%" in capsys.readouterr().err
    monkeypatch.setattr(progress, "live", lambda: False)
    with caplog.at_level(logging.INFO, logger="simcse_hn.progress"):
        assert list(progress.progress(iter(range(3)), "encoding all-MiniLM-L6-v2", total=3)) == [0, 1, 2]
    assert capsys.readouterr().err == ""
    assert caplog.messages == ["encoding all-MiniLM-L6-v2: 3 batches"]


def test_a_piped_process_has_no_live_bar_and_a_terminal_has_one():
    probe = "import sys; from simcse_hn.progress import live; sys.stdout.write(str(live()))"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    piped = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert piped.stdout == "False"
    import pty

    leader, follower = pty.openpty()
    with subprocess.Popen([sys.executable, "-c", probe], stdout=subprocess.PIPE, stderr=follower, env=env) as shown:
        out = shown.communicate(timeout=60)[0]
    os.close(follower)
    os.close(leader)
    assert out == b"True"


def test_eval_sts_names_the_model_each_encoding_is_for_and_leaves_no_debris(tmp_path):
    data = write_data(tmp_path / "sts", pairs_per_subset=3)
    result = run_cli(
        "--model",
        "builtin:tiny-bert",
        "--baseline",
        "builtin:tiny-bert:avg",
        "--data_dir",
        str(data),
        "--output",
        str(tmp_path / "out"),
        "--no_mteb_results",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "INFO simcse_hn.progress: encoding builtin:tiny-bert: " in result.stderr
    assert "INFO simcse_hn.progress: encoding builtin:tiny-bert (avg pooler): " in result.stderr
    assert not any(mark in result.stdout + result.stderr for mark in DEBRIS)


def test_a_logged_training_run_has_lines_and_no_bar_debris(tmp_path):
    command = [
        sys.executable,
        "train.py",
        "--config",
        "configs/debug_tiny.yaml",
        "--output_dir",
        str(tmp_path / "o"),
        "--max_steps",
        "4",
        "--eval_steps",
        "2",
        "--save_steps",
        "2",
        "--logging_steps",
        "2",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    log = result.stdout + result.stderr
    assert "{'loss': " in log and "{'eval_stsb_spearman': " in log  # each log a line of its own
    assert not any(mark in log for mark in DEBRIS), repr(log[-1500:])


def test_the_trainers_bars_are_named_where_they_are_shown(tmp_path, capsys):
    from simcse_hn.cli import train

    argv = [
        "--config",
        str(ROOT / "configs" / "debug_tiny.yaml"),
        "--train_file",
        str(FIXTURES / "tiny_corpus.txt"),
        "--eval_file",
        str(FIXTURES / "sts_tiny.jsonl"),
        "--output_dir",
        str(tmp_path / "o"),
        "--max_steps",
        "2",
        "--eval_steps",
        "2",
        "--save_steps",
        "2",
        "--disable_tqdm",
        "false",
    ]
    train.run(argv)
    err = capsys.readouterr().err
    assert "training: 100%" in err and "evaluating: 100%" in err


def test_the_end_line_without_a_start_in_the_trained_pooler_says_whose_the_other_number_is():
    own = ("all-MiniLM-L6-v2's own mean pooling", 86.72)
    line = start_summary("cls", 81.93, None, own, "outputs/q", "builtin:all-MiniLM-L6-v2")[0]
    assert line == (
        "STS-B dev Spearman x 100 of the saved model (cls pooler): 81.93; the cls pooler before training: not scored "
        "(--eval_on_start true scores it); another vector, all-MiniLM-L6-v2's own mean pooling before training: 86.72"
    )
