"""Topic batches as sentence-transformers users combine them: with an evaluation set (its loader gets
sentence-transformers' default batches, before, during and after training: the evaluation loss is the one a trainer
without TopicBatches computes on the same weights) and with a DatasetDict under ProportionalBatchSampler and
RoundRobinBatchSampler (each dataset clustered on its own, every batch one cluster of one dataset, a stopped and
resumed run bit-equal); what cannot work is refused in one line before the first step."""

from __future__ import annotations

import datasets
import pytest
import torch
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.base.sampler import DefaultBatchSampler, MultiDatasetBatchSamplers
from test_st_losses import st_folder  # noqa: F401  (a fixture: a tiny BERT without dropout, mean pooling)
from test_st_queue import StopAt
from test_st_topic import BATCH, Recording, pairs
from transformers import TrainerCallback

from simcse_hn.errors import ConfigError
from simcse_hn.export.st_losses import SimCSELoss
from simcse_hn.export.st_topic import TopicBatchesSampler
from simcse_hn.export.st_training import SimCSECallback, TopicBatches, token_text_ids
from simcse_hn.training import distributed

pytestmark = pytest.mark.usefixtures("one_thread")
SETTINGS = dict(
    per_device_train_batch_size=BATCH,
    per_device_eval_batch_size=BATCH,
    max_steps=6,
    learning_rate=1e-2,
    report_to=[],
    use_cpu=True,
    disable_tqdm=True,
    logging_steps=2,
    seed=0,
    save_strategy="no",
)


def trainer_for(folder, output_dir, train, batches=None, eval_dataset=None, callbacks=(), **overrides):
    model = SentenceTransformer(str(folder), device="cpu")
    loss = Recording(model, "infonce", temperature=0.05)
    loss.batches = []
    sampler = {} if batches is None else {"batch_sampler": batches}
    args = SentenceTransformerTrainingArguments(output_dir=str(output_dir), **{**SETTINGS, **sampler, **overrides})
    ours = [SimCSECallback(loss, batches)] if batches is not None else []
    return SentenceTransformerTrainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=eval_dataset,
        loss=loss,
        callbacks=[*ours, *callbacks],
    )


def plain_eval_loss(folder, output_dir, weights: dict, eval_dataset) -> float:
    """The evaluation loss a trainer without TopicBatches (sentence-transformers' default batches) computes."""
    trainer = trainer_for(folder, output_dir, pairs(), eval_dataset=eval_dataset)
    trainer.model.load_state_dict(weights)
    return trainer.evaluate()["eval_loss"]


