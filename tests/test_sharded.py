"""FSDP and DeepSpeed ZeRO-2 / ZeRO-3 through accelerate with the shipped configs (configs/accelerate/fsdp.yaml:
FSDP2, a shard group per encoder layer; deepspeed_zero{2,3}.yaml), two CPU processes with gloo
(simcse_hn/testing/sharded_cpu.py says why accelerate needs a nudge for that on a machine without GPUs).
DeepSpeed cases run where deepspeed is installed, and are skipped otherwise.

* tests/sharded_worker.py trains every objective (plain and, under FSDP, with GradCache; LoRA too) under the engine and
  saves; each saved folder must hold the weights of one process trained on the global batch: the cross-process
  negatives are exact under the engine, and `save_model` writes the weights it gathered, not the shards.
* A run stopped after step 3 and resumed from its checkpoint-2 (the engine's own checkpoint: pytorch_model_fsdp.bin,
  pytorch_model_fsdp_0/ with SHARDED_STATE_DICT, DeepSpeed's global_step2/) ends with the uninterrupted run's weights.
* train.py under `accelerate launch --config_file configs/accelerate/...`: the folder loads in sentence-transformers
  with SimCSEModel's embeddings, and holds the best checkpoint's weights.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES, ROOT, free_port
from safetensors.torch import load_file
from sharded_worker import CORPUS, STREAM, STREAM_STEPS, build, cases

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

CONFIGS = {"fsdp": "fsdp.yaml", "zero2": "deepspeed_zero2.yaml", "zero3": "deepspeed_zero3.yaml"}
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
ENGINES = [pytest.param(name, marks=[] if name == "fsdp" or HAS_DEEPSPEED else pytest.mark.skip("needs deepspeed"))
           for name in CONFIGS]  # fmt: skip


def launch(name: str, *args: str, output: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    """Two processes under engine `name`, writing into `output`, once: every failure counts (no rerun of issue
    39's abort at exit, which train.py and the workers now leave through simcse_hn/training/process_exit.finish)."""
    config = str(ROOT / "configs" / "accelerate" / CONFIGS[name])
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config, "--num_processes", "2",
               "--main_process_port", free_port(), "--mixed_precision", "no", *args]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


_RUNS: dict = {}


def runs(name: str, tmp_path_factory) -> Path:
    """The worker's output folder for engine `name` (one launch per engine and test session)."""
    if name not in _RUNS:
        out = tmp_path_factory.mktemp(name)
        result = launch(name, str(ROOT / "tests" / "sharded_worker.py"), str(out), output=out)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        _RUNS[name] = out
    return _RUNS[name]


def saved_weights(folder) -> dict[str, torch.Tensor]:
    """A saved folder's weights under SimCSEModel's names (encoder., mlp., loss_fn.)."""
    weights = {f"encoder.{k}": v for k, v in load_file(os.path.join(folder, "model.safetensors")).items()}
    for name, prefix in (("simcse_head.safetensors", "mlp."), ("simcse_loss_state.safetensors", "loss_fn.")):
        if os.path.isfile(os.path.join(folder, name)):
            weights.update({prefix + k: v for k, v in load_file(os.path.join(folder, name)).items()})
    return weights


def assert_same_weights(got: dict, want: dict, rtol: float, initial: dict | None = None) -> None:
    """Equal keys, float tensors within `rtol` in norm: relative to the training's update (want - initial) when
    `initial` is given, else to the weights; other tensors equal."""
    assert got.keys() == want.keys(), sorted(set(got) ^ set(want))
    floats = [k for k in want if want[k].is_floating_point()]
    diff = torch.cat([(got[k] - want[k]).flatten() for k in floats]).norm()
    base = {k: initial.get(k, torch.zeros_like(want[k])) for k in floats} if initial is not None else None
    scale = torch.cat([(want[k] - (base[k] if base else 0)).flatten() for k in floats]).norm()
    assert float(diff / scale) <= rtol, f"relative difference {float(diff / scale):.2e}"
    for k in set(want) - set(floats):
        assert torch.equal(got[k], want[k]), k


CASES = [(name, *case) for name in CONFIGS for case in cases(name)]


@pytest.mark.parametrize(
    ("engine", "case", "loss", "form", "overrides"),
    [pytest.param(*c, marks=ENGINES[list(CONFIGS).index(c[0])].marks) for c in CASES],
    ids=[f"{c[0]}-{c[1]}" for c in CASES],
)
def test_sharded_run_saves_the_weights_of_one_process_on_the_global_batch(
    engine, case, loss, form, overrides, tmp_path_factory
):
    folder = runs(engine, tmp_path_factory) / case / "final"
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        reference = build(case, loss, form, tmp, engine, per_device_train_batch_size=8, **overrides)  # 2 x 4
        reference.train()
        want = {k: v.detach().clone() for k, v in reference.model.state_dict().items()}
        if case == "lora":  # the folder holds merged weights and the adapter: the reference's save merges alike
            reference.save_model(os.path.join(tmp, "saved"))
            want = saved_weights(os.path.join(tmp, "saved"))
            adapter = load_file(str(folder / "adapter" / "adapter_model.safetensors"))
            trained = {k.replace(".default", ""): v for k, v in reference.model.encoder.state_dict().items()}
    got = saved_weights(folder)
    initial_model = build(case, loss, form, tempfile.gettempdir(), engine).model
    initial = initial_model.state_dict()
    rtol = 1e-12 if engine == "fsdp" else 1e-4
    if case == "lora":  # the adapter in peft's format is the trained one, relative to its update as below
        start = {k.replace(".default", ""): v for k, v in initial_model.encoder.state_dict().items()}
        assert adapter and adapter.keys() <= trained.keys()
        assert_same_weights(adapter, {k: trained[k] for k in adapter}, rtol, initial={k: start[k] for k in adapter})
        initial = {k.replace("base_model.model.", "").replace(".base_layer", ""): v for k, v in initial.items()}
    assert any(not torch.equal(got[k], initial[k]) for k in got if k in initial), "nothing trained"
    # relative to the SGD update (a gradient off by the 1/W of a wrong average would be 0.5 off): float64 under FSDP
    # (measured ~3e-15), float32 under DeepSpeed (~1e-6; ProGCL's float32 mixture fit ~1e-5)
    assert_same_weights(got, want, rtol, initial=initial)


