"""Shared by tests/dist_worker.py (run under torchrun) and the tests that compare against one process.

Batches are rows [a, a', b, b', ...] of distinct fixture sentences, so that positives are not identical even with
dropout off; models are the tiny BERT in float64 with the SimCSE MLP head.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch
from doc_examples import shared_objective

from simcse_hn.configuration.training_arguments import SimCSETrainingArguments
from simcse_hn.data.sts import load_sts_pairs
from simcse_hn.losses import LOSSES, build_loss
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.testing.models import build_tiny_bert
from simcse_hn.training.trainer import SimCSETrainer

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TEMPERATURE = 0.1  # tiny random encoders give cosines near 1: a larger t keeps every loss's terms alive
SENTENCES_PER_RANK = 4
WORLD_SIZE = 2
CACHE_SENTENCES = 3  # mini-batches of 3 + 1 sentences per process: an uneven split

LOSS_KWARGS = {
    "infonce": {},
    "dcl": {"tau_plus": 0.05},
    "hcl": {"beta": 0.5, "tau_plus": 0.05},
    "progcl": {"warmup_ratio": 0.0},
    "unremix": {"beta": 1.0, "gradient": "head"},
}


def cases() -> list[tuple[str, str, str]]:
    """(case name, loss, contrast form): every registered loss in the symmetric form and InfoNCE in the simcse form,
    plus ProGCL-mix (fixed permutation) and UnReMix with a learned mixture (a trainable loss parameter)."""
    out = [(name, name, "symmetric") for name in LOSSES]
    out.append(("infonce_simcse", "infonce", "simcse"))
    if "progcl" in LOSSES:
        out.append(("progcl_mix", "progcl", "symmetric"))
    if "unremix" in LOSSES:
        out.append(("unremix_learned", "unremix", "symmetric"))
    out.append(("user_objective", shared_objective(), "symmetric"))  # docs/writing-an-objective.md's, from a file
    return out


def make_loss(case: str, loss: str):
    kwargs = {"temperature": TEMPERATURE, **LOSS_KWARGS.get(loss, {})}
    if case == "progcl_mix":
        kwargs["mode"] = "mix"
    if case == "unremix_learned":
        kwargs["learn_mixture"] = True
    loss_fn = build_loss(loss, **kwargs)
    if case == "progcl_mix":  # one fixed permutation, the same in every process and in the reference
        k = 2 * SENTENCES_PER_RANK * WORLD_SIZE
        permutation = torch.randperm(k, generator=torch.Generator().manual_seed(0))
        compute = loss_fn.compute
        loss_fn.compute = lambda candidates, targets, context=None: compute(
            candidates, targets, dataclasses.replace(context, mix_permutation=permutation)
        )
    return loss_fn


def make_model(dropout: float = 0.0, seed: int = 0, spread: float = 0.3) -> SimCSEModel:
    """Tiny BERT + MLP head in float64. BERT's init (std 0.02) maps every sentence to nearly the same vector
    (cosines ~0.9999, every hard-negative weight ~1, ProGCL's fit degenerate); `spread` adds seeded noise of that
    std to every weight so the batch has a spread of similarities."""
    encoder, _ = build_tiny_bert(seed=seed, dropout=dropout)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        model = SimCSEModel(encoder, pooler="cls").double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(spread * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def sentences(count: int) -> list[str]:
    lines = (FIXTURES / "tiny_corpus.txt").read_text(encoding="utf-8").splitlines()
    return lines[:count]


def batch(texts: list[str], max_length: int = 24) -> dict[str, torch.Tensor]:
    """Rows in the given order (pairs are consecutive texts), padded to the longest."""
    _, tokenizer = build_tiny_bert()
    return dict(tokenizer(texts, max_length=max_length, truncation=True, padding=True, return_tensors="pt"))


def global_texts() -> list[str]:
    return sentences(2 * SENTENCES_PER_RANK * WORLD_SIZE)


def rank_texts(rank: int) -> list[str]:
    rows = 2 * SENTENCES_PER_RANK
    return global_texts()[rank * rows : (rank + 1) * rows]


def dev_pairs():
    """The tiny STS fixture's dev pairs."""
    return load_sts_pairs(str(FIXTURES / "sts_tiny.jsonl"), "dev")


def make_trainer(
    model,
    loss_fn,
    output_dir,
    contrast_form="symmetric",
    train_dataset=None,
    data_collator=None,
    eval_pairs=None,
    processing_class=None,
    group_size=None,
    guide=None,
    **overrides,
) -> SimCSETrainer:
    args = SimCSETrainingArguments(
        output_dir=str(output_dir),
        loss="infonce" if contrast_form == "simcse" else "hcl",  # only validated; the loss object is passed in
        contrast_form=contrast_form,
        temperature=TEMPERATURE,
        eval_strategy="no",
        load_best_model_at_end=False,
        metric_for_best_model=None,
        report_to=[],
        disable_tqdm=True,
        **{"per_device_train_batch_size": SENTENCES_PER_RANK, "save_strategy": "no", "use_cpu": True, **overrides},
    )
    trainer = SimCSETrainer(
        model=model, args=args, loss_fn=loss_fn, train_dataset=train_dataset, data_collator=data_collator,
        eval_pairs=eval_pairs, processing_class=processing_class, group_size=group_size, guide=guide,
    )  # fmt: skip
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop, which these tests skip
    return trainer


# --- paired data: rows [a, p, n_1, n_2] per example, SimCSE's hard negative weight, guide models ---

GROUP_SIZE = 4
HARD_NEGATIVE_WEIGHT = 0.5


def paired_cases() -> list[tuple[str, str, int | None, str | None]]:
    """(case, loss, group size, guide): every registered loss on paired rows with the hard negative weight; HCL with
    the model as its own guide, on pairs and on single sentences; InfoNCE with a separate guide model."""
    out = [(f"paired_{name}", name, GROUP_SIZE, None) for name in LOSSES]
    out.append(("paired_hcl_self_guide", "hcl", GROUP_SIZE, "self"))
    out.append(("paired_infonce_guide", "infonce", GROUP_SIZE, "model"))
    out.append(("sentences_hcl_self_guide", "hcl", None, "self"))
    return out


class TinyGuide(torch.nn.Module):
    """A frozen guide model (another seeded tiny BERT) on the `guide_*` features: what simcse_hn.data.guide.Guide does
    with a sentence-transformers model."""

    def __init__(self):
        super().__init__()
        self.model = make_model(seed=5).eval().requires_grad_(False)

    def train(self, mode: bool = True):
        return super().train(False)

    @torch.no_grad()
    def forward(self, features):
        return self.model(**features).embeddings


def paired_texts(group_size: int | None) -> list[str]:
    return sentences((group_size or 2) * SENTENCES_PER_RANK * WORLD_SIZE)


def paired_rank_texts(group_size: int | None, rank: int) -> list[str]:
    rows = (group_size or 2) * SENTENCES_PER_RANK
    return paired_texts(group_size)[rank * rows : (rank + 1) * rows]


def paired_batch(texts: list[str], guide: str | None) -> dict[str, torch.Tensor]:
    """Rows in order; with a separate guide model, its features of every row under `guide_*` keys."""
    rows = batch(texts)
    if guide == "model":
        rows.update({f"guide_{key}": value for key, value in batch(texts).items()})
    return rows


def make_paired_trainer(model, loss_fn, output_dir, group_size, guide, **overrides) -> SimCSETrainer:
    weight = HARD_NEGATIVE_WEIGHT if group_size is not None else 0.0
    return make_trainer(
        model, loss_fn, output_dir, group_size=group_size, guide=TinyGuide() if guide == "model" else None,
        hard_negative_weight=weight, guide_model={"model": "tiny-guide"}.get(guide, guide), **overrides,
    )  # fmt: skip


def gradients(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def relative_error(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    assert got.keys() == want.keys(), sorted(set(got) ^ set(want))
    diff = torch.cat([(got[k] - want[k]).flatten() for k in want]).norm()
    return float(diff / torch.cat([want[k].flatten() for k in want]).norm())


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
