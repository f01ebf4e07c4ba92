"""The negative queue (simcse_hn.training.queue): its entries are detached in-batch candidates to every objective, an
anchor's own text is masked, it changes once per optimizer step, the momentum encoder is an EMA without dropout, a
resumed run ends at the uninterrupted run's weights and queue, and the saved folder holds the online encoder only."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import FIXTURES, ROOT
from dist_worker_common import (
    LOSS_KWARGS,
    TEMPERATURE,
    batch,
    global_texts,
    gradients,
    make_loss,
    make_model,
    make_trainer,
    relative_error,
    sentences,
)
from queue_cases import QUEUE_CASES, queue_batch, queue_trainer

from simcse_hn.cli import train
from simcse_hn.data.collator import text_id
from simcse_hn.errors import ConfigError
from simcse_hn.losses import LOSSES, build_loss
from simcse_hn.losses.targets import ContrastiveTargets, LossContext, RowLayout, build_paired_targets, build_targets
from simcse_hn.training.queue import EMPTY, QUEUE_FILE, MomentumEncoder, NegativeQueue, QueueEntries
from simcse_hn.training.step import contrastive_loss, with_queue
from simcse_hn.training.trainer import SimCSETrainer


def _queue(k: int, d: int, ids: torch.Tensor, h: int | None = None, seed: int = 3) -> QueueEntries:
    g = torch.Generator().manual_seed(seed)
    features = None if h is None else torch.randn(k, h, generator=g, dtype=torch.float64)
    return QueueEntries(torch.randn(k, d, generator=g, dtype=torch.float64), ids, features)


def _reference(loss_fn, z, h, queue, targets, ids):
    """The queue's entries appended as detached candidates, N(i) extended by a loop over anchors and entries."""
    n, k = z.shape[0], queue.embeddings.shape[0]
    mask = torch.zeros(targets.num_anchors, n + k, dtype=torch.bool)
    mask[:, :n] = targets.negative_mask
    for i in range(targets.num_anchors):
        own, positive = ids[targets.anchor_index[i]], ids[targets.positive_index[i]]
        for j in range(k):
            q = queue.text_ids[j]
            mask[i, n + j] = bool(q != EMPTY and q != own and q != positive)
    log_weights = targets.negative_log_weights
    if log_weights is not None:
        log_weights = torch.cat([log_weights, torch.zeros(targets.num_anchors, k, dtype=log_weights.dtype)], 1)
    full = ContrastiveTargets(targets.positive_index, mask, anchor_index=targets.anchor_index,
                              negative_log_weights=log_weights)  # fmt: skip
    context = LossContext(candidate_features=None if h is None else torch.cat([h, queue.features]),
                          candidate_text_ids=torch.cat([ids, queue.text_ids]))  # fmt: skip
    return loss_fn.compute(torch.cat([z, queue.embeddings.detach()]), full, context)


