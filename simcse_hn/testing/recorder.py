"""A TorchFunctionMode that records what would copy host data to an accelerator or wait for it, for checking on a
CPU that a loss path makes no host tensor and no host synchronisation (tests/test_loss_device.py, bench/gpu.py)."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

FROM_HOST_DATA = {torch.tensor, torch.as_tensor, torch.asarray, torch.from_numpy, torch.Tensor.new_tensor}
FACTORIES = {
    torch.zeros, torch.ones, torch.full, torch.empty, torch.arange, torch.eye, torch.rand, torch.randn,
    torch.randint, torch.randperm, torch.linspace, torch.logspace, torch.tril_indices, torch.triu_indices,
}
SYNCS = {
    torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.__bool__,
    torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__, torch.nonzero, torch.Tensor.nonzero,
    torch.masked_select, torch.Tensor.masked_select, torch.unique, torch.equal,
}
MOVES = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.copy_}


class HostTensorRecorder(TorchFunctionMode):
    """Records the loss path's calls that would copy host data to the device or wait for it. `known`: the tensors
    the path may move freely (its inputs and the module's state); every tensor the path makes is added."""

    def __init__(self, known: list[torch.Tensor]):
        super().__init__()
        self.known = {id(t) for t in known}
        self.keep = list(known)  # ids stay unique while the tensors live
        self.violations: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__qualname__", getattr(func, "__name__", str(func)))
        if func in FROM_HOST_DATA:
            self.violations.append(f"{name}: a tensor from host data")
        elif func in FACTORIES and "device" not in kwargs:
            self.violations.append(f"{name} without a device: made on the host")
        elif func in SYNCS:
            self.violations.append(f"{name}: waits for the device")
        elif func in MOVES and args and isinstance(args[0], torch.Tensor) and id(args[0]) not in self.known:
            moves = func is not torch.Tensor.to or "device" in kwargs or any(
                isinstance(a, (torch.device, str, torch.Tensor)) for a in args[1:]
            )
            if moves:
                self.violations.append(f"{name} of a tensor made outside the loss path (a host constant)")
        out = func(*args, **kwargs)
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.known.add(id(t))
                self.keep.append(t)
        return out
