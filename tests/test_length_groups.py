"""Length-grouped training forwards (SimCSEModel.length_groups): the same embeddings and gradients as one forward,
in the batch's order, and how the trainer sets them."""

from __future__ import annotations

import pytest
import torch

from simcse_hn.cli import train
from simcse_hn.errors import ConfigError
from simcse_hn.modeling.batching import MIN_GROUP_ROWS, length_groups_of
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.testing.models import build_tiny_bert, build_tiny_llama

# lengths from 2 to ~40 characters: a padded batch is mostly padding
SENTENCES = [("word " * (1 + (7 * i) % 9)).strip() + f" {i}" for i in range(32)]


def mask_of(lengths: list[int], columns: int, left: bool = False) -> torch.Tensor:
    mask = torch.zeros(len(lengths), columns, dtype=torch.long)
    for row, length in enumerate(lengths):
        if left:
            mask[row, columns - length :] = 1
        else:
            mask[row, :length] = 1
    return mask


def test_groups_sort_rows_longest_first_and_cut_each_to_its_longest_row():
    lengths = [3, 9, 1, 9, 5, 2, 7, 4, 6, 8, 1, 3, 2, 5, 7, 6]
    groups = length_groups_of(mask_of(lengths, 10), groups=2)
    assert groups is not None and len(groups) == 2
    rows = torch.cat([r for r, _ in groups]).tolist()
    assert sorted(rows) == list(range(16))  # every row once
    assert [lengths[r] for r in rows] == sorted(lengths, reverse=True)
    assert rows[:2] == [1, 3]  # stable: equal lengths keep the batch's order
    assert [width for _, width in groups] == [9, 5]  # each part's longest row: 9,9,8,7,7,6,6,5 | 5,4,3,3,2,2,1,1


def test_groups_are_skipped_when_they_would_not_pay():
    assert length_groups_of(mask_of([5] * 64, 5), groups=8) is None  # no padding to cut
    assert length_groups_of(mask_of([3, 9] * 4, 10), groups=8) is None  # under MIN_GROUP_ROWS rows per part
    # left padding: every row ends in the last column, nothing is cut, positions never move
    assert length_groups_of(mask_of(list(range(1, 33)), 32, left=True), groups=4) is None
    parts = length_groups_of(mask_of(list(range(1, 33)), 32), groups=100)
    assert parts is not None and len(parts) == 32 // MIN_GROUP_ROWS


def batch_of(tokenizer, sentences):
    return dict(tokenizer(sentences, padding=True, return_tensors="pt"))


def forward_and_gradients(model: SimCSEModel, batch: dict, groups: int) -> tuple:
    """A float64 model's output in `groups` length groups and every parameter's gradient of a fixed weighting of its
    embeddings. -> (SimCSEOutput, {name: gradient})"""
    model.length_groups = groups
    model.zero_grad()
    output = model(**batch, return_head_inputs=True)
    weights = torch.linspace(-1, 1, output.embeddings.numel(), dtype=torch.float64)
    (output.embeddings * weights.view_as(output.embeddings)).sum().backward()
    return output, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("pooler", ["cls", "avg", "avg_first_last", "avg_top2", "cls_before_pooler"])
def test_grouped_forward_gives_the_one_forward_embeddings_and_gradients(pooler):
    """In train mode without dropout (so that both draw nothing), in float64: embeddings, the head's inputs and every
    parameter's gradient equal one forward's up to rounding, rows in the batch's order."""
    torch.manual_seed(0)
    encoder, tokenizer = build_tiny_bert(seed=0, dropout=0.0)
    model = SimCSEModel(encoder, pooler=pooler).double().train()
    batch = batch_of(tokenizer, SENTENCES)
    (one, one_grads), (grouped, grouped_grads) = [forward_and_gradients(model, batch, groups) for groups in (1, 4)]
    assert length_groups_of(batch["attention_mask"], 4) is not None  # the grouped path really ran
    torch.testing.assert_close(grouped.embeddings, one.embeddings, rtol=0, atol=1e-12)
    if pooler == "cls":
        torch.testing.assert_close(grouped.head_inputs, one.head_inputs, rtol=0, atol=1e-12)
    assert grouped_grads.keys() == one_grads.keys()
    for name, grad in one_grads.items():
        torch.testing.assert_close(grouped_grads[name], grad, rtol=0, atol=1e-11, msg=name)


