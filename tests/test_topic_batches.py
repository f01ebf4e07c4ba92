"""Topic-aware batches (simcse_hn/data/topic_batches.py): every gathered batch drawn from one k-means cluster, the
share option, an order that depends on seed, epoch and assignment only (so a resumed run skips to the same batches),
the same batches on two processes, paired data, GradCache, and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import torch
from accelerate.data_loader import BatchSamplerShard, skip_first_batches
from dist_worker_topic import CLUSTERS, EXAMPLES, PER_DEVICE
from dist_worker_topic import RecordingCollator as AnchorCollator
from torch.utils.data import BatchSampler, DataLoader
from transformers import TrainerCallback

from simcse_hn.cli import train
from simcse_hn.configuration.training_arguments import SimCSETrainingArguments
from simcse_hn.data.topic_batches import TOPIC_CLUSTERS_FILE, InForce, TopicBatchSampler, kmeans
from simcse_hn.losses import build_loss
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.testing.models import build_tiny_bert
from simcse_hn.training.trainer import SimCSETrainer

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]


def topics(count: int = 6, per_topic: int = 50, dim: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Embeddings of `count` obvious topics (tight noise around random directions) and each row's topic."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(count, dim, generator=generator)
    truth = torch.arange(count).repeat_interleave(per_topic)  # (n,)
    return centres[truth] + 0.1 * torch.randn(len(truth), dim, generator=generator), truth


def test_kmeans_finds_obvious_topics_and_is_seeded():
    embeddings, truth = topics()
    assignment = kmeans(embeddings, 6, seed=1, use_faiss=False)
    for topic in range(6):  # each topic is one cluster, each cluster one topic
        assert len(set(assignment[truth == topic].tolist())) == 1
    assert len(set(assignment.tolist())) == 6
    assert torch.equal(assignment, kmeans(embeddings, 6, seed=1, use_faiss=False))
    with pytest.raises(ValueError, match="clusters must be in 1..300"):
        kmeans(embeddings, 301)


def test_every_window_is_drawn_from_one_cluster():
    _, truth = topics()
    sampler = TopicBatchSampler(truth, window=16, seed=3)
    windows = sampler.epoch_windows()
    assert len(windows) == 300 // 16 and sampler.mixed_windows == 0
    assert all(len(set(truth[w].tolist())) == 1 for w in windows)
    order = list(sampler)
    assert len(order) == len(sampler) == 288 and len(set(order)) == 288  # no example twice in an epoch
    plain = torch.randperm(300, generator=torch.Generator().manual_seed(3))[:288].view(-1, 16)
    assert all(len(set(truth[w].tolist())) > 1 for w in plain)  # a random batch mixes topics


def test_clusters_too_small_for_a_window_are_pooled_and_counted():
    truth = torch.tensor([0] * 40 + [1] * 5 + [2] * 5 + [3] * 6)  # three clusters smaller than a window of 8
    sampler = TopicBatchSampler(truth, window=8, seed=0)
    windows = sampler.epoch_windows()
    assert len(windows) == 7 and sampler.mixed_windows == 2
    assert sum(len(set(truth[w].tolist())) == 1 for w in windows) == 5  # cluster 0's five windows
    assert len({i for w in windows for i in w}) == 56


def test_the_share_option_takes_that_many_rows_from_one_cluster():
    _, truth = topics(count=10, per_topic=64)
    sampler = TopicBatchSampler(truth, window=16, share=0.5, seed=2)
    windows = sampler.epoch_windows()
    assert sampler.from_cluster == 8 and len(windows) == 40
    for w in windows:
        assert len(set(truth[w[:8]].tolist())) == 1  # the cluster's share
    rest = torch.tensor([w[8:] for w in windows])  # (40, 8): the random share spans the topics
    assert len(set(truth[rest.flatten()].tolist())) == 10
    assert sum(len(set(truth[w].tolist())) > 1 for w in windows) > 30


def test_no_duplicates_inside_a_cluster():
    rows = [(f"text {i % 90}", f"positive {i}") for i in range(180)]  # each text twice, both copies in one cluster
    truth = torch.tensor([(i % 90) % 4 for i in range(180)])  # clusters of 46, 46, 44, 44 rows: 22 windows of 8
    sampler = TopicBatchSampler(truth, window=8, seed=0, rows=rows, no_duplicates=True)
    windows = sampler.epoch_windows()
    assert len(windows) == 22 and sampler.mixed_windows == 2  # 5 chunks of 8 per cluster; the 20 rows left, 2 more
    assert sum(len(set(truth[w].tolist())) == 1 for w in windows) >= 20
    for w in windows:
        texts = [text for i in w for text in rows[i]]
        assert len(texts) == len(set(texts))
    plain = TopicBatchSampler(truth, window=8, seed=0).epoch_windows()
    assert any(len({rows[i][0] for i in w}) < 8 for w in plain)  # without the option a window repeats a text


def test_the_order_depends_on_seed_epoch_and_assignment_and_a_resume_skips_to_it():
    _, truth = topics()
    sampler = TopicBatchSampler(truth, 16, seed=1)
    assert list(sampler) == list(TopicBatchSampler(truth.clone(), 16, seed=1))
    sampler.set_epoch(1)
    again = TopicBatchSampler(truth, 16, seed=1)
    again.set_epoch(1)
    assert list(sampler) == list(again) != list(TopicBatchSampler(truth, 16, seed=1))
    # a resumed run: a fresh sampler, the epoch set, the first k batches skipped as the Trainer does
    whole = list(DataLoader(range(300), batch_sampler=BatchSampler(sampler, 16, drop_last=True)))
    fresh = TopicBatchSampler(truth, 16, seed=1)
    fresh.set_epoch(1)
    resumed = skip_first_batches(DataLoader(range(300), batch_sampler=BatchSampler(fresh, 16, drop_last=True)), 5)
    assert [b.tolist() for b in resumed] == [b.tolist() for b in whole[5:]]


def test_accelerate_deals_one_cluster_window_out_to_the_processes():
    _, truth = topics()
    sampler = TopicBatchSampler(truth, window=2 * 8, seed=5)  # 2 processes x 8 examples
    shards = [list(BatchSamplerShard(BatchSampler(sampler, 8, drop_last=True), 2, rank)) for rank in (0, 1)]
    assert len(shards[0]) == len(shards[1]) == 300 // 16  # one batch of each window per process
    for mine, theirs in zip(*shards):
        assert len(set(truth[mine + theirs].tolist())) == 1


def make_trainer(tmp_path, dataset, collator, **overrides):
    settings = dict(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=8, eval_strategy="no",
                    save_strategy="no", load_best_model_at_end=False, metric_for_best_model=None, report_to=[],
                    disable_tqdm=True, learning_rate=1e-3, seed=0, topic_batches=True, topic_clusters=4)  # fmt: skip
    args = SimCSETrainingArguments(**{**settings, **overrides})
    model = SimCSEModel(build_tiny_bert(seed=0, dropout=0.0)[0], pooler="avg")
    return SimCSETrainer(model=model, args=args, loss_fn=build_loss("infonce"), train_dataset=dataset,
                         data_collator=collator)  # fmt: skip


def pairs(count: int = 64) -> datasets.Dataset:
    anchors = [f"topic {i % 4} " + " ".join(["alpha", "beta", "gamma", "delta"][i % 4] * (1 + i % 3)) + f" {i // 4}"
               for i in range(count)]  # fmt: skip
    return datasets.Dataset.from_dict({"anchor": anchors, "positive": [f"positive {i}" for i in range(count)]})


def test_the_trainer_clusters_paired_anchors_and_a_resumed_run_reads_the_checkpoints_clusters(tmp_path):
    """Clustered by the model being trained: the resumed run's model (the checkpoint's weights) would cluster
    differently, so the checkpoint carries the assignment; the resumed batches are the uninterrupted run's."""
    tokenizer = build_tiny_bert()[1]
    whole = AnchorCollator(tokenizer, 32)
    trainer = make_trainer(tmp_path / "whole", pairs(), whole, max_steps=12)  # 8 batches an epoch: into epoch 1
    trainer.train()
    sampler, assignment = trainer.batches.sampler, trainer.batches.assignment
    anchors = pairs()["anchor"]
    cluster = {text: int(c) for text, c in zip(anchors, assignment)}
    pure = sum(len({cluster[t] for t in batch}) == 1 for batch in whole.batches[:8])
    assert pure == 8 - sampler.mixed_windows >= 6 and sampler.epoch == 1
    first = AnchorCollator(tokenizer, 32)
    make_trainer(tmp_path / "cut", pairs(), first, max_steps=10, save_strategy="steps", save_steps=10).train()
    assert os.path.isfile(tmp_path / "cut" / "checkpoint-10" / TOPIC_CLUSTERS_FILE)
    resumed = AnchorCollator(tokenizer, 32)
    again = make_trainer(tmp_path / "cut", pairs(), resumed, max_steps=12)
    again.train(resume_from_checkpoint=str(tmp_path / "cut" / "checkpoint-10"))
    assert torch.equal(again.batches.assignment, assignment)
    assert first.batches[:10] == whole.batches[:10] and resumed.batches[:2] == whole.batches[10:12]


