"""A resume compares the run's whole record: what the allowlist names may differ and the run still ends bit-equal to
one never stopped; a longer run only with --extend_schedule, whose schedule is the new length's from the resumed
step on and which the record's history keeps; a user's objective by its file and every module of theirs it imports."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch
from safetensors.torch import load_file
from test_hub import train_args

from simcse_hn.cli import train
from simcse_hn.record_compare import ALLOWLIST
from simcse_hn.training.checkpoints import write_checkpoint_manifest

COMMON = ["--save_steps", "2", "--seed", "5", "--logging_steps", "1"]


def _same_weights(want, got) -> None:
    for name in ("model.safetensors", "simcse_head.safetensors"):
        expected, found = load_file(str(want / name)), load_file(str(got / name))
        for key in expected:
            torch.testing.assert_close(found[key], expected[key], rtol=0, atol=0, msg=f"{name}: {key}")


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """Four steps, never stopped: checkpoint-2, checkpoint-4 and the final folder."""
    out = tmp_path_factory.mktemp("straight") / "out"
    assert train.main(train_args(out, *COMMON, "--max_steps", "4")) == 0
    return out


def _stopped_after_checkpoint_2(straight, folder):
    """The straight run's folder as a run killed after checkpoint-2 leaves it."""
    shutil.copytree(straight, folder)
    shutil.rmtree(folder / "checkpoint-4")
    for name in ("model.safetensors", "simcse_head.safetensors", "simcse_config.json"):
        (folder / name).unlink()


def test_what_the_allowlist_names_may_change_and_the_run_still_ends_bit_equal(straight, tmp_path):
    out = tmp_path / "out"
    _stopped_after_checkpoint_2(straight, out)
    changed = ["--logging_steps", "3", "--save_steps", "3", "--save_total_limit", "1", "--report_to", "none",
               "--run_name", "renamed", "--disable_tqdm", "false", "--dataloader_num_workers", "0"]  # fmt: skip
    assert {flag[2:] for flag in changed[::2]} <= set(ALLOWLIST)
    argv = train_args(out, *COMMON, "--max_steps", "4", *changed, "--resume_from_checkpoint", "true")
    assert train.main(argv) == 0
    _same_weights(straight, out)
    history = json.loads((out / "simcse_config.json").read_text())["history"]
    assert [(event["step"], event["event"], event["changes"]) for event in history] == [(2, "resumed", {})]
    for checkpoint in out.glob("checkpoint-*"):  # the record is part of each checkpoint's unit
        assert "simcse_config.json" in json.loads((checkpoint / "checkpoint_manifest.json").read_text())["files"]


def test_a_longer_run_needs_extend_schedule_and_its_schedule_is_the_new_lengths(tmp_path, capsys):
    out = tmp_path / "out"
    assert train.main(train_args(out, *COMMON, "--max_steps", "2")) == 0
    longer = train_args(out, *COMMON, "--max_steps", "4", "--resume_from_checkpoint", "true")
    assert train.main(longer) == 2
    assert "pass --extend_schedule true to extend it" in capsys.readouterr().err
    assert train.main(longer + ["--extend_schedule", "true"]) == 0
    record = json.loads((out / "simcse_config.json").read_text())
    assert record["history"][-1] == {"step": 2, "event": "extended", "changes": {"max_steps": [2, 4]},
                                     "source_sha256": record["provenance"]["code"]["source_sha256"]}  # fmt: skip
    assert record["optimisation"]["max_steps"] == 4 and record["budget"]["steps"] == 4
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    rates = {entry["step"]: entry["learning_rate"] for entry in state["log_history"] if "learning_rate" in entry}
    # linear decay, no warmup: step s trains at lr0 (T - s + 1) / T, T = 2 up to the checkpoint; step 3 at the rate
    # the checkpoint's schedule had set for it (0: the end of the 2-step decay), step 4 and on at T = 4's
    assert rates == pytest.approx({1: 1e-3, 2: 1e-3 / 2, 3: 0.0, 4: 1e-3 / 4}, rel=1e-6)


