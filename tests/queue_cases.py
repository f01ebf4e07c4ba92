"""The queue's two-process cases, shared by tests/dist_worker_queue.py and tests/test_queue.py: a trainer with a
queue pre-filled the same way in every process, and batches that carry their text ids."""

from __future__ import annotations

import torch
from dist_worker_common import batch

from simcse_hn.data.collator import text_id
from simcse_hn.training.queue import QueueEntries

QUEUE_SIZE, PREFILLED = 24, 6
# case -> (loss, momentum): HCL's weights over a momentum encoder's entries; UnReMix's head-gradient scores over a
# memory bank's (its entries carry the head's inputs)
QUEUE_CASES = {"hcl_momentum": ("hcl", 0.9), "unremix_memory_bank": ("unremix", 0.0)}


def queue_batch(texts: list[str]) -> dict[str, torch.Tensor]:
    """Rows [a, a', b, b', ...] of consecutive text pairs (distinct texts: the positives differ with dropout off)."""
    rows = batch(texts)
    rows["text_ids"] = torch.tensor([text_id(t) for t in texts[0::2]]).repeat_interleave(2)
    return rows


def queue_trainer(case: str, out_dir, make_trainer, make_model, make_loss):
    loss, momentum = QUEUE_CASES[case]
    trainer = make_trainer(make_model(), make_loss(case, loss), out_dir, queue_size=QUEUE_SIZE, momentum=momentum)
    g = torch.Generator().manual_seed(11)
    prefill = QueueEntries(torch.randn(PREFILLED, 32, generator=g, dtype=torch.float64), torch.arange(PREFILLED) + 7,
                           torch.randn(PREFILLED, 32, generator=g, dtype=torch.float64) if loss == "unremix" else None)
    trainer.queue.queue.enqueue(prefill)
    return trainer
