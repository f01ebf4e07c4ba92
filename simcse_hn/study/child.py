"""`python -m simcse_hn.study.child RUNNER_PID MODULE ARGS...`: `python -m MODULE ARGS...` in a process that dies with
the study's runner that started it, so that no trainer outlives its runner and trains on beside the next one.

On Linux the kernel sends it SIGKILL when the runner's thread that started it ends, however it ends (`kill -9`
included: PR_SET_PDEATHSIG, kept across the module's run); where the runner is already gone when that is set up, it
stops at once. The runner also hands it the run's lock (runs.held), which it then holds as long as it lives: on a
system without PR_SET_PDEATHSIG a trainer that outlives its runner still keeps every other runner off its folder."""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with(runner: int) -> None:
    """SIGKILL when the runner ends (Linux); exit now when it has ended already (this process was handed on)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != runner:
        os._exit(3)


def main() -> None:
    runner, module, *args = sys.argv[1:]
    die_with(int(runner))
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