@pytest.mark.multiprocess
def test_two_processes_hold_process_0s_clusters_and_re_clustering_and_draw_one_window_per_step(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(ROOT / "tests" / "dist_worker_topic.py"), str(tmp_path)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"topic_rank{r}.pt") for r in (0, 1)]
    assert torch.equal(ranks[0]["assignment"], ranks[1]["assignment"])
    schedules = [[(e["epoch"], e["window"], e["step"], e["assignment"].tolist()) for e in rank["schedule"]]
                 for rank in ranks]  # fmt: skip
    assert schedules[0] == schedules[1] and [entry[:3] for entry in schedules[0]] == [(0, 0, 0), (0, 2, 1)]
    assert schedules[0][0][3] != schedules[0][1][3]  # the re-clustering changed the clusters
    # the same windows as one process's sampler over process 0's assignments, dealt out batch by batch
    sampler = TopicBatchSampler(ranks[0]["assignment"], 2 * PER_DEVICE, seed=3, no_duplicates=False)
    sampler.load_schedule([InForce(**entry) for entry in ranks[0]["schedule"]])
    anchors = [f"topic {i % 4} sentence {i}" for i in range(EXAMPLES)]
    windows = [[anchors[i] for i in w] for w in sampler.epoch_windows()]
    steps = len(windows)
    assert [a + b for a, b in zip(ranks[0]["batches"][:steps], ranks[1]["batches"][:steps])] == windows
    assert len(set(ranks[0]["assignment"].tolist())) <= CLUSTERS


