"""FSDP through accelerate (configs/accelerate/fsdp.yaml: FSDP2, a shard group per encoder layer), two CPU processes
with gloo (tests/fsdp_cpu.py says why accelerate needs a nudge for that on a machine without GPUs).

* tests/fsdp_worker.py trains every objective (plain and with GradCache, LoRA too) under FSDP and saves; each saved
  folder must hold the weights of one process trained on the global batch: the cross-process negatives are exact
  under FSDP, and `save_model` writes the weights FSDP gathered, not the shards.
* A run stopped after step 3 and resumed from its checkpoint-2 (the Trainer's FSDP checkpoint: pytorch_model_fsdp.bin,
  or pytorch_model_fsdp_0/ with SHARDED_STATE_DICT) ends with the uninterrupted run's weights.
* train.py under `accelerate launch --config_file configs/accelerate/fsdp.yaml`: the folder loads in
  sentence-transformers and transformers, and the best checkpoint is what it holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch
from conftest import FIXTURES, ROOT
from fsdp_worker import CASES, build
from safetensors.torch import load_file

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

FSDP_CONFIG = str(ROOT / "configs" / "accelerate" / "fsdp.yaml")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


def launch(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", FSDP_CONFIG, "--num_processes",
               "2", "--mixed_precision", "no", *args]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    result = launch(str(ROOT / "tests" / "fsdp_worker.py"), str(out))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def saved_weights(folder) -> dict[str, torch.Tensor]:
    """A saved folder's weights under SimCSEModel's names (encoder., mlp., loss_fn.)."""
    weights = {f"encoder.{k}": v for k, v in load_file(os.path.join(folder, "model.safetensors")).items()}
    for name, prefix in (("simcse_head.safetensors", "mlp."), ("simcse_loss_state.safetensors", "loss_fn.")):
        if os.path.isfile(os.path.join(folder, name)):
            weights.update({prefix + k: v for k, v in load_file(os.path.join(folder, name)).items()})
    return weights


def assert_same_weights(got: dict, want: dict, rtol: float) -> None:
    assert got.keys() == want.keys(), sorted(set(got) ^ set(want))
    floats = [k for k in want if want[k].is_floating_point()]
    diff = torch.cat([(got[k] - want[k]).flatten() for k in floats]).norm()
    scale = torch.cat([want[k].flatten() for k in floats]).norm()
    assert float(diff / scale) <= rtol, f"relative difference {float(diff / scale):.2e}"
    for k in set(want) - set(floats):
        assert torch.equal(got[k], want[k]), k


@pytest.mark.parametrize(("case", "loss", "form", "overrides"), CASES, ids=[c[0] for c in CASES])
def test_fsdp_run_saves_the_weights_of_one_process_on_the_global_batch(runs, case, loss, form, overrides):
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        reference = build(case, loss, form, tmp, per_device_train_batch_size=8, **overrides)  # 2 x 4 sentences
        reference.train()
        want = {k: v.detach().clone() for k, v in reference.model.state_dict().items()}
        if case == "lora":  # the folder holds merged weights and the adapter: the reference's save merges alike
            reference.save_model(os.path.join(tmp, "saved"))
            want = saved_weights(os.path.join(tmp, "saved"))
            adapter = load_file(str(runs / case / "final" / "adapter" / "adapter_model.safetensors"))
            trained = {k.replace(".default", ""): v for k, v in reference.model.encoder.state_dict().items()}
            assert adapter and all(torch.allclose(v, trained[k], rtol=1e-10, atol=0) for k, v in adapter.items())
    got = saved_weights(runs / case / "final")
    initial = build(case, loss, form, tempfile.gettempdir()).model.state_dict()
    assert any(not torch.equal(got[k], initial[k]) for k in got if k in initial), "nothing trained"
    assert_same_weights(got, want, rtol=1e-10)


@pytest.mark.parametrize("kind", ["", "sharded_"], ids=["full_state_dict", "sharded_state_dict"])
def test_stopped_fsdp_run_resumes_to_the_uninterrupted_weights(runs, kind):
    resume = runs / "resume"
    checkpoint = resume / f"{kind}stopped" / "checkpoint-2"
    fsdp_files = "pytorch_model_fsdp_0" if kind else "pytorch_model_fsdp.bin"
    assert (checkpoint / fsdp_files).exists(), sorted(os.listdir(checkpoint))  # what the Trainer's loader reads
    straight = saved_weights(resume / "straight" / "final")
    assert_same_weights(saved_weights(resume / f"{kind}straight" / "final"), straight, rtol=1e-12)
    assert_same_weights(saved_weights(resume / f"{kind}stopped" / "final"), straight, rtol=1e-12)
    assert_same_weights(saved_weights(checkpoint), saved_weights(resume / "straight" / "checkpoint-2"), rtol=1e-12)


def test_train_py_under_the_fsdp_config(tmp_path):
    """The shipped config end to end, with STS-B dev selection: the final folder is the best checkpoint (loaded back
    by the Trainer's FSDP loader), each checkpoint's folder holds the weights of the Trainer's own FSDP checkpoint,
    and the folder loads in sentence-transformers with SimCSEModel's embeddings."""
    from sentence_transformers import SentenceTransformer

    from simcse_hn.modeling import SimCSEModel, load_tokenizer

    out = tmp_path / "out"
    args = ["--config", "configs/debug_tiny.yaml", "--train_file", str(FIXTURES / "tiny_corpus.txt"),
            "--eval_file", str(FIXTURES / "sts_tiny.jsonl"), "--output_dir", str(out), "--max_steps", "4",
            "--eval_steps", "2", "--save_steps", "2", "--disable_tqdm", "true", "--pooler", "avg"]  # fmt: skip
    result = launch(str(ROOT / "tests" / "fsdp_cpu.py"), *args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "world size 2 (process 0)" in result.stdout
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    best = state["best_model_checkpoint"]
    assert_same_weights(saved_weights(out), saved_weights(best), rtol=0)
    for step in (2, 4):
        checkpoint = out / f"checkpoint-{step}"
        fsdp = torch.load(checkpoint / "pytorch_model_fsdp.bin", map_location="cpu", weights_only=True)
        assert_same_weights(saved_weights(checkpoint), fsdp, rtol=0)
    sentences = ["A man is playing a guitar.", "The weather is cold today.", "Stocks fell sharply on Monday."]
    expected = SimCSEModel.from_pretrained(str(out)).encode(sentences, load_tokenizer(str(out)))
    got = SentenceTransformer(str(out), device="cpu").encode(sentences, convert_to_tensor=True)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
