"""Packed training forwards (simcse_hn.modeling.packing): a BERT encoder's length groups run on the batch's tokens
alone, with the padded forward's embeddings and gradients; where packing does not apply, the groups or one forward
run as before; the CPU dropout that packing uses is a dropout."""

from __future__ import annotations

import pytest
import torch
from test_length_groups import forward_and_gradients
from torch import nn

from simcse_hn.modeling import packing
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.testing.models import build_tiny_bert, build_tiny_llama

# lengths from 2 to ~40 characters; rows 4 and 9 equal (SimCSE's batches hold each sentence twice)
SENTENCES = [("word " * (1 + (7 * i) % 9)).strip() + f" {i % 30}" for i in range(34)]


def batch_of(tokenizer, sentences=SENTENCES):
    return dict(tokenizer(sentences, padding=True, return_tensors="pt"))


def encoder_calls(encoder) -> list[dict]:
    calls: list[dict] = []
    encoder.register_forward_hook(lambda module, args, kwargs, out: calls.append(kwargs), with_kwargs=True)
    return calls


@pytest.mark.parametrize("pooler", ["cls", "avg", "avg_first_last", "avg_top2", "cls_before_pooler", "last"])
def test_packed_forward_gives_the_padded_embeddings_and_gradients(pooler):
    """float64, dropout off: embeddings, head inputs and every gradient equal one padded forward's up to rounding
    (a key bias's gradient is zero in exact arithmetic: softmax ignores a shift shared by all keys)."""
    encoder, tokenizer = build_tiny_bert(seed=0, dropout=0.0)
    model = SimCSEModel(encoder, pooler=pooler).double().train()
    calls = encoder_calls(encoder)
    batch = batch_of(tokenizer)
    (one, one_grads), (packed, packed_grads) = [forward_and_gradients(model, batch, groups) for groups in (1, 4)]
    tokens = int(batch["attention_mask"].sum())
    assert calls[1]["input_ids"].shape == (1, tokens)  # the packed path ran: one row of the batch's own tokens
    torch.testing.assert_close(packed.embeddings, one.embeddings, rtol=0, atol=1e-12)
    if pooler == "cls":
        torch.testing.assert_close(packed.head_inputs, one.head_inputs, rtol=0, atol=1e-12)
    assert packed_grads.keys() == one_grads.keys()
    for name, grad in one_grads.items():
        atol = 1e-9 if "key.bias" in name else 1e-11
        torch.testing.assert_close(packed_grads[name], grad, rtol=0, atol=atol, msg=name)


def test_the_plan_keeps_each_rows_tokens_and_positions():
    encoder, tokenizer = build_tiny_bert(seed=0, dropout=0.0)
    batch = batch_of(tokenizer)
    mask = batch["attention_mask"]
    plan = packing.plan_packing(mask, groups=4)
    assert plan is not None and len(plan.shapes) == 4
    inputs = packing.pack_inputs(plan, batch["input_ids"], batch["token_type_ids"])
    lengths = mask.sum(dim=1)
    for packed_row, row in enumerate(plan.order.tolist()):
        start, length = int(plan.starts[packed_row]), int(lengths[row])
        assert int(plan.lengths[packed_row]) == length
        span = slice(start, start + length)
        assert inputs["input_ids"][0, span].tolist() == batch["input_ids"][row, :length].tolist()
        assert inputs["position_ids"][0, span].tolist() == list(range(length))
    assert [lengths[r] for r in plan.order.tolist()] == sorted(lengths.tolist(), reverse=True)
    assert sum(rows for rows, _ in plan.shapes) == mask.shape[0]
    assert plan.keep.numel() == inputs["input_ids"].shape[1] == int(mask.sum())


def test_no_packing_where_it_does_not_apply():
    left = torch.tensor([[0, 1, 1], [1, 1, 1]] * 8)
    assert packing.plan_packing(left, groups=2) is None  # left padding: positions would move
    assert packing.plan_packing(torch.ones(16, 5, dtype=torch.long), groups=2) is None  # no padding to save
    holes = torch.tensor([[1, 0, 1], [1, 1, 0]] * 8)
    assert packing.plan_packing(holes, groups=2) is None
    llama, _ = build_tiny_llama(seed=0)
    bert, _ = build_tiny_bert(seed=0)
    assert not packing.packs(llama)  # rotary and causal encoders need their own packing
    assert packing.packs(bert)
    bert.gradient_checkpointing_enable()
    assert not packing.packs(bert)  # a recomputed layer would run after the plan is gone


def test_an_encoder_that_does_not_pack_runs_its_groups_and_evaluation_one_forward():
    encoder, tokenizer = build_tiny_llama(seed=0, dropout=0.0)
    model = SimCSEModel(encoder, pooler="last").train()
    model.length_groups = 4
    calls = encoder_calls(encoder)
    model(**batch_of(tokenizer))
    assert len(calls) == 4
    bert, bert_tokenizer = build_tiny_bert(seed=0)
    model = SimCSEModel(bert, pooler="cls").eval()
    model.length_groups = 4
    calls = encoder_calls(bert)
    batch = batch_of(bert_tokenizer)
    model(**batch)
    assert len(calls) == 1 and calls[0]["input_ids"].shape == batch["input_ids"].shape


def test_packed_attention_outside_a_packed_forward_is_refused():
    query = torch.zeros(1, 2, 3, 4)
    with pytest.raises(RuntimeError, match="packed"):
        packing.packed_attention(None, query, query, query, None)


def test_the_context_puts_attention_and_dropout_back_even_after_an_error():
    encoder, tokenizer = build_tiny_bert(seed=0, dropout=0.1)
    plan = packing.plan_packing(batch_of(tokenizer)["attention_mask"], groups=4)
    assert plan is not None
    before = encoder.config._attn_implementation
    with pytest.raises(ValueError), packing.packed(encoder, plan):
        assert encoder.config._attn_implementation == packing.PACKED_ATTENTION
        raise ValueError
    assert encoder.config._attn_implementation == before
    assert all("forward" not in vars(m) for m in encoder.modules() if isinstance(m, nn.Dropout))


def test_fast_dropout_is_a_seeded_dropout():
    x = torch.ones(400, 500)
    torch.manual_seed(3)
    out = packing.fast_dropout(x, 0.1)
    zero = (out == 0).float().mean().item()
    assert abs(zero - 0.1) < 0.005  # 200,000 draws: sd 0.0007
    kept = out[out != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / 0.9))
    torch.manual_seed(3)
    assert torch.equal(packing.fast_dropout(x, 0.1), out)


def test_packed_training_draws_are_seeded_and_dropout_changes_them():
    encoder, tokenizer = build_tiny_bert(seed=0, dropout=0.1)
    model = SimCSEModel(encoder, pooler="cls").train()
    model.length_groups = 4
    batch = batch_of(tokenizer)
    runs = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        runs.append(model(**batch).embeddings)
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])
    model.eval()
    assert torch.equal(model(**batch).embeddings, model(**batch).embeddings)
