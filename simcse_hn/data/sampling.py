"""Batches in which no text appears twice (sentence-transformers' NoDuplicatesBatchSampler, as an index sampler).

A text that appears twice in a batch is its own in-batch negative: for a pair (a, p) whose positive p is also another
example's anchor or positive, the loss pushes p away from a copy of itself. `NoDuplicatesSampler` orders the dataset
so that every window of `window` consecutive indices (one gathered batch: per-device batch x processes, which
accelerate deals out to the processes batch by batch) holds distinct texts, across all columns. It is a plain index
sampler: the DataLoader batches it, accelerate shards its batches, and the Trainer skips batches on resume as usual.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Sampler

logger = logging.getLogger(__name__)

EXTRA_PASSES = 2  # reshuffled passes when one pass leaves too few windows (as sentence-transformers)


class NoDuplicatesSampler(Sampler[int]):
    """rows: one tuple of texts per example (its column values). Yields len(self) indices in windows of `window`
    distinct texts.

    The order depends only on `seed` and the epoch (`set_epoch`): every process draws the same one. Each window is
    filled greedily from a shuffled pass, an example that would repeat a text of the window waiting for the next
    (sentence-transformers' rule). drop_last True: floor(n / window) full windows; when one pass leaves too few
    (many duplicates), further reshuffled passes supply the rest (their examples repeat earlier ones of the epoch),
    and a window that cannot be filled without a repeat even then is filled anyway; both with a warning.
    drop_last False: every example once, the pass's windows first, then what it could not place (those windows may
    repeat a text).
    """

    def __init__(self, rows: Sequence[tuple[str, ...]], window: int, seed: int = 0, drop_last: bool = True):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        ids: dict[str, int] = {}
        self.rows = [tuple({ids.setdefault(text, len(ids)) for text in row}) for row in rows]  # texts -> int ids
        self.window = window
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        n = len(self.rows)
        return n if not self.drop_last else n // self.window * self.window

    def __iter__(self) -> Iterator[int]:
        return iter(self.epoch_order())

    def epoch_order(self) -> list[int]:
        """The indices of this epoch, in order (len(self) of them)."""
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        n, full = len(self.rows), len(self.rows) // self.window
        windows, leftover = self._one_pass(torch.randperm(n, generator=generator).tolist(), full)
        if not self.drop_last:  # every example once: what one pass cannot place follows its windows
            return [index for w in windows for index in w] + leftover
        first = len(windows)
        for _ in range(EXTRA_PASSES):
            if len(windows) >= full:
                break
            windows += self._one_pass(torch.randperm(n, generator=generator).tolist(), full - len(windows))[0]
        if len(windows) > first:
            logger.warning("no-duplicates batches: %d of %d batches of %d came from reshuffled passes (repeats)",
                           len(windows) - first, full, self.window)
        missing = full - len(windows)
        if missing > 0:
            logger.warning("no-duplicates batches: %d of %d batches of %d hold a repeated text (too few distinct "
                           "texts for this batch size)", missing, full, self.window)
            filler = torch.randperm(n, generator=generator).tolist()
            windows += [[filler[(i * self.window + j) % n] for j in range(self.window)] for i in range(missing)]
        return [index for w in windows for index in w]

    def _one_pass(self, permutation: list[int], wanted: int) -> tuple[list[list[int]], list[int]]:
        """Up to `wanted` full windows of distinct texts from `permutation`, and the indices left over.

        Each window scans the remaining indices from the front and takes those that add no text it already holds;
        the others stay, in order, for the next window. The remaining indices are a linked list over the positions
        of `permutation` (as sentence-transformers'), so a window costs its own scan, not a copy of what remains."""
        n = len(permutation)
        following = list(range(1, n + 1))  # position -> next remaining position, -1 at the end
        if n:
            following[-1] = -1
        head, windows = (0 if n else -1), []
        while head != -1 and len(windows) < wanted:
            taken, seen, previous, position = [], set(), -1, head
            while position != -1:
                index, after = permutation[position], following[position]
                if seen.isdisjoint(self.rows[index]):
                    taken.append(index)
                    seen.update(self.rows[index])
                    if previous == -1:
                        head = after
                    else:
                        following[previous] = after
                    if len(taken) == self.window:
                        break
                else:
                    previous = position
                position = after
            if len(taken) < self.window:  # no further window can be completed from this pass
                return windows, taken + self._walk(permutation, following, head)
            windows.append(taken)
        return windows, self._walk(permutation, following, head)

    @staticmethod
    def _walk(permutation: list[int], following: list[int], head: int) -> list[int]:
        out = []
        while head != -1:
            out.append(permutation[head])
            head = following[head]
        return out
