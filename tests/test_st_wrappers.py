"""simcse-hn's losses inside sentence-transformers' wrapper losses, in SentenceTransformerTrainer: MatryoshkaLoss
around a loss with a queue gives each dimension a queue of its own (equal, step by step, to two losses with one
queue each driven by hand), AdaptiveLayerLoss enqueues one set of entries per batch (the final layer's), schedules
read the trainer's optimizer step and not a count of calls, and a run stopped and resumed ends bit-equal."""

from __future__ import annotations

import datasets
import pytest
import torch
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.sentence_transformer.losses import AdaptiveLayerLoss, MatryoshkaLoss
from sentence_transformers.sentence_transformer.losses.matryoshka import shrink
from test_st_losses import st_folder  # noqa: F401  (a fixture: a tiny BERT without dropout, mean pooling)
from test_st_queue import SETTINGS, StopAt, in_order, texts

from simcse_hn.export.st_cached import CachedSimCSELoss
from simcse_hn.export.st_losses import SimCSELoss
from simcse_hn.export.st_training import SimCSECallback

pytestmark = pytest.mark.usefixtures("one_thread")
BATCH, STEPS, QUEUE, DIMS = 4, 5, 10, (32, 16)


def train_wrapped(folder, output_dir, make_loss, callbacks=(), resume=False, **overrides):
    """STEPS optimizer steps of `make_loss(model)` (a wrapper; its SimCSELoss found by the callback) in order."""
    model = SentenceTransformer(str(folder), device="cpu")
    loss = make_loss(model)
    settings = {**SETTINGS, "per_device_train_batch_size": BATCH, "max_steps": STEPS, "save_strategy": "no"}
    args = SentenceTransformerTrainingArguments(
        output_dir=str(output_dir), batch_sampler=in_order, **{**settings, **overrides}
    )
    train = datasets.Dataset.from_dict({"anchor": texts(), "positive": texts()})
    trainer = SentenceTransformerTrainer(
        model=model, args=args, train_dataset=train, loss=loss, callbacks=[SimCSECallback(loss), *callbacks]
    )
    trainer.train(resume_from_checkpoint=True if resume else None)
    return trainer, loss


def inner(loss) -> SimCSELoss:
    return loss.loss


def losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def by_hand(folder, momentum: float, accumulation: int) -> list[float]:
    """The reference: one SimCSELoss per dimension, each with a queue of its own, on the full embeddings and on
    MatryoshkaLoss's truncation of them, stepped by hand (SGD, the trainer's settings)."""
    model = SentenceTransformer(str(folder), device="cpu")
    per_dim = [SimCSELoss(model, "hcl", beta=0.5, temperature=0.05, queue_size=QUEUE, momentum=momentum) for _ in DIMS]
    for loss in per_dim:
        loss.trainer_step.set(0, STEPS)
        loss.queue.start(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=SETTINGS["learning_rate"])
    rows, micro = texts(), BATCH // accumulation
    logged = []
    model.train()
    for step in range(STEPS):
        total = 0.0
        for batch in range(accumulation):
            start = (step * accumulation + batch) * micro % len(rows)
            chunk = (rows + rows)[start : start + micro]
            features = [model.tokenize(chunk), model.tokenize(chunk)]
            value = 0.0
            for loss, dim in zip(per_dim, DIMS):
                loss.trainer_step.set(step, STEPS, batch)
                columns = loss.batch_columns(features)
                embeddings = [shrink(model(dict(c))["sentence_embedding"], dim) for c in columns]
                value = value + loss.compute_loss_from_embeddings(embeddings)
            (value / accumulation).backward()
            total += value.item() / accumulation
        optimizer.step()
        optimizer.zero_grad()
        for loss in per_dim:
            loss.queue.step_end(model)
        logged.append(total)
    return logged


