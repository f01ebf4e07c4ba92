"""accelerate's FSDP and DeepSpeed on CPU processes (gloo), for the tests on this machine without GPUs.

accelerate picks its process type and backend from the device: its FSDP branch is taken for MULTI_GPU, MULTI_NPU, ...
types (accelerate/state.py) and a CPU launch is MULTI_CPU, so an FSDP config on a CPU machine silently runs as plain
DDP (simcse-hn warns); DeepSpeed is skipped when `cpu=True`, and without it a machine without GPUs gets no backend at
all (one process). torch's FSDP runs on CPU with gloo, and DeepSpeed has a CPU accelerator with gloo.
`allow_sharding_on_cpu()` makes accelerate's state report the multi-GPU type when FSDP is requested, and the gloo
backend when DeepSpeed is: accelerate and the Trainer then take their real FSDP / DeepSpeed code paths
(fully_shard, get_state_dict, save_fsdp_model / load_fsdp_model, the DeepSpeed engine and its checkpoints), with
every parameter partitioned under ZeRO-3 (`partition_every_parameter`). Tests only; DeepSpeed must be installed
(`pip install deepspeed`; it builds without CUDA with DS_BUILD_OPS=0; CI installs it).

scripts/sharded_cpu.py is the program that applies this and runs train.py: `accelerate launch --config_file
configs/accelerate/... scripts/sharded_cpu.py TRAIN_ARGS...`.
"""

from __future__ import annotations

import os


def requested(name: str) -> bool:
    return os.environ.get(f"ACCELERATE_USE_{name}", "false").lower() == "true"


def allow_sharding_on_cpu() -> None:
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    if getattr(PartialState, "sharding_on_cpu", False):
        return
    init, prepare_backend = PartialState.__init__, PartialState._prepare_backend

    def init_as_multi_gpu(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if requested("FSDP") and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.MULTI_GPU

    def gloo_for_deepspeed(self, cpu=False, sagemaker_dp=False, backend=None):
        chosen, distributed_type = prepare_backend(self, cpu, sagemaker_dp, backend)
        if chosen is None and requested("DEEPSPEED"):
            return "gloo", DistributedType.MULTI_CPU
        return chosen, distributed_type

    PartialState.__init__, PartialState._prepare_backend = init_as_multi_gpu, gloo_for_deepspeed
    PartialState.sharding_on_cpu = True
    partition_every_parameter()


def partition_every_parameter() -> None:
    """ZeRO-3 keeps a parameter of fewer than stage3_param_persistence_threshold elements (default 10^5) whole on
    every process: every weight of the tiny test models. Partition them all, as a real model's large ones are."""
    from accelerate.utils import DeepSpeedPlugin

    post_init = DeepSpeedPlugin.__post_init__

    def partitioning_post_init(self):
        post_init(self)
        zero = self.deepspeed_config.get("zero_optimization", {})
        if zero.get("stage") == 3:
            zero["stage3_param_persistence_threshold"] = 0

    DeepSpeedPlugin.__post_init__ = partitioning_post_init


def use_cpu() -> bool:
    """The training arguments' use_cpu: accelerate skips DeepSpeed under it."""
    return not requested("DEEPSPEED")

