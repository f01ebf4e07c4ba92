"""simcse-hn's objectives inside sentence-transformers' own trainer: one SGD step there moves the weights by exactly
simcse-hn's gradient on the same batch."""

from __future__ import annotations

import math

import datasets
import pytest
import torch
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments

from simcse_hn.export import st_losses
from simcse_hn.export.st_training import SimCSECallback
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.testing.models import build_tiny_bert
from simcse_hn.training.step import contrastive_loss

pytestmark = pytest.mark.usefixtures("one_thread")

ANCHORS = ["a man plays a guitar", "the cat sleeps", "stocks fell on monday", "it rains in paris",
           "a dog runs in a park", "she reads a book", "the train was late", "kids play football"]  # fmt: skip
POSITIVES = ["someone plays an instrument", "a cat is asleep", "markets dropped monday", "paris is rainy",
             "a dog is running", "a woman is reading", "the train came late", "children play soccer"]  # fmt: skip
CASES = {
    "infonce": (st_losses.SimCSEInfoNCELoss, "infonce", {}),
    "infonce_paper": (st_losses.SimCSEInfoNCELoss, "infonce", {"contrast_form": "simcse"}),
    "dcl": (st_losses.SimCSEDCLLoss, "dcl", {"tau_plus": 0.01}),
    "hcl": (st_losses.SimCSEHCLLoss, "hcl", {"beta": 1.0}),
    "progcl": (st_losses.SimCSEProGCLLoss, "progcl", {"mode": "weight", "warmup_ratio": 0.0, "max_steps": 1}),
    "unremix": (st_losses.SimCSEUnReMixLoss, "unremix", {"beta": 1.0}),
}


@pytest.fixture(scope="module")
def st_folder(tmp_path_factory):
    """A tiny BERT without dropout, saved by simcse-hn with mean pooling: a SentenceTransformer folder."""
    encoder, tokenizer = build_tiny_bert(seed=3, dropout=0.0)
    with torch.no_grad():  # spread the similarities (BERT's init maps every sentence to nearly one vector)
        for p in encoder.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    folder = tmp_path_factory.mktemp("st") / "model"
    SimCSEModel(encoder, pooler="avg").save_pretrained(str(folder), tokenizer=tokenizer)
    return folder


@pytest.mark.parametrize("case", list(CASES))
def test_one_step_in_sentence_transformers_trainer_follows_simcse_hn_gradient(case, st_folder, tmp_path):
    st_class, objective, kwargs = CASES[case]
    model = SentenceTransformer(str(st_folder), device="cpu")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    # simcse-hn on the same batch: SimCSEModel (avg pooler) over the same weights, rows [a_0, p_0, a_1, p_1, ...]
    reference = SimCSEModel.from_pretrained(str(st_folder), pooler="avg").train()
    texts = [t for pair in zip(ANCHORS, POSITIVES) for t in pair]
    tokenizer = model.tokenizer
    batch = tokenizer(texts, padding=True, truncation=True, max_length=model.max_seq_length, return_tensors="pt")
    loss_kwargs = {k: v for k, v in kwargs.items() if k not in ("contrast_form", "max_steps")}
    if objective == "unremix":
        loss_kwargs["gradient"] = "embedding"
    from simcse_hn.losses import build_loss

    want = contrastive_loss(
        build_loss(objective, temperature=0.05, **loss_kwargs),
        reference(**batch).embeddings,
        form=kwargs.get("contrast_form", "symmetric"),
        step=0 if "max_steps" in kwargs else None,
        max_steps=kwargs.get("max_steps"),
    )
    want.loss.backward()
    grads = {"0.model." + n: p.grad for n, p in reference.encoder.named_parameters() if p.grad is not None}

    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=len(ANCHORS), max_steps=1, learning_rate=1.0,
        optim="sgd", lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1e9,
        report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True, logging_steps=1, seed=0,
    )  # fmt: skip
    loss = st_class(model, temperature=0.05, **kwargs)
    train = datasets.Dataset.from_dict({"anchor": ANCHORS, "positive": POSITIVES})
    callbacks = [SimCSECallback(loss)] if loss.loss_fn.uses_schedule else []  # ProGCL reads the trainer's step
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train, loss=loss, callbacks=callbacks)
    trainer.train()

    logged = next(entry["loss"] for entry in trainer.state.log_history if "loss" in entry)
    assert logged == pytest.approx(want.loss.item(), rel=1e-4)  # the trainer logs it rounded
    moved = {n: before[n] - p.detach() for n, p in model.named_parameters()}  # SGD, lr 1: the gradient
    assert moved.keys() >= grads.keys() and grads
    for name, grad in grads.items():
        torch.testing.assert_close(moved[name], grad, rtol=1e-3, atol=1e-6, msg=name)
    assert math.isfinite(loss.last_metrics["pos_sim"].item())


def test_dropout_pairs_train_and_a_form_the_objective_lacks_is_refused(st_folder, tmp_path):
    """SimCSE's unsupervised recipe (the same sentence twice, dropout on) runs; a form the objective is not defined
    on is a clear error (one column and explicit negatives: tests/test_st_columns.py)."""
    model = SentenceTransformer(str(st_folder), device="cpu")
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.1
    loss = st_losses.SimCSEHCLLoss(model, beta=0.5)
    features = [model.tokenize(ANCHORS), model.tokenize(ANCHORS)]
    model.train()
    value = loss(features)
    assert torch.isfinite(value) and value.item() > 0
    assert 0.5 < loss.last_metrics["pos_sim"].item() < 1  # dropout: the two views differ
    with pytest.raises(ValueError, match="symmetric form"):
        st_losses.SimCSEHCLLoss(model, contrast_form="simcse")
