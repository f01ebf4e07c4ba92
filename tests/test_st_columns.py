"""The columns a SimCSE loss takes in SentenceTransformerTrainer: one text column trains (the loss makes the dropout
pair, and equals the same column given twice), and a third column is explicit negatives, trained as simcse-hn's own
trainer trains paired data (hard_negative_weight and the queue included), step by step."""

from __future__ import annotations

import datasets
import pytest
import torch
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from test_st_losses import st_folder  # noqa: F401  (a fixture: a tiny BERT without dropout, mean pooling)
from test_st_queue import SETTINGS, Sequential, in_order, losses, texts

from simcse_hn.configuration.training_arguments import SimCSETrainingArguments
from simcse_hn.data.pairs import PairCollator
from simcse_hn.export.st_cached import CachedSimCSELoss
from simcse_hn.export.st_losses import SimCSELoss
from simcse_hn.export.st_training import SimCSECallback
from simcse_hn.losses import build_loss
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.training.trainer import SimCSETrainer

pytestmark = pytest.mark.usefixtures("one_thread")
BATCH, STEPS, QUEUE, WEIGHT = 4, 5, 10, 0.7


def st_train(folder, output_dir, columns: dict, make_loss, dropout: float = 0.0):
    model = SentenceTransformer(str(folder), device="cpu")
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = dropout
    loss = make_loss(model)
    args = SentenceTransformerTrainingArguments(
        output_dir=str(output_dir), batch_sampler=in_order, **{**SETTINGS, "save_strategy": "no"}
    )
    trainer = SentenceTransformerTrainer(
        model=model,
        args=args,
        train_dataset=datasets.Dataset.from_dict(columns),
        loss=loss,
        callbacks=[SimCSECallback(loss)],
    )
    trainer.train()
    return trainer, loss


def test_one_column_trains_with_the_dropout_pair_the_loss_makes(st_folder, tmp_path):  # noqa: F811
    trainer, loss = st_train(st_folder, tmp_path, {"text": texts()}, lambda m: SimCSELoss(m, "infonce"), dropout=0.1)
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == STEPS and all(0.5 < entry["pos_sim"] < 1.0 for entry in logged)  # two views, two masks


@pytest.mark.parametrize("kind", ["plain", "queue", "cached-queue"])
def test_one_column_is_the_column_given_twice(kind, st_folder, tmp_path):  # noqa: F811
    """Dropout off, so the two views of a text are equal: one column trains exactly as (text, text) pairs."""
    options = {"queue": {"queue_size": QUEUE, "momentum": 0.9}, "cached-queue": {"queue_size": QUEUE}}.get(kind, {})

    def make(model):
        if kind == "cached-queue":
            return CachedSimCSELoss(model, "hcl", beta=0.5, mini_batch_size=3, **options)
        return SimCSELoss(model, "hcl", beta=0.5, **options)

    one, one_loss = st_train(st_folder, tmp_path / "one", {"text": texts()}, make)
    two, two_loss = st_train(st_folder, tmp_path / "two", {"anchor": texts(), "positive": texts()}, make)
    assert losses(one) == losses(two) and len(losses(one)) == STEPS
    for name, want in two.model.state_dict().items():
        torch.testing.assert_close(one.model.state_dict()[name], want, rtol=0, atol=0, msg=name)
    if options:
        torch.testing.assert_close(one_loss.queue.entries(32).embeddings, two_loss.queue.entries(32).embeddings)


def triples() -> dict[str, list[str]]:
    sentences = texts()
    return {"anchor": sentences, "positive": sentences[1:] + sentences[:1], "negative_1": sentences[::-1]}


@pytest.mark.parametrize("queue", [0, QUEUE], ids=["in-batch", "queue"])
def test_explicit_negatives_train_as_simcse_hns_paired_data(queue, st_folder, tmp_path):  # noqa: F811
    """(anchor, positive, negative) in SentenceTransformerTrainer against SimCSETrainer on the same examples in the
    same order (PairCollator: rows [a, p, n] per example), hard_negative_weight on each anchor's own negative, with a
    momentum queue of the positives and negatives."""
    model = SimCSEModel.from_pretrained(str(st_folder), pooler="avg")
    args = SimCSETrainingArguments(
        output_dir=str(tmp_path / "simcse"),
        loss="hcl",
        temperature=0.05,
        hard_negative_weight=WEIGHT,
        queue_size=queue,
        momentum=0.9 if queue else 0.0,
        eval_strategy="no",
        save_strategy="no",
        load_best_model_at_end=False,
        metric_for_best_model=None,
        **SETTINGS,
    )
    dataset = datasets.Dataset.from_dict(triples())
    tokenizer = SentenceTransformer(str(st_folder), device="cpu").tokenizer
    own = SimCSETrainer(
        model=model,
        args=args,
        loss_fn=build_loss("hcl", temperature=0.05, beta=0.5),
        train_dataset=dataset,
        data_collator=PairCollator(tokenizer, 128, negatives=1),
    )
    own.batches.make_sampler = lambda *a, **k: Sequential(dataset)
    own.train()

    def make(model):
        extra = {"queue_size": queue, "momentum": 0.9} if queue else {}
        return SimCSELoss(model, "hcl", beta=0.5, temperature=0.05, hard_negative_weight=WEIGHT, **extra)

    theirs, loss = st_train(st_folder, tmp_path / "st", triples(), make)
    want, got = losses(own), losses(theirs)
    assert len(got) == STEPS and got == pytest.approx(want, rel=2e-4)
    for name, value in own.model.encoder.state_dict().items():
        torch.testing.assert_close(theirs.model.state_dict()["0.model." + name], value, rtol=1e-4, atol=1e-5)
    if queue:  # the positives and negatives of each example (anchors never are negatives in SimCSE's targets)
        assert loss.queue.queues[32].position == own.queue.queue.position == STEPS * BATCH * 2 % QUEUE
        torch.testing.assert_close(
            loss.queue.entries(32).embeddings, own.queue.entries().embeddings, rtol=1e-3, atol=1e-4
        )


def test_hard_negative_weight_without_negatives_is_refused(st_folder):  # noqa: F811
    model = SentenceTransformer(str(st_folder), device="cpu").train()
    loss = SimCSELoss(model, "infonce", hard_negative_weight=1.0)
    features = [model.tokenize(texts()[:4]), model.tokenize(texts()[:4])]
    with pytest.raises(ValueError, match=r"^hard_negative_weight needs paired data with explicit negatives"):
        loss(features)
    assert len(loss([model.tokenize(texts()[:4]) for _ in range(3)]).shape) == 0  # with a third column it trains
