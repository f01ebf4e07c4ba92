"""simcse-hn's negative queue inside SentenceTransformerTrainer (simcse_hn.export.st_training): the loss per step of
simcse-hn's own trainer on the same data, batch order and settings (dropout off), a run stopped after its first
checkpoint and resumed ends at the uninterrupted run's weights and queue, the queue never reaches the saved model,
and what cannot work is refused in one line."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
from types import SimpleNamespace

import datasets
import pytest
import torch
from conftest import free_port
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from test_st_losses import st_folder  # noqa: F401  (a fixture: a tiny BERT without dropout, mean pooling)
from torch.utils.data import BatchSampler, SequentialSampler
from transformers import TrainerCallback

from simcse_hn.configuration.training_arguments import SimCSETrainingArguments
from simcse_hn.data.collator import SimCSECollator
from simcse_hn.errors import ConfigError
from simcse_hn.export.st_losses import SimCSELoss
from simcse_hn.export.st_training import SimCSECallback, resumed_checkpoint
from simcse_hn.losses import build_loss
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.training.checkpoints import CHECKPOINT_MANIFEST
from simcse_hn.training.queue import QUEUE_FILE
from simcse_hn.training.trainer import SimCSETrainer

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "tiny_corpus.txt")
BATCH, STEPS, QUEUE = 4, 5, 10
SETTINGS = dict(per_device_train_batch_size=BATCH, max_steps=STEPS, learning_rate=0.5, optim="sgd",
                lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1e9, report_to=[], use_cpu=True,
                disable_tqdm=True, logging_steps=1, seed=0)  # fmt: skip


def texts() -> list[str]:
    """Eight sentences, then the same eight again: from step 3 on the queue holds texts of the batch (masked)."""
    with open(FIXTURE, encoding="utf-8") as f:
        first = f.read().splitlines()[:8]
    return first + first + first[:4]


class Sequential(SequentialSampler):
    def set_epoch(self, epoch: int) -> None:  # simcse-hn's trainer sets its sampler's epoch
        pass


def in_order(dataset, batch_size, drop_last=False, **kwargs):
    return BatchSampler(SequentialSampler(dataset), batch_size, drop_last)


def st_run(folder, output_dir, momentum, callbacks=(), resume=False, **overrides):
    model = SentenceTransformer(str(folder), device="cpu")
    loss = SimCSELoss(model, "hcl", beta=0.5, temperature=0.05, queue_size=QUEUE, momentum=momentum)
    args = SentenceTransformerTrainingArguments(output_dir=str(output_dir), batch_sampler=in_order,
                                                **{**SETTINGS, "save_strategy": "no", **overrides})  # fmt: skip
    train = datasets.Dataset.from_dict({"anchor": texts(), "positive": texts()})  # dropout pairs (dropout off here)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train, loss=loss,
                                         callbacks=[SimCSECallback(loss), *callbacks])  # fmt: skip
    trainer.train(resume_from_checkpoint=True if resume else None)
    return trainer, loss


def losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


@pytest.mark.parametrize("momentum, accumulation", [(0.0, 1), (0.9, 1), (0.9, 2)],
                         ids=["memory-bank", "momentum", "momentum-accumulation"])  # fmt: skip
def test_the_loss_per_step_is_simcse_hns_own_trainers(momentum, accumulation, st_folder, tmp_path):  # noqa: F811
    """Gradient accumulation: both micro-batches of a step see the queue of the step's start, and both enqueue at
    its end, in both trainers."""
    model = SimCSEModel.from_pretrained(str(st_folder), pooler="avg")
    steps = {"per_device_train_batch_size": BATCH // accumulation, "gradient_accumulation_steps": accumulation}
    args = SimCSETrainingArguments(output_dir=str(tmp_path / "simcse"), loss="hcl", temperature=0.05,
                                   queue_size=QUEUE, momentum=momentum, eval_strategy="no", save_strategy="no",
                                   load_best_model_at_end=False, metric_for_best_model=None,
                                   **{**SETTINGS, **steps})  # fmt: skip
    dataset = datasets.Dataset.from_dict({"text": texts()})
    tokenizer = SentenceTransformer(str(st_folder), device="cpu").tokenizer
    own = SimCSETrainer(model=model, args=args, loss_fn=build_loss("hcl", temperature=0.05, beta=0.5),
                        train_dataset=dataset, data_collator=SimCSECollator(tokenizer, 128))  # fmt: skip
    own.batches.make_sampler = lambda *a, **k: Sequential(dataset)  # the same batch order as below
    own.train()
    theirs, loss = st_run(st_folder, tmp_path / "st", momentum, **steps)
    want, got = losses(own), losses(theirs)
    assert len(want) == len(got) == STEPS and want[0] < want[-1]  # the queue's negatives raise the loss
    assert got == pytest.approx(want, rel=2e-4)
    (queue,) = loss.queue.queues.values()  # one embedding width, one queue
    assert queue.position == own.queue.queue.position == STEPS * BATCH % QUEUE
    torch.testing.assert_close(queue.entries().embeddings, own.queue.entries().embeddings, rtol=1e-3, atol=1e-4)


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


@pytest.mark.slow
def test_a_run_stopped_after_its_first_checkpoint_and_resumed_ends_at_the_uninterrupted_runs_weights(
    st_folder, tmp_path  # noqa: F811
):
    saving = {"save_strategy": "steps", "save_steps": 2}
    straight, straight_loss = st_run(st_folder, tmp_path / "straight", 0.9, **saving)
    stopped, _ = st_run(st_folder, tmp_path / "resumed", 0.9, callbacks=[StopAt(2)], **saving)
    assert stopped.state.global_step == 2 and (tmp_path / "resumed" / "checkpoint-2" / QUEUE_FILE).is_file()
    resumed, resumed_loss = st_run(st_folder, tmp_path / "resumed", 0.9, resume=True, **saving)
    assert resumed.state.global_step == STEPS
    for name, want in straight.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], want, rtol=0, atol=0, msg=name)
    want, got = straight_loss.queue.state_dict(), resumed_loss.queue.state_dict()
    assert list(want["queues"]) == list(got["queues"]) == [32]
    for key, value in want["queues"][32]["buffer"].items():
        if value is not None:
            torch.testing.assert_close(got["queues"][32]["buffer"][key], value, rtol=0, atol=0, msg=key)
    for name, value in want["momentum_encoder"].items():
        torch.testing.assert_close(got["momentum_encoder"][name], value, rtol=0, atol=0, msg=name)
    # never in the saved model: the folder holds the online encoder only, and loads in sentence-transformers
    straight.save_model(str(tmp_path / "saved"))
    assert not any("queue" in name or "momentum" in name for name in os.listdir(tmp_path / "saved"))
    loaded = SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    for name, value in loaded.state_dict().items():
        torch.testing.assert_close(value, straight.model.state_dict()[name], rtol=0, atol=0)
    # each checkpoint is committed by its manifest, written last, which lists the queue; one without is not resumed
    manifest = json.loads((tmp_path / "resumed" / "checkpoint-2" / CHECKPOINT_MANIFEST).read_text(encoding="utf-8"))
    assert QUEUE_FILE in manifest["files"] and "model.safetensors" in manifest["files"]
    (tmp_path / "straight" / "checkpoint-5" / CHECKPOINT_MANIFEST).unlink()  # as if killed before it was written
    with pytest.raises(ConfigError, match=r"checkpoint-5 is not a whole checkpoint \(no checkpoint_manifest.json"):
        st_run(st_folder, tmp_path / "straight", 0.9, resume=True, max_steps=STEPS + 1, **saving)
    # resumed with other queue settings, or without the queue: one line each
    with pytest.raises(ConfigError, match="checkpoint-5 was trained with queue_size 10 and momentum 0.9"):
        st_run(st_folder, tmp_path / "resumed", 0.5, resume=True, max_steps=STEPS + 1, **saving)


def test_what_cannot_be_exact_is_refused_in_one_line(st_folder, tmp_path, caplog):  # noqa: F811
    model = SentenceTransformer(str(st_folder), device="cpu")
    loss = SimCSELoss(model, "infonce", queue_size=QUEUE)
    train = datasets.Dataset.from_dict({"anchor": texts(), "positive": texts()})
    args = SentenceTransformerTrainingArguments(output_dir=str(tmp_path), **{**SETTINGS, "save_strategy": "no"})
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train, loss=loss)  # no callback
    with pytest.raises(ConfigError, match=r"^SimCSELoss\(queue_size=...\) needs SimCSECallback\(loss\)"):
        trainer.train()
    with pytest.raises(ValueError, match="momentum needs a queue"):
        SimCSELoss(model, "infonce", momentum=0.9)
    # transformers' save_total_limit 1 can leave no whole checkpoint: a warning at the start
    args = SimpleNamespace(fsdp="", deepspeed=None, save_total_limit=1, output_dir=str(tmp_path),
                           gradient_accumulation_steps=1)
    with caplog.at_level(logging.WARNING, logger="simcse_hn.export.st_training"):
        SimCSECallback(loss).on_train_begin(args, SimpleNamespace(global_step=0, max_steps=5), None, model=model)
    assert "save_total_limit 1: transformers deletes the last whole checkpoint" in caplog.text
    # the Trainer tells callbacks the step it resumes at, not the folder: one outside output_dir is refused
    resumed = SimpleNamespace(global_step=3)
    with pytest.raises(ConfigError, match="resuming at step 3, but output_dir has no checkpoint-3"):
        resumed_checkpoint(SimpleNamespace(output_dir=str(tmp_path)), resumed)
    assert resumed_checkpoint(SimpleNamespace(output_dir=str(tmp_path)), resumed, required=False) is None


def test_the_momentum_encoder_copies_the_unwrapped_model(st_folder):  # noqa: F811
    """The trainer may put a wrapped model into `loss.model` (DDP, DataParallel): the momentum copy is the
    SentenceTransformer under it, and its parameters follow the model's by name."""
    model = SentenceTransformer(str(st_folder), device="cpu")
    loss = SimCSELoss(model, "infonce", queue_size=QUEUE, momentum=0.5)
    loss.model = torch.nn.DataParallel(model)  # no device: it calls the model itself
    loss.trainer_step.set(0, None)  # SimCSECallback's part, done by hand here
    loss.queue.start(loss.model)
    model.train()
    loss([model.tokenize(texts()[:4]), model.tokenize(texts()[:4])])
    assert type(loss.queue.encoder.model) is SentenceTransformer
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    before = {n: p.clone() for n, p in loss.queue.encoder.model.named_parameters()}
    loss.queue.step_end(model)
    for name, p in loss.queue.encoder.model.named_parameters():
        torch.testing.assert_close(p, 0.5 * before[name] + 0.5 * dict(model.named_parameters())[name])
    assert loss.queue.entries(32).embeddings.shape == (QUEUE, 32) and loss.queue.queues[32].position == 4


