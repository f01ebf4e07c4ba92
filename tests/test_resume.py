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

# Crash like a SIGKILL right after step 5 finished (checkpoint-4 is on disk, checkpoint-6 is not).
CRASH = """
import os, sys, train
from transformers import TrainerCallback
from simcse_hn.trainer import SimCSETrainer

class Crash(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 5:
            os._exit(137)

init = SimCSETrainer.__init__
def patched(self, *a, **k):
    init(self, *a, **k)
    self.add_callback(Crash())
SimCSETrainer.__init__ = patched
sys.exit(train.main(sys.argv[1:]))
"""


def _run(args, crash=False):
    code = ["-c", CRASH] if crash else ["train.py"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
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
    "loss_args",
    [
        ["--loss", "progcl", "--progcl_warmup_ratio", "0.25", "--progcl_warm_start", "true"],
        ["--loss", "unremix", "--unremix_learn_mixture", "true"],
    ],
    ids=["progcl", "unremix"],
)
def test_killed_run_resumes_to_the_same_weights(tmp_path, loss_args):
    common = [
        "--config",
        "configs/debug_tiny.yaml",
        "--train_file",
        str(FIXTURES / "tiny_corpus.txt"),
        "--eval_file",
        str(FIXTURES / "sts_tiny.jsonl"),
        "--max_steps",
        "8",
        "--save_steps",
        "2",
        "--eval_steps",
        "2",
        "--save_total_limit",
        "2",
        "--load_best_model_at_end",
        "false",
        "--disable_tqdm",
        "true",
        "--seed",
        "7",
        *loss_args,
    ]
    straight = tmp_path / "straight"
    crashed = tmp_path / "crashed"
    result = _run([*common, "--output_dir", str(straight)])
    assert result.returncode == 0, result.stderr[-2000:]

    result = _run([*common, "--output_dir", str(crashed)], crash=True)
    assert result.returncode == 137
    assert (crashed / "checkpoint-4").is_dir() and not (crashed / "checkpoint-6").exists()
    assert not (crashed / "model.safetensors").exists()
    # a checkpoint the crash interrupted while writing (no trainer_state.json) must be skipped, not loaded
    shutil.copytree(crashed / "checkpoint-4", crashed / "checkpoint-5")
    os.remove(crashed / "checkpoint-5" / "trainer_state.json")

    result = _run([*common, "--output_dir", str(crashed), "--resume_from_checkpoint", "true"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"resuming from {crashed / 'checkpoint-4'}" in result.stdout
    assert "checkpoint-5 is incomplete" in result.stdout + result.stderr

    expected, got = _weights(straight), _weights(crashed)
    assert expected.keys() == got.keys()
    if "progcl" in loss_args:
        assert {"loss.bmm_alpha", "loss.bmm_beta", "loss.bmm_pi"} <= got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0, msg=name)


def test_resume_needs_a_complete_checkpoint(tmp_path):
    from simcse_hn.checkpoints import resolve_resume
    from simcse_hn.config import ConfigError

    (tmp_path / "checkpoint-3").mkdir()
    with pytest.raises(ConfigError, match="no complete checkpoint in"):
        resolve_resume("true", str(tmp_path))
    with pytest.raises(ConfigError, match="checkpoint-3 is incomplete"):
        resolve_resume(str(tmp_path / "checkpoint-3"), str(tmp_path))
    (tmp_path / "checkpoint-3" / "trainer_state.json").write_text("{}")
    assert resolve_resume("latest", str(tmp_path)) == str(tmp_path / "checkpoint-3")
