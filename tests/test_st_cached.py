"""CachedSimCSELoss (GradCache on sentence-transformers' CachedLossMixin): the same loss and gradients as SimCSELoss
on two batch sizes, one column and inside MatryoshkaLoss; in SentenceTransformerTrainer with a momentum queue, the
same run as SimCSELoss, step by step (its resume: tests/test_st_wrappers.py). Its memory: bench/st_cached.py."""

from __future__ import annotations

import copy

import pytest
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.losses import MatryoshkaLoss
from test_st_columns import st_train
from test_st_losses import st_folder  # noqa: F401  (a fixture: a tiny BERT without dropout, mean pooling)
from test_st_queue import losses, texts

from simcse_hn.export.st_cached import CachedSimCSELoss
from simcse_hn.export.st_losses import SimCSELoss

pytestmark = pytest.mark.usefixtures("one_thread")


def gradients(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("batch", [8, 13])
@pytest.mark.parametrize("case", ["pairs", "one-column", "matryoshka", "progcl-queue"])
def test_the_cached_loss_equals_the_plain_one(case, batch, st_folder):  # noqa: F811
    """Mini-batches of 3: the last one short at both sizes; dropout off (with dropout the cached forward replays its
    own masks, which the plain loss does not draw alike)."""
    sentences = (texts() * 2)[:batch]
    options = {"objective": "hcl", "beta": 0.5}
    if case == "progcl-queue":
        options = {"objective": "progcl", "mode": "weight", "warmup_ratio": 0.0, "queue_size": 16, "momentum": 0.5}
    plain_model = SentenceTransformer(str(st_folder), device="cpu").train()
    cached_model = copy.deepcopy(plain_model)
    results = []
    for model, cached in ((plain_model, False), (cached_model, True)):
        loss = CachedSimCSELoss(model, mini_batch_size=3, **options) if cached else SimCSELoss(model, **options)
        loss.trainer_step.set(0, 10)
        if loss.queue is not None:  # a queue filled by one step first
            loss.queue.start(model)
            loss([model.tokenize(sentences[::-1]), model.tokenize(sentences[::-1])]).backward()
            loss.queue.step_end(model)
            loss.trainer_step.set(1, 10)
            model.zero_grad()
        wrapped = MatryoshkaLoss(model, loss, [32, 16]) if case == "matryoshka" else loss
        columns = 1 if case == "one-column" else 2
        value = wrapped([model.tokenize(sentences) for _ in range(columns)], None)
        value.backward()
        results.append((value.detach(), gradients(model)))
    (want, want_grads), (got, got_grads) = results
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert got_grads.keys() == want_grads.keys() and len(want_grads) > 10
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_cached_loss_trains_as_the_plain_one_with_a_queue(st_folder, tmp_path):  # noqa: F811
    def make(kind):
        def loss_for(model):
            extra = {"mini_batch_size": 3} if kind is CachedSimCSELoss else {}
            return kind(model, "hcl", beta=0.5, queue_size=10, momentum=0.9, **extra)

        return loss_for

    columns = {"anchor": texts(), "positive": texts()}
    plain, _ = st_train(st_folder, tmp_path / "plain", columns, make(SimCSELoss))
    cached, cached_loss = st_train(st_folder, tmp_path / "cached", columns, make(CachedSimCSELoss))
    assert losses(cached) == pytest.approx(losses(plain), rel=1e-5) and len(losses(plain)) == 5
    # AdamW at lr 0.5 moves each weight by up to 0.5 a step; the two paths' float32 sums differ in order, which
    # leaves a few entries apart by up to 6e-6 (HCL's sums from InfoNCE's exponentials, issue 70)
    for name, want in plain.model.state_dict().items():
        torch.testing.assert_close(cached.model.state_dict()[name], want, rtol=1e-4, atol=2e-5, msg=name)
    assert cached_loss.queue.chunk_rows == 3  # the momentum encoder embeds mini-batch by mini-batch too


def test_what_the_cached_loss_cannot_do_is_refused(st_folder):  # noqa: F811
    model = SentenceTransformer(str(st_folder), device="cpu")
    with pytest.raises(ValueError, match="^CachedSimCSELoss: unremix's learned parameters would get their gradient"):
        CachedSimCSELoss(model, "unremix", learn_mixture=True)
    with pytest.raises(ValueError, match="mini_batch_size and mini_batch_num_tokens must be >= 1"):
        CachedSimCSELoss(model, "infonce", mini_batch_size=0)
