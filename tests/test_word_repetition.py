"""ESimCSE's word repetition (`--word_repetition RATE`): the second view of each sentence repeats some of its tokens
in place, seeded by (seed, sentence) alone; refused on paired data; recorded with the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import FIXTURES, ROOT

from simcse_hn.cli import train
from simcse_hn.configuration.parser import parse_args
from simcse_hn.data.collator import SimCSECollator
from simcse_hn.errors import ConfigError
from simcse_hn.testing.models import build_tiny_bert, build_tiny_llama

CORPUS = (FIXTURES / "tiny_corpus.txt").read_text(encoding="utf-8").splitlines()
SHORT = [line[:40] for line in CORPUS[:120]]  # at most 42 tokens with [CLS] and [SEP]: never cut at 64
LONG = [line for line in CORPUS if len(line) > 60][:20]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_bert()[1]


def tokens(batch: dict, row: int) -> list[int]:
    """The row's tokens without its padding (right padding: the mask is ones, then zeros)."""
    mask = batch["attention_mask"][row].tolist()
    length = sum(mask)
    assert mask == [1] * length + [0] * (len(mask) - length)
    return batch["input_ids"][row, :length].tolist()


def runs(ids: list[int]) -> list[list[int]]:
    """[[token, count], ...] of consecutive equal tokens."""
    out = []
    for token in ids:
        if out and out[-1][0] == token:
            out[-1][1] += 1
        else:
            out.append([token, 1])
    return out


def added_repeats(original: list[int], repeated: list[int]) -> int | None:
    """How many tokens `repeated` adds to `original` when it is `original` with some tokens repeated once in place
    (t becomes t t); None when it is not."""
    before, after = runs(original), runs(repeated)
    if [t for t, _ in before] != [t for t, _ in after]:
        return None
    if any(not count <= new <= 2 * count for (_, count), (_, new) in zip(before, after)):
        return None
    return len(repeated) - len(original)


def test_added_repeats_tells_a_repetition_from_other_edits():
    assert added_repeats([2, 5, 6, 6, 7, 3], [2, 5, 5, 6, 6, 6, 7, 3]) == 2
    assert added_repeats([2, 5, 6, 3], [2, 5, 6, 3]) == 0
    assert added_repeats([2, 5, 6, 3], [2, 5, 5, 5, 6, 3]) is None  # a token three times
    assert added_repeats([2, 5, 6, 3], [2, 6, 5, 3]) is None  # reordered
    assert added_repeats([2, 5, 6, 3], [2, 5, 6, 6]) is None  # a token dropped


def test_rate_0_gives_the_plain_collators_batch(tokenizer):
    plain = SimCSECollator(tokenizer, 32)(CORPUS[:8])
    off = SimCSECollator(tokenizer, 32, word_repetition=0.0, seed=7)(CORPUS[:8])
    assert plain.keys() == off.keys()
    for key, value in plain.items():
        assert torch.equal(value, off[key]) if isinstance(value, torch.Tensor) else value == off[key], key


def test_the_second_view_repeats_some_tokens_in_place_and_the_anchor_stays(tokenizer):
    rate = 0.3
    batch = SimCSECollator(tokenizer, 64, word_repetition=rate, seed=1)(SHORT)
    draws = []  # (tokens added, the bound they are drawn below)
    for k, text in enumerate(SHORT):
        original = tokenizer(text)["input_ids"]  # [CLS] ... [SEP]
        assert tokens(batch, 2 * k) == original
        added = added_repeats(original, tokens(batch, 2 * k + 1))
        assert added is not None, text
        bound = min(10, int(rate * len(original)))  # the authors' draw, L counting [CLS] and [SEP]
        assert 0 <= added < bound and added <= max(2, int(rate * (len(original) - 2))), text
        draws.append((added, bound))
    assert any(added == 0 for added, _ in draws) and any(added == bound - 1 for added, bound in draws)
    assert torch.equal(batch["text_ids"][0::2], batch["text_ids"][1::2])


def positives(batch: dict, texts: list[str]) -> dict[str, list[int]]:
    return {text: tokens(batch, 2 * k + 1) for k, text in enumerate(texts)}