@pytest.mark.parametrize("group", [None, 3], ids=["sentences", "pairs"])
@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_queue_entries_count_as_detached_in_batch_candidates(loss, group):
    """Loss, gradient (embeddings and head inputs) and the weights the objective applied equal those of the same
    entries added as detached candidates, with N(i) extended by a loop: every written entry but the anchor's own text
    and its positive's."""
    torch.manual_seed(0)
    rows, d, h, k = 12, 8, 6, 10
    z = torch.randn(rows, d, dtype=torch.float64, requires_grad=True)
    head = torch.randn(rows, h, dtype=torch.float64, requires_grad=True)
    ids = torch.arange(rows) // 2 if group is None else torch.arange(rows) + 100
    queue_ids = torch.tensor([EMPTY, 1, 2, 50, 51, 52, 53, 54, 55, 56])  # 1, 2: texts of the batch (anchor/positive)
    if group is not None:
        queue_ids[1:3] = torch.tensor([100, 104])  # example 0's anchor and example 1's positive
    queue = _queue(k, d, queue_ids, h)
    targets = build_targets(rows) if group is None else build_paired_targets(rows, group, hard_negative_weight=0.5)
    kwargs = {"temperature": TEMPERATURE, **LOSS_KWARGS.get(loss, {})}
    outputs = []
    for reference in (False, True):
        torch.manual_seed(1)  # ProGCL's sampled pairs
        loss_fn = build_loss(loss, **kwargs)
        if reference:
            out = _reference(loss_fn, z, head, queue, targets, ids)
        else:
            out = contrastive_loss(loss_fn, z, group_size=group, hard_negative_weight=0.0 if group is None else 0.5,
                                   head_inputs=head, text_ids=ids, queue=queue)  # fmt: skip
        grads = torch.autograd.grad(out.loss, [z, head], allow_unused=True)
        outputs.append((out, grads))
    (got, got_grads), (want, want_grads) = outputs
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-12, atol=0)
    for a, b in zip(got_grads, want_grads):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-14)
    if want.weights is not None:
        torch.testing.assert_close(got.weights, want.weights, rtol=1e-10, atol=1e-14)
    # the queue did change the loss: against the batch alone
    alone = contrastive_loss(build_loss(loss, **kwargs), z, group_size=group, head_inputs=head, text_ids=ids,
                             hard_negative_weight=0.0 if group is None else 0.5)  # fmt: skip
    assert abs(float(alone.loss.detach()) - float(got.loss.detach())) > 1e-6


def test_an_entry_of_the_anchors_own_text_is_no_negative():
    """An entry whose text is an anchor's (or its positive's) is no negative of that anchor, however similar; it is
    of the others. An unwritten entry is nobody's."""
    z = torch.randn(8, 4, dtype=torch.float64)
    ids = torch.arange(8) // 2  # rows [a, a', b, b', ...]: sentence s is rows 2s and 2s + 1
    queue = QueueEntries(torch.cat([z[0:1], z[0:1], z[5:6]]), torch.tensor([0, EMPTY, 2]))
    candidates, targets, _, candidate_ids, _ = with_queue(queue, z, build_targets(8), None, ids, None)
    assert candidates.shape == (11, 4) and candidate_ids.tolist() == ids.tolist() + [0, EMPTY, 2]
    extra = targets.negative_mask[:, 8:]
    assert extra[:, 0].tolist() == [False, False] + [True] * 6
    assert not extra[:, 1].any()
    assert extra[:, 2].tolist() == [True] * 4 + [False, False] + [True] * 2
    assert torch.equal(targets.negative_mask[:, :8], build_targets(8).negative_mask)
    assert targets.negative_count.tolist() == (extra.sum(1) + 6).tolist()


def test_ring_buffer_replaces_the_oldest_entries():
    queue = NegativeQueue(5)
    assert queue.entries() is None
    queue.enqueue(QueueEntries(torch.arange(3.0)[:, None], torch.arange(3)))
    assert queue.entries().text_ids.tolist() == [0, 1, 2, EMPTY, EMPTY]
    queue.enqueue(QueueEntries(torch.arange(3.0, 7.0)[:, None], torch.arange(3, 7)))
    assert queue.entries().text_ids.tolist() == [5, 6, 2, 3, 4]
    assert queue.entries().embeddings[:, 0].tolist() == [5.0, 6.0, 2.0, 3.0, 4.0]
    queue.enqueue(QueueEntries(torch.arange(7.0, 14.0)[:, None], torch.arange(7, 14)))  # more than it holds: last 5
    assert sorted(queue.entries().text_ids.tolist()) == [9, 10, 11, 12, 13]
    restored = NegativeQueue(5)
    restored.load_state_dict(queue.state_dict(), "cpu")
    assert torch.equal(restored.entries().embeddings, queue.entries().embeddings)
    assert restored.position == queue.position


def test_queued_rows_are_first_views_or_paired_candidates():
    assert RowLayout().negative_rows(6).tolist() == [0, 2, 4]
    assert RowLayout(4).negative_rows(8).tolist() == [1, 2, 3, 5, 6, 7]  # [a, p, n1, n2] x 2: never the anchors


