"""A training batch's tokens without padding: the encoder's linear layers, norms and dropouts run on the batch's own
tokens only (one (1, N) sequence of the rows' tokens, N = the tokens the attention mask keeps), and attention runs
row by row in length groups (`length_groups_of`), each group cut to its longest row. On a CPU the encoder's dropouts
draw uniform masks (`fast_dropout`) while a packed forward runs.

On the 2-core CPU at batch 64 and max length 32 (MiniLM), length groups alone left 6.3 % of the positions padding and
ran each layer's products once per group, each parameter's gradient summed over the groups; packed, the products run
once per layer on the tokens alone (bench/results/train_throughput_versus*.md measures both).

Only for encoders known to compute each token from its own position and the attention alone (`packs`): BERT's
family, where `position_ids` are the positions within each row and the attention is the model's registered
attention function (transformers' AttentionInterface). The embeddings are the padded forward's up to float rounding
(tests/test_packing.py holds them to it); with dropout on, the draws differ from a padded forward's, equally random
and equally seeded.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers import AttentionInterface, PreTrainedModel

from simcse_hn.modeling.batching import length_groups_of

PACKED_ATTENTION = "simcse_hn_packed"
PACKED_MODEL_TYPES = ("bert",)  # absolute positions 0.., token types, attention through AttentionInterface


@dataclass
class Packing:
    """Where each row's tokens lie in the packed sequence, rows in length order (longest first), and the padded
    layout of its attention groups.

    order (B,): the batch's row at each packed row; starts (B,), lengths (B,): each packed row's span of the N
    tokens; tokens (N,): each kept token's flat index in the (B, T) batch. The attention's padded layout: `gather`
    (P,) the token at each of the groups' positions, group by group, row by row (positions past a row's end repeat its
    last token); `shapes` [(b, w)] and `biases` [(b, 1, 1, w)] per group (0 on a row's keys, the dtype's least value
    on its padding); `keep` (N,) where each token is in it."""

    order: Tensor
    starts: Tensor
    lengths: Tensor
    tokens: Tensor
    gather: Tensor
    shapes: list[tuple[int, int]]
    biases: list[Tensor]
    keep: Tensor


_PLAN: contextvars.ContextVar[Packing | None] = contextvars.ContextVar("simcse_hn_packing", default=None)


def packs(encoder) -> bool:
    """Whether `encoder` can run packed: a plain transformers model of a type in PACKED_MODEL_TYPES, not
    checkpointing its layers (a recomputed layer would run after the packing plan is gone)."""
    return (
        isinstance(encoder, PreTrainedModel)
        and getattr(encoder.config, "model_type", None) in PACKED_MODEL_TYPES
        and not getattr(encoder.config, "is_decoder", False)
        and not _checkpointing(encoder)
        and hasattr(type(encoder.config), "_attn_implementation")
    )


def _checkpointing(encoder) -> bool:
    """Whether the encoder recomputes its layers in the backward (transformers 5 names it is_activation_checkpointing,
    before it is_gradient_checkpointing)."""
    if hasattr(type(encoder), "is_activation_checkpointing"):
        return bool(encoder.is_activation_checkpointing)
    return bool(getattr(encoder, "is_gradient_checkpointing", False))


def plan_packing(attention_mask: Tensor, groups: int) -> Packing | None:
    """The packing of a right-padded batch (every row's tokens first), attention in `groups` length groups; None
    where a row has holes or starts with padding (left padding), or the batch has no padding to save. A few host
    reads (the mask's shape check, the groups' widths, the kept positions): packing is a CPU default, where they cost
    nothing. attention_mask (B, T) -> Packing"""
    mask = attention_mask.bool()
    lengths = mask.sum(dim=1)  # (B,)
    columns = mask.shape[1]
    prefix = torch.arange(columns, device=mask.device) < lengths[:, None]  # (B, T) the mask a right-padded row has
    if not torch.equal(prefix, mask) or bool((lengths == 0).any()):
        return None
    if bool(mask.all()):
        return None
    split = length_groups_of(attention_mask, max(groups, 1), min_saving=0.0)
    parts = split if split is not None else [(torch.sort(lengths, descending=True, stable=True).indices, columns)]
    order = torch.cat([rows for rows, _ in parts])  # (B,)
    sorted_lengths = lengths[order]
    starts = torch.cumsum(sorted_lengths, 0) - sorted_lengths  # (B,)
    tokens = (order[:, None] * columns + torch.arange(columns, device=mask.device))[mask[order]]  # (N,)
    gathers, shapes, keys, first = [], [], [], 0
    for rows, width in parts:
        count = rows.numel()
        offsets = torch.arange(width, device=mask.device)  # (w,)
        row_lengths = sorted_lengths[first : first + count, None]  # (b, 1)
        keys.append(offsets < row_lengths)  # (b, w)
        gathers.append((starts[first : first + count, None] + torch.minimum(offsets, row_lengths - 1)).reshape(-1))
        shapes.append((count, width))
        first += count
    keep = torch.cat([k.reshape(-1) for k in keys]).nonzero().squeeze(1)  # (N,) one host read
    least = torch.finfo(torch.float32).min  # -inf in a narrower dtype: every row keeps a key, softmax stays finite
    biases = [torch.zeros(k.shape, device=k.device).masked_fill_(~k, least)[:, None, None] for k in keys]  # float32
    return Packing(order, starts, sorted_lengths, tokens, torch.cat(gathers), shapes, biases, keep)


def packed_attention(
    module, query: Tensor, key: Tensor, value: Tensor, attention_mask, dropout: float = 0.0, scaling=None, **kwargs
) -> tuple[Tensor, None]:
    """The attention of packed rows, one length group at a time (registered as PACKED_ATTENTION).
    query, key, value (1, heads, N, d) -> ((1, N, heads, d), None)"""
    plan = _PLAN.get()
    if plan is None:
        raise RuntimeError(f"{PACKED_ATTENTION} attention runs only inside simcse_hn.modeling.packing.packed()")
    sizes = [rows * width for rows, width in plan.shapes]
    padded = [x[0].transpose(0, 1).index_select(0, plan.gather).split(sizes) for x in (query, key, value)]
    pieces = []
    for (rows, width), bias, *qkv in zip(plan.shapes, plan.biases, *padded):  # each (b w, heads, d)
        q, k, v = (x.view(rows, width, *x.shape[1:]).transpose(1, 2) for x in qkv)  # (b, heads, w, d)
        heads, size = q.shape[1], q.shape[-1]
        bias = bias.to(q.dtype).expand(rows, heads, 1, width).reshape(rows * heads, 1, width)
        keys_t = k.reshape(-1, width, size).transpose(1, 2)  # (b heads, d, w)
        scale = size**-0.5 if scaling is None else scaling
        scores = torch.baddbmm(bias, q.reshape(-1, width, size), keys_t, alpha=scale)  # (b heads, w, w)
        probs = fast_dropout(scores.softmax(dim=-1), dropout) if dropout > 0 else scores.softmax(dim=-1)
        out = torch.bmm(probs, v.reshape(-1, width, size)).view(rows, heads, width, size)
        pieces.append(out.transpose(1, 2).reshape(rows * width, heads, size))
    return torch.cat(pieces).index_select(0, plan.keep).unsqueeze(0), None


AttentionInterface.register(PACKED_ATTENTION, packed_attention)


def fast_dropout(x: Tensor, p: float) -> Tensor:
    """Dropout (each entry zeroed with probability p, the rest scaled by 1 / (1 - p)) from uniform draws, where
    torch's CPU dropout draws Bernoulli ones: 1.8x faster on the 2-core CPU (a (3000, 384) tensor: 6.2 ms against
    11.3 ms), equally random, from the same generator."""
    return x * torch.rand_like(x).ge_(p).div_(1 - p)


def _dropout_forward(module: nn.Dropout):
    return lambda x: fast_dropout(x, module.p) if module.training and module.p > 0 else x


@contextlib.contextmanager
def packed(encoder, plan: Packing):
    """The encoder's attention runs `plan`'s packed rows while the block runs; on a CPU its dropouts draw
    `fast_dropout`'s uniform masks."""
    config = encoder.config
    previous = config._attn_implementation
    token = _PLAN.set(plan)
    config._attn_implementation = PACKED_ATTENTION
    dropouts = [m for m in encoder.modules() if type(m) is nn.Dropout] if plan.tokens.device.type == "cpu" else []
    for module in dropouts:
        module.forward = _dropout_forward(module)
    try:
        yield
    finally:
        for module in dropouts:
            del module.forward
        config._attn_implementation = previous
        _PLAN.reset(token)