def test_train_with_topic_batches_and_grad_cache(tiny_args, tmp_path):
    extra = ["--topic_batches", "true", "--topic_clusters", "8", "--cache_minibatch_size", "4",
             "--per_device_train_batch_size", "8", "--max_steps", "3", "--logging_steps", "1", "--eval_steps", "3",
             "--save_steps", "3"]  # fmt: skip
    trainer = train.run(tiny_args + extra)
    assert trainer.batches.sampler is not None and len(trainer.batches.assignment) == 400
    assert sum("loss" in entry for entry in trainer.state.log_history) == 3
    assert os.path.isfile(Path(trainer.args.output_dir) / "checkpoint-3" / TOPIC_CLUSTERS_FILE)


def test_train_paired_data_with_topic_batches_grad_cache_and_re_clustering(tiny_args, tmp_path):
    """Paired data (anchor, positive, negative) through train.py: clustered on the anchors, re-clustered after
    step 2, GradCache mini-batches; the checkpoint keeps both assignments."""
    rows = [{"anchor": f"topic {i % 5} anchor {i}", "positive": f"positive {i}", "negative": f"negative {i}"}
            for i in range(96)]  # fmt: skip
    data = tmp_path / "tri.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    extra = ["--train_file", str(data), "--topic_batches", "true", "--topic_clusters", "4",
             "--topic_recluster_steps", "2", "--cache_minibatch_size", "6", "--hard_negative_weight", "1",
             "--per_device_train_batch_size", "8", "--max_steps", "4", "--logging_steps", "1", "--eval_steps", "4",
             "--save_steps", "4"]  # fmt: skip
    trainer = train.run(tiny_args + extra)
    assert trainer.args.no_duplicates is not False and trainer.layout.group_size == 3
    assert sum("loss" in entry for entry in trainer.state.log_history) == 4
    saved = torch.load(Path(trainer.args.output_dir) / "checkpoint-4" / TOPIC_CLUSTERS_FILE)
    assert [(e["epoch"], e["window"], e["step"]) for e in saved] == [(0, 0, 0), (0, 3, 2)]
    assert all(len(e["assignment"]) == 96 for e in saved)
    record = json.loads((Path(trainer.args.output_dir) / "checkpoint-4" / "simcse_config.json").read_text())
    assert record["method"]["topic_batches"] == {"clusters": 4, "share": 1.0, "encoder": "the model being trained",
                                                 "recluster_steps": 2, "encoder_weights": None}  # fmt: skip


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--topic_share", "0"], "topic_share: must be in (0, 1], got 0.0"),
        (["--topic_share", "1.5"], "topic_share: must be in (0, 1], got 1.5"),
        (["--topic_clusters", "0"], "topic_clusters: must be >= 1, got 0"),
        (["--topic_clusters", "401"], "topic_clusters: 401 clusters for 400 sentences"),
        (["--streaming", "true", "--max_steps", "2"], "topic_batches: not available with streaming"),
    ],
)
def test_bad_settings_are_one_line(tiny_args, monkeypatch, capsys, extra, message):
    def no_model_loads(*args, **kwargs):
        raise AssertionError("a model was loaded before the configuration was validated")

    monkeypatch.setattr(SimCSEModel, "from_pretrained", no_model_loads)
    assert train.main(tiny_args + ["--topic_batches", "true"] + extra) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1, err