def test_momentum_encoder_is_an_ema_without_dropout_and_with_the_head():
    model = make_model(dropout=0.3)
    model.loss_fn = build_loss("unremix", learn_mixture=True)  # a loss with parameters of its own
    momentum = MomentumEncoder(model, 0.9)
    assert getattr(momentum.model, "loss_fn", None) is None  # the loss and its state stay with the online model
    inputs = batch(sentences(4))
    first, _ = momentum.embed(inputs, return_head_inputs=False)
    second, features = momentum.embed(inputs, return_head_inputs=True)
    assert torch.equal(first, second)  # no dropout
    model.eval()
    pooled = model.encoder(**inputs).last_hidden_state[:, 0]
    torch.testing.assert_close(features, pooled)  # the head's inputs: the head ran, as in training
    torch.testing.assert_close(first, model.mlp(pooled))
    before = {n: p.clone() for n, p in momentum.model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    momentum.update(model)
    online = dict(model.named_parameters())
    for name, p in momentum.model.named_parameters():
        torch.testing.assert_close(p, 0.9 * before[name] + 0.1 * online[name], rtol=1e-12, atol=1e-12)


def _texts_batch(texts: list[str]) -> dict[str, torch.Tensor]:
    rows = batch([t for t in texts for _ in (0, 1)])  # [a, a', b, b', ...]
    rows["text_ids"] = torch.tensor([text_id(t) for t in texts]).repeat_interleave(2)
    return rows


@pytest.mark.parametrize("momentum", [0.0, 0.9], ids=["memory-bank", "momentum"])
def test_queue_changes_once_per_optimizer_step_and_gradcache_sees_the_same(tmp_path, momentum):
    """Two micro-batches of one optimizer step see the same queue; the step's end enqueues both, in order. A GradCache
    step gives the plain step's loss, gradient and entries."""
    results = []
    for cache in (None, 1):
        trainer = make_trainer(make_model(), make_loss("hcl", "hcl"), tmp_path, queue_size=16, momentum=momentum,
                               cache_minibatch_size=cache)  # fmt: skip
        trainer.queue.queue.enqueue(_queue(4, 32, torch.arange(4) + 1000, seed=5)._replace(features=None))
        before = trainer.queue.entries().embeddings.clone()
        texts = sentences(8)
        first = trainer.training_step(trainer.model, _texts_batch(texts[:4]))
        assert torch.equal(trainer.queue.entries().embeddings, before)
        trainer.training_step(trainer.model, _texts_batch(texts[4:]))
        assert torch.equal(trainer.queue.entries().embeddings, before)
        grads = gradients(trainer.model)
        trainer.queue.step_end(trainer.model)
        entries = trainer.queue.entries()
        assert entries.text_ids[4:12].tolist() == [text_id(t) for t in texts]
        assert entries.text_ids[12:].tolist() == [EMPTY] * 4
        results.append((float(first), grads, entries.embeddings.clone()))
    (plain_loss, plain_grads, plain_queue), (cached_loss, cached_grads, cached_queue) = results
    assert cached_loss == pytest.approx(plain_loss, rel=1e-12)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(cached_grads[name], grad, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(cached_queue, plain_queue, rtol=1e-12, atol=1e-12)


def _run_args(tmp_path, name, *extra, queue=("--queue_size", "40", "--momentum", "0.9")):
    return ["--config", str(ROOT / "configs" / "debug_tiny.yaml"), "--train_file", str(FIXTURES / "tiny_corpus.txt"),
            "--eval_file", str(FIXTURES / "sts_tiny.jsonl"), "--output_dir", str(tmp_path / name),
            "--disable_tqdm", "true", "--max_steps", "6", "--save_steps", "3", "--eval_steps", "3",
            "--load_best_model_at_end", "false", "--lr_scheduler_type", "constant", "--loss", "hcl", *queue,
            *extra]  # fmt: skip


def _stop_after(step, monkeypatch):
    from transformers import TrainerCallback

    class Stop(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == step:
                control.should_training_stop = True

    init = SimCSETrainer.__init__

    def patched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.add_callback(Stop())

    monkeypatch.setattr(SimCSETrainer, "__init__", patched)


@pytest.mark.slow
def test_a_resumed_run_ends_at_the_uninterrupted_runs_weights_and_queue(tmp_path, monkeypatch):
    straight = train.run(_run_args(tmp_path, "straight"))
    with monkeypatch.context() as patch:
        _stop_after(3, patch)
        stopped = train.run(_run_args(tmp_path, "resumed"))
    assert stopped.state.global_step == 3
    resumed = train.run(_run_args(tmp_path, "resumed", "--resume_from_checkpoint", "true"))
    assert resumed.state.global_step == 6
    for name, want in straight.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], want, rtol=0, atol=0, msg=name)
    want, got = straight.queue.state_dict(), resumed.queue.state_dict()
    assert got["queue"]["position"] == want["queue"]["position"] == (6 * 16) % 40
    for key, value in want["queue"]["buffer"].items():
        if value is not None:
            torch.testing.assert_close(got["queue"]["buffer"][key], value, rtol=0, atol=0, msg=key)
    for name, value in want["momentum_encoder"].items():
        torch.testing.assert_close(got["momentum_encoder"][name], value, rtol=0, atol=0, msg=name)
    # the folder holds the online encoder only, and sentence-transformers loads it
    from sentence_transformers import SentenceTransformer

    folder = tmp_path / "straight"
    assert (folder / "checkpoint-6" / QUEUE_FILE).is_file() and not (folder / QUEUE_FILE).exists()
    assert not any("momentum" in name for name in os.listdir(folder))
    loaded = SentenceTransformer(str(folder), device="cpu")
    online = straight.model.encoder.embeddings.word_embeddings.weight
    torch.testing.assert_close(loaded[0].auto_model.embeddings.word_embeddings.weight, online)
    momentum = straight.queue.encoder.model.encoder.embeddings.word_embeddings.weight
    assert not torch.allclose(momentum, online)
    # a resume without the queue is refused in one line, as is another queue: both values named, no advice to change
    # the run
    with pytest.raises(ConfigError, match="^queue_size: checkpoint-6 was trained with queue_size 40, momentum 0.9; "
                                          "this run has no queue; resume with the settings it was trained with"):
        train.run(_run_args(tmp_path, "straight", "--resume_from_checkpoint", "true", queue=()))
    with pytest.raises(ConfigError, match="^queue_size: checkpoint-6 was trained with 40; this run has 8;"):
        train.run(_run_args(tmp_path, "straight", "--resume_from_checkpoint", "true", queue=("--queue_size", "8")))


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--momentum", "0.9"], "momentum: needs queue_size > 0"),
        (["--queue_size", "-1"], "queue_size: must be >= 0"),
        (["--queue_size", "8", "--momentum", "1.0"], r"momentum: must be in \[0, 1\)"),
    ],
)
def test_queue_settings_are_refused_in_one_line(tiny_args, extra, message):
    with pytest.raises(ConfigError, match=message):
        train.run(tiny_args + extra)


