"""Topic batches inside SentenceTransformerTrainer (simcse_hn.export.st_training.TopicBatches as `batch_sampler`):
every trained batch from one cluster of the model's clustering, the share option, re-clustering, a stopped and
resumed run that trains on the uninterrupted run's batches and ends at its weights, the batches' diagnostics in the
logs, and one-line refusals."""

from __future__ import annotations

import json

import datasets
import pytest
import torch
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from test_st_losses import st_folder  # noqa: F401  (a fixture: a tiny BERT without dropout, mean pooling)
from test_st_queue import StopAt

from simcse_hn.data.topic_batches import TOPIC_CLUSTERS_FILE
from simcse_hn.errors import ConfigError
from simcse_hn.export.st_losses import SimCSELoss
from simcse_hn.export.st_training import SimCSECallback, TopicBatches, token_text_ids
from simcse_hn.training.checkpoints import CHECKPOINT_MANIFEST

pytestmark = pytest.mark.usefixtures("one_thread")
WORDS = ["alpha", "beta", "gamma", "delta"]
BATCH = 8


def pairs(count: int = 64) -> datasets.Dataset:
    anchors = [f"topic {i % 4} " + " ".join([WORDS[i % 4]] * (1 + i % 3)) + f" {i // 4}" for i in range(count)]
    return datasets.Dataset.from_dict({"anchor": anchors, "positive": [f"positive {i}" for i in range(count)]})


class Recording(SimCSELoss):
    """Records the anchors' text ids of every training batch."""

    def forward(self, sentence_features, labels=None):
        features = list(sentence_features)
        if self.model.training:
            self.batches.append(token_text_ids(features[0]).tolist())
        return super().forward(features, labels)


def run(folder, output_dir, batches, callbacks=(), resume=False, **overrides):
    model = SentenceTransformer(str(folder), device="cpu")
    loss = Recording(model, "infonce", temperature=0.05)
    loss.batches = []
    settings = dict(per_device_train_batch_size=BATCH, max_steps=6, learning_rate=1e-2, report_to=[], use_cpu=True,
                    disable_tqdm=True, logging_steps=2, seed=0, save_strategy="no", batch_sampler=batches)  # fmt: skip
    args = SentenceTransformerTrainingArguments(output_dir=str(output_dir), **{**settings, **overrides})
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=pairs(), loss=loss,
                                         callbacks=[SimCSECallback(loss, batches), *callbacks])  # fmt: skip
    trainer.train(resume_from_checkpoint=True if resume else None)
    return trainer, loss


def clusters_of(batches: TopicBatches, trained: list[list[int]], step: int = 0) -> list[set[int]]:
    """The clusters (of the assignment in force from `step`) of each trained batch's anchors."""
    sampler = batches.samplers[-1]
    ids = token_text_ids(SentenceTransformer.tokenize(sampler.model, sampler.dataset["anchor"])).tolist()
    assignment = max((e for e in sampler.topic.schedule if e.step <= step), key=lambda e: e.step).assignment
    cluster = dict(zip(ids, assignment.tolist()))
    return [{cluster[i] for i in batch} for batch in trained]


def test_every_trained_batch_is_one_cluster_and_the_share_is_logged(st_folder, tmp_path):  # noqa: F811
    batches = TopicBatches(clusters=4)
    trainer, loss = run(st_folder, tmp_path / "one", batches)
    assert len(loss.batches) == 6 and all(len(c) == 1 for c in clusters_of(batches, loss.batches))
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 3 and all("topic_cluster_share" in e and "pos_sim" in e for e in logged)
    half = TopicBatches(clusters=4, share=0.5)
    _, loss = run(st_folder, tmp_path / "half", half)
    assert any(len(c) > 1 for c in clusters_of(half, loss.batches))  # the rest of each batch is random


