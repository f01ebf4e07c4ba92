"""accelerate's FSDP on CPU processes (gloo), for the tests on this GPU-less machine.

accelerate turns FSDP on only for accelerator process types: AcceleratorState takes its FSDP branch for MULTI_GPU,
MULTI_NPU, MULTI_XPU, ... (accelerate/state.py), and a CPU launch is MULTI_CPU, so an FSDP config on a CPU machine
silently runs as plain DDP (simcse-hn warns). torch's FSDP itself runs on CPU with gloo. `allow_fsdp_on_cpu()` makes
accelerate's state report the multi-GPU type when FSDP is requested, while the device stays the CPU and the process
group gloo: accelerate and the Trainer then take their real FSDP code paths (fully_shard, get_state_dict,
save_fsdp_model / load_fsdp_model, the sharded optimizer). Tests only.

`python tests/fsdp_cpu.py TRAIN_ARGS...`, started by `accelerate launch --config_file configs/accelerate/fsdp.yaml`:
train.py under FSDP.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def allow_fsdp_on_cpu() -> None:
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    init = PartialState.__init__
    if getattr(init, "fsdp_on_cpu", False):
        return

    def init_as_multi_gpu(self, *args, **kwargs):
        init(self, *args, **kwargs)
        fsdp = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
        if fsdp and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.MULTI_GPU

    init_as_multi_gpu.fsdp_on_cpu = True
    PartialState.__init__ = init_as_multi_gpu


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # train.py and simcse_hn, from any folder
    allow_fsdp_on_cpu()
    import train

    sys.exit(train.main(sys.argv[1:]))