def test_paired_run_with_a_queue_and_explicit_negatives(tmp_path):
    """Paired data with an explicit negative: the positives and negatives enter the queue, never the anchors."""
    pairs = tmp_path / "pairs.jsonl"
    lines = sentences(120)
    with open(pairs, "w", encoding="utf-8") as f:
        for i in range(40):
            a, p, n = lines[3 * i : 3 * i + 3]
            f.write(json.dumps({"anchor": a, "positive": p, "negative": n}) + "\n")
    trainer = train.run(["--config", str(ROOT / "configs" / "debug_tiny.yaml"), "--train_file", str(pairs),
                         "--eval_file", str(FIXTURES / "sts_tiny.jsonl"), "--output_dir", str(tmp_path / "out"),
                         "--disable_tqdm", "true", "--max_steps", "2", "--eval_strategy", "no", "--save_strategy",
                         "no", "--load_best_model_at_end", "false", "--per_device_train_batch_size", "4",
                         "--queue_size", "64", "--hard_negative_weight", "1.0", "--data_format", "pairs"])  # fmt: skip
    ids = trainer.queue.entries().text_ids
    written = set(ids[ids != EMPTY].tolist())
    assert len(written) == 2 * 4 * 2  # 2 steps x 4 examples x (positive + negative)
    anchors = {text_id(lines[3 * i]) for i in range(40)}
    assert not written & anchors


