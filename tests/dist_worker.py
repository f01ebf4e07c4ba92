"""Two-process worker for tests/test_distributed.py: `torchrun --nproc_per_node 2 tests/dist_worker.py OUT_DIR`.

For every case of dist_worker_common.cases() it runs one real `SimCSETrainer.training_step` on a DDP-wrapped
model (gloo, CPU) over this rank's rows and saves the all-reduced parameter gradients, the loss and the loss's
buffers to OUT_DIR/rank{r}.pt. Modes:
* gather: all_gather_with_grad (the trainer's default with 2 processes);
* no_grad_gather: the trainer with SimCSE's reference gather (all_gather_no_grad) patched in;
* cached: GradCache (cache_minibatch_size) with gathering, dropout off;
* cached_dropout / same_masks: GradCache with dropout on, and its reference: the same mini-batches embedded with a
  graph from the same RNG state, one loss over them and one backward, gradients averaged over processes as DDP does.
The parent compares the first three against one process on the whole global batch. The paired cases
(dist_worker_common.paired_cases(): rows [a, p, n_1, n_2], the hard negative weight, guide models) run gather, cached
and cached_dropout / same_masks the same way.
Then `trainer.train()` (the Trainer's loop: DDP, 2 gradient-accumulation micro-batches under its no_sync, AdamW),
plain and cached, 2 optimizer steps each: the final parameters go to OUT_DIR/train_rank{r}.pt.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import datasets
import torch
import torch.distributed as dist
from dist_worker_common import (  # noqa: E402
    CACHE_SENTENCES,
    batch,
    cases,
    dev_pairs,
    global_texts,
    gradients,
    make_loss,
    make_model,
    make_paired_trainer,
    make_trainer,
    paired_batch,
    paired_cases,
    paired_rank_texts,
    rank_texts,
)

from simcse_hn.data.collator import SimCSECollator  # noqa: E402
from simcse_hn.testing.models import build_tiny_bert  # noqa: E402
from simcse_hn.training import distributed, grad_cache  # noqa: E402
from simcse_hn.training.process_exit import finish  # noqa: E402

DROPOUT = 0.1


def _record(trainer, loss) -> dict:
    model = trainer.accelerator.unwrap_model(trainer.model)
    buffers = {k: v.detach().clone() for k, v in model.loss_fn.state_dict().items()}
    metrics = {k: float(v) for k, v in trainer._metric_sums.items()}
    return {"loss": float(loss), "grads": gradients(model), "loss_state": buffers, "metrics": metrics}


def _trainer_step(case, loss, form, out_dir, inputs, cache=None, dropout=0.0, seed=None) -> dict:
    trainer = make_trainer(make_model(dropout), make_loss(case, loss), out_dir, form, cache_minibatch_size=cache)
    ddp_model = trainer.accelerator.prepare_model(trainer.model)
    assert isinstance(ddp_model, torch.nn.parallel.DistributedDataParallel), type(ddp_model)
    if seed is not None:
        torch.manual_seed(seed)
    loss_value = trainer.training_step(ddp_model, inputs)
    return _record(trainer, loss_value)


def _same_masks_step(case, loss, form, out_dir, inputs, seed, trainer=None) -> dict:
    """The plain step with GradCache's dropout masks: mini-batches embedded with a graph, in order, from one RNG
    state; one (gathered) loss; one backward; gradients averaged over the processes as DDP does."""
    trainer = trainer or make_trainer(make_model(DROPOUT), make_loss(case, loss), out_dir, form)
    model = trainer.model
    model.train()
    torch.manual_seed(seed)
    guide_inputs = {k: v for k, v in inputs.items() if k.startswith("guide_")}
    inputs = {k: v for k, v in inputs.items() if k not in guide_inputs}
    guide_embeddings = trainer._guide_embeddings(guide_inputs)
    chunks = grad_cache.split_groups(inputs, CACHE_SENTENCES, trainer.layout.rows_per_example)
    outputs = [trainer._embed(model, chunk) for chunk in chunks]
    embeddings = torch.cat([z for z, _ in outputs])
    head_inputs = None if outputs[0][1] is None else torch.cat([h for _, h in outputs])
    result = trainer.contrastive_loss(model, embeddings, head_inputs, guide_embeddings=guide_embeddings)
    result.loss.backward()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
    return _record(trainer, result.loss.detach())


def _train(out_dir, cache) -> dict[str, torch.Tensor]:
    """Two optimizer steps of the real training loop, 2 micro-batches of 4 sentences per process per step."""
    trainer = make_trainer(
        make_model(),
        make_loss("hcl", "hcl"),
        out_dir,
        train_dataset=datasets.Dataset.from_dict({"text": global_texts() * 2}),  # 32 sentences: 2 steps
        data_collator=SimCSECollator(build_tiny_bert()[1], max_length=24),
        cache_minibatch_size=cache,
        gradient_accumulation_steps=2,
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        seed=0,
    )
    trainer.train()
    return {n: p.detach().clone() for n, p in trainer.accelerator.unwrap_model(trainer.model).named_parameters()}


def _evaluate_and_log(out_dir, inputs) -> dict:
    """The STS-B dev score (each process encodes its share of the sentences) and the diagnostics logged after one
    training step (each process's own window and what log() writes, which must be the mean over processes)."""
    trainer = make_trainer(make_model(), make_loss("hcl", "hcl"), out_dir, eval_pairs=dev_pairs(),
                           processing_class=build_tiny_bert()[1])  # fmt: skip
    score = trainer.evaluate()["eval_stsb_spearman"]
    ddp_model = trainer.accelerator.prepare_model(trainer.model)
    trainer.training_step(ddp_model, inputs)
    own = {key: float(value) for key, value in trainer._metric_sums.items()}
    trainer.log({"loss": 0.0})
    logged = {key: trainer.state.log_history[-1][key] for key in own}
    return {"dev": score, "own": own, "logged": logged}


def main(out_dir: str) -> None:
    out = Path(out_dir)
    trainer_dir = out / "trainer"
    make_trainer(make_model(), make_loss("infonce", "infonce"), trainer_dir)  # the first trainer starts gloo
    rank = distributed.rank()
    inputs = batch(rank_texts(rank))
    results = {}
    for case, loss, form in cases():
        runs = {
            "gather": _trainer_step(case, loss, form, trainer_dir, inputs),
            "cached": _trainer_step(case, loss, form, trainer_dir, inputs, cache=CACHE_SENTENCES),
            "cached_dropout": _trainer_step(
                case, loss, form, trainer_dir, inputs, cache=CACHE_SENTENCES, dropout=DROPOUT, seed=100 + rank
            ),
            "same_masks": _same_masks_step(case, loss, form, trainer_dir, inputs, seed=100 + rank),
        }
        with_grad = distributed.all_gather_with_grad
        distributed.all_gather_with_grad = distributed.all_gather_no_grad  # what the trainer calls
        try:
            runs["no_grad_gather"] = _trainer_step(case, loss, form, trainer_dir, inputs)
        finally:
            distributed.all_gather_with_grad = with_grad
        results[case] = runs
    for case, loss, group, guide in paired_cases():
        rows = paired_batch(paired_rank_texts(group, rank), guide)

        def step(cache=None, dropout=0.0, seed=None, case=case, loss=loss, group=group, guide=guide, rows=rows):
            trainer = make_paired_trainer(make_model(dropout), make_loss(case, loss), trainer_dir, group, guide,
                                          cache_minibatch_size=cache)  # fmt: skip
            ddp_model = trainer.accelerator.prepare_model(trainer.model)
            if seed is not None:
                torch.manual_seed(seed)
            return _record(trainer, trainer.training_step(ddp_model, rows))

        reference = make_paired_trainer(make_model(DROPOUT), make_loss(case, loss), trainer_dir, group, guide)
        results[case] = {
            "gather": step(),
            "cached": step(cache=CACHE_SENTENCES),
            "cached_dropout": step(cache=CACHE_SENTENCES, dropout=DROPOUT, seed=100 + rank),
            "same_masks": _same_masks_step(case, loss, None, trainer_dir, rows, 100 + rank, trainer=reference),
        }
    results["evaluate_and_log"] = _evaluate_and_log(trainer_dir, inputs)
    initial = {n: p.detach() for n, p in make_model().named_parameters()}
    trained = {"plain": _train(trainer_dir, None), "cached": _train(trainer_dir, 1), "initial": initial}
    torch.save(trained, out / f"train_rank{rank}.pt")
    torch.save({"rank": rank, "world_size": distributed.world_size(), "results": results}, out / f"rank{rank}.pt")
    dist.barrier()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(sys.argv[1])
    finish(0)  # gloo's threads would abort the exit (-6): simcse_hn/training/process_exit.py