def test_a_right_padded_decoder_groups_too():
    encoder, tokenizer = build_tiny_llama(seed=0, dropout=0.0)
    model = SimCSEModel(encoder, pooler="last").double().train()
    batch = batch_of(tokenizer, SENTENCES)
    model.length_groups = 1
    one = model(**batch).embeddings
    model.length_groups = 4
    grouped = model(**batch).embeddings
    assert length_groups_of(batch["attention_mask"], 4) is not None
    torch.testing.assert_close(grouped, one, rtol=0, atol=1e-12)


def test_groups_run_the_encoder_once_each_and_never_at_evaluation(monkeypatch):
    """An encoder that does not pack (simcse_hn.modeling.packing.packs: tests/test_packing.py) runs its groups."""
    monkeypatch.setattr("simcse_hn.modeling.model.packs", lambda encoder: False)
    encoder, tokenizer = build_tiny_bert(seed=0, dropout=0.1)
    model = SimCSEModel(encoder, pooler="cls")
    model.length_groups = 4
    widths = []
    encoder.register_forward_hook(lambda module, args, kwargs, out: widths.append(kwargs["attention_mask"].shape),
                                  with_kwargs=True)  # fmt: skip
    batch = batch_of(tokenizer, SENTENCES)
    model.train()(**batch)
    assert len(widths) == 4 and sum(rows for rows, _ in widths) == 32
    assert max(width for _, width in widths) == batch["attention_mask"].shape[1]
    assert min(width for _, width in widths) < batch["attention_mask"].shape[1]
    widths.clear()
    model.eval()(**batch)
    assert widths == [batch["attention_mask"].shape]


def test_dropout_draws_are_seeded():
    encoder, tokenizer = build_tiny_bert(seed=0, dropout=0.1)
    model = SimCSEModel(encoder, pooler="cls").train()
    model.length_groups = 4
    batch = batch_of(tokenizer, SENTENCES)
    first = [model(**batch).embeddings for _ in range(2) if torch.manual_seed(7) is not None]
    assert torch.equal(first[0], first[1])


def test_the_trainer_defaults_to_eight_groups_on_a_cpu_and_takes_the_argument(tiny_args):
    extra = ["--max_steps", "1", "--eval_strategy", "no", "--save_strategy", "no", "--load_best_model_at_end", "false"]
    assert train.run(tiny_args + extra).model.length_groups == 8
    assert train.run(tiny_args + extra + ["--length_groups", "1"]).model.length_groups == 1


def test_grouped_training_matches_one_forward_without_dropout(tiny_args):
    """Three steps of the tiny config without dropout, grouped (batch 16 sentences: 32 rows, 4 groups; the tiny BERT
    packs them) and not: the same weights up to float rounding. With SGD, so that the weights move by lr x the
    gradients and differ by the gradients' rounding alone; AdamW divides each gradient by its own size, and this
    encoder's near-zero gradients would then move by up to lr whatever sign their rounding gives them (lr 1: the
    tiny encoder's gradients are under 1e-3, and the weights' own float32 rounding must not hide the moves)."""
    extra = ["--max_steps", "3", "--eval_strategy", "no", "--save_strategy", "no", "--load_best_model_at_end", "false",
             "--dropout", "0.0", "--optim", "sgd", "--learning_rate", "1.0"]
    weights = []
    for groups in ("1", "4"):
        trainer = train.run(tiny_args + extra + ["--length_groups", groups])
        weights.append({k: v.detach().clone() for k, v in trainer.model.state_dict().items()})
    differ = max((weights[0][k] - v).abs().max().item() for k, v in weights[1].items())
    start = train.run(tiny_args + extra[:-1] + ["0"]).model.state_dict()  # learning rate 0: where the steps began
    moved = max((weights[0][k] - v).abs().max().item() for k, v in start.items())
    # the untrained tiny encoder's embeddings are nearly one vector (uniformity -5e-6), so the loss's gradient comes
    # from differences of nearly equal float32 vectors: the forwards' rounding (1e-7) reaches 0.4 % of the moves,
    # where a wrong row, position or mask moves them by as much as the steps themselves (float64: test above)
    assert differ < 1e-2 * moved, (differ, moved)


def test_length_groups_are_refused_where_they_are_not_offered(tiny_args):
    with pytest.raises(ConfigError, match="length_groups"):
        train.run(tiny_args + ["--length_groups", "0"])
    with pytest.raises(ConfigError, match="length_groups.*torch_compile"):
        train.run(tiny_args + ["--length_groups", "4", "--torch_compile", "true"])