@pytest.mark.slow
def test_a_run_stopped_and_resumed_trains_on_the_uninterrupted_runs_batches_across_reclusterings(
    st_folder, tmp_path  # noqa: F811
):
    """Re-clustered by the model after steps 2 and 4; stopped at 3 (a checkpoint holding the step-2 clusters, which
    the resumed run's model would not make again) and resumed."""
    saving = {"save_strategy": "steps", "save_steps": 3}
    straight_batches = TopicBatches(clusters=4, recluster_steps=2)
    straight, straight_loss = run(st_folder, tmp_path / "straight", straight_batches, **saving)
    schedule = straight_batches.samplers[-1].topic.schedule
    assert [entry.step for entry in schedule] == [0, 2, 4]
    first = TopicBatches(clusters=4, recluster_steps=2)
    _, first_loss = run(st_folder, tmp_path / "resumed", first, callbacks=[StopAt(3)], **saving)
    manifest = json.loads((tmp_path / "resumed" / "checkpoint-3" / CHECKPOINT_MANIFEST).read_text(encoding="utf-8"))
    assert TOPIC_CLUSTERS_FILE in manifest["files"]  # written before the manifest, which is written last
    resumed, resumed_loss = run(st_folder, tmp_path / "resumed", TopicBatches(clusters=4, recluster_steps=2),
                                resume=True, **saving)  # fmt: skip
    assert first_loss.batches + resumed_loss.batches == straight_loss.batches
    for name, want in straight.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], want, rtol=0, atol=0, msg=name)
    # the checkpoint resumed without topic batches: one line
    with pytest.raises(ConfigError, match="checkpoint-6 was trained with TopicBatches"):
        run(st_folder, tmp_path / "resumed", None, resume=True, max_steps=7, **saving)


def test_topic_settings_are_refused_in_one_line(st_folder, tmp_path):  # noqa: F811
    for kwargs, message in (({"share": 0.0}, "share must be in"), ({"clusters": 0}, "clusters must be >= 1"),
                            ({"recluster_steps": 2, "encoder": object()}, "recluster_steps must be >= 0, and 0 with")):
        with pytest.raises(ConfigError, match=message):
            TopicBatches(**kwargs)
    model = SentenceTransformer(str(st_folder), device="cpu")
    args = SentenceTransformerTrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=BATCH,
                                                max_steps=1, report_to=[], use_cpu=True, disable_tqdm=True,
                                                batch_sampler=TopicBatches(clusters=4))  # fmt: skip
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=pairs(), loss=SimCSELoss(model))
    with pytest.raises(ConfigError, match=r"^TopicBatches needs SimCSECallback\(loss, batches\) in the trainer's"):
        trainer.train()


def test_no_duplicates_and_a_clustering_encoder_of_its_own(st_folder, tmp_path):  # noqa: F811
    """Each anchor twice: one cluster gathers both copies, so batches repeat texts unless `no_duplicates`. With an
    `encoder` the sampler clusters with it, not with the model (the callback still tells training from evaluation)."""
    doubled = datasets.concatenate_datasets([pairs(32), pairs(32)])
    encoder = SentenceTransformer(str(st_folder), device="cpu")
    repeats = {}
    for no_duplicates in (False, True):
        batches = TopicBatches(clusters=4, encoder=encoder, no_duplicates=no_duplicates)
        model = SentenceTransformer(str(st_folder), device="cpu")
        loss = Recording(model, "infonce", temperature=0.05)
        loss.batches = []
        args = SentenceTransformerTrainingArguments(
            output_dir=str(tmp_path / str(no_duplicates)), max_steps=6, per_device_train_batch_size=BATCH,
            report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no", batch_sampler=batches,
        )  # fmt: skip
        callbacks = [SimCSECallback(None, batches)]
        trainer = SentenceTransformerTrainer(model, args, train_dataset=doubled, loss=loss, callbacks=callbacks)
        trainer.train()
        batches.samplers[-1].model = encoder  # for clusters_of's tokenizer only
        assert all(len(c) == 1 for c in clusters_of(batches, loss.batches))
        repeats[no_duplicates] = sum(len(batch) - len(set(batch)) for batch in loss.batches)
    assert repeats[False] > 0 and repeats[True] == 0
