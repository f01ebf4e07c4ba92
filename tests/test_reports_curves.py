"""Training curves from what the Trainer writes (a real tiny run with TensorBoard), eval/curves.py and
eval/sts.py --curves."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from conftest import FIXTURES, ROOT
from test_sts_cli import load_script, write_data

from simcse_hn.cli import train
from simcse_hn.errors import DataError
from simcse_hn.evaluation.curves import event_folders, load_curves, read_tensorboard, write_curves

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """debug_tiny for 6 steps with TensorBoard: loss every 2 steps, STS-B dev and a checkpoint every 3."""
    out = tmp_path_factory.mktemp("run") / "out"
    trainer = train.run([
        "--config", str(ROOT / "configs" / "debug_tiny.yaml"), "--train_file", str(FIXTURES / "tiny_corpus.txt"),
        "--eval_file", str(FIXTURES / "sts_tiny.jsonl"), "--output_dir", str(out), "--disable_tqdm", "true",
        "--max_steps", "6", "--logging_steps", "2", "--eval_steps", "3", "--save_steps", "3",
        "--report_to", "tensorboard",
    ])  # fmt: skip
    return out, trainer.state.log_history


def test_curves_are_the_trainers_log_history_merged_with_tensorboard(trained, tmp_path):
    out, history = trained
    curves = load_curves(str(out))
    assert curves.name == "out"
    assert curves.sources[-1] == str(out / "checkpoint-6" / "trainer_state.json")  # the output folder has none
    assert len(curves.sources) == 2 and "runs" in curves.sources[0]
    losses = {e["step"]: e["loss"] for e in history if "loss" in e}
    assert list(losses) == [2, 4, 6] and curves.series["loss"] == losses
    first_dev = next(e["eval_stsb_spearman"] for e in history if "eval_stsb_spearman" in e)
    assert curves.series["eval_stsb_spearman"][3] == first_dev
    for key in ("pos_sim", "neg_sim", "clamp_frac", "learning_rate"):  # the loss diagnostics, every logging step
        assert list(curves.steps(key)) == [2, 4, 6]
    assert "train_runtime" not in curves.series and "epoch" not in curves.series

    # the event files alone hold the same numbers (float32) under the Trainer's tag names
    tensorboard = read_tensorboard(event_folders(str(out))[0])
    assert tensorboard["loss"] == {s: pytest.approx(v, rel=1e-6) for s, v in losses.items()}
    assert set(tensorboard["eval_stsb_spearman"]) == {3, 6}

    written = write_curves([curves], str(tmp_path))
    assert {"curves.md", "curves.json", "curves.png", "curve_loss.png", "curve_eval_stsb_spearman.png"} <= set(written)
    assert "alignment_uniformity.png" in written  # the trainer logs alignment and uniformity at each evaluation
    assert set(curves.series["eval_uniformity"]) == {3, 6}
    for name in written:
        assert (tmp_path / name).is_file()
    text = (tmp_path / "curves.md").read_text()
    assert f"| out | 6 | {losses[6]:.4g} |" in text
    assert json.loads((tmp_path / "curves.json").read_text())["out"]["series"]["loss"] == {str(k): v for k, v in
                                                                                           losses.items()}  # fmt: skip


def test_curves_without_tensorboard_installed_read_trainer_state(trained, monkeypatch, caplog):
    out, history = trained
    monkeypatch.setitem(sys.modules, "tensorboard.backend.event_processing.event_accumulator", None)
    curves = load_curves(str(out))
    assert curves.sources == [str(out / "checkpoint-6" / "trainer_state.json")]
    assert "tensorboard is not installed" in caplog.text


def write_state(folder, history):
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"log_history": history}))


def test_several_runs_alignment_uniformity_and_constant_metrics(tmp_path, capsys):
    history = []
    for step in (10, 20, 30):
        history += [{"step": step, "loss": 3.0 - step / 100, "nonfinite_fallback": 0.0, "pos_sim": 0.8},
                    {"step": step, "eval_stsb_spearman": 70 + step / 10, "eval_alignment": 0.3 - step / 1000,
                     "eval_uniformity": -2 - step / 100}]  # fmt: skip
    write_state(tmp_path / "a" / "checkpoint-30", history)
    write_state(tmp_path / "b" / "checkpoint-20", [{"step": 20, "loss": 2.0, "pos_sim": 0.7, "epoch": 1.0}])
    (tmp_path / "b" / "checkpoint-40").mkdir()  # incomplete (no trainer_state.json): skipped
    curves = load_script("curves")
    out = tmp_path / "report"
    assert curves.main([str(tmp_path / "a"), str(tmp_path / "b"), "--output", str(out)]) == 0
    text = (out / "curves.md").read_text()
    assert "| a | 30 | 2.7 | 73.00 (30) | 73.00 |" in text and "| b | 20 | 2 | – | – |" in text
    assert "Constant over every logged step (not drawn): nonfinite_fallback = 0" in text
    assert not (out / "curve_nonfinite_fallback.png").exists()
    assert (out / "alignment_uniformity.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "curve_pos_sim.png").is_file() and text in capsys.readouterr().out

    assert curves.main([str(tmp_path / "a"), "--output", str(out), "--keys", "loss,kl"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: --keys: kl not logged by any run; logged: loss,")
    (tmp_path / "empty").mkdir()
    assert curves.main([str(tmp_path / "empty"), "--output", str(out)]) == 2
    message = "empty: no trainer_state.json (in the folder or a checkpoint-N) and no TensorBoard"
    assert message in capsys.readouterr().err
    with pytest.raises(DataError, match="malformed JSON"):
        (tmp_path / "bad").mkdir()
        (tmp_path / "bad" / "trainer_state.json").write_text("{")
        load_curves(str(tmp_path / "bad"))


def test_a_curves_json_redraws_its_runs_without_their_folders(tmp_path, capsys):
    write_state(tmp_path / "a" / "checkpoint-30", [{"step": s, "loss": 3.0 - s / 10} for s in (10, 20, 30)])
    write_state(tmp_path / "b", [{"step": 10, "loss": 1.5}, {"step": 20, "loss": 1.0}])
    curves = load_script("curves")
    first = tmp_path / "first"
    assert curves.main([str(tmp_path / "a"), "--output", str(first), "--labels", "run-a"]) == 0
    shutil.rmtree(tmp_path / "a")  # the training folder is gone; its record is enough
    again = tmp_path / "again"
    assert curves.main([str(first / "curves.json"), str(tmp_path / "b"), "--output", str(again), "--labels", "B"]) == 0
    record = json.loads((again / "curves.json").read_text())
    assert list(record) == ["run-a", "B"]  # the record's name kept, the label for the folder
    assert record["run-a"]["series"]["loss"] == {"10": 2.0, "20": 1.0, "30": 0.0}
    # named from the run's folder's parent on, not by this machine's absolute path (issue 39)
    assert record["run-a"]["sources"][-1] == "first/curves.json"
    assert "| run-a | 30 | 0 |" in (again / "curves.md").read_text()
    (tmp_path / "bad.json").write_text('{"x": {"loss": []}}')
    capsys.readouterr()
    assert curves.main([str(tmp_path / "bad.json"), "--output", str(again)]) == 2
    assert "bad.json: run 'x' has no 'series'" in capsys.readouterr().err


def test_sts_cli_adds_the_evaluated_runs_curves(trained, tmp_path):
    out, _ = trained
    data = write_data(tmp_path / "sts", pairs_per_subset=3)
    sts = load_script("sts")
    report = tmp_path / "report"
    assert sts.main(["--model", str(out), "--data_dir", str(data), "--output", str(report), "--curves",
                     "--no_progress_bar", "--tasks", "stsb,sickr"]) == 0  # fmt: skip
    assert (report / "curves" / "curves.md").read_text().startswith("# Training curves")
    assert (report / "curves" / "curve_loss.png").is_file()
    results = json.loads((report / "results.json").read_text())
    method = results["training"]["method"]
    assert method["loss"] == "infonce" and method["contrast_form"] == "symmetric"
    argv = ["--model", "builtin:tiny-bert", "--data_dir", str(data), "--output", str(report), "--curves"]
    assert sts.main(argv) == 2  # not a training folder: one error line, before the model loads
