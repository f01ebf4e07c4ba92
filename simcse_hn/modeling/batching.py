"""Batching helpers for encoding: batches by token length (`token_length_order`, `restore_order`), run on threads
(`map_batches`), and the length groups of a training batch (`length_groups_of`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence, Sized
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

from simcse_hn.progress import progress

logger = logging.getLogger(__name__)


ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def map_batches(
    fn,
    batches: Iterable,
    device=None,
    show_progress_bar: bool | str = False,
    desc: str = "encoding",
    total: int | None = None,
) -> list:
    """[fn(batch) for batch in batches], in order. On a CPU where torch runs n > 1 intra-op threads, the batches go to
    n Python threads with one intra-op thread each (the caller's thread count is restored after), so that no core
    waits at the end of every small kernel for the others. On the idle 2-core machine this made the STS suite on
    MiniLM 1.07x faster than one batch after the other, at 1.9x the peak memory added (bench/results/eval_speed.md;
    1.10x in eval_speed_593ac27.md, 1.23x on the host of eval_speed_8949230.md). `fn` must be safe to call from
    several threads at once: a module's forward under inference mode is; a tokenizer is not, so callers tokenise
    before, or in `batches`: an iterator is drawn in the caller's thread while the first batches already run
    (tokenising overlaps encoding). `total`: how many batches an iterator yields (for the progress bar). `device`
    None: one batch after the other. `show_progress_bar`: a text names the bar (what is encoded, for what), else
    `desc` does; a bar only where it can be watched, a line in a log file (simcse_hn.progress)."""
    label = show_progress_bar if isinstance(show_progress_bar, str) else desc
    threads = torch.get_num_threads()
    total = len(batches) if isinstance(batches, Sized) else total
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        threads = 1  # a sharded module's forward runs collectives, which must come in the same order on every rank
    if device is None or torch.device(device).type != "cpu" or threads < 2 or (total is not None and total < 2):
        iterator = progress(batches, label, total) if show_progress_bar else batches
        return [fn(batch) for batch in iterator]
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="simcse-hn-encode") as pool:
            results = pool.map(fn, batches)  # submits each batch as `batches` yields it
            if show_progress_bar:
                results = progress(results, label, total)
            return list(results)
    finally:
        torch.set_num_threads(threads)


def token_length_order(
    tokenizer, sentences: list[str], batch_size: int, max_length: int | None = None
) -> tuple[dict, list[list[int]]]:
    """Tokenise `sentences` once (truncated to `max_length`, no padding) and group them in batches of at most
    `batch_size` by token count, longest first (`length_cuts`). -> (the tokenizer's output, lists of int per
    sentence; batches of indices)"""
    encoded = tokenizer(sentences, truncation=True, max_length=max_length)
    order = sorted(range(len(sentences)), key=lambda i: -len(encoded["input_ids"][i]))
    cuts = length_cuts([len(encoded["input_ids"][i]) for i in order], batch_size)
    return encoded, [order[start:end] for start, end in cuts]


def length_cuts(lengths: Sequence[int], batch_size: int) -> list[tuple[int, int]]:
    """Batches of rows sorted by length, longest first: at most `batch_size` rows each, a batch closed early where
    the length drops once it holds a quarter of `batch_size` (its padding is its first row's length less each
    row's). On the STS suite (MiniLM, batches of 128) this computes 0.6 % padding where batches of exactly 128 rows
    computed 3.8 %, in 261 batches instead of 205. -> [(start, end)]"""
    cuts, start, least = [], 0, max(1, batch_size // 4)
    while start < len(lengths):
        end = min(start + batch_size, len(lengths))
        drop = start + least
        while drop < end and lengths[drop] == lengths[start]:
            drop += 1
        end = drop if drop < end else end
        cuts.append((start, end))
        start = end
    return cuts


def restore_order(embeddings: Tensor, order: Sequence[int]) -> Tensor:
    """Rows computed in `order` (row k is sentence order[k]) put back in the caller's order. (n, D) -> (n, D)"""
    out = torch.empty_like(embeddings)
    out[torch.as_tensor(order, dtype=torch.long)] = embeddings
    return out


MIN_GROUP_ROWS = 8  # a length group has at least this many rows: smaller matrix products lose more than padding


def length_groups_of(attention_mask: Tensor, groups: int, min_saving: float = 0.1) -> list[tuple[Tensor, int]] | None:
    """The batch's rows sorted by length, longest first (stable), split into `groups` nearly equal parts (fewer
    where a part would have under MIN_GROUP_ROWS rows), each with its width: the last column any of its rows
    attends to, + 1. Only trailing columns are cut (right padding): a left-padded batch keeps its columns, and
    positions never move. None when one forward is as good: fewer than 2 parts, or the parts would compute under
    `min_saving` fewer positions than the padded batch. One host synchronisation (the widths).
    attention_mask (B, T) -> [(row indices (b,), width)] or None"""
    rows, columns = attention_mask.shape
    groups = min(groups, rows // MIN_GROUP_ROWS)
    if groups < 2:
        return None
    positions = torch.arange(1, columns + 1, device=attention_mask.device)  # (T,)
    lengths = torch.where(attention_mask.bool(), positions, 0).amax(dim=1)  # (B,) last attended column + 1
    sorted_lengths, order = torch.sort(lengths, descending=True, stable=True)
    parts = torch.tensor_split(order, groups)
    starts = [0]
    for part in parts[:-1]:
        starts.append(starts[-1] + part.numel())
    widths = [max(1, width) for width in sorted_lengths[starts].tolist()]  # each part's first row is its longest
    computed = sum(part.numel() * width for part, width in zip(parts, widths))
    if computed > (1 - min_saving) * rows * columns:
        return None
    return list(zip(parts, widths))
