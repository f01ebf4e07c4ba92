"""The user-facing errors: each message is one line, which the command-line tools print as `error: ...` (exit 2).
Light on purpose (no torch, no transformers), so a tool can catch them before anything heavy is imported."""

from __future__ import annotations

import difflib
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
