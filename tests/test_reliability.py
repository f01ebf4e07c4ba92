"""Failures a user meets mid-run: non-finite embeddings, too little data, overlong lines."""

from __future__ import annotations

import pytest
import torch

from simcse_hn.cli import train
from simcse_hn.errors import DataError
from simcse_hn.modeling.model import SimCSEModel


def nan_embeddings_at(monkeypatch, training_call: int) -> None:
    """SimCSEModel's `training_call`-th training forward returns NaN embeddings, as an fp16 overflow would."""
    forward = SimCSEModel.forward
    calls = {"train": 0}

    def overflowing_forward(self, *args, **kwargs):
        output = forward(self, *args, **kwargs)
        if self.training:
            calls["train"] += 1
            if calls["train"] == training_call:
                output.embeddings = output.embeddings * torch.tensor(float("nan"))
        return output

    monkeypatch.setattr(SimCSEModel, "forward", overflowing_forward)


def test_nan_embeddings_skip_the_step_and_training_continues(tiny_args, monkeypatch):
    nan_embeddings_at(monkeypatch, 3)
    trainer = train.run(
        tiny_args + ["--max_steps", "6", "--logging_steps", "1", "--eval_steps", "3", "--save_steps", "3"]
    )
    assert trainer.state.global_step == 6
    assert trainer.gradient_guard.skipped_steps == 1
    logged = [entry for entry in trainer.state.log_history if "skipped_steps" in entry]
    assert [entry["skipped_steps"] for entry in logged] == [0, 0, 1, 1, 1, 1]
    assert logged[2]["nonfinite_fallback"] == 1.0  # the loss saw it too, and could not fall back on NaN inputs
    for name, parameter in trainer.model.named_parameters():
        assert torch.isfinite(parameter).all(), name


def test_fewer_sentences_than_one_batch_is_a_clear_error(tiny_args, tmp_path):
    small = tmp_path / "small.txt"
    small.write_text("one sentence\nanother one\nthird\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"small.txt: 3 sentences, fewer than one batch \(16 x 1 processes\)"):
        train.run(tiny_args + ["--train_file", str(small)])


def test_overlong_lines_are_truncated_and_counted(tiny_args, tmp_path, caplog):
    """Counted over the batches trained on: 3 batches of 16 exist, 2 steps train on 2 of them (the data loader
    collates the third ahead of time, and a count in the collator would include it)."""
    corpus = tmp_path / "long.txt"
    lines = [f"sentence number {i} is far longer than thirty-two characters" for i in range(48)]
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    extra = ["--train_file", str(corpus), "--max_steps", "2", "--eval_strategy", "no", "--load_best_model_at_end",
             "false", "--per_device_train_batch_size", "16"]  # fmt: skip
    with caplog.at_level("WARNING"):
        trainer = train.run(tiny_args + extra)
    assert (trainer.truncated_sentences, trainer.trained_sentences) == (32, 32)
    assert ("32 of the 32 sentences trained on (100 %) were longer than 32 tokens and were truncated: 32 tokens is "
            "SimCSE's setting; a larger --max_seq_length keeps more") in caplog.text


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), -float("inf"), None])
def test_the_gradient_guard_skips_exactly_the_steps_with_a_nonfinite_gradient(poison):
    """One NaN or inf anywhere in one gradient skips the step (gradients dropped, counted); finite gradients, however
    large, pass untouched."""
    from types import SimpleNamespace

    from simcse_hn.training.callbacks import NonFiniteGradientGuard

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    for p in model.parameters():
        p.grad = torch.full_like(p, 3e38)  # finite, and its square overflows float32
    if poison is not None:
        model[1].bias.grad[1] = poison
    guard = NonFiniteGradientGuard()  # on its own: no trainer, the model as the Trainer's callbacks receive it
    guard.on_pre_optimizer_step(SimpleNamespace(device="cpu"), SimpleNamespace(global_step=0), None, model=model)
    grads = [p.grad for p in model.parameters()]
    if poison is None:
        assert guard.skipped_steps == 0 and all(g is not None and (g == 3e38).all() for g in grads)
    else:
        assert guard.skipped_steps == 1 and all(g is None for g in grads)


def test_a_finite_total_grad_norm_spares_the_guard_its_pass_and_a_nonfinite_one_still_skips(tiny_args, monkeypatch):
    """The Trainer's total norm (computed for clipping and logging) decides when finite; NaN falls back to the exact
    per-gradient check, so the step with the NaN batch is still skipped."""
    foreach_norm = torch._foreach_norm
    passes = []

    def counting(tensors, ord=2, **kwargs):
        if ord == float("inf"):
            passes.append(len(tensors))
        return foreach_norm(tensors, ord, **kwargs)

    monkeypatch.setattr(torch, "_foreach_norm", counting)
    nan_embeddings_at(monkeypatch, 2)
    trainer = train.run(tiny_args + ["--max_steps", "3", "--eval_strategy", "no", "--load_best_model_at_end", "false"])
    assert trainer.state.global_step == 3 and trainer.gradient_guard.skipped_steps == 1
    assert len(passes) == 1  # the NaN step only: the two finite steps took the Trainer's norm
    assert trainer.gradient_guard.total_norm is None  # consumed by each step's guard