@pytest.mark.multiprocess
def test_two_processes_give_one_process_on_the_global_batch(st_folder, tmp_path):  # noqa: F811
    """The queue (momentum encoder) and topic batches under two processes (gloo): each process's batch is its share of
    the window, the entries are gathered in rank order, so the run is one process's on the global batch: the same
    losses, weights, queue and clusters (to float32 rounding: the processes sum their gradients in another order)."""
    from dist_worker_st import train

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               os.path.join(os.path.dirname(__file__), "dist_worker_st.py"), str(st_folder),
               str(tmp_path)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"st_rank{r}.pt", weights_only=True) for r in (0, 1)]
    one = train(str(st_folder), str(tmp_path / "one"), 1)
    assert len(one["losses"]) == 4
    for run in ranks:
        assert run["losses"] == pytest.approx(one["losses"], rel=1e-5)
        assert torch.equal(run["schedule"], one["schedule"])
        for name, value in one["weights"].items():
            torch.testing.assert_close(run["weights"][name], value, rtol=1e-5, atol=5e-5, msg=name)
        for key, value in one["queue"].items():
            torch.testing.assert_close(run["queue"][key], value, rtol=1e-5, atol=5e-5, msg=key)


SHARDED_CONFIGS = {"fsdp": "fsdp.yaml", "zero2": "deepspeed_zero2.yaml"}


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("engine", [
    "fsdp", pytest.param("zero2", marks=pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                                           reason="needs deepspeed"))])  # fmt: skip