@pytest.mark.multiprocess
def test_two_processes_give_one_process_on_the_global_batch_with_the_same_queue(tmp_path):
    """Each process steps on its rows with the same queue: the averaged gradient is one process's on the global batch,
    and after the step every process holds the same queue, the global batch's entries in order."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(ROOT / "tests" / "dist_worker_queue.py"), str(tmp_path)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"queue_rank{r}.pt", weights_only=True)["results"] for r in (0, 1)]
    for case in QUEUE_CASES:
        trainer = queue_trainer(case, tmp_path / "one", make_trainer, make_model, make_loss)
        loss = trainer.training_step(trainer.model, queue_batch(global_texts()))
        trainer.queue.step_end(trainer.model)
        want = trainer.queue.entries()._asdict()
        runs = [r[case] for r in ranks]
        assert (runs[0]["loss"] + runs[1]["loss"]) / 2 == pytest.approx(float(loss), rel=1e-12), case
        assert relative_error(runs[0]["grads"], gradients(trainer.model)) < 1e-10, case
        for run in runs:
            assert run["queue"].keys() == {k for k, v in want.items() if v is not None}
            for key, value in run["queue"].items():
                torch.testing.assert_close(value, want[key], rtol=1e-12, atol=1e-14, msg=f"{case} {key}")


def test_the_guide_screens_queue_entries():
    """Guided by the model itself (`self`), an entry as similar to an anchor as its positive leaves N(i) as an in-batch
    candidate would; an external guide's embeddings of the entries (QueueEntries.guide) are used when given."""
    torch.manual_seed(0)
    views = torch.randn(4, 6, dtype=torch.float64).repeat_interleave(2, 0) + 0.01 * torch.randn(8, 6)  # [a, a', ...]
    z = torch.nn.functional.normalize(views, dim=1)
    ids = torch.arange(8) // 2
    loss_fn = build_loss("infonce", temperature=0.1)

    def removed(queue, guide=None):
        out = contrastive_loss(loss_fn, z, text_ids=ids, guide_embeddings=z if guide is None else guide,
                               guide_margin=1e-9, queue=queue)  # fmt: skip
        return round(float(out.metrics["guide_removed"]) * 8)

    far = QueueEntries(-z[1:2], torch.tensor([99]))  # opposite to sentence 0: kept
    near = QueueEntries(z[1:2], torch.tensor([99]))  # sentence 0's second view, another text: removed for rows 0, 1
    assert removed(None) == 0 and removed(far) == 0 and removed(near) == 2
    # an external guide scores the entries by its own embeddings, not the queue's
    assert removed(far._replace(guide=z[1:2]), guide=z) == 2


@pytest.mark.slow
def test_a_compiled_model_trains_with_a_momentum_queue(tiny_args):
    """--torch_compile: the momentum encoder copies the model under the compiled wrapper, and runs eagerly."""
    from simcse_hn.modeling.model import SimCSEModel

    trainer = train.run(tiny_args + ["--max_steps", "2", "--eval_strategy", "no", "--save_strategy", "no",
                                     "--load_best_model_at_end", "false", "--torch_compile", "true",
                                     "--queue_size", "64", "--momentum", "0.9"])  # fmt: skip
    assert type(trainer.queue.encoder.model) is SimCSEModel
    assert int((trainer.queue.entries().text_ids != EMPTY).sum()) == 2 * 16