class KeepWeights(TrainerCallback):
    def __init__(self):
        self.at: dict[int, dict] = {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.at[state.global_step] = {n: p.detach().clone() for n, p in model.state_dict().items()}


def test_topic_batches_with_an_evaluation_set(st_folder, tmp_path):  # noqa: F811
    evaluation = pairs(24).map(lambda row: {"anchor": "eval " + row["anchor"]})
    kept = KeepWeights()
    batches = TopicBatches(clusters=4)
    trainer = trainer_for(
        st_folder,
        tmp_path / "topic",
        pairs(),
        batches,
        evaluation,
        callbacks=[kept],
        eval_strategy="steps",
        eval_steps=2,
    )
    start = {n: p.detach().clone() for n, p in trainer.model.state_dict().items()}
    before = trainer.evaluate()["eval_loss"]  # before training: no sampler claimed, ST's default batches
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    during = {e["step"]: e["eval_loss"] for e in trainer.state.log_history if "eval_loss" in e}
    assert sorted(during) == [2, 4, 6] and len(trainer.loss.batches) == 6
    assert before == pytest.approx(plain_eval_loss(st_folder, tmp_path / "plain", start, evaluation), rel=1e-6)
    assert during[4] == pytest.approx(plain_eval_loss(st_folder, tmp_path / "plain", kept.at[4], evaluation), rel=1e-6)
    assert after == pytest.approx(plain_eval_loss(st_folder, tmp_path / "plain", kept.at[6], evaluation), rel=1e-6)
    (sampler,) = [s for s in batches.samplers if s.training]  # the training loader's, claimed; the rest evaluated
    assert sampler.dataset is trainer.train_dataset and sampler.topic is not None
    made_during = batches(evaluation, BATCH)  # what TopicBatches gives a loader built while a train runs
    assert isinstance(made_during, TopicBatchesSampler)  # after the train: undecided again (a 2nd train may claim it)
    batches.in_training = True
    assert type(batches(evaluation, BATCH)) is DefaultBatchSampler


def two_datasets() -> datasets.DatasetDict:
    second = pairs(48).map(lambda row: {"anchor": "second " + row["anchor"], "positive": "2 " + row["positive"]})
    return datasets.DatasetDict({"first": pairs(64), "second": second})


def cluster_of_text(batches: TopicBatches) -> dict[int, tuple[int, int]]:
    """text id -> (dataset, cluster) over the claimed samplers."""
    found = {}
    for number, sampler in enumerate(s for s in batches.samplers if s.training):
        ids = token_text_ids(SentenceTransformer.tokenize(sampler.model, sampler.dataset["anchor"])).tolist()
        found.update({i: (number, c) for i, c in zip(ids, sampler.topic.assignment.tolist())})
    return found


@pytest.mark.parametrize("multi", ["proportional", "round_robin"])
def test_topic_batches_with_a_dataset_dict(multi, st_folder, tmp_path):  # noqa: F811
    batches = TopicBatches(clusters=4)
    trainer = trainer_for(
        st_folder, tmp_path, two_datasets(), batches, multi_dataset_batch_sampler=MultiDatasetBatchSamplers(multi)
    )
    trainer.train()
    claimed = [s for s in batches.samplers if s.training]
    assert len(claimed) == 2 and claimed[0].topic.assignment.shape == (64,) and claimed[1].topic.size == 48
    where = cluster_of_text(batches)
    trained = [{where[i] for i in batch} for batch in trainer.loss.batches]
    assert len(trained) == 6 and all(len(found) == 1 for found in trained)  # one cluster of one dataset each
    assert {dataset for found in trained for dataset, _ in found} == {0, 1}
    if multi == "round_robin":  # alternating datasets
        assert [next(iter(found))[0] for found in trained] == [0, 1, 0, 1, 0, 1]
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert all(entry["topic_cluster_share"] == 1.0 for entry in logged)


@pytest.mark.slow
def test_a_dataset_dict_run_stopped_and_resumed_ends_bit_equal(st_folder, tmp_path):  # noqa: F811
    saving = {"save_strategy": "steps", "save_steps": 3}
    straight = trainer_for(st_folder, tmp_path / "straight", two_datasets(), TopicBatches(clusters=4), **saving)
    straight.train()
    first = trainer_for(
        st_folder, tmp_path / "resumed", two_datasets(), TopicBatches(clusters=4), callbacks=[StopAt(3)], **saving
    )
    first.train()
    resumed = trainer_for(st_folder, tmp_path / "resumed", two_datasets(), TopicBatches(clusters=4), **saving)
    resumed.train(resume_from_checkpoint=True)
    assert first.loss.batches + resumed.loss.batches == straight.loss.batches
    for name, want in straight.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], want, rtol=0, atol=0, msg=name)


def test_a_dataset_dict_on_several_processes_is_refused(st_folder, tmp_path, monkeypatch):  # noqa: F811
    """Two processes (as the callback counts them): the multi-dataset sampler would deal each process batches of
    other datasets, so no gathered batch could be one cluster."""
    trainer = trainer_for(st_folder, tmp_path, two_datasets(), TopicBatches(clusters=4))
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    with pytest.raises(ConfigError, match=r"^TopicBatches with a DatasetDict trains on one process"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_what_topic_batches_cannot_do_is_refused_before_the_first_step(st_folder, tmp_path):  # noqa: F811
    cases = [
        (two_datasets(), TopicBatches(clusters=4, recluster_steps=2), "recluster_steps with a DatasetDict"),
        (pairs(6), TopicBatches(clusters=4), "TopicBatches: 6 examples for batches of 8 and 4 clusters"),
        (pairs(64).to_iterable_dataset(), TopicBatches(clusters=4), "the training loader has no topic sampler"),
    ]
    for number, (train, batches, message) in enumerate(cases):
        trainer = trainer_for(st_folder, tmp_path / str(number), train, batches)
        with pytest.raises(ConfigError, match=message):
            trainer.train()
        assert trainer.state.global_step == 0 and trainer.loss.batches == []
    model = SentenceTransformer(str(st_folder), device="cpu")
    loss, batches = SimCSELoss(model), TopicBatches(clusters=4)
    args = SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "none"), batch_sampler=batches, **SETTINGS)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=pairs(), loss=loss)  # no callback
    with pytest.raises(ConfigError, match=r"^TopicBatches needs SimCSECallback\(loss, batches\)"):
        trainer.train()
    assert trainer.state.global_step == 0
