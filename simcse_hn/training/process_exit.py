"""The end of a command-line process that ran collectives (issue 39's abort at exit).

gloo's native threads (`pt_gloo_runloop`, `gloo_tcp_loop`: std::threads owned by C++ ProcessGroupGloo objects) are
still running when the interpreter exits, even after `destroy_process_group()` and a garbage collection (the C++
backends are kept by C++ references; bench/results/exit_abort_before_fix.md). A std::thread still joinable when
its owner is destroyed during interpreter finalisation or static destruction calls std::terminate ("terminate called
without an active exception", exit -6), after a run that finished and saved.

`finish(code)` is the deliberate way out of such a process: everything Python would do at a normal exit that can
write something is done first (non-daemon threads joined, atexit handlers run: TensorBoard / logging flushes,
accelerate's trackers; stdout and stderr flushed), then `os._exit(code)` ends the process without interpreter
finalisation and without C++ static destructors, the step in which the joinable std::threads would be destroyed.
No barrier and no destroy_process_group here: a peer that ended with an error would leave a barrier waiting for
ever, and each process has finished its own collectives once `train.main` returned. It is called only after
`train.main` returned, i.e. after the model, card and checkpoints were written and closed,
and only where torch.distributed was initialised in this process; any other process exits the ordinary way.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading


def _distributed_was_used() -> bool:
    """This process is one of a launch (the launcher's WORLD_SIZE above 1) or initialised a process group."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        return True
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def finish(code: int) -> None:
    """Exit with `code`; in a process that used torch.distributed, without interpreter finalisation (see above)."""
    if not _distributed_was_used():
        sys.exit(code)
    main = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
