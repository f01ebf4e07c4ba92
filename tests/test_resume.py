"""A run killed mid-way resumes from its last complete checkpoint and ends with the weights of an uninterrupted
run; hard-negative state (ProGCL mixture, UnReMix's learned mixture) travels with the checkpoint."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import FIXTURES, ROOT
from safetensors.torch import load_file

# A SIGKILL at a chosen point (env CRASH): "step N" right after step N finished (checkpoint N is on disk only if N is
# a save step); "save NAME" half-way through writing the folder NAME ("checkpoint-6", or "final" for output_dir):
# its encoder weights are written, nothing else.
CRASH = """
import os, sys, train
from transformers import TrainerCallback
from simcse_hn.training.trainer import SimCSETrainer

where = os.environ["CRASH"]

class Crash(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if where == f"step {state.global_step}":
            os._exit(137)

init = SimCSETrainer.__init__
def patched(self, *a, **k):
    init(self, *a, **k)
    self.add_callback(Crash())
SimCSETrainer.__init__ = patched

save = SimCSETrainer.save_model  # every save goes through it: the Trainer's checkpoints and the final folder
def crashing_save(self, output_dir=None, _internal_call=False):
    folder = output_dir if output_dir is not None else self.args.output_dir
    final = os.path.abspath(folder) == os.path.abspath(self.args.output_dir)
    if where == "save " + ("final" if final else os.path.basename(folder)):
        self.accelerator.unwrap_model(self.model).encoder.save_pretrained(folder)
        os._exit(137)
    save(self, output_dir, _internal_call)
SimCSETrainer.save_model = crashing_save
sys.exit(train.main(sys.argv[1:]))
"""


def _run(args, crash: str | None = None):
    code = ["-c", CRASH] if crash else ["train.py"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CRASH": crash or ""}
    return subprocess.run(
        [sys.executable, *code, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env
    )


def _weights(folder):
    state = load_file(os.path.join(folder, "model.safetensors"))
    state.update({f"head.{k}": v for k, v in load_file(os.path.join(folder, "simcse_head.safetensors")).items()})
    loss_state = os.path.join(folder, "simcse_loss_state.safetensors")
    if os.path.isfile(loss_state):
        state.update({f"loss.{k}": v for k, v in load_file(loss_state).items()})
    return state


@pytest.mark.slow
@pytest.mark.parametrize(
    "loss_args, crash, resumed_from",
    [
        (["--loss", "progcl", "--progcl_warmup_ratio", "0.25", "--progcl_warm_start", "true"], "step 5", 4),
        # killed while writing the last checkpoint, under a constant learning rate (a linear decay reaches lr 0 at the
        # end, where a wrong extra step would change no weight)
        (["--loss", "unremix", "--unremix_learn_mixture", "true", "--lr_scheduler_type", "constant"],
         "save checkpoint-8", 6),
    ],
    ids=["progcl-step-5", "unremix-constant-lr-last-checkpoint"],
)  # fmt: skip
def test_killed_run_resumes_to_the_same_weights(tmp_path, loss_args, crash, resumed_from):
    common = [
        "--config", "configs/debug_tiny.yaml",
        "--train_file", str(FIXTURES / "tiny_corpus.txt"),
        "--eval_file", str(FIXTURES / "sts_tiny.jsonl"),
        "--max_steps", "8", "--save_steps", "2", "--eval_steps", "2", "--save_total_limit", "2",
        "--load_best_model_at_end", "false",
        "--disable_tqdm", "true",
        "--seed", "7",
        *loss_args,
    ]  # fmt: skip
    straight = tmp_path / "straight"
    crashed = tmp_path / "crashed"
    result = _run([*common, "--output_dir", str(straight)])
    assert result.returncode == 0, result.stderr[-2000:]

    result = _run([*common, "--output_dir", str(crashed)], crash=crash)
    assert result.returncode == 137
    newest = crashed / f"checkpoint-{resumed_from + 2}"
    assert (crashed / f"checkpoint-{resumed_from}" / "trainer_state.json").is_file()
    assert not (newest / "trainer_state.json").exists()
    assert not (crashed / "model.safetensors").exists()
    if not newest.exists():  # a checkpoint the crash interrupted while writing must be skipped, not loaded
        shutil.copytree(crashed / f"checkpoint-{resumed_from}", newest)
        os.remove(newest / "trainer_state.json")

    result = _run([*common, "--output_dir", str(crashed), "--resume_from_checkpoint", "true"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"resuming from {crashed / f'checkpoint-{resumed_from}'}" in result.stdout
    assert f"{newest} is skipped: no trainer_state.json" in result.stdout + result.stderr

    expected, got = _weights(straight), _weights(crashed)
    assert expected.keys() == got.keys()
    if "progcl" in loss_args:
        assert {"loss.bmm_alpha", "loss.bmm_beta", "loss.bmm_pi"} <= got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0, msg=name)


def test_resume_needs_a_folder_of_this_run_and_starts_again_when_nothing_was_ever_whole(tmp_path, caplog):
    from simcse_hn.errors import ConfigError
    from simcse_hn.training.checkpoints import claim_output_dir, resolve_resume

    (tmp_path / "checkpoint-3").mkdir()
    with pytest.raises(ConfigError, match="was not written by simcse-hn"):
        resolve_resume("true", str(tmp_path))
    with pytest.raises(ConfigError, match="checkpoint-3 cannot be resumed from: no trainer_state.json"):
        resolve_resume(str(tmp_path / "checkpoint-3"), str(tmp_path))
    claim_output_dir(str(tmp_path), "run-a")
    with caplog.at_level("WARNING"):  # cut short before its record: nothing whole to lose, set aside, never read
        assert resolve_resume("true", str(tmp_path)) is None
    assert caplog.text.count("\n") == 1 and "starting it again from step 0" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-3.incomplete", "simcse_run.json"]