@pytest.mark.parametrize(
    ("engine", "kind"),
    [pytest.param(name, "", marks=ENGINES[i].marks) for i, name in enumerate(CONFIGS)] + [("fsdp", "sharded_")],
    ids=[*CONFIGS, "fsdp-sharded_state_dict"],
)
def test_stopped_sharded_run_resumes_to_the_uninterrupted_weights(engine, kind, tmp_path_factory):
    resume = runs(engine, tmp_path_factory) / "resume"
    checkpoint = resume / f"{kind}stopped" / "checkpoint-2"
    own = {"fsdp": "pytorch_model_fsdp.bin", "zero2": "global_step2", "zero3": "global_step2"}[engine]
    own = "pytorch_model_fsdp_0" if kind else own
    assert (checkpoint / own).exists(), sorted(os.listdir(checkpoint))  # what the engine's loader reads
    straight = saved_weights(resume / "straight" / "final")
    assert_same_weights(saved_weights(resume / f"{kind}straight" / "final"), straight, rtol=1e-12)
    assert_same_weights(saved_weights(resume / f"{kind}stopped" / "final"), straight, rtol=1e-12)
    assert_same_weights(saved_weights(checkpoint), saved_weights(resume / "straight" / "checkpoint-2"), rtol=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_each_process_trains_on_its_own_share_of_a_streamed_corpus(engine, tmp_path_factory):
    """Not re-sharded by accelerate nor dispatched from process 0: process r's batches are its split of the stream."""
    from simcse_hn.data.collator import SimCSECollator
    from simcse_hn.data.sentences import load_sentence_stream
    from simcse_hn.testing.models import build_tiny_bert

    folder = runs(engine, tmp_path_factory) / "stream"
    collate = SimCSECollator(build_tiny_bert()[1], max_length=24)
    texts = []
    for rank in (0, 1):
        stream = iter(load_sentence_stream(str(CORPUS), rank=rank, world_size=2, **STREAM))
        want = [collate([next(stream) for _ in range(4)])["input_ids"] for _ in range(STREAM_STEPS)]
        got = torch.load(folder / f"rank{rank}.pt", weights_only=True)
        assert len(got) == STREAM_STEPS and all(torch.equal(g, w) for g, w in zip(got, want)), rank
        texts.append({tuple(row.tolist()) for batch in got for row in batch})
    assert not texts[0] & texts[1]  # (the fixture's sentences are distinct within these 24)


@pytest.mark.parametrize("engine", ENGINES)
def test_train_py_under_the_shipped_config(engine, tmp_path):
    """The shipped config end to end, with STS-B dev selection: the final folder is the best checkpoint (loaded back
    by the Trainer's FSDP or DeepSpeed loader), under FSDP each checkpoint's folder holds the weights of the Trainer's
    own FSDP checkpoint, and the folder loads in sentence-transformers with SimCSEModel's embeddings."""
    from sentence_transformers import SentenceTransformer

    from simcse_hn.modeling.loading import load_tokenizer
    from simcse_hn.modeling.model import SimCSEModel

    out = tmp_path / "out"
    args = ["--config", "configs/debug_tiny.yaml", "--train_file", str(FIXTURES / "tiny_corpus.txt"),
            "--eval_file", str(FIXTURES / "sts_tiny.jsonl"), "--output_dir", str(out), "--max_steps", "4",
            "--eval_steps", "2", "--save_steps", "2", "--disable_tqdm", "true", "--pooler", "avg"]  # fmt: skip
    result = launch(engine, str(ROOT / "scripts" / "sharded_cpu.py"), *args, output=out)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "world size 2 (process 0)" in result.stdout
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    best = state["best_model_checkpoint"]
    assert_same_weights(saved_weights(out), saved_weights(best), rtol=0)
    for step in (2, 4) if engine == "fsdp" else ():
        checkpoint = out / f"checkpoint-{step}"
        fsdp = torch.load(checkpoint / "pytorch_model_fsdp.bin", map_location="cpu", weights_only=True)
        assert_same_weights(saved_weights(checkpoint), fsdp, rtol=0)
    sentences = ["A man is playing a guitar.", "The weather is cold today.", "Stocks fell sharply on Monday."]
    expected = SimCSEModel.from_pretrained(str(out)).encode(sentences, load_tokenizer(str(out)))
    got = SentenceTransformer(str(out), device="cpu").encode(sentences, convert_to_tensor=True)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