def test_the_draw_depends_on_the_seed_and_the_sentence_alone(tokenizer):
    texts = SHORT[:8]
    first = positives(SimCSECollator(tokenizer, 64, word_repetition=0.3, seed=1)(texts), texts)
    assert any(first[t] != tokenizer(t)["input_ids"] for t in texts)
    # other companions, another order, a fresh collator
    others = list(reversed(texts[:4])) + SHORT[50:54]
    again = positives(SimCSECollator(tokenizer, 64, word_repetition=0.3, seed=1)(others), others)
    assert all(again[t] == first[t] for t in texts[:4])
    reseeded = positives(SimCSECollator(tokenizer, 64, word_repetition=0.3, seed=2)(texts), texts)
    assert any(reseeded[t] != first[t] for t in texts)
    # another process, with another salt for Python's own hash
    code = (
        "import json, sys\n"
        "from simcse_hn.data.collator import SimCSECollator\n"
        "from simcse_hn.testing.models import build_tiny_bert\n"
        "texts = json.loads(sys.argv[1])\n"
        "batch = SimCSECollator(build_tiny_bert()[1], 64, word_repetition=0.3, seed=1)(texts)\n"
        "print(json.dumps([row[mask.bool()].tolist() for row, mask in zip(batch['input_ids'][1::2], "
        "batch['attention_mask'][1::2])]))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run([sys.executable, "-c", code, json.dumps(texts)], capture_output=True, text=True,
                            cwd=ROOT, env=env, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == [first[t] for t in texts]


@pytest.mark.parametrize("build", [build_tiny_bert, build_tiny_llama], ids=["bert", "llama"])
def test_a_long_sentence_stays_within_max_length_and_keeps_its_closing_token(build):
    tokenizer = build()[1]
    batch = SimCSECollator(tokenizer, 16, word_repetition=1.0, seed=0)(LONG)
    assert batch["input_ids"].shape[1] == 16
    closing = tokenizer(LONG[0])["input_ids"][-1]  # [SEP], </s>
    changed = 0
    for k in range(len(LONG)):
        anchor, positive = tokens(batch, 2 * k), tokens(batch, 2 * k + 1)
        assert len(anchor) == len(positive) == 16 and anchor[-1] == positive[-1] == closing
        # the positive's tokens before the closing one: a prefix of the anchor's, with some tokens repeated
        assert any(added_repeats(anchor[:end], positive[:-1]) is not None for end in range(1, 16)), k
        changed += positive != anchor
    assert changed > len(LONG) // 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--word_repetition", "1.5"], "word_repetition: must be in [0, 1], got 1.5"),
        (["--word_repetition", "-0.1"], "word_repetition: must be in [0, 1], got -0.1"),
        (["--word_repetition", "nan"], "word_repetition: must be a finite number, got nan"),
        (["--word_repetition", "0.3", "--data_format", "pairs"],
         "word_repetition: augments the second dropout view of single sentences; paired data (data_format pairs) "
         "has its own positives: leave word_repetition out"),
        (["--word_repetition", "0.3", "--anchor_column", "sent0"],
         "word_repetition: augments the second dropout view of single sentences; paired data (anchor_column set)"),
    ],
)  # fmt: skip
def test_a_rate_that_cannot_work_is_one_line_naming_the_field(tmp_path, argv, message):
    with pytest.raises(ConfigError) as error:
        parse_args([*argv, "--output_dir", str(tmp_path)])
    assert str(error.value).startswith(message) and "\n" not in str(error.value), str(error.value)


def test_a_bad_rate_in_yaml_names_the_file(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("word_repetition: 2\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^word_repetition: must be in \[0, 1\], got 2.0 \(in .*c.yaml\)$"):
        parse_args(["--config", str(config), "--output_dir", str(tmp_path)])


def test_a_tiny_run_trains_on_repeated_positives_and_records_the_rate(tiny_args, tmp_path):
    extra = ["--word_repetition", "0.3", "--max_steps", "3", "--eval_strategy", "no", "--save_strategy", "no",
             "--load_best_model_at_end", "false"]  # fmt: skip
    trainer = train.run(tiny_args + extra)
    assert (trainer.data_collator.word_repetition, trainer.data_collator.seed) == (0.3, 42)  # debug_tiny's seed
    batch = next(iter(trainer.get_train_dataloader()))
    lengths = batch["attention_mask"].sum(1)  # (2B,)
    assert (lengths[1::2] >= lengths[0::2]).all() and (lengths[1::2] > lengths[0::2]).any()
    out = tmp_path / "out"
    assert json.loads((out / "simcse_config.json").read_text())["data"]["word_repetition"] == 0.3
    assert "| word_repetition | `0.3` |" in (out / "README.md").read_text(encoding="utf-8")
