"""One writer per output folder: a run holds an exclusive `flock` on `<output_dir>/simcse_run.lock` (LOCK_FILE) for
its whole life, taken before it writes or reads anything else in the folder. The kernel releases the lock when the
holder's last descriptor closes: when it exits, and when it is killed (SIGKILL included), so a dead run never leaves
a stale lock. A second process on the same folder (a fresh run, a resume, another seed) is refused in one line
naming the holder (pid, host, start time), which the holder writes into the lock file.

`fcntl.flock` rather than `filelock`: filelock falls back to a marker file where the filesystem has no flock, which
a SIGKILL leaves behind; here a filesystem without flock is said in one warning, and the run goes on unguarded.
Shared filesystems: docs/reliability.md ("One writer per folder")."""

from __future__ import annotations

import datetime
import errno
import json
import logging
import os
import socket

from simcse_hn.errors import ConfigError

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

LOCK_FILE = "simcse_run.lock"
# errors that mean "this filesystem does not lock" (Lustre without -o flock: ENOSYS; some NFS setups: ENOLCK)
_NO_FLOCK = (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL)


class OutputLock:
    """The lock of one output folder, held from `acquire` to `release` (or the process's end)."""

    def __init__(self, output_dir: str):
        self.output_dir = output_dir
        self.path = os.path.join(output_dir, LOCK_FILE)
        self.fd: int | None = None

    def acquire(self) -> None:
        """Create the folder if needed and take its lock, or raise ConfigError (one line) naming the holder. On a
        filesystem without flock: a warning, and no lock."""
        try:
            os.makedirs(self.output_dir, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(
                f"output_dir: cannot write {self.output_dir} ({type(e).__name__}: {e.strerror or e})"
            ) from None
        if fcntl is None:
            os.close(fd)
            logger.warning(
                "output_dir: no flock on this platform: another process could write into %s too", self.output_dir
            )
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ConfigError(
                    f"output_dir: {self.output_dir} is in use by another run ({self.holder()}); wait "
                    "for it to end, or choose another output_dir"
                ) from None
            if e.errno in _NO_FLOCK:
                logger.warning(
                    "output_dir: the filesystem of %s does not lock files (%s): another process could "
                    "write into it too",
                    self.output_dir,
                    e.strerror,
                )
                return
            raise
        self.fd = fd
        started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": started}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)

    def holder(self) -> str:
        """Who holds the lock, as the holder wrote it: 'pid 123 on node-1, started 2025-...'."""
        try:
            with open(self.path, encoding="utf-8") as f:
                holder = json.load(f)
            return f"pid {holder['pid']} on {holder['host']}, started {holder['started']}"
        except (OSError, ValueError, KeyError, TypeError):
            return f"a process that holds {LOCK_FILE} and has not said who it is yet"

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
