"""train.py under accelerate's FSDP or DeepSpeed on CPU processes (gloo), for the tests and benches on a machine
without GPUs: `accelerate launch --config_file configs/accelerate/... scripts/sharded_cpu.py TRAIN_ARGS...`
(simcse_hn/testing/sharded_cpu.py says why accelerate needs a nudge for that)."""

import sys

from simcse_hn.testing.sharded_cpu import allow_sharding_on_cpu, use_cpu

allow_sharding_on_cpu()  # before the first Accelerator

from simcse_hn.cli import train  # noqa: E402
from simcse_hn.training.process_exit import finish  # noqa: E402

if __name__ == "__main__":
    if not use_cpu():  # train.py adds --use_cpu true under a launcher without GPUs
        train._cpu_fallback = lambda argv: list(argv)
    finish(train.main(sys.argv[1:]))  # see simcse_hn/training/process_exit.py
