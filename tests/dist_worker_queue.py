"""Run under `torch.distributed.run --nproc_per_node 2` by tests/test_queue.py: each process takes one training step
on its rows with a queue pre-filled the same on every process, then ends the step (the queue takes the step's
entries), and saves the averaged gradients, the loss and the queue to OUT/queue_rank{r}.pt."""

from __future__ import annotations

import sys

import torch
from dist_worker_common import gradients, make_loss, make_model, make_trainer, rank_texts
from queue_cases import QUEUE_CASES, queue_batch, queue_trainer

from simcse_hn.training import distributed
from simcse_hn.training.process_exit import finish


def main(out: str) -> None:
    torch.set_num_threads(1)
    results, rank = {}, None
    for case in QUEUE_CASES:
        trainer = queue_trainer(case, out, make_trainer, make_model, make_loss)  # the first trainer starts gloo
        rank = distributed.rank()
        model = trainer.accelerator.prepare_model(trainer.model)
        assert isinstance(model, torch.nn.parallel.DistributedDataParallel), type(model)
        loss = trainer.training_step(model, queue_batch(rank_texts(rank)))
        trainer.queue.step_end(trainer.model)
        entries = trainer.queue.entries()
        results[case] = {"loss": float(loss), "grads": gradients(trainer.model),
                         "queue": {k: v for k, v in entries._asdict().items() if v is not None}}  # fmt: skip
    torch.save({"rank": rank, "results": results}, f"{out}/queue_rank{rank}.pt")


if __name__ == "__main__":
    main(sys.argv[1])
    finish(0)  # gloo's threads would abort the exit (-6): simcse_hn/training/process_exit.py