def test_momentum_under_a_sharded_engine_launched_by_accelerates_config_is_refused(engine, st_folder, tmp_path):  # noqa: F811
    """FSDP or DeepSpeed chosen by `accelerate launch --config_file` alone (the training arguments name no engine, as
    in a user's script): a momentum encoder is refused in one line on every process; the memory bank trains."""
    config = os.path.join(os.path.dirname(__file__), "..", "configs", "accelerate", SHARDED_CONFIGS[engine])
    worker = os.path.join(os.path.dirname(__file__), "dist_worker_st_sharded.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    results = {}
    for momentum in ("0.9", "0"):
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config, "--num_processes", "2"]
        command += ["--main_process_port", free_port(), "--mixed_precision", "no", worker, str(st_folder)]
        command += [str(tmp_path / momentum), momentum]
        results[momentum] = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    refused = results["0.9"]
    assert refused.returncode != 0
    message = "SimCSELoss: momentum with FSDP or DeepSpeed is not available"
    assert refused.stderr.count(message) >= 2, refused.stderr[-3000:]  # each process says it, before any step
    assert not (tmp_path / "0.9" / "done.txt").exists()
    bank = results["0"]
    assert bank.returncode == 0, bank.stdout[-2000:] + bank.stderr[-3000:]
    assert (tmp_path / "0" / "done.txt").read_text(encoding="utf-8") == "2\n"