def pack_inputs(plan: Packing, input_ids: Tensor, token_type_ids: Tensor | None) -> dict[str, Tensor]:
    """The encoder's inputs for the packed sequence: ids, each token's position within its row, token types.
    (B, T) -> {name: (1, N)}"""
    columns = input_ids.shape[1]
    inputs = {
        "input_ids": input_ids.reshape(-1)[plan.tokens].unsqueeze(0),
        "position_ids": (plan.tokens % columns).unsqueeze(0),
    }
    if token_type_ids is not None:
        inputs["token_type_ids"] = token_type_ids.reshape(-1)[plan.tokens].unsqueeze(0)
    return inputs


def row_of_each_token(plan: Packing) -> Tensor:
    """The packed row of each of the N tokens. -> (N,)"""
    return torch.repeat_interleave(torch.arange(plan.lengths.numel(), device=plan.lengths.device), plan.lengths)


def pool_packed(hidden: Tensor, plan: Packing, pooler: str, token_rows: Tensor) -> Tensor:
    """A pooler over packed hidden states, rows in packed order. hidden (N, H) -> (B, H)"""
    if pooler in ("cls", "cls_before_pooler"):
        return hidden[plan.starts]
    if pooler == "last":
        return hidden[plan.starts + plan.lengths - 1]
    sums = hidden.new_zeros(plan.lengths.numel(), hidden.shape[-1]).index_add(0, token_rows, hidden)  # (B, H)
    return sums / plan.lengths[:, None].to(hidden.dtype)