def test_a_re_clustering_draws_the_rest_of_the_epoch_from_the_new_clusters_and_a_resume_draws_it_again():
    _, truth = topics()  # 6 topics of 50
    shuffled = truth[torch.randperm(300, generator=torch.Generator().manual_seed(9))]  # another clustering
    sampler = TopicBatchSampler(truth, 16, seed=4)
    sampler.set_epoch(1)
    before = sampler.epoch_windows()
    reader = iter(sampler)
    read = [next(reader) for _ in range(5 * 16)]  # 5 windows read
    sampler.recluster(shuffled, epoch=1, window=6, step=3)
    rest = [index for index in reader]
    windows = [(read + rest)[i : i + 16] for i in range(0, 288, 16)]
    assert windows[:6] == before[:6] and windows[6:] != before[6:]
    assert all(len(set(shuffled[w].tolist())) == 1 for w in windows[6:] if w not in before)
    assert sum(len(set(shuffled[w].tolist())) == 1 for w in windows[6:]) >= 12 - sampler.mixed_windows
    assert len(set(read + rest)) == 288  # no example twice in the epoch
    with pytest.raises(RuntimeError, match="from window 10 of epoch 1, but the loader has already read 18 windows"):
        sampler.recluster(shuffled, epoch=1, window=10)
    # resumed: a fresh sampler given the schedule the checkpoint keeps draws the same epoch
    resumed = TopicBatchSampler(truth, 16, seed=4)
    resumed.load_schedule(list(sampler.schedule))
    resumed.set_epoch(1)
    assert list(resumed) == read + rest
    assert [(e.epoch, e.window, e.step) for e in sampler.schedule] == [(0, 0, 0), (1, 6, 3)]
    sampler.recluster(truth, epoch=3, window=0, step=30)  # from epoch 3's start: epoch 1's entries are not needed
    assert [(e.epoch, e.window) for e in sampler.schedule] == [(1, 6), (3, 0)]


class StopAt(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def test_the_trainer_re_clusters_every_k_steps_and_a_resume_across_it_draws_the_same_batches(tmp_path):
    """64 pairs in windows of 8: 8 steps an epoch; re-clustering after steps 3, 6, 9 and a run stopped at 7. The
    learning rate moves the model enough that its clusters change."""
    tokenizer = build_tiny_bert()[1]
    whole = AnchorCollator(tokenizer, 32)
    moving = {"topic_recluster_steps": 3, "learning_rate": 1e-2}
    trainer = make_trainer(tmp_path / "whole", pairs(), whole, max_steps=12, **moving)
    trainer.train()
    schedule = trainer.batches.sampler.schedule
    # made after step 9 (epoch 1, one step done): from window 2 of epoch 1; steps 3 and 6 were epoch 0's
    assert [(e.epoch, e.window, e.step) for e in schedule] == [(0, 7, 6), (1, 2, 9)]
    anchors = pairs()["anchor"]
    late = {text: int(c) for text, c in zip(anchors, schedule[-1].assignment)}
    assert not torch.equal(schedule[-1].assignment, trainer.batches.assignment)  # re-encoded by the model as trained
    pure = sum(len({late[t] for t in batch}) == 1 for batch in whole.batches[10:12])
    assert pure >= 2 - trainer.batches.sampler.mixed_windows
    cut = AnchorCollator(tokenizer, 32)
    interrupted = make_trainer(tmp_path / "cut", pairs(), cut, max_steps=12, save_strategy="steps", save_steps=7,
                               **moving)  # fmt: skip
    interrupted.add_callback(StopAt(7))  # killed after step 7's checkpoint (same learning-rate schedule as `whole`)
    interrupted.train()
    saved = torch.load(tmp_path / "cut" / "checkpoint-7" / TOPIC_CLUSTERS_FILE)
    assert [(e["epoch"], e["window"], e["step"]) for e in saved] == [(0, 0, 0), (0, 4, 3), (0, 7, 6)]  # all epoch 0's
    resumed = AnchorCollator(tokenizer, 32)
    again = make_trainer(tmp_path / "cut", pairs(), resumed, max_steps=12, **moving)
    again.train(resume_from_checkpoint=str(tmp_path / "cut" / "checkpoint-7"))
    assert cut.batches[:7] == whole.batches[:7] and resumed.batches[:5] == whole.batches[7:12]
