"""Reliability, class 4: resume trusts a checkpoint only when it is complete (its trainer_state.json parses, every
weight and state file is whole) and this run family wrote it, and otherwise takes the previous one with a warning
saying why; a run killed after its last checkpoint (during the final save) resumes without training past max_steps,
to the weights of an uninterrupted run, whatever the learning-rate schedule."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest
from conftest import FIXTURES
from test_hub import train_args
from test_resume import _run, _weights

from simcse_hn.cli import train
from simcse_hn.errors import ConfigError
from simcse_hn.training.checkpoints import resolve_resume, write_checkpoint_manifest


def _truncate(path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _rewrite_json(path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}), encoding="utf-8")


BROKEN = {  # how the newest checkpoint is broken -> the reason the warning gives
    "empty state": (lambda c: (c / "trainer_state.json").write_text(""), "trainer_state.json does not parse"),
    "truncated weights": (lambda c: _truncate(c / "model.safetensors"), "model.safetensors is truncated"),
    "garbled header": (
        lambda c: (c / "simcse_head.safetensors").write_bytes(b"\xff" * 64),
        "simcse_head.safetensors has no readable safetensors header",
    ),
    "truncated optimizer": (lambda c: _truncate(c / "optimizer.pt", 0.9), "optimizer.pt is truncated"),
    "another run's": (
        lambda c: _rewrite_json(c / "simcse_config.json", run_id="0123abcd"),
        "written by another run (run_id 0123abcd",
    ),
    "not simcse-hn's": (lambda c: os.remove(c / "simcse_config.json"), "not written by simcse-hn"),
    "a renamed copy": (  # a stray checkpoint-6 that is checkpoint-4, renamed
        lambda c: (_rewrite_json(c / "trainer_state.json", global_step=4), write_checkpoint_manifest(str(c), 4)),
        "its trainer_state.json is of step 4, not 6 (a copy or a rename)",
    ),
    "manifest of another step": (
        lambda c: write_checkpoint_manifest(str(c), 4),
        "checkpoint_manifest.json is of step 4, its trainer_state.json of step 6",
    ),
}


def _copy_as_step(checkpoint, folder, step: int) -> None:
    """A whole checkpoint of step `step`: a copy of `checkpoint` whose trainer_state.json and manifest say `step`."""
    shutil.copytree(checkpoint, folder)
    _rewrite_json(folder / "trainer_state.json", global_step=step)
    write_checkpoint_manifest(str(folder), step)


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A finished tiny run with checkpoint-2 and checkpoint-4."""
    out = tmp_path_factory.mktemp("run") / "out"
    train.run(train_args(out, "--max_steps", "4", "--save_steps", "2", "--save_total_limit", "3"))
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    return out


@pytest.mark.parametrize("kind", list(BROKEN))
def test_a_broken_or_foreign_newest_checkpoint_is_skipped_with_the_reason(run_folder, kind, caplog):
    breaks, reason = BROKEN[kind]
    newest = run_folder / "checkpoint-6"
    _copy_as_step(run_folder / "checkpoint-4", newest, 6)
    try:
        breaks(newest)
        with caplog.at_level("WARNING"):
            assert resolve_resume("true", str(run_folder)) == str(run_folder / "checkpoint-4")
        assert f"{newest} is skipped: {reason}" in caplog.text
        if kind != "another run's":  # named explicitly, another run's checkpoint is that run's resume
            with pytest.raises(ConfigError, match=re.escape(f"checkpoint-6 cannot be resumed from: {reason}")) as e:
                resolve_resume(str(newest), str(run_folder))  # an error, no fallback
            assert "\n" not in str(e.value)
    finally:
        shutil.rmtree(newest)


def test_resume_into_a_folder_simcse_hn_did_not_write_is_a_one_line_error(tmp_path, capsys):
    theirs = tmp_path / "theirs" / "checkpoint-3"
    theirs.mkdir(parents=True)
    (theirs / "trainer_state.json").write_text('{"global_step": 3}', encoding="utf-8")
    assert train.main(train_args(theirs.parent, "--resume_from_checkpoint", "true")) == 2
    assert capsys.readouterr().err == (
        f"error: resume_from_checkpoint: {theirs.parent} was not written by simcse-hn (no simcse_run.json), so it "
        "holds no checkpoint of this run\n"
    )


@pytest.mark.slow
def test_a_run_killed_during_its_final_save_resumes_without_an_extra_step(tmp_path):
    """Killed after its last checkpoint, while writing output_dir. An uninterrupted run's final weights are its
    weights after the last step, which the last checkpoint holds; transformers would train one step past max_steps
    on resume (it checks for the end only after a step), and under a constant learning rate that step changes them."""
    crashed = tmp_path / "crashed"
    common = [
        "--config", "configs/debug_tiny.yaml",
        "--train_file", str(FIXTURES / "tiny_corpus.txt"),
        "--output_dir", str(crashed),
        "--max_steps", "6", "--save_steps", "2", "--save_total_limit", "2",
        "--eval_strategy", "no", "--load_best_model_at_end", "false",
        "--lr_scheduler_type", "constant",
        "--disable_tqdm", "true", "--seed", "7",
    ]  # fmt: skip
    result = _run(common, crash="save final")
    assert result.returncode == 137
    last = crashed / "checkpoint-6"
    assert (last / "trainer_state.json").is_file()  # the last checkpoint is complete, the final folder is not
    assert (crashed / "model.safetensors").is_file() and not (crashed / "simcse_config.json").exists()
    after_the_last_step = _weights(last)

    result = _run([*common, "--resume_from_checkpoint", "true"])
    assert result.returncode == 0, result.stderr[-2000:]
    got = _weights(crashed)
    assert got.keys() == after_the_last_step.keys()
    for name, value in after_the_last_step.items():
        assert (got[name] == value).all(), name
    assert sorted(p.name for p in crashed.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]
    assert f"{last} already reached step 6: finishing the save only" in result.stdout
