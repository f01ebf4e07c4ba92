"""No host-made tensors and no host synchronisation in the loss path (docs/losses.md section 6).

On the CPU a copy from host memory cannot be told from device work, so a TorchFunctionMode records what would be one
on an accelerator: a tensor made from Python data (torch.tensor, as_tensor, ...), a factory without a device (it
would be made on the host), a `.to(device)` of a tensor that neither came in nor was made in the loss path (a
module-level constant), and every host synchronisation (.item(), bool(tensor), .cpu(), ...). With CUDA, the same
losses also run under torch.cuda.set_sync_debug_mode("error").
"""

from __future__ import annotations

import pytest
import torch
from conftest import square_targets, symmetric_targets

from simcse_hn.losses import LossContext, build_loss
from simcse_hn.testing.recorder import HostTensorRecorder


def host_tensor_violations(loss_fn, z: torch.Tensor, context: LossContext, targets=None) -> list[str]:
    targets = square_targets(z.shape[0]) if targets is None else targets
    leaf = z.clone().requires_grad_(True)
    known = [leaf, *loss_fn.parameters(), *loss_fn.buffers(), targets.positive_index, targets.negative_mask,
             targets.anchor_index, context.candidate_features]
    recorder = HostTensorRecorder(known)
    with recorder:
        out = loss_fn.compute(leaf, targets, context)
        out.loss.backward()
        for value in out.metrics.values():  # metrics stay tensors: the trainer averages them on the device
            assert isinstance(value, torch.Tensor)
    return recorder.violations


def batch(rows: int = 16, dim: int = 12) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    z = torch.randn(rows, dim, generator=g)
    z[1::2] = z[0::2] + 0.3 * torch.randn(rows // 2, dim, generator=g)
    return z


# every loss and every path it has: fitted and stored ProGCL mixtures, sampled and full fits, both mix pairings,
# UnReMix's head gradient, learned mixture and debiasing
CASES = {
    "infonce": lambda: build_loss("infonce", temperature=0.05),
    "dcl": lambda: build_loss("dcl", temperature=0.05),
    "hcl": lambda: build_loss("hcl", temperature=0.05, beta=0.5, tau_plus=0.01),
    "hcl_beta0": lambda: build_loss("hcl", temperature=0.05, beta=0.0),
    "hardness": lambda: build_loss("hardness", temperature=0.05, strength=9.0),
    "progcl_weight_full": lambda: build_loss("progcl", temperature=0.05, fit_pairs=0),
    "progcl_weight_sampled": lambda: build_loss("progcl", temperature=0.05, fit_pairs=50),
    "progcl_weight_warm_start": lambda: build_loss("progcl", temperature=0.05, warm_start=True),
    "progcl_mix_all": lambda: build_loss("progcl", temperature=0.05, mode="mix"),
    "progcl_mix_top3": lambda: build_loss("progcl", temperature=0.05, mode="mix", mix_k=3),
    "progcl_stored_fit": lambda: build_loss("progcl", temperature=0.05, refit_every=3, warmup_ratio=0.1),
    "progcl_warmup": lambda: build_loss("progcl", temperature=0.05, warmup_ratio=0.9),
    "unremix_head": lambda: build_loss("unremix", temperature=0.05, gradient="head", tau_plus=0.01),
    "unremix_learned": lambda: build_loss("unremix", temperature=0.05, gradient="embedding", learn_mixture=True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_loss_path_makes_no_host_tensors_and_never_waits(name):
    z = batch()
    features = torch.randn(16, 10, generator=torch.Generator().manual_seed(1))
    context = LossContext(step=5, max_steps=10, candidate_features=features)
    assert host_tensor_violations(CASES[name](), z, context) == []


def test_plain_call_and_several_processes_make_no_host_tensors():
    """The plain call (targets made inside the loss, no structure: the full-matrix fit) and an all-reduce hook (the
    draws shared between processes)."""
    z = batch()
    positive_index, negative_mask = symmetric_targets(16)
    for name in ("progcl_weight_sampled", "progcl_mix_all", "unremix_head", "dcl"):
        loss_fn = CASES[name]()
        leaf = z.clone().requires_grad_(True)
        context = LossContext(all_reduce=lambda t: t * 1.0, anchor_features=z, candidate_features=z)
        recorder = HostTensorRecorder([leaf, z, positive_index, negative_mask, *loss_fn.parameters(),
                                       *loss_fn.buffers()])
        # None: the standard negatives stated by the call (the shortcuts); a mask with anchors of their own: read as
        # given; a mask with the anchors as candidates: compared once with the standard one, its only wait
        for mask, own, waits in ((negative_mask, True, []), (None, False, []),
                                 (negative_mask, False, ["_VariableFunctionsClass.equal: waits for the device"])):
            with recorder:
                loss_fn(leaf.clone() if own else leaf, leaf, positive_index, mask, context).loss.backward()
            assert recorder.violations == waits, (name, mask is None, own)


def test_recorder_catches_what_the_old_loss_path_did():
    """The check can fail: each thing the audit found in the old code is recorded."""
    host_constant = torch.tensor([-float("inf"), 1.0], dtype=torch.float64)  # made at import, like BETA1_FLOOR
    z = torch.randn(4, 2, dtype=torch.float64)
    recorder = HostTensorRecorder([z])
    with recorder:
        torch.where(host_constant.to(z.device) > z[0], 1.01, z[0])
        torch.tensor([0, 1], device=z.device)
        torch.tensor(1.0, device=z.device)
        torch.arange(3)
        bool(z.sum() > 0)
        z.to(torch.float32)  # a dtype cast of an input: fine
        torch.zeros(3, device=z.device).to(z.device)  # made on the device in the path: fine
    assert len(recorder.violations) == 5, recorder.violations


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", list(CASES))
def test_loss_path_never_synchronises_on_cuda(name):
    device = torch.device("cuda")
    loss_fn = CASES[name]().to(device)
    z = batch().to(device).requires_grad_(True)
    features = torch.randn(16, 10, device=device)
    targets = square_targets(16)  # built (and checked, with one synchronisation) before the step, as build_targets
    targets = type(targets)(*(t.to(device) for t in (targets.positive_index, targets.negative_mask,
                                                      targets.anchor_index)))
    context = LossContext(step=5, max_steps=10, candidate_features=features)
    loss_fn.compute(z, targets, context).loss.backward()  # warm-up: caches (triangle indices) filled once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = loss_fn.compute(z, targets, context)
        out.loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(out.loss).item()
