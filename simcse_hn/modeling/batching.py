"""Batching helpers for encoding: batches by token length (`iter_prepared_batches`, `token_length_order`,
`restore_order`), run on threads (`map_batches`), and the length groups of a training batch (`length_groups_of`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
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


def trim_padding(features: dict, rows: Tensor, width: int, side: str, group: int, padded: int) -> dict:
    """The features of `rows` of a batch of `group` texts padded to `padded` positions, cut to `width` positions on
    the padding `side`: what the tokenizer gives for those rows alone when `width` is their longest. A tensor is
    (group, padded, ...) -> (len(rows), width, ...) or (group, ...) -> (len(rows), ...); anything else is shared."""
    out = {}
    for key, value in features.items():
        if isinstance(value, Tensor) and value.dim() >= 2 and value.shape[:2] == (group, padded):
            value = value[rows]
            out[key] = value[:, :width] if side == "right" else value[:, padded - width :]
        elif isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == group:
            out[key] = value[rows]
        else:
            out[key] = value
    return out


def _padding_side(mask: Tensor, lengths: Tensor) -> str | None:
    """'right' or 'left' when every row of an attention mask (B, T) is its real tokens on one side and padding on the
    other; None otherwise (a mask with holes, a packed batch), so that the features are not cut."""
    positions = torch.arange(mask.shape[1])  # (T,)
    if torch.equal(mask.bool(), positions < lengths[:, None]):
        return "right"
    if torch.equal(mask.bool(), positions >= mask.shape[1] - lengths[:, None]):
        return "left"
    return None


def iter_prepared_batches(
    prepare: Callable[[list[str]], dict],
    sentences: list[str],
    batch_size: int,
    group_size: int = 4096,
    copies: dict[int, int] | None = None,
) -> Iterator[tuple[list[int], dict]]:
    """Features for batches of equal token length, each text tokenised once by the model's own `prepare` (e.g. a
    SentenceTransformer's `preprocess`), one batch at a time. -> (the sentence index of each row, features) per batch

    Texts go to `prepare` in groups of about `group_size` (whole batches; the first group two batches, so that
    the first batches do not wait for a whole group's tokens), taken in order of character count; within
    a group the rows are sorted by their token count (the attention mask) and cut into batches (`length_cuts`),
    each cut to its own longest row. A cut batch is what `prepare` gives for those texts alone, since padding only
    fills the positions after (or before) each row's tokens. A group whose features cannot be cut (no attention mask,
    or one with holes) is prepared again batch by batch, in the order of character count.

    On the STS suite (26,126 distinct sentences, MiniLM) this tokenises in about half the time of a token-count pass
    followed by `preprocess` per batch. Batches of 128 compute 0.6 % padding (3.8 % in batches of exactly 128 rows,
    before `length_cuts`); groups of 256 would leave more, one group of everything a little less at a 1.5x slower
    tokenisation.

    With `copies` (a dict the caller passes and reads after), a text whose token ids equal an earlier one's in its
    group (e.g. "The cat" and "the cat" under an uncased tokenizer) is not batched again: copies[its index] = the
    index of the text it equals, so that both get one embedding and their cosines tie exactly, as they do in exact
    arithmetic (bench/eval_speed.py's same-scores check).
    """
    by_chars = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))
    group_size = max(group_size // batch_size, 1) * batch_size
    first = min(2 * batch_size, group_size)  # a small first group: the first batches start without waiting
    starts = [*range(0, min(first, len(by_chars)), first), *range(first, len(by_chars), group_size)]
    for group_start, group_end in zip(starts, [*starts[1:], len(by_chars)]):
        indices = by_chars[group_start:group_end]
        features = prepare([sentences[i] for i in indices])
        mask = features.get("attention_mask")
        side = None
        if isinstance(mask, Tensor) and mask.dim() == 2 and mask.shape[0] == len(indices):
            lengths = mask.sum(dim=1)  # (g,)
            side = _padding_side(mask, lengths)
        if side is None:
            for k in range(0, len(indices), batch_size):
                yield indices[k : k + batch_size], prepare([sentences[i] for i in indices[k : k + batch_size]])
            continue
        rows = torch.sort(lengths, descending=True, stable=True).indices  # (g,)
        if copies is not None and isinstance(features.get("input_ids"), Tensor):
            rows = _first_of_equal_rows(features["input_ids"], rows, indices, copies)
        for start, end in length_cuts(lengths[rows].tolist(), batch_size):
            batch = rows[start:end]
            width = int(lengths[batch].max())
            cut = trim_padding(features, batch, width, side, len(indices), mask.shape[1])
            yield [indices[r] for r in batch.tolist()], cut


def _first_of_equal_rows(input_ids: Tensor, rows: Tensor, indices: list[int], copies: dict[int, int]) -> Tensor:
    """`rows` without those whose padded token ids (g, T) repeat an earlier kept row's; each dropped row's sentence
    index is mapped to the kept one's in `copies`. -> the kept rows, in order"""
    first: dict[tuple, int] = {}
    kept = []
    ids = input_ids.tolist()
    for row in rows.tolist():
        key = tuple(ids[row])
        if key in first:
            copies[indices[row]] = indices[first[key]]
        else:
            first[key] = row
            kept.append(row)
    return torch.tensor(kept, dtype=torch.long)


def place_rows(computed: Tensor, order: Sequence[int], copies: dict[int, int], count: int) -> Tensor:
    """The rows of `iter_prepared_batches`' batches put back in the caller's order: row k of `computed` is sentence
    order[k], and each sentence in `copies` gets the row of the sentence it equals. (m, D) -> (count, D)"""
    out = computed.new_empty(count, computed.shape[1])
    out[torch.as_tensor(order, dtype=torch.long)] = computed
    if copies:
        out[list(copies)] = out[list(copies.values())]
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