HELPER = "SCALE = {scale}\n"
OBJECTIVE = """from helper_module import SCALE
from simcse_hn.losses import ContrastiveLoss, ObjectiveInput, ObjectiveOutput


class ScaledInfoNCE(ContrastiveLoss):
    name = "scaled"

    def per_anchor(self, batch: ObjectiveInput) -> ObjectiveOutput:
        return ObjectiveOutput(loss=SCALE * batch.plain.loss())
"""


def test_a_changed_module_that_the_objective_imports_is_refused(tmp_path, capsys, monkeypatch):
    code = tmp_path / "code"
    code.mkdir()
    (code / "helper_module.py").write_text(HELPER.format(scale=1.0), encoding="utf-8")
    (code / "scaled.py").write_text(OBJECTIVE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(code))
    out = tmp_path / "out"
    argv = train_args(out, *COMMON, "--max_steps", "2", "--loss", f"{code / 'scaled.py'}:ScaledInfoNCE")
    assert train.main(argv) == 0
    record = json.loads((out / "simcse_config.json").read_text())["method"]
    assert list(record["objective_imports"]) == ["helper_module"]  # its own module; not torch, not simcse_hn
    (code / "helper_module.py").write_text(HELPER.format(scale=2.0), encoding="utf-8")
    monkeypatch.delitem(sys.modules, "helper_module", raising=False)
    assert train.main(argv + ["--resume_from_checkpoint", "true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: loss: module helper_module, which the objective's file imports, is not the one "
                          "checkpoint-2 was trained with (sha256 ")  # fmt: skip
    assert err.count("\n") == 1


def test_a_run_killed_before_its_first_checkpoint_was_whole_starts_again(straight, tmp_path, caplog):
    """No dead end: checkpoint-2 without its manifest is all there is; a resume starts again from step 0."""
    out = tmp_path / "out"
    _stopped_after_checkpoint_2(straight, out)
    (out / "checkpoint-2" / "checkpoint_manifest.json").unlink()
    with caplog.at_level("WARNING"):
        assert train.main(train_args(out, *COMMON, "--max_steps", "4", "--resume_from_checkpoint", "true")) == 0
    assert "(checkpoint-2 cut short before its manifest): starting it again from step 0" in caplog.text
    _same_weights(straight, out)


@pytest.mark.parametrize("lost", ["a damaged whole checkpoint", "the finished model"])
def test_a_resume_that_would_lose_something_whole_is_refused(straight, tmp_path, capsys, lost):
    out = tmp_path / "out"
    if lost == "the finished model":  # a run without checkpoints, finished
        assert train.main(train_args(out, *COMMON, "--max_steps", "2", "--save_strategy", "no")) == 0
        line = f"{out} holds this run's finished model (2 steps) and no checkpoint: there is nothing to resume"
    else:
        _stopped_after_checkpoint_2(straight, out)
        (out / "checkpoint-2" / "scheduler.pt").write_bytes(b"not the file it was")
        line = f"no whole checkpoint of this run in {out} (checkpoint-2: scheduler.pt is "
    assert train.main(train_args(out, *COMMON, "--max_steps", "4", "--resume_from_checkpoint", "true")) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: resume_from_checkpoint: {line}") and err.count("\n") == 1, err


def test_a_checkpoint_written_before_the_record_is_refused_in_one_line(straight, tmp_path, capsys):
    out = tmp_path / "out"
    _stopped_after_checkpoint_2(straight, out)
    config = out / "checkpoint-2" / "simcse_config.json"
    record = json.loads(config.read_text())
    flat = {"run_id": record["run_id"], "loss": "infonce", "loss_kwargs": {"temperature": 0.05}, "seed": 5,
            "checkpoint_manifest": "checkpoint_manifest.json"}  # fmt: skip
    config.write_text(json.dumps(flat))  # as simcse-hn 0.x wrote it (the manifest no longer matches: taken by path)
    write_checkpoint_manifest(str(out / "checkpoint-2"), 2)
    assert train.main(train_args(out, *COMMON, "--max_steps", "4", "--resume_from_checkpoint", "true")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: resume_from_checkpoint: checkpoint-2 was written by an earlier simcse-hn, before "
                          "runs kept their whole record (its simcse_config.json has no record_version)")  # fmt: skip
    assert err.count("\n") == 1
