"""LoRA adapters (peft) on the encoder: only the adapters and SimCSE's MLP head train; the saved folder holds plain
merged weights that sentence-transformers and transformers load with SimCSEModel's embeddings, and the adapter in
peft's format beside them (listed in the manifest, so a push uploads it); GradCache gives the plain step's gradient
for every objective; a resumed run ends with the uninterrupted run's adapter."""

from __future__ import annotations

import json

import pytest
import torch
from dist_worker_common import (
    CACHE_SENTENCES,
    batch,
    cases,
    global_texts,
    gradients,
    make_loss,
    make_model,
    make_trainer,
    relative_error,
)
from safetensors.torch import load_file
from sentence_transformers import SentenceTransformer
from test_hub import train_args
from transformers import AutoModel

from simcse_hn.cli import train
from simcse_hn.modeling.loading import load_tokenizer
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.testing.models import TINY_MODEL

pytest.importorskip("peft")

SENTENCES = ["A man is playing a guitar on the stage.", "Someone plays an instrument.", "The weather is cold."]
LORA = ["--lora_r", "4", "--lora_alpha", "16", "--learning_rate", "5e-2"]  # large steps: the merge must matter


def test_only_the_adapters_and_the_head_train_and_the_folder_holds_merged_weights(tmp_path):
    out = tmp_path / "out"
    trainer = train.run(train_args(out, *LORA, "--pooler", "cls", "--mlp_only_train", "false", "--max_steps", "3"))
    model = trainer.model
    base = SimCSEModel.from_pretrained(TINY_MODEL, pooler="cls", mlp_only_train=False)  # the same seed's weights
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_" in n or n.startswith("mlp.") for n in trained), sorted(trained)
    initial = {**{f"mlp.{k}": v for k, v in base.mlp.state_dict().items()}}
    for name, value in model.named_parameters():
        if name.startswith("mlp.") or ".lora_B." in name:  # B starts at zero, the head at the seed's init
            assert not torch.equal(value, initial.get(name, torch.zeros_like(value))), f"{name} did not train"
    for name, value in model.encoder.get_base_model().state_dict().items():
        if ".lora_" not in name:  # the base weights are the base model's, untouched
            assert torch.equal(value, base.encoder.state_dict()[name.replace(".base_layer", "")]), name

    saved = load_file(str(out / "model.safetensors"))
    assert not [k for k in saved if "lora" in k or "base_layer" in k]
    query = "encoder.layer.0.attention.self.query.weight"
    assert not torch.equal(saved[query], base.encoder.state_dict()[query])  # merged: W + alpha / r * B A
    tokenizer = load_tokenizer(str(out))
    expected = model.encode(SENTENCES, trainer.processing_class)  # the adapted model itself, unmerged
    st = SentenceTransformer(str(out), device="cpu").encode(SENTENCES, convert_to_tensor=True)
    torch.testing.assert_close(st, expected, rtol=0, atol=1e-5)
    auto = AutoModel.from_pretrained(str(out))  # plain weights: every key loads
    batch_ = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        pooled = auto(**batch_).pooler_output  # cls with the MLP kept: the head is the encoder's pooler
    torch.testing.assert_close(pooled, expected, rtol=0, atol=1e-5)

    files = json.loads((out / "simcse_files.json").read_text())["files"]
    assert {"adapter/adapter_config.json", "adapter/adapter_model.safetensors"} <= set(files)
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (4, 16, TINY_MODEL)
    assert json.loads((out / "simcse_config.json").read_text())["model"]["lora"]["r"] == 4

    from peft import PeftModel

    adapted = SimCSEModel.from_pretrained(TINY_MODEL, pooler="cls", mlp_only_train=False)
    adapted.encoder = PeftModel.from_pretrained(adapted.encoder, str(out / "adapter"))
    adapted.mlp.load_state_dict(load_file(str(out / "simcse_head.safetensors")))
    torch.testing.assert_close(adapted.encode(SENTENCES, tokenizer), expected, rtol=0, atol=1e-6)


CASES = cases()


@pytest.mark.parametrize(("case", "loss", "form"), CASES, ids=[c[0] for c in CASES])
def test_gradcache_with_lora_gives_the_plain_gradient_for_every_objective(case, loss, form, tmp_path, one_thread):
    results = {}
    for mode, cache in (("plain", None), ("cached", CACHE_SENTENCES)):
        model = make_model()
        torch.manual_seed(0)
        model.add_lora(r=4, alpha=8)
        with torch.no_grad():  # B starts at zero (no gradient to A): give the adapters a value first
            for name, parameter in model.named_parameters():
                if ".lora_B." in name:
                    parameter.normal_(0, 0.3, generator=torch.Generator().manual_seed(1))
        model.double()
        trainer = make_trainer(model, make_loss(case, loss).double(), tmp_path, form, cache_minibatch_size=cache)
        value = trainer.training_step(trainer.model, batch(global_texts()))  # 16 rows: progcl_mix's permutation
        results[mode] = (float(value), gradients(trainer.model))
    (plain_loss, plain), (cached_loss, cached) = results["plain"], results["cached"]
    assert plain and all(".lora_" in n or n.startswith(("mlp.", "loss_fn.")) for n in plain), sorted(plain)
    assert cached_loss == pytest.approx(plain_loss, rel=1e-12)
    assert relative_error(cached, plain) < 1e-10


def test_a_resumed_lora_run_ends_with_the_uninterrupted_adapter(tmp_path):
    common = [*LORA, "--save_steps", "2", "--lr_scheduler_type", "constant", "--seed", "5"]  # lr: as if 4 steps
    straight = tmp_path / "straight"
    train.run(train_args(straight, *common, "--max_steps", "4"))
    stopped = tmp_path / "stopped"
    train.run(train_args(stopped, *common, "--max_steps", "2"))  # the same run, ended after its checkpoint-2
    checkpoint = stopped / "checkpoint-2"
    assert (checkpoint / "adapter" / "adapter_model.safetensors").is_file()
    extended = ["--max_steps", "4", "--extend_schedule", "true"]  # a constant rate: the same as planned for 4 steps
    resumed = train.run(train_args(stopped, *common, *extended, "--resume_from_checkpoint", str(checkpoint)))
    assert resumed.state.global_step == 4
    for name in ("adapter/adapter_model.safetensors", "simcse_head.safetensors", "model.safetensors"):
        want, got = load_file(str(straight / name)), load_file(str(stopped / name))
        assert want.keys() == got.keys()
        for key in want:
            torch.testing.assert_close(got[key], want[key], rtol=0, atol=0, msg=f"{name}: {key}")
