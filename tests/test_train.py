"""train.py end to end on the tiny config, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.stats
import torch
from conftest import FIXTURES, ROOT, free_port
from sklearn.metrics.pairwise import paired_cosine_distances

from simcse_hn.cli import train
from simcse_hn.modeling.loading import load_tokenizer
from simcse_hn.modeling.model import SimCSEModel

SENTENCES = ["A man is playing a guitar.", "The weather is cold today.", "Stocks fell sharply on Monday."]


def test_dev_score_is_scipy_spearman_of_encode_cosines(tiny_args):
    """The STS-B dev metric (the Trainer's evaluation loop: sentences sorted by token length, untruncated, gathered
    and put back in order) against SciPy's Spearman of the cosines of SimCSEModel.encode's embeddings, times 100.
    Mean pooling: the tiny model's CLS vectors are nearly identical after a short run, which would make any Spearman a
    ranking of rounding noise."""
    extra = ["--pooler", "avg", "--max_steps", "3", "--eval_strategy", "no", "--save_strategy", "no",
             "--load_best_model_at_end", "false"]
    trainer = train.run(tiny_args + extra)
    model, pairs, tokenizer = trainer.model, trainer.eval_pairs, trainer.processing_class
    assert trainer.eval_max_length == 128  # the tiny encoder's limit: no truncation at the training length (32)
    # The reference encodes the same batches (padding changes float32 results by ~1e-7, and this fixture's cosines
    # have near-ties that such noise reorders: 0.03 points of Spearman), each distinct sentence once, in the order of
    # the pairs' first appearance rather than the loop's; cosines in float64.
    unique = list(dict.fromkeys(pairs.sentence1 + pairs.sentence2))
    order = [unique[i] for i in trainer._dev.dataset["sentence_index"]]
    size = trainer.args.eval_batch_size
    lookup = {}
    for start in range(0, len(order), size):
        batch = order[start : start + size]
        lookup.update(zip(batch, model.encode(batch, tokenizer, batch_size=size).double()))
    first, second = (torch.stack([lookup[s] for s in side]).float().numpy() for side in (pairs.sentence1,
                                                                                       pairs.sentence2))
    # the cosine as MTEB's evaluator takes it: scikit-learn's paired cosine distance on the float32 embeddings
    cosines = 1 - paired_cosine_distances(first, second)
    assert cosines.std() > 1e-3
    expected = 100 * scipy.stats.spearmanr(cosines, pairs.scores).statistic
    metrics = trainer.evaluate()
    assert metrics["eval_stsb_spearman"] == pytest.approx(expected, abs=1e-6)
    # uniformity next to it (SimCSE's protocol: every distinct dev sentence), written out in NumPy
    x = torch.stack([lookup[s] for s in unique]).numpy()
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    upper = np.triu_indices(len(x), k=1)
    squared = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)[upper]
    assert metrics["eval_uniformity"] == pytest.approx(np.log(np.exp(-2 * squared).mean()), abs=1e-6)
    assert "eval_alignment" in metrics


def test_debug_tiny_trains_evaluates_saves_and_reloads(tiny_args, tmp_path, monkeypatch):
    initial = {}
    original = SimCSEModel.from_pretrained.__func__

    def recording_from_pretrained(cls, *args, **kwargs):
        model = original(cls, *args, **kwargs)
        initial.update({k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad})
        return model

    monkeypatch.setattr(SimCSEModel, "from_pretrained", classmethod(recording_from_pretrained))
    trainer = train.run(tiny_args)
    model = trainer.model

    unchanged = [n for n, p in model.named_parameters() if p.requires_grad and torch.equal(p.detach(), initial[n])]
    assert initial and not unchanged, f"parameters that did not train: {unchanged}"

    evals = [entry["eval_stsb_spearman"] for entry in trainer.state.log_history if "eval_stsb_spearman" in entry]
    assert len(evals) >= 2 and all(-100 <= e <= 100 for e in evals)
    assert trainer.state.best_model_checkpoint is not None
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert {"pos_sim", "neg_sim", "neg_weight_max", "clamp_frac", "nonfinite_fallback"} <= set(logged[0])

    out = tmp_path / "out"
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "simcse_config.json",
        "simcse_head.safetensors",
    ):
        assert (out / name).is_file(), name
    saved_config = json.loads((out / "simcse_config.json").read_text())
    assert saved_config["pooler"] == "cls" and saved_config["method"]["loss"] == "infonce"

    reloaded = SimCSEModel.from_pretrained(str(out))
    tokenizer = load_tokenizer(str(out))
    expected = model.encode(SENTENCES, trainer.processing_class)
    torch.testing.assert_close(reloaded.encode(SENTENCES, tokenizer), expected, rtol=0, atol=1e-6)
    assert not reloaded.training and reloaded.pooler == "cls" and reloaded.mlp_only_train


def test_debug_tiny_config_runs_from_the_command_line(tmp_path):
    result = subprocess.run(
        [
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
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "STS-B dev Spearman x 100 of the saved model" in result.stdout
    assert (tmp_path / "o" / "model.safetensors").is_file()


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_with_accelerate_launch(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [
            sys.executable,  # the accelerate of this interpreter, activated or not
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_processes",
            "2",
            "--num_machines",
            "1",
            "--main_process_port",
            free_port(),
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "train.py",
            "--config",
            "configs/debug_tiny.yaml",
            "--train_file",
            str(FIXTURES / "tiny_corpus.txt"),
            "--output_dir",
            str(tmp_path / "mp"),
            "--max_steps",
            "6",
            "--eval_steps",
            "3",
            "--save_steps",
            "3",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "world size 2 (process 0)" in result.stdout
    assert (tmp_path / "mp" / "model.safetensors").is_file()
