"""GradCache (simcse_hn/training/grad_cache.py) through SimCSETrainer.training_step, one process, float64 tiny BERT.

With dropout on, the reference is the plain step with the same dropout masks: the same mini-batches embedded with
a graph from the same RNG state, one loss over all rows, one backward. With dropout off it is the Trainer's own
plain step on the whole batch. Two processes with gathering: tests/test_distributed.py.
"""

from __future__ import annotations

import pytest
import torch
from dist_worker_common import (
    CACHE_SENTENCES,
    GROUP_SIZE,
    batch,
    cases,
    global_texts,
    gradients,
    make_loss,
    make_model,
    make_paired_trainer,
    make_trainer,
    paired_batch,
    paired_cases,
    paired_texts,
    relative_error,
)

from simcse_hn.losses.targets import RowLayout
from simcse_hn.training import grad_cache

SENTENCES = RowLayout()  # rows [a, a', b, b', ...]
CASES = cases()
IDS = [case for case, _, _ in CASES]
PAIRED = paired_cases()


pytestmark = pytest.mark.usefixtures("one_thread")


def _same_masks_step(trainer, inputs, sentences):
    model = trainer.model
    model.train()
    chunks = grad_cache.split_groups(inputs, sentences, SENTENCES.rows_per_example)
    outputs = [trainer._embed(model, chunk) for chunk in chunks]
    embeddings = torch.cat([z for z, _ in outputs])
    head_inputs = None if outputs[0][1] is None else torch.cat([h for _, h in outputs])
    result = trainer.contrastive_loss(model, embeddings, head_inputs)
    result.loss.backward()
    return result.loss.detach()


def test_split_groups_keeps_pairs_together_and_trims_only_trailing_padding():
    texts = ["a", "a b c d e f", "x y", "x y z", "p", "q", "long sentence number seven", "eight"]
    inputs = batch(texts)  # rows [a, a', b, b', ...], padded to the longest
    chunks = grad_cache.split_groups(inputs, 3, SENTENCES.rows_per_example)
    assert [c["input_ids"].shape[0] for c in chunks] == [6, 2]  # 3 sentences + 1 sentence, pairs never split
    for start, chunk in zip((0, 6), chunks):
        rows = slice(start, start + chunk["input_ids"].shape[0])
        length = int(inputs["attention_mask"][rows].sum(dim=1).max())
        assert chunk["input_ids"].shape[1] == length
        for key, value in chunk.items():
            assert torch.equal(value, inputs[key][rows, :length]), key
        assert not inputs["attention_mask"][rows, length:].any()
    with pytest.raises(ValueError, match="at least one sentence"):
        grad_cache.split_groups(inputs, 0, SENTENCES.rows_per_example)


@pytest.mark.parametrize(("case", "loss", "form"), CASES, ids=IDS)
def test_cached_step_equals_the_plain_step_with_the_same_dropout_masks(case, loss, form, tmp_path):
    inputs = batch(global_texts())  # 8 sentences, mini-batches of 3 + 3 + 2

    reference = make_trainer(make_model(dropout=0.1), make_loss(case, loss), tmp_path, form)
    torch.manual_seed(7)
    want_loss = _same_masks_step(reference, inputs, CACHE_SENTENCES)
    want_rng = torch.get_rng_state()

    cached = make_trainer(make_model(dropout=0.1), make_loss(case, loss), tmp_path, form, cache_minibatch_size=3)
    torch.manual_seed(7)
    got_loss = cached.training_step(cached.model, inputs)

    torch.testing.assert_close(got_loss, want_loss, rtol=1e-12, atol=0)
    assert relative_error(gradients(cached.model), gradients(reference.model)) < 1e-10
    # the generator continues after the step as after the plain one (the next step draws fresh masks)
    assert torch.equal(torch.get_rng_state(), want_rng)
    assert cached._metric_count == 1 and {"pos_sim", "neg_sim", "nonfinite_fallback"} <= set(cached._metric_sums)

    # dropout is on: masks drawn over the whole batch at once give another gradient
    whole = make_trainer(make_model(dropout=0.1), make_loss(case, loss), tmp_path, form)
    torch.manual_seed(7)
    whole.training_step(whole.model, inputs)
    assert relative_error(gradients(whole.model), gradients(reference.model)) > 1e-3


def test_without_replaying_the_rng_state_the_gradient_is_wrong(tmp_path, monkeypatch):
    inputs = batch(global_texts())
    reference = make_trainer(make_model(dropout=0.1), make_loss("infonce", "infonce"), tmp_path)
    torch.manual_seed(7)
    _same_masks_step(reference, inputs, CACHE_SENTENCES)

    monkeypatch.setattr(grad_cache.RNGState, "restore", lambda self: None)
    cached = make_trainer(make_model(dropout=0.1), make_loss("infonce", "infonce"), tmp_path, cache_minibatch_size=3)
    torch.manual_seed(7)
    cached.training_step(cached.model, inputs)
    assert relative_error(gradients(cached.model), gradients(reference.model)) > 1e-3


