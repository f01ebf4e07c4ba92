"""The user-facing errors: each message is one line, which the command-line tools print as `error: ...` (exit 2).
Light on purpose (no torch, no transformers), so a tool can catch them before anything heavy is imported."""

from __future__ import annotations


class UserError(ValueError):
    """A mistake the user can fix; the message is one line naming the field, or the file and line."""


class ConfigError(UserError):
    """A user mistake in the configuration; its message is one line naming the field."""


class DataError(UserError):
    """A problem with the user's data; the message is one line naming file and line or field."""
