"""The user-facing errors: each message is one line, which the command-line tools print as `error: ...` (exit 2).
Light on purpose (no torch, no transformers), so a tool can catch them before anything heavy is imported."""

from __future__ import annotations

import difflib
import errno
from collections.abc import Callable, Iterable


class UserError(ValueError):
    """A mistake the user can fix; the message is one line naming the field, or the file and line."""


class ConfigError(UserError):
    """A user mistake in the configuration; its message is one line naming the field."""


class DataError(UserError):
    """A problem with the user's data; the message is one line naming file and line or field."""


def did_you_mean(name: str, known: Iterable[str], shown: Callable[[str], str] = repr) -> str:
    """' (did you mean X?)' naming the known name closest to a misspelt `name` (difflib's ratio, as Python's own
    NameError hint does), or '' when none is close: the tail of a one-line error."""
    names = list(known)
    keys = {_key(candidate): candidate for candidate in names}
    close = difflib.get_close_matches(_key(name), list(keys), n=1, cutoff=0.6)
    return f" (did you mean {shown(keys[close[0]])}?)" if close else ""


def _key(name: str) -> str:
    """Flag spellings compare alike: --Learning-Rate and learning_rate."""
    return name.lstrip("-").lower().replace("-", "_")


class DiskError(UserError):
    """A write the disk refused (no space, a quota, a read-only folder): one line naming the path, what was being
    written and the last whole checkpoint."""


# errno -> how a refusal says it
DISK_ERRNOS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "the operation is not permitted",
    errno.EFBIG: "the file is too large for the file system",
}
# what torch.save's C++ writer says when a write comes short (it keeps no errno)
_TORCH_WRITE_FAILED = ("PytorchStreamWriter failed", "unexpected pos", "file write failed")


def disk_problem(error: BaseException) -> tuple[str, str | None] | None:
    """(what the disk refused, the file when known) when `error`, or an error that caused it, is a failed write of a
    full, over-quota or read-only disk; None for any other error."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in DISK_ERRNOS:
            return DISK_ERRNOS[current.errno], current.filename
        if isinstance(current, RuntimeError) and any(words in str(current) for words in _TORCH_WRITE_FAILED):
            return f"torch.save could not finish a file ({str(current).strip().splitlines()[0]})", None
        current = current.__cause__ or current.__context__
    return None