@pytest.mark.parametrize(("case", "loss", "form"), CASES, ids=IDS)
def test_cached_step_equals_the_trainers_plain_step_without_dropout(case, loss, form, tmp_path):
    """Both through SimCSETrainer.training_step, with 2 gradient-accumulation steps (the loss is divided by 2)."""
    inputs = batch(global_texts())
    plain = make_trainer(make_model(), make_loss(case, loss), tmp_path, form)
    cached = make_trainer(make_model(), make_loss(case, loss), tmp_path, form, cache_minibatch_size=CACHE_SENTENCES)
    losses = []
    for trainer in (plain, cached):
        trainer.current_gradient_accumulation_steps = 2
        losses.append(trainer.training_step(trainer.model, inputs))
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-12, atol=0)
    assert relative_error(gradients(cached.model), gradients(plain.model)) < 1e-10
    for name, p in plain.model.named_parameters():  # every trainable parameter got a gradient (DDP needs it)
        assert not p.requires_grad or name in gradients(cached.model), name
    if case == "progcl":
        for key, value in plain.model.loss_fn.state_dict().items():
            torch.testing.assert_close(cached.model.loss_fn.state_dict()[key], value, rtol=1e-12, atol=0)


def test_a_cache_as_large_as_the_batch_is_the_plain_step(tmp_path, monkeypatch):
    inputs = batch(global_texts())
    trainer = make_trainer(make_model(), make_loss("infonce", "infonce"), tmp_path, cache_minibatch_size=8)
    monkeypatch.setattr(grad_cache, "cached_loss", lambda *a, **k: pytest.fail("GradCache for a batch that fits"))
    trainer.training_step(trainer.model, inputs)


def test_split_groups_keeps_each_example_together():
    texts = ["a", "p", "n", "m", "longer anchor here", "q", "o", "r", "s", "t", "u", "v"]  # 3 examples of 4 rows
    inputs = batch(texts)
    chunks = grad_cache.split_groups(inputs, 2, GROUP_SIZE)
    assert [c["input_ids"].shape[0] for c in chunks] == [8, 4]
    assert chunks[1]["input_ids"].shape[1] < inputs["input_ids"].shape[1]  # the long anchor's padding trimmed
    for start, chunk in zip((0, 8), chunks):
        rows, length = chunk["input_ids"].shape
        assert torch.equal(chunk["input_ids"], inputs["input_ids"][start : start + rows, :length])
    with pytest.raises(ValueError, match="not groups of 4"):
        grad_cache.split_groups(batch(texts[:10]), 2, GROUP_SIZE)


def _paired_same_masks_step(trainer, inputs):
    """The plain paired step with GradCache's masks: mini-batches of whole examples embedded with a graph in order."""
    model = trainer.model
    model.train()
    guide_inputs = {k: v for k, v in inputs.items() if k.startswith("guide_")}
    inputs = {k: v for k, v in inputs.items() if k not in guide_inputs}
    guide = trainer._guide_embeddings(guide_inputs)
    chunks = grad_cache.split_groups(inputs, CACHE_SENTENCES, trainer.layout.rows_per_example)
    outputs = [trainer._embed(model, chunk) for chunk in chunks]
    head_inputs = None if outputs[0][1] is None else torch.cat([h for _, h in outputs])
    result = trainer.contrastive_loss(model, torch.cat([z for z, _ in outputs]), head_inputs, guide_embeddings=guide)
    result.loss.backward()
    return result.loss.detach()


@pytest.mark.parametrize(("case", "loss", "group", "guide"), PAIRED, ids=[c[0] for c in PAIRED])
def test_paired_cached_step_equals_the_plain_step(case, loss, group, guide, tmp_path):
    """Paired rows and guides: GradCache (mini-batches of whole examples) equals the plain step with the same
    dropout masks, and, without dropout, the Trainer's own plain step on the whole batch."""
    inputs = paired_batch(paired_texts(group), guide)  # 8 examples: mini-batches of 3 + 3 + 2
    reference = make_paired_trainer(make_model(dropout=0.1), make_loss(case, loss), tmp_path, group, guide)
    torch.manual_seed(7)
    want = _paired_same_masks_step(reference, dict(inputs))
    cached = make_paired_trainer(make_model(dropout=0.1), make_loss(case, loss), tmp_path, group, guide,
                                 cache_minibatch_size=CACHE_SENTENCES)  # fmt: skip
    torch.manual_seed(7)
    got = cached.training_step(cached.model, dict(inputs))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    assert relative_error(gradients(cached.model), gradients(reference.model)) < 1e-10

    plain = make_paired_trainer(make_model(), make_loss(case, loss), tmp_path, group, guide)
    cached = make_paired_trainer(make_model(), make_loss(case, loss), tmp_path, group, guide,
                                 cache_minibatch_size=CACHE_SENTENCES)  # fmt: skip
    losses = [trainer.training_step(trainer.model, dict(inputs)) for trainer in (plain, cached)]
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-12, atol=0)
    assert relative_error(gradients(cached.model), gradients(plain.model)) < 1e-10
    if guide is not None:
        assert cached._metric_sums["guide_removed"] == plain._metric_sums["guide_removed"] > 0
