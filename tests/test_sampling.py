"""Batches without duplicates (simcse_hn/data/sampling.py) and the trainer's sampler hook: every gathered batch holds
distinct texts, accelerate's sharding deals each gathered batch out to the processes, and a resumed run draws the
batches of an uninterrupted one."""

from __future__ import annotations

import logging
import random

import datasets
import pytest
import torch
from accelerate.data_loader import BatchSamplerShard
from torch.utils.data import BatchSampler, RandomSampler

from simcse_hn.configuration.training_arguments import SimCSETrainingArguments
from simcse_hn.data.pairs import PairCollator
from simcse_hn.data.sampling import NoDuplicatesSampler
from simcse_hn.losses import build_loss
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.testing.models import build_tiny_bert
from simcse_hn.training.trainer import SimCSETrainer

pytestmark = pytest.mark.usefixtures("one_thread")


def nli_like(count: int, premises: int, seed: int = 0) -> list[tuple[str, str, str]]:
    """(anchor, positive, negative) with repeated premises (as SimCSE's NLI file) and a few shared negatives."""
    rng = random.Random(seed)
    return [(f"premise {rng.randrange(premises)}", f"entailed {i}", f"contradiction {rng.randrange(count)}")
            for i in range(count)]  # fmt: skip


def texts_of(rows, indices):
    return [text for i in indices for text in rows[i]]


def test_every_window_has_distinct_texts_and_every_example_appears_once():
    rows = nli_like(300, premises=60)
    sampler = NoDuplicatesSampler(rows, window=16, seed=3)
    order = list(sampler)
    assert len(order) == len(sampler) == 288 and len(set(order)) == 288  # 18 full windows, no repeat
    for start in range(0, len(order), 16):
        window = texts_of(rows, order[start : start + 16])
        assert len(window) == len(set(window)), start
    plain = torch.randperm(300, generator=torch.Generator().manual_seed(3)).tolist()[:288]
    assert any(len(set(texts_of(rows, plain[s : s + 16]))) < 48 for s in range(0, 288, 16))  # a plain shuffle repeats


def test_the_order_depends_on_seed_and_epoch_only():
    rows = nli_like(200, premises=50)
    first = NoDuplicatesSampler(rows, 8, seed=1)
    assert list(first) == list(NoDuplicatesSampler(rows, 8, seed=1))  # every process draws the same order
    first.set_epoch(1)
    again = NoDuplicatesSampler(rows, 8, seed=1)
    again.set_epoch(1)
    assert list(first) == list(again) != list(NoDuplicatesSampler(rows, 8, seed=1))


def test_many_duplicates_take_reshuffled_passes_and_say_so(caplog):
    rows = [(f"premise {i % 5}", f"hypothesis {i}") for i in range(40)]  # at most 5 examples per window of 5
    with caplog.at_level(logging.WARNING, logger="simcse_hn.data.sampling"):
        order = list(NoDuplicatesSampler(rows, 5, seed=0))
    assert len(order) == 40
    for start in range(0, 40, 5):
        window = texts_of(rows, order[start : start + 5])
        assert len(window) == len(set(window))
    impossible = [("same", f"other {i}") for i in range(12)]  # one anchor for all: no window of 2 without a repeat
    with caplog.at_level(logging.WARNING, logger="simcse_hn.data.sampling"):
        assert len(list(NoDuplicatesSampler(impossible, 2))) == 12
    assert "hold a repeated text" in caplog.text


def test_drop_last_false_keeps_every_example():
    rows = nli_like(50, premises=20)
    order = list(NoDuplicatesSampler(rows, 8, drop_last=False))
    assert sorted(order) == list(range(50))


def test_accelerate_deals_each_gathered_batch_out_to_the_processes():
    """BatchSamplerShard (what accelerate.prepare wraps the DataLoader's batches in) gives process r batches r, r + W,
    ...: the W batches of one step are one window of the sampler, so the gathered batch has distinct texts."""
    rows = nli_like(256, premises=40)
    sampler = NoDuplicatesSampler(rows, window=2 * 8, seed=5)  # 2 processes x 8 examples
    shards = [list(BatchSamplerShard(BatchSampler(sampler, 8, drop_last=True), 2, rank)) for rank in (0, 1)]
    assert len(shards[0]) == len(shards[1]) == 16
    for step, (mine, theirs) in enumerate(zip(*shards)):
        gathered = texts_of(rows, mine + theirs)
        assert len(gathered) == len(set(gathered)), step
    assert sorted(i for shard in shards for batch in shard for i in batch) == sorted(sampler)


