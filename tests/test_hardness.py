"""The `hardness` objective: sentence-transformers' MultipleNegativesRankingLoss hardness term (in-batch negatives),
equal to MNRL in the simcse form (loss, gradients, one step of SentenceTransformerTrainer), on every negative of the
symmetric form and on a queue's entries in simcse-hn (against a loop), InfoNCE at strength 0; and the symmetric
InfoNCE named in MNRL's terms."""

from __future__ import annotations

import datasets
import pytest
import torch
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
from test_st_losses import ANCHORS, POSITIVES, st_folder  # noqa: F401  (st_folder: a fixture)

from simcse_hn.configuration.parser import parse_args
from simcse_hn.errors import ConfigError
from simcse_hn.export.st_losses import SimCSEHardnessLoss, SimCSELoss
from simcse_hn.losses import build_loss
from simcse_hn.training.queue import QueueEntries
from simcse_hn.training.step import contrastive_loss

pytestmark = pytest.mark.usefixtures("one_thread")
T = 0.05


def pairs(batch: int = 8, dim: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    anchors = torch.randn(batch, dim, generator=g, dtype=torch.float64)
    return anchors.requires_grad_(), (anchors + 0.8 * torch.randn(batch, dim, generator=g, dtype=torch.float64))


def value_and_grads(loss: torch.Tensor, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return (loss.detach(), *torch.autograd.grad(loss, inputs))


@pytest.mark.parametrize("strength", [0.5, 9.0])
def test_simcse_form_equals_mnrl_hardness_in_batch_negatives(strength):
    anchors, positives = pairs()
    positives.requires_grad_()
    model = torch.nn.Linear(1, 1)  # the losses only keep it; the embeddings are given
    mnrl = MultipleNegativesRankingLoss(model, scale=1 / T, hardness_mode="in_batch_negatives",
                                        hardness_strength=strength)  # fmt: skip
    ours = SimCSELoss(model, "hardness", strength=strength, contrast_form="simcse", temperature=T)
    want = value_and_grads(mnrl.compute_loss_from_embeddings([anchors, positives], None), [anchors, positives])
    got = value_and_grads(ours.compute_loss_from_embeddings([anchors, positives]), [anchors, positives])
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    # without the term: SimCSE's own loss is MNRL's default
    plain = value_and_grads(SimCSELoss(model, "infonce", contrast_form="simcse", temperature=T)
                            .compute_loss_from_embeddings([anchors, positives]), [anchors, positives])  # fmt: skip
    default = value_and_grads(MultipleNegativesRankingLoss(model, scale=1 / T).compute_loss_from_embeddings(
        [anchors, positives], None), [anchors, positives])  # fmt: skip
    for w, g in zip(default, plain):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    assert plain[0] < got[0]  # the term acts


def reference_hardness(z: torch.Tensor, strength: float, queue: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """The symmetric form by loops: rows [a, a', b, b', ...], every row an anchor against every other row but its
    pair and every queue entry not masked for it; each negative's logit + strength x its cosine (detached)."""
    unit = torch.nn.functional.normalize(z, dim=-1)
    entries = torch.nn.functional.normalize(queue, dim=-1)
    losses = []
    for i in range(len(z)):
        positive = unit[i] @ unit[i ^ 1] / T
        terms = [positive]
        for j in range(len(z)):
            if j not in (i, i ^ 1):
                cos = unit[i] @ unit[j]
                terms.append(cos / T + strength * cos.detach())
        for k in range(len(queue)):
            if not masked[i, k]:
                cos = unit[i] @ entries[k]
                terms.append(cos / T + strength * cos.detach())
        losses.append(torch.logsumexp(torch.stack(terms), 0) - positive)
    return torch.stack(losses).mean()


def test_symmetric_form_and_queue_entries_take_the_term_on_every_negative():
    anchors, positives = pairs(batch=4, seed=1)
    z = torch.stack([anchors, positives], 1).reshape(8, -1)  # rows [a, a', b, b', ...]
    text_ids = torch.arange(4).repeat_interleave(2)
    g = torch.Generator().manual_seed(2)
    queue = torch.randn(5, z.shape[1], generator=g, dtype=torch.float64)
    queue_ids = torch.tensor([1, 7, 8, -1, 9])  # entry 0 is sentence 1's text: masked for its rows; entry 3 unwritten
    masked = (queue_ids[None] == text_ids[:, None]) | (queue_ids[None] < 0)
    loss_fn = build_loss("hardness", temperature=T, strength=3.0)
    output = contrastive_loss(loss_fn, z, text_ids=text_ids, queue=QueueEntries(queue, queue_ids))
    got = value_and_grads(output.loss, [anchors])
    want = value_and_grads(reference_hardness(z, 3.0, queue, masked), [anchors])
    for w, g_ in zip(want, got):
        torch.testing.assert_close(g_, w, rtol=1e-12, atol=1e-12)
    count = 6 + (~masked).sum(1)  # n_i: the batch's 8 rows but the anchor and its pair, and its entries
    torch.testing.assert_close(output.weights.sum(1), count.double())  # the diagnostics' weights: mean one


def test_strength_zero_is_infonce():
    anchors, positives = pairs(seed=3)
    z = torch.stack([anchors, positives], 1).reshape(16, -1)
    got = value_and_grads(contrastive_loss(build_loss("hardness", temperature=T, strength=0.0), z).loss, [anchors])
    want = value_and_grads(contrastive_loss(build_loss("infonce", temperature=T), z).loss, [anchors])
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("strength", [2.0, 0.0])
def test_one_step_in_sentence_transformers_trainer_moves_the_weights_as_mnrl_does(strength, st_folder, tmp_path):  # noqa: F811
    """The same model and batch, one SGD step each: SimCSEHardnessLoss in the simcse form and MNRL with hardness
    (strength 0: MNRL without it, since MNRL's hardness at 0 only warns) end at the same weights."""
    train = datasets.Dataset.from_dict({"anchor": ANCHORS, "positive": POSITIVES})
    moved = []
    for name in ("mnrl", "ours"):
        model = SentenceTransformer(str(st_folder), device="cpu")
        if name == "mnrl":
            mode = "in_batch_negatives" if strength else None
            loss = MultipleNegativesRankingLoss(model, scale=1 / T, hardness_mode=mode, hardness_strength=strength)
        else:
            loss = SimCSEHardnessLoss(model, strength=strength, contrast_form="simcse", temperature=T)
        args = SentenceTransformerTrainingArguments(
            output_dir=str(tmp_path / name), per_device_train_batch_size=len(ANCHORS), max_steps=1, learning_rate=1.0,
            optim="sgd", lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1e9, report_to=[],
            use_cpu=True, save_strategy="no", disable_tqdm=True, logging_steps=1, seed=0,
        )  # fmt: skip
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train, loss=loss)
        trainer.train()
        loss_value = next(entry["loss"] for entry in trainer.state.log_history if "loss" in entry)
        moved.append((loss_value, {n: before[n] - p.detach() for n, p in model.named_parameters()}))
    (mnrl_loss, mnrl_moved), (our_loss, our_moved) = moved
    assert our_loss == pytest.approx(mnrl_loss, rel=1e-4)
    assert any(d.abs().max() > 1e-4 for d in mnrl_moved.values())
    for name, delta in mnrl_moved.items():
        torch.testing.assert_close(our_moved[name], delta, rtol=1e-4, atol=1e-6, msg=name)


def test_symmetric_infonce_is_the_mean_of_mnrl_query_to_doc_and_query_to_query_over_both_column_orders():
    """NT-Xent (simcse-hn's symmetric form) in MNRL's terms: directions ("query_to_doc", "query_to_query"), joint
    partition, averaged over (anchor, positive) and (positive, anchor); not MNRL's four directions in one partition."""
    anchors, positives = pairs(seed=4)
    positives.requires_grad_()
    model = torch.nn.Linear(1, 1)
    mnrl = MultipleNegativesRankingLoss(model, scale=1 / T, directions=("query_to_doc", "query_to_query"))
    want = value_and_grads((mnrl.compute_loss_from_embeddings([anchors, positives], None)
                            + mnrl.compute_loss_from_embeddings([positives, anchors], None)) / 2,
                           [anchors, positives])  # fmt: skip
    ours = SimCSELoss(model, "infonce", temperature=T)  # contrast_form "symmetric", the default
    got = value_and_grads(ours.compute_loss_from_embeddings([anchors, positives]), [anchors, positives])
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    gte = MultipleNegativesRankingLoss(
        model, scale=1 / T, directions=("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")
    )
    assert not torch.isclose(gte.compute_loss_from_embeddings([anchors, positives], None), got[0])


def test_hardness_strength_flag(tmp_path):
    args = parse_args(["--loss", "hardness", "--hardness_strength", "2", "--output_dir", str(tmp_path)])[2]
    assert build_loss("hardness", **args.loss_kwargs()).options.strength == 2.0
    for value, message in (("-1", "hardness_strength: must be >= 0"), ("0", "hardness_strength: 0 makes hardness")):
        with pytest.raises(ConfigError) as error:
            parse_args(["--loss", "hardness", "--hardness_strength", value, "--output_dir", str(tmp_path)])
        assert str(error.value).startswith(message) and "\n" not in str(error.value)
