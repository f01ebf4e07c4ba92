"""Run by tests/test_st_queue.py under `accelerate launch --config_file configs/accelerate/{fsdp,deepspeed_zero2}.yaml
--num_processes 2 tests/dist_worker_st_sharded.py FOLDER OUT MOMENTUM`, as a user launches a sentence-transformers
script: SentenceTransformerTrainer with SimCSELoss(queue_size=8, momentum=MOMENTUM) and SimCSECallback, two steps.
The engine comes from accelerate's config alone (the training arguments name none). Writes OUT/done.txt on success."""

from __future__ import annotations

import sys
from pathlib import Path

from simcse_hn.testing.sharded_cpu import allow_sharding_on_cpu, use_cpu

allow_sharding_on_cpu()  # before the first Accelerator

import datasets  # noqa: E402
from sentence_transformers import (  # noqa: E402
    SentenceTransformer,
    SentenceTransformerTrainer,
    SentenceTransformerTrainingArguments,
)

from simcse_hn.export.st_losses import SimCSELoss  # noqa: E402
from simcse_hn.export.st_training import SimCSECallback  # noqa: E402
from simcse_hn.training.process_exit import finish  # noqa: E402

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "tiny_corpus.txt"


def main(folder: str, out: str, momentum: float) -> None:
    sentences = FIXTURE.read_text(encoding="utf-8").splitlines()[:16]
    model = SentenceTransformer(folder, device="cpu")
    loss = SimCSELoss(model, "infonce", queue_size=8, momentum=momentum)
    args = SentenceTransformerTrainingArguments(
        output_dir=out, per_device_train_batch_size=2, max_steps=2, learning_rate=1e-3, report_to=[],
        use_cpu=use_cpu(), disable_tqdm=True, logging_steps=1, seed=0, save_strategy="no",
    )  # fmt: skip
    train = datasets.Dataset.from_dict({"anchor": sentences, "positive": sentences})
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train, loss=loss,
                                         callbacks=[SimCSECallback(loss)])  # fmt: skip
    trainer.train()
    if trainer.is_world_process_zero():
        Path(out, "done.txt").write_text(f"{trainer.state.global_step}\n", encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
    finish(0)  # see simcse_hn/training/process_exit.py
