"""simcse_hn.training.process_exit.finish: the exit of a launched process (issue 39)."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

PROGRAM = """
import atexit, sys, threading, time
from simcse_hn.training.process_exit import finish
atexit.register(lambda: print("atexit ran", flush=True))
t = threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined", flush=True)))
t.start()
sys.stdout.write("buffered, not flushed")
finish(int(sys.argv[1]))
print("not reached")
"""


def run(code: int, world_size: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT), "WORLD_SIZE": world_size, "PATH": ""}
    return subprocess.run([sys.executable, "-c", PROGRAM, str(code)], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_a_launched_process_leaves_by_os_exit_after_everything_is_written():
    for code in (0, 2):
        result = run(code, "2")
        assert result.returncode == code
        assert "thread joined" in result.stdout and "atexit ran" in result.stdout
        assert "buffered, not flushed" in result.stdout and "not reached" not in result.stdout


def test_a_single_process_exits_the_ordinary_way():
    result = run(3, "1")
    assert result.returncode == 3 and "atexit ran" in result.stdout and "not reached" not in result.stdout
