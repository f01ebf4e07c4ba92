"""Reliability: one writer per output folder. A run holds the folder's lock (simcse_run.lock, an flock) for its whole
life, taken before anything is read or written there; a second process on the same folder (a fresh run, a resume,
another seed) is refused in one line naming the holder, and nothing of the first run's is touched. The kernel
releases the lock when its holder dies, SIGKILL included: a killed run never leaves a stale lock."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import ROOT
from test_hub import files_snapshot, train_args

from simcse_hn.cli import train
from simcse_hn.errors import ConfigError
from simcse_hn.training.output_lock import LOCK_FILE, OutputLock

HOLD = """
import sys, time
from simcse_hn.training.checkpoints import claim_output_dir
from simcse_hn.training.output_lock import OutputLock
OutputLock(sys.argv[1]).acquire()
claim_output_dir(sys.argv[1], "the-first-run")  # as a training run does once it holds the folder
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture
def holder(tmp_path):
    """Another process holding the lock of tmp_path/out, as a running training would: -> its Popen."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "out")], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    yield process
    process.kill()
    process.wait()


WAYS = {  # a second process on the same folder, each refused the same way
    "a fresh run": [],
    "a resume": ["--resume_from_checkpoint", "true"],
    "another seed": ["--seed", "43", "--overwrite_output_dir", "true"],
}


@pytest.mark.parametrize("way", list(WAYS))
def test_a_second_process_on_the_folder_is_refused_naming_the_holder(holder, tmp_path, capsys, way):
    out = tmp_path / "out"
    (out / "checkpoint-2").mkdir()  # what the running process has written so far
    (out / "checkpoint-2" / "model.safetensors").write_bytes(b"the first run's")
    before = files_snapshot(out)
    assert train.main(train_args(out, *WAYS[way])) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: output_dir: {out} is in use by another run (pid {holder.pid} on "
                          f"{socket.gethostname()}, started ")  # fmt: skip
    assert err.endswith("; wait for it to end, or choose another output_dir\n") and err.count("\n") == 1
    assert files_snapshot(out) == before  # nothing read, written or deleted


def test_a_sigkilled_holder_leaves_no_stale_lock(tmp_path):
    folder = tmp_path / "out"
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    with pytest.raises(ConfigError, match=f"pid {process.pid} on "):
        OutputLock(str(folder)).acquire()
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    lock = OutputLock(str(folder))
    lock.acquire()  # at once: the kernel released the dead process's lock
    assert f"pid {os.getpid()} on " in lock.holder()
    with pytest.raises(ConfigError, match="is in use by another run"):  # a second lock in this very process too
        OutputLock(str(folder)).acquire()
    lock.release()
    with OutputLock(str(folder)):  # released: free again
        pass


def test_a_run_holds_the_lock_for_its_whole_life_and_releases_it(tmp_path, monkeypatch):
    out = tmp_path / "out"
    seen = []
    original = train.RunBuilder.train

    def train_and_look(self):  # while training: another process cannot take the folder
        probe = subprocess.run([sys.executable, "-c", HOLD, str(out)], capture_output=True, text=True, timeout=120)
        seen.append(probe.stderr.strip().splitlines()[-1])
        return original(self)

    monkeypatch.setattr(train.RunBuilder, "train", train_and_look)
    assert train.main(train_args(out)) == 0
    assert seen and f"is in use by another run (pid {os.getpid()} on " in seen[0]
    assert (out / LOCK_FILE).is_file()  # left in place (the next holder locks the same file), and released:
    with OutputLock(str(out)):
        pass


def test_a_filesystem_without_flock_is_one_warning_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    import errno

    from simcse_hn.training import output_lock

    def no_flock(fd, operation):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(output_lock.fcntl, "flock", no_flock)
    with caplog.at_level("WARNING"):
        OutputLock(str(tmp_path / "out")).acquire()
    assert "does not lock files (Function not implemented): another process could write into it too" in caplog.text


def test_a_stale_holder_line_is_not_trusted_over_the_lock(tmp_path):
    """The holder file of a dead run says who held it last; only a held lock refuses."""
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / LOCK_FILE).write_text('{"pid": 1, "host": "gone", "started": "yesterday"}', encoding="utf-8")
    started = time.time()
    with OutputLock(str(folder)) as lock:
        assert f"pid {os.getpid()} on {socket.gethostname()}" in lock.holder()
    assert time.time() - started < 5


def test_under_a_launcher_process_0_asks_and_every_process_gives_its_answer(holder, tmp_path):
    """Two processes (torchrun): process 0 tries the lock, process 1 waits for its answer; both leave with its line,
    and neither touches the folder."""
    out = tmp_path / "out"
    before = files_snapshot(out)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    argv = [*launcher, str(ROOT / "train.py"), *train_args(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode != 0
    line = f"error: output_dir: {out} is in use by another run (pid {holder.pid} on {socket.gethostname()}, started "
    assert result.stderr.count(line) == 2, result.stderr[-3000:]
    assert files_snapshot(out) == before


FORK = """
import os, sys, time
from simcse_hn.training.output_lock import OutputLock
OutputLock(sys.argv[1]).acquire()
if os.fork() == 0:  # a child that inherits the descriptor, as a forked DataLoader worker does
    time.sleep(600)
print("held", flush=True)
time.sleep(600)
"""


def test_a_forked_child_holds_the_lock_until_it_ends_too(tmp_path):
    folder = tmp_path / "out"
    parent = subprocess.Popen([sys.executable, "-c", FORK, str(folder)], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)  # fmt: skip
    assert parent.stdout.readline().strip() == "held"
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    with pytest.raises(ConfigError, match="is in use by another run"):  # its child still holds the descriptor
        OutputLock(str(folder)).acquire()
    os.killpg(parent.pid, signal.SIGKILL)  # the child too (the same session)
    deadline = time.time() + 30
    while True:
        try:
            with OutputLock(str(folder)):
                break
        except ConfigError:
            assert time.time() < deadline, "the lock outlived every process that held it"
            time.sleep(0.1)