@pytest.mark.parametrize("momentum, accumulation", [(0.0, 1), (0.9, 2)], ids=["memory-bank", "momentum-accumulation"])
def test_matryoshka_around_a_queue_gives_each_dimension_its_own_queue(momentum, accumulation, st_folder, tmp_path):  # noqa: F811
    def make(model):
        loss = SimCSELoss(model, "hcl", beta=0.5, temperature=0.05, queue_size=QUEUE, momentum=momentum)
        return MatryoshkaLoss(model, loss, list(DIMS))

    steps = {"per_device_train_batch_size": BATCH // accumulation, "gradient_accumulation_steps": accumulation}
    trainer, loss = train_wrapped(st_folder, tmp_path, make, **steps)
    queue = inner(loss).queue
    assert sorted(queue.queues) == [16, 32]
    assert all(q.position == STEPS * BATCH % QUEUE for q in queue.queues.values())  # one set per batch and step
    if momentum:  # the momentum encoder embeds once; the narrow queue is the wide one's first dimensions
        torch.testing.assert_close(queue.entries(16).embeddings, queue.entries(32).embeddings[:, :16])
    else:  # the training forward's own embeddings, truncated as MatryoshkaLoss truncates them
        narrow = torch.nn.functional.normalize(queue.entries(32).embeddings[:, :16], dim=-1)
        torch.testing.assert_close(queue.entries(16).embeddings, narrow)
    got, want = losses(trainer), by_hand(st_folder, momentum, accumulation)
    assert len(got) == STEPS and got[-1] > got[0]  # the queues' negatives raise the loss
    assert got == pytest.approx(want, rel=2e-4)


def test_adaptive_layer_loss_enqueues_the_final_layers_rows_once_per_batch(st_folder, tmp_path):  # noqa: F811
    """AdaptiveLayerLoss calls the loss for the final layer, then for an earlier one, on each batch: the queue takes
    the final layer's anchors once (a memory bank: the forward's own rows)."""
    kept = {}

    class KeepLastStep(StopAt):
        def on_step_begin(self, args, state, control, model=None, **kwargs):
            kept.update({n: p.detach().clone() for n, p in model.state_dict().items()})

    def make(model):
        loss = SimCSELoss(model, "infonce", temperature=0.05, queue_size=QUEUE)
        return AdaptiveLayerLoss(model, loss, n_layers_per_step=1)

    trainer, loss = train_wrapped(st_folder, tmp_path, make, callbacks=[KeepLastStep(STEPS + 1)])
    queue = inner(loss).queue
    assert list(queue.queues) == [32] and queue.queues[32].position == STEPS * BATCH % QUEUE
    model = SentenceTransformer(str(st_folder), device="cpu")
    model.load_state_dict(kept)  # the weights the last step's forward ran with
    last = (texts() + texts())[(STEPS - 1) * BATCH : STEPS * BATCH]
    with torch.no_grad():
        final = model.train()(model.tokenize(last))["sentence_embedding"]
    newest = (queue.queues[32].position - BATCH + torch.arange(BATCH)) % QUEUE
    torch.testing.assert_close(queue.entries(32).embeddings[newest], final, rtol=1e-5, atol=1e-6)


def test_a_schedule_reads_the_trainers_step_however_often_a_wrapper_calls_the_loss(st_folder, tmp_path):  # noqa: F811
    """ProGCL inside MatryoshkaLoss, two micro-batches per step: four calls per optimizer step, each told the
    trainer's step (so the warm-up, half of the 5 steps, covers steps 0-2), never a count of calls."""
    seen = []

    def make(model):
        loss = SimCSELoss(model, "progcl", temperature=0.05, mode="weight", warmup_ratio=0.5)
        compute = loss.loss_fn.compute

        def recording(candidates, targets, context=None):
            if loss.model.training:
                seen.append((context.step, context.max_steps, loss.loss_fn.in_warmup(context.step, context.max_steps)))
            return compute(candidates, targets, context)

        loss.loss_fn.compute = recording
        return MatryoshkaLoss(model, loss, list(DIMS))

    train_wrapped(st_folder, tmp_path, make, per_device_train_batch_size=2, gradient_accumulation_steps=2)
    assert seen == [(step, STEPS, step < 2.5) for step in range(STEPS) for _ in range(4)]


@pytest.mark.slow
@pytest.mark.parametrize("cached", [False, True], ids=["matryoshka", "cached-matryoshka"])
def test_a_wrapped_queue_run_stopped_and_resumed_ends_bit_equal(cached, st_folder, tmp_path):  # noqa: F811
    def make(model):
        kind = CachedSimCSELoss if cached else SimCSELoss
        extra = {"mini_batch_size": 3} if cached else {}
        loss = kind(model, "hcl", beta=0.5, temperature=0.05, queue_size=QUEUE, momentum=0.9, **extra)
        return MatryoshkaLoss(model, loss, list(DIMS))

    saving = {"save_strategy": "steps", "save_steps": 2}
    straight, straight_loss = train_wrapped(st_folder, tmp_path / "straight", make, **saving)
    train_wrapped(st_folder, tmp_path / "resumed", make, callbacks=[StopAt(2)], **saving)
    resumed, resumed_loss = train_wrapped(st_folder, tmp_path / "resumed", make, resume=True, **saving)
    assert resumed.state.global_step == STEPS
    for name, want in straight.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], want, rtol=0, atol=0, msg=name)
    want, got = inner(straight_loss).queue.state_dict(), inner(resumed_loss).queue.state_dict()
    assert sorted(want["queues"]) == sorted(got["queues"]) == [16, 32]
    for width, queue in want["queues"].items():
        for key, value in queue["buffer"].items():
            torch.testing.assert_close(got["queues"][width]["buffer"][key], value, rtol=0, atol=0, msg=key)
    for name, value in want["momentum_encoder"].items():
        torch.testing.assert_close(got["momentum_encoder"][name], value, rtol=0, atol=0, msg=name)


def test_adaptive_layer_loss_on_one_column_keeps_each_views_layers_apart(st_folder, tmp_path):  # noqa: F811
    """One column is embedded twice, each view into features of its own: AdaptiveLayerLoss keeps every layer's
    outputs in them for its later calls, so an earlier layer's two views differ as the final layer's do (dropout
    on); with one shared dict the second view's layers would overwrite the first's (cosine 1)."""
    seen = []

    def make(model):
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.3
        loss = SimCSELoss(model, "infonce", temperature=0.05)
        compute = loss.compute_loss_from_embeddings

        def recording(embeddings, labels=None):
            if loss.model.training:
                seen.append(torch.nn.functional.cosine_similarity(*embeddings).mean().item())
            return compute(embeddings, labels)

        loss.compute_loss_from_embeddings = recording
        return AdaptiveLayerLoss(model, loss, n_layers_per_step=1)

    model = SentenceTransformer(str(st_folder), device="cpu")
    loss = make(model)
    args = SentenceTransformerTrainingArguments(output_dir=str(tmp_path), **{**SETTINGS, "max_steps": 2})
    train = datasets.Dataset.from_dict({"text": texts()})
    SentenceTransformerTrainer(model=model, args=args, train_dataset=train, loss=loss).train()
    assert len(seen) == 4 and all(0.5 < cosine < 0.9999 for cosine in seen)  # final, earlier, final, earlier
