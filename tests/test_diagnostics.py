"""The false-negative diagnostics every objective logs, against loops written out, and in a real run."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import square_targets

from simcse_hn.cli import train
from simcse_hn.losses import LossContext, build_loss
from simcse_hn.losses.base import negative_diagnostics


def loop_diagnostics(sim, positive_index, negative_mask, weights, ids):
    harder, share, pairs, total = [], [], 0, 0.0
    for i in range(sim.shape[0]):
        negatives = [j for j in range(sim.shape[1]) if negative_mask[i, j]]
        w = {j: 1.0 if weights is None else float(weights[i, j]) for j in negatives}
        harder.append(sum(bool(sim[i, j] > sim[i, positive_index[i]]) for j in negatives) / len(negatives))
        k = max(1, math.ceil(0.01 * len(negatives)))
        top = sorted(negatives, key=lambda j: -float(sim[i, j]))[:k]
        share.append(sum(w[j] for j in top) / sum(w.values()))
        same = [j for j in negatives if ids[i] == ids[j]]
        pairs += len(same)
        total += sum(w[j] for j in same)
    return sum(harder) / len(harder), sum(share) / len(share), pairs, total


@pytest.mark.parametrize("name", ["infonce", "hcl", "progcl", "unremix"])
def test_diagnostics_equal_a_loop_reference(name):
    """A batch of 120 rows (so 1 % of the 118 negatives is 2 of them) where sentences 0 and 5 are the same text."""
    generator = torch.Generator().manual_seed(3)
    z = torch.randn(120, 16, generator=generator, dtype=torch.float64)
    z[10:12] = z[0:2] + 0.01 * torch.randn(2, 16, generator=generator, dtype=torch.float64)  # a duplicate: rows 10, 11
    ids = torch.arange(120) // 2
    ids[10:12] = 0
    targets = square_targets(120)
    out = build_loss(name, temperature=0.1).compute(z, targets, LossContext(candidate_text_ids=ids))
    sim = torch.nn.functional.normalize(z, dim=1) @ torch.nn.functional.normalize(z, dim=1).T
    mask = targets.negative_mask
    harder, share, pairs, total = loop_diagnostics(sim, targets.positive_index, mask, out.weights, ids)
    assert out.metrics["harder_than_positive"].item() == pytest.approx(harder, abs=1e-6)
    assert out.metrics["top1pct_weight_share"].item() == pytest.approx(share, rel=1e-5)
    assert out.metrics["duplicate_pairs"].item() == pairs == 8  # rows 0, 1, 10, 11: each sees the other pair's 2
    assert out.metrics["duplicate_weight_total"].item() == pytest.approx(total, rel=1e-5)
    if name == "infonce":
        assert share == pytest.approx(2 / 118)  # uniform weights: the top 1 % holds 1 % of the mass


def test_diagnostics_sample_the_first_anchors_and_need_no_ids():
    z = torch.randn(300, 8, generator=torch.Generator().manual_seed(0))
    targets = square_targets(300)
    sim = torch.nn.functional.normalize(z, dim=1) @ torch.nn.functional.normalize(z, dim=1).T
    got = negative_diagnostics(sim, targets.positive_index, targets.negative_mask, None, LossContext())
    want = loop_diagnostics(sim[:128], targets.positive_index[:128], targets.negative_mask[:128], None, [0] * 300)
    assert set(got) == {"harder_than_positive", "top1pct_weight_share"}  # no text ids: no duplicate counts
    assert got["harder_than_positive"].item() == pytest.approx(want[0], abs=1e-6)


def test_a_run_with_a_repeated_sentence_logs_every_diagnostic(tiny_args, tmp_path):
    corpus = tmp_path / "repeats.txt"
    lines = [f"sentence number {i}" for i in range(14)] + ["the same sentence"] * 2
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    extra = ["--train_file", str(corpus), "--loss", "hcl", "--max_steps", "2", "--logging_steps", "2",
             "--eval_strategy", "no", "--load_best_model_at_end", "false", "--save_strategy", "no"]  # fmt: skip
    trainer = train.run(tiny_args + extra)
    logged = next(e for e in trainer.state.log_history if "loss" in e)
    assert {"harder_than_positive", "top1pct_weight_share", "duplicate_weight"} <= set(logged)
    assert "duplicate_weight_total" not in logged and 0 < logged["duplicate_weight"]
    assert 0 <= logged["harder_than_positive"] <= 1
