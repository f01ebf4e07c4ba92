"""Run under `torch.distributed.run --nproc_per_node 2` by tests/test_topic_batches.py: each process builds a trainer
with topic batches over the same paired dataset, but with a model of its own seed (so that clustering on each
process would disagree), and records the cluster assignment it holds and the anchors of every batch its sharded
training loader yields, with a re-clustering after the first step."""

from __future__ import annotations

import sys

import datasets
import torch

from simcse_hn.configuration.training_arguments import SimCSETrainingArguments
from simcse_hn.data.pairs import PairCollator
from simcse_hn.losses import build_loss
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.testing.models import build_tiny_bert
from simcse_hn.training.process_exit import finish
from simcse_hn.training.trainer import SimCSETrainer

EXAMPLES, PER_DEVICE, CLUSTERS = 64, 4, 4


def dataset() -> datasets.Dataset:
    anchors = [f"topic {i % 4} sentence {i}" for i in range(EXAMPLES)]
    return datasets.Dataset.from_dict({"anchor": anchors, "positive": [f"positive {i}" for i in range(EXAMPLES)]})


class RecordingCollator(PairCollator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches: list[list[str]] = []

    def __call__(self, features):
        self.batches.append([f["anchor"] for f in features])
        return super().__call__(features)


def main(out: str) -> None:
    args = SimCSETrainingArguments(output_dir=out, use_cpu=True, per_device_train_batch_size=PER_DEVICE,
                                   eval_strategy="no", save_strategy="no", load_best_model_at_end=False,
                                   metric_for_best_model=None, report_to=[], disable_tqdm=True, seed=3,
                                   topic_batches=True, topic_clusters=CLUSTERS, ddp_backend="gloo")  # fmt: skip
    rank = args.process_index
    encoder, tokenizer = build_tiny_bert(seed=rank, dropout=0.0)  # a different encoder on each process
    collator = RecordingCollator(tokenizer, 32, negatives=0)
    trainer = SimCSETrainer(model=SimCSEModel(encoder, pooler="avg"), args=args, loss_fn=build_loss("infonce"),
                            train_dataset=dataset(), data_collator=collator)  # fmt: skip
    for step, _ in enumerate(trainer.get_train_dataloader(), start=1):
        if step == 1:  # re-clustered after step 1 by process 0's model, its word embeddings redrawn: other clusters
            words = trainer.model.encoder.embeddings.word_embeddings.weight
            words.data.normal_(generator=torch.Generator().manual_seed(7))
            trainer.batches.recluster(1)
    schedule = [entry.as_dict() for entry in trainer.batches.sampler.schedule]
    torch.save({"rank": rank, "assignment": trainer.batches.assignment, "batches": collator.batches,
                "schedule": schedule}, f"{out}/topic_rank{rank}.pt")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
    finish(0)  # gloo's threads would abort the exit (-6): simcse_hn/training/process_exit.py
