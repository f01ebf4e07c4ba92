"""Run under `torch.distributed.run --nproc_per_node 2` by tests/test_st_queue.py (and called on one process there):
SentenceTransformerTrainer with simcse-hn's queue (a momentum encoder) and topic batches, the batches in the
sampler's order; saves each process's final weights, logged losses and queue to OUT/st_rank{r}.pt."""

from __future__ import annotations

import sys
from pathlib import Path

import datasets
import torch
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments

from simcse_hn.export.st_losses import SimCSELoss
from simcse_hn.export.st_training import SimCSECallback, TopicBatches
from simcse_hn.training import distributed
from simcse_hn.training.process_exit import finish

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "tiny_corpus.txt"
GLOBAL_BATCH = 4


def train(folder: str, output_dir: str, processes: int) -> dict:
    """Four steps of a global batch of GLOBAL_BATCH pairs over `processes` processes."""
    torch.set_num_threads(1)
    sentences = FIXTURE.read_text(encoding="utf-8").splitlines()[:12] * 2  # repeated: the queue masks them
    model = SentenceTransformer(folder, device="cpu")
    loss = SimCSELoss(model, "hcl", beta=0.5, temperature=0.05, queue_size=10, momentum=0.9)
    batches = TopicBatches(clusters=2)
    args = SentenceTransformerTrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=GLOBAL_BATCH // processes, max_steps=4, learning_rate=0.5,
        optim="sgd", lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1e9, report_to=[], use_cpu=True,
        disable_tqdm=True, logging_steps=1, seed=0, save_strategy="no", batch_sampler=batches,
    )  # fmt: skip
    train = datasets.Dataset.from_dict({"anchor": sentences, "positive": sentences})
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train, loss=loss,
                                         callbacks=[SimCSECallback(loss, batches)])  # fmt: skip
    trainer.train()
    return {"weights": {k: v.clone() for k, v in model.state_dict().items()},
            "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
            "queue": {k: v for k, v in loss.queue.entries(32)._asdict().items() if v is not None},
            "schedule": batches.samplers[-1].topic.schedule[0].assignment}  # fmt: skip


def main(folder: str, out: str) -> None:
    result = train(folder, f"{out}/run", 2)
    torch.save(result, f"{out}/st_rank{distributed.rank()}.pt")
    if distributed.is_distributed():  # a process group left open can abort a process at exit
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    finish(0)  # gloo's threads would abort the exit (-6): simcse_hn/training/process_exit.py
