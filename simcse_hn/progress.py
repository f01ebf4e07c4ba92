"""Progress bars where someone watches them, one line where a bar would be debris.

A bar redraws itself with carriage returns, and a nested one with cursor-up escapes (`\r`, `\x1b[A`): in a terminal
or a notebook that is a bar; in a log file it is debris. `live()` says which of the two stderr is, and
`progress(items, label)` is tqdm's bar named `label` where it is live, else one log line saying what the wait is
for. The Trainer's own bars follow the same rule through `disable_tqdm` (configuration.training_arguments). tqdm's
environment variables (TQDM_DISABLE=1, TQDM_MININTERVAL=30, ...) apply to every bar shown."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable

from tqdm.auto import tqdm

logger = logging.getLogger(__name__)


def live() -> bool:
    """Whether a bar can redraw itself where it is shown: stderr is a terminal, or this is a notebook (tqdm.auto's
    widget)."""
    return sys.stderr.isatty() or any(cls.__module__ == "tqdm.notebook" for cls in tqdm.__mro__)


def progress(batches: Iterable, label: str, total: int | None = None) -> Iterable:
    """`batches`, with a bar named `label` (what the wait is for: 'encoding all-MiniLM-L6-v2') where it is live;
    else with a log line naming it and its size."""
    if live():
        return tqdm(batches, desc=label, total=total, unit="batch")
    logger.info("%s: %s batches", label, "a number of" if total is None else total)
    return batches
