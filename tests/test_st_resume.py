"""A SentenceTransformerTrainer run with everything at once (one column, or explicit negatives; CachedSimCSELoss with
a momentum queue; topic batches; an evaluation set evaluated during training; dropout on), stopped after a checkpoint
and resumed, ends bit-equal to the run that was not stopped: weights, queue, momentum encoder and the evaluation
losses after the resume."""

from __future__ import annotations

import datasets
import pytest
import torch
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from test_st_losses import st_folder  # noqa: F401  (a fixture: a tiny BERT without dropout, mean pooling)
from test_st_queue import StopAt
from test_st_topic import pairs

from simcse_hn.export.st_cached import CachedSimCSELoss
from simcse_hn.export.st_training import SimCSECallback, TopicBatches

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]
SETTINGS = dict(
    per_device_train_batch_size=8,
    per_device_eval_batch_size=8,
    max_steps=6,
    learning_rate=1e-2,
    report_to=[],
    use_cpu=True,
    disable_tqdm=True,
    logging_steps=1,
    seed=0,
    eval_strategy="steps",
    eval_steps=2,
    save_strategy="steps",
    save_steps=3,
)


def columns(kind: str) -> datasets.Dataset:
    data = pairs(64)
    if kind == "one-column":
        return data.select_columns(["anchor"]).rename_column("anchor", "text")
    return data.add_column("negative", data["positive"][1:] + data["positive"][:1])


def run(folder, output_dir, kind, callbacks=(), resume=False):
    model = SentenceTransformer(str(folder), device="cpu")
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.1
    loss = CachedSimCSELoss(model, "hcl", beta=0.5, mini_batch_size=3, queue_size=12, momentum=0.9)
    batches = TopicBatches(clusters=4)
    args = SentenceTransformerTrainingArguments(output_dir=str(output_dir), batch_sampler=batches, **SETTINGS)
    trainer = SentenceTransformerTrainer(
        model=model,
        args=args,
        train_dataset=columns(kind),
        eval_dataset=pairs(16),
        loss=loss,
        callbacks=[SimCSECallback(loss, batches), *callbacks],
    )
    trainer.train(resume_from_checkpoint=True if resume else None)
    return trainer, loss


@pytest.mark.parametrize("kind", ["one-column", "explicit-negatives"])
def test_everything_at_once_stopped_and_resumed_ends_bit_equal(kind, st_folder, tmp_path):  # noqa: F811
    straight, straight_loss = run(st_folder, tmp_path / "straight", kind)
    run(st_folder, tmp_path / "resumed", kind, callbacks=[StopAt(3)])
    resumed, resumed_loss = run(st_folder, tmp_path / "resumed", kind, resume=True)
    assert resumed.state.global_step == 6
    for name, want in straight.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], want, rtol=0, atol=0, msg=name)
    want, got = straight_loss.queue.state_dict(), resumed_loss.queue.state_dict()
    for key, value in want["queues"][32]["buffer"].items():
        if value is not None:
            torch.testing.assert_close(got["queues"][32]["buffer"][key], value, rtol=0, atol=0, msg=key)
    for name, value in want["momentum_encoder"].items():
        torch.testing.assert_close(got["momentum_encoder"][name], value, rtol=0, atol=0, msg=name)
    evaluated = {e["step"]: e["eval_loss"] for e in straight.state.log_history if "eval_loss" in e}
    after = {e["step"]: e["eval_loss"] for e in resumed.state.log_history if "eval_loss" in e and e["step"] > 3}
    assert after == {step: evaluated[step] for step in (4, 6)}