class RecordingCollator(PairCollator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches = []

    def __call__(self, features):
        self.batches.append([f["anchor"] for f in features])
        return super().__call__(features)


def make_trainer(tmp_path, dataset, collator, **overrides):
    settings = dict(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=8, eval_strategy="no",
                    save_strategy="no", load_best_model_at_end=False, metric_for_best_model=None, report_to=[],
                    disable_tqdm=True, learning_rate=1e-3, seed=0)  # fmt: skip
    args = SimCSETrainingArguments(**{**settings, **overrides})
    model = SimCSEModel(build_tiny_bert(seed=0, dropout=0.0)[0], pooler="avg")
    return SimCSETrainer(model=model, args=args, loss_fn=build_loss("infonce"), train_dataset=dataset,
                         data_collator=collator)  # fmt: skip


def pair_dataset(rows):
    return datasets.Dataset.from_dict({"anchor": [r[0] for r in rows], "positive": [r[1] for r in rows],
                                       "negative_1": [r[2] for r in rows]})  # fmt: skip


def test_the_trainer_samples_without_duplicates_for_pairs_by_default(tmp_path):
    rows = nli_like(64, premises=12)
    tokenizer = build_tiny_bert()[1]
    trainer = make_trainer(tmp_path, pair_dataset(rows), PairCollator(tokenizer, 64, negatives=1))
    assert trainer.batches.no_duplicates and trainer.layout.group_size == 3
    loader = trainer.get_train_dataloader()
    assert isinstance(trainer.batches.sampler, NoDuplicatesSampler)
    for batch in loader:
        ids = [tuple(row[row != 0].tolist()) for row in batch["input_ids"]]
        assert len(ids) == 24 and len(set(ids)) == 24  # 8 examples x 3 texts, none twice
    sentences = datasets.Dataset.from_dict({"text": [r[0] for r in rows]})
    from simcse_hn.data.collator import SimCSECollator

    plain = make_trainer(tmp_path, sentences, SimCSECollator(tokenizer, 16))
    assert not plain.batches.no_duplicates and plain.layout.group_size is None
    plain.get_train_dataloader()
    assert plain.batches.sampler is None  # single sentences: the Trainer's own sampler, unchanged
    forced = make_trainer(tmp_path, sentences, SimCSECollator(tokenizer, 16), no_duplicates=True)
    forced.get_train_dataloader()
    assert forced.batches.sampler is not None
    windows = [[rows[i][0] for i in list(forced.batches.sampler)[s : s + 8]] for s in range(0, 8, 8)]
    assert all(len(w) == len(set(w)) for w in windows)
    assert not isinstance(forced.batches.make_sampler(sentences), RandomSampler)


def test_a_run_resumed_in_its_second_epoch_draws_the_same_batches(tmp_path):
    """48 examples, 6 batches an epoch: an uninterrupted run of 9 steps, and a run stopped at its checkpoint of step 7
    (epoch 1) and resumed to step 9. The resumed batches are the uninterrupted run's, not epoch 0's order."""
    rows = nli_like(48, premises=24, seed=4)
    tokenizer = build_tiny_bert()[1]
    whole = RecordingCollator(tokenizer, 64, negatives=1)
    make_trainer(tmp_path / "whole", pair_dataset(rows), whole, max_steps=9).train()
    first = RecordingCollator(tokenizer, 64, negatives=1)
    make_trainer(tmp_path / "cut", pair_dataset(rows), first, max_steps=7, save_strategy="steps", save_steps=7).train()
    resumed = RecordingCollator(tokenizer, 64, negatives=1)
    trainer = make_trainer(tmp_path / "cut", pair_dataset(rows), resumed, max_steps=9)
    trainer.train(resume_from_checkpoint=str(tmp_path / "cut" / "checkpoint-7"))
    # (accelerate's loader fetches one batch ahead, so a collator may see one batch more than a run trains on)
    assert first.batches[:7] == whole.batches[:7]
    assert resumed.batches[:2] == whole.batches[7:9]
    assert whole.batches[6:9] != whole.batches[:3]  # epoch 1 is not epoch 0's order again
    assert trainer.batches.sampler.epoch == 1


def test_the_epoch_reaches_the_sampler_from_the_trainer_state(tmp_path):
    """Under a resumed multi-process run accelerate's set_epoch stops at its batch-skipping wrapper; the trainer's
    callback sets the sampler's epoch from state.epoch at every epoch's start (a checkpoint's 1.5 -> epoch 1)."""
    from transformers import TrainerControl, TrainerState

    trainer = make_trainer(tmp_path, pair_dataset(nli_like(32, premises=16)),
                           PairCollator(build_tiny_bert()[1], 64, negatives=1))  # fmt: skip
    trainer.get_train_dataloader()
    sampler = trainer.batches.sampler
    for epoch, want in ((1.5, 1), (2.0 - 1e-9, 2), (0.0, 0), (None, 0)):
        trainer.callback_handler.on_epoch_begin(trainer.args, TrainerState(epoch=epoch), TrainerControl())
        assert sampler.epoch == want, epoch
