"""Two processes (torchrun, gloo, CPU) with gathering give the gradient of one process on the global batch.

One torchrun launch (tests/dist_worker.py) runs every case through SimCSETrainer.training_step on a DDP-wrapped
float64 tiny BERT with dropout off; this file computes the one-process reference on the concatenated batch and
compares. Process start-up is the expensive part, hence one launch for everything.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT
from dist_worker_common import (
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
    paired_texts,
    relative_error,
)

from simcse_hn.losses import LOSSES
from simcse_hn.testing.models import build_tiny_bert
from simcse_hn.training import distributed

CASES = cases()
IDS = [case for case, _, _ in CASES]
PAIRED = paired_cases()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """[rank 0's results, rank 1's results] of one 2-process run; results[case][mode] = loss, grads, loss_state."""
    out = tmp_path_factory.mktemp("two_processes")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(ROOT / "tests" / "dist_worker.py"), str(out)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    loaded = [torch.load(out / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert [(r["rank"], r["world_size"]) for r in loaded] == [(0, 2), (1, 2)]
    trained = [torch.load(out / f"train_rank{r}.pt", weights_only=True) for r in (0, 1)]
    return [{**r["results"], "train_loop": t} for r, t in zip(loaded, trained)]


_REFERENCES: dict[str, dict] = {}


def one_process(case, loss, form, tmp_path) -> dict:
    """The plain step of one process on all 16 rows (the two ranks' rows in rank order)."""
    if case not in _REFERENCES:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            trainer = make_trainer(make_model(), make_loss(case, loss), tmp_path, form)
            value = trainer.training_step(trainer.model, batch(global_texts()))
        finally:
            torch.set_num_threads(threads)
        state = {k: v.clone() for k, v in trainer.model.loss_fn.state_dict().items()}
        _REFERENCES[case] = {"loss": float(value), "grads": gradients(trainer.model), "loss_state": state}
    return _REFERENCES[case]


@pytest.mark.multiprocess
@pytest.mark.parametrize(("case", "loss", "form"), CASES, ids=IDS)
def test_gathered_gradient_equals_one_process_on_the_global_batch(ranks, case, loss, form, tmp_path):
    want = one_process(case, loss, form, tmp_path)
    for mode in ("gather", "cached", "no_grad_gather"):  # cached: GradCache (3 + 1 sentences) with gathering
        runs = [r[case][mode] for r in ranks]
        for name, grad in runs[0]["grads"].items():  # DDP: both processes hold the same averaged gradient
            assert torch.equal(grad, runs[1]["grads"][name]), (mode, name)
        # each process averages its own anchors; with equal batches the mean of the two is the global mean
        assert (runs[0]["loss"] + runs[1]["loss"]) / 2 == pytest.approx(want["loss"], rel=1e-12), mode
        error = relative_error(runs[0]["grads"], want["grads"])
        if mode == "no_grad_gather":
            # SimCSE's reference gather: other processes' rows are constants, so each row loses the gradient of
            # the other process's anchors against it
            assert error > 1e-2, f"{mode}: relative error {error:.2e}"
        else:
            assert error < 1e-5, f"{mode}: relative error {error:.2e}"


@pytest.mark.multiprocess
@pytest.mark.parametrize(("case", "loss", "form"), CASES, ids=IDS)
def test_cached_step_with_gathering_and_dropout_equals_the_plain_step_with_the_same_masks(ranks, case, loss, form):
    for r in ranks:
        cached, plain = r[case]["cached_dropout"], r[case]["same_masks"]
        assert cached["loss"] == pytest.approx(plain["loss"], rel=1e-12)
        assert relative_error(cached["grads"], plain["grads"]) < 1e-10
        # dropout was on: the gradient is not the dropout-free one
        assert relative_error(cached["grads"], r[case]["gather"]["grads"]) > 1e-3


@pytest.mark.multiprocess
@pytest.mark.skipif("progcl" not in LOSSES, reason="ProGCL has not landed")
@pytest.mark.parametrize("case", [c for c in ("progcl", "progcl_mix") if c in IDS])
def test_progcl_fits_the_same_mixture_on_every_process(ranks, case, tmp_path):
    want = one_process(case, "progcl", "symmetric", tmp_path)["loss_state"]
    assert bool(want["bmm_valid"]), "the reference fit is degenerate: the test would compare fallbacks"
    for mode in ("gather", "cached", "no_grad_gather"):
        states = [r[case][mode]["loss_state"] for r in ranks]
        for key in ("bmm_alpha", "bmm_beta", "bmm_pi", "bmm_valid"):
            assert torch.equal(states[0][key], states[1][key]), (mode, key)  # bitwise: the same fit
            torch.testing.assert_close(states[0][key], want[key], rtol=1e-10, atol=0)  # of all the pairs


@pytest.mark.multiprocess
def test_training_loop_with_gradient_accumulation_cached_equals_plain(ranks):
    """trainer.train(): DDP, 2 accumulation micro-batches (the Trainer's no_sync around the first, GradCache's inside
    each), AdamW, 2 steps; HCL, dropout off, mini-batches of 1 sentence."""
    runs = [r["train_loop"] for r in ranks]
    for name, value in runs[0]["cached"].items():
        assert torch.equal(value, runs[1]["cached"][name]), name  # the processes stay in step
        assert torch.equal(runs[0]["plain"][name], runs[1]["plain"][name]), name
    initial = runs[0]["initial"]
    updates = {mode: {n: p - initial[n] for n, p in runs[0][mode].items()} for mode in ("plain", "cached")}
    assert relative_error(updates["cached"], updates["plain"]) < 1e-8
    frozen = "encoder.pooler."  # SimCSEModel freezes BERT's own pooler
    still = [n for n, u in updates["plain"].items() if not n.startswith(frozen) and not u.any()]
    assert not still, f"parameters that did not train: {still}"


def test_helpers_are_the_identity_without_a_process_group():
    x = torch.randn(3, 2, requires_grad=True)
    assert distributed.world_size() == 1 and distributed.rank() == 0
    assert distributed.all_gather_with_grad(x) is x
    assert distributed.all_gather_no_grad(x) is x
    assert distributed.all_reduce_sum(x) is x


@pytest.mark.multiprocess
def test_dev_evaluation_split_across_processes_equals_one_process(ranks, tmp_path):
    """Each process encodes its share of the dev sentences; the gathered score is the one-process score."""
    trainer = make_trainer(make_model(), make_loss("hcl", "hcl"), tmp_path, eval_pairs=dev_pairs(),
                           processing_class=build_tiny_bert()[1])  # fmt: skip
    want = trainer.evaluate()["eval_stsb_spearman"]
    for r in ranks:
        assert r["evaluate_and_log"]["dev"] == pytest.approx(want, abs=1e-9)


@pytest.mark.multiprocess
def test_logged_diagnostics_are_the_mean_over_processes(ranks):
    own = [r["evaluate_and_log"]["own"] for r in ranks]
    assert own[0]["pos_sim"] != own[1]["pos_sim"]  # the processes' rows differ, so their windows do
    for r in ranks:
        for key in own[0]:
            assert r["evaluate_and_log"]["logged"][key] == pytest.approx((own[0][key] + own[1][key]) / 2, abs=1e-6)


_PAIRED_REFERENCES: dict[str, dict] = {}


def paired_one_process(case, loss, group, guide, tmp_path) -> dict:
    """The plain step of one process on both ranks' rows (rank order), with the same layout, weight and guide."""
    if case not in _PAIRED_REFERENCES:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            trainer = make_paired_trainer(make_model(), make_loss(case, loss), tmp_path, group, guide)
            value = trainer.training_step(trainer.model, paired_batch(paired_texts(group), guide))
        finally:
            torch.set_num_threads(threads)
        metrics = {k: float(v) for k, v in trainer._metric_sums.items()}
        _PAIRED_REFERENCES[case] = {"loss": float(value), "grads": gradients(trainer.model), "metrics": metrics}
    return _PAIRED_REFERENCES[case]


@pytest.mark.multiprocess
@pytest.mark.parametrize(("case", "loss", "group", "guide"), PAIRED, ids=[c[0] for c in PAIRED])
def test_paired_and_guided_steps_on_two_processes_equal_one_process(ranks, case, loss, group, guide, tmp_path):
    """Paired rows [a, p, n_1, n_2] (every objective, SimCSE's hard negative weight) and a guide's exclusions
    (the model itself, or another model whose embeddings are gathered too): 2 processes with gathering, plain and
    GradCache, give one process's loss and gradient on the global batch; the guide removes the same negatives."""
    want = paired_one_process(case, loss, group, guide, tmp_path)
    for mode in ("gather", "cached"):
        runs = [r[case][mode] for r in ranks]
        for name, grad in runs[0]["grads"].items():
            assert torch.equal(grad, runs[1]["grads"][name]), (mode, name)
        assert (runs[0]["loss"] + runs[1]["loss"]) / 2 == pytest.approx(want["loss"], rel=1e-12), mode
        error = relative_error(runs[0]["grads"], want["grads"])
        assert error < 1e-5, f"{mode}: relative error {error:.2e}"
        if guide is not None:  # each process's mean over its anchors; equal batches: their mean is the global one
            removed = (runs[0]["metrics"]["guide_removed"] + runs[1]["metrics"]["guide_removed"]) / 2
            assert removed == pytest.approx(want["metrics"]["guide_removed"], rel=1e-9)
            assert 0 < want["metrics"]["guide_removed_frac"] < 1  # the case removes some negatives, not all
    for r in ranks:  # GradCache with dropout on equals the plain step with the same masks
        cached, plain = r[case]["cached_dropout"], r[case]["same_masks"]
        assert cached["loss"] == pytest.approx(plain["loss"], rel=1e-12)
        assert relative_error(cached["grads"], plain["grads"]) < 1e-10
