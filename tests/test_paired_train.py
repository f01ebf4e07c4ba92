"""Paired training as a user runs it: negatives mined with scripts/mine_negatives.py (sentence-transformers'
mine_hard_negatives, on a tiny encoder saved in code), then train.py on the mined file with a guide model."""

from __future__ import annotations

import importlib.util
import json
import os
import random

import pytest
import torch
from conftest import FIXTURES

from simcse_hn.cli import train
from simcse_hn.data.pairs import load_pairs
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.run_record import RunRecord
from simcse_hn.testing.models import build_tiny_bert


def _load_script():
    return importlib.import_module("simcse_hn.cli.mine_negatives")


mine_negatives = _load_script()


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """A tiny encoder folder that sentence-transformers loads (a SimCSEModel saved with its tokenizer)."""
    folder = tmp_path_factory.mktemp("encoder")
    model, tokenizer = build_tiny_bert(seed=1)
    SimCSEModel(model, pooler="avg").save_pretrained(str(folder), tokenizer=tokenizer)
    return str(folder)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """60 (anchor, positive) pairs: a corpus sentence and the sentence without one word."""
    rng = random.Random(0)
    lines = (FIXTURES / "tiny_corpus.txt").read_text(encoding="utf-8").splitlines()[:60]
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            words = line.split()
            if len(words) > 2:
                del words[rng.randrange(len(words))]
            f.write(json.dumps({"anchor": line, "positive": " ".join(words)}) + "\n")
    return str(path)


def test_mined_negatives_keep_the_relative_margin_below_each_positive(encoder, pairs, tmp_path):
    output = tmp_path / "mined.jsonl"
    args = ["--num_negatives", "2", "--relative_margin", "0.002", "--range_max", "40"]
    assert mine_negatives.main(["--train_file", pairs, "--model", encoder, "--output", str(output)] + args) == 0
    mined = load_pairs(str(output))
    assert mined.column_names == ["anchor", "positive", "negative_1", "negative_2"] and 0 < len(mined) <= 60
    model = SimCSEModel.from_pretrained(encoder, pooler="avg")
    tokenizer = build_tiny_bert()[1]
    for row in mined:
        a, p, n1, n2 = model.encode([row["anchor"], row["positive"], row["negative_1"], row["negative_2"]], tokenizer)
        s_pos = torch.cosine_similarity(a, p, dim=0)
        for n in (n1, n2):  # what mine_hard_negatives promises: s_neg <= s_pos - |s_pos| * margin
            assert torch.cosine_similarity(a, n, dim=0) <= s_pos - abs(s_pos) * 0.002 + 1e-6
        assert {row["negative_1"], row["negative_2"]}.isdisjoint({row["anchor"], row["positive"]})
    # triplet output: one row per negative, a `negative` column train.py reads as well
    triplets = tmp_path / "triplets.csv"
    assert mine_negatives.main(["--train_file", pairs, "--model", encoder, "--output", str(triplets),
                                "--num_negatives", "2", "--output_format", "triplet"]) == 0  # fmt: skip
    assert load_pairs(str(triplets)).column_names == ["anchor", "positive", "negative_1"]


def test_mining_errors_are_one_line(encoder, pairs, tmp_path, capsys):
    existing = tmp_path / "exists.jsonl"
    existing.write_text("{}\n", encoding="utf-8")
    cases = [
        (["--output", str(existing)], f"error: output: {existing} exists (pass --overwrite to replace it)"),
        (["--output", str(tmp_path / "o.parquet")], "must end in .jsonl or .csv"),
        (["--output", str(tmp_path / "o.jsonl"), "--anchor_column", "query"], "no column 'query'"),
        (["--output", str(tmp_path / "o.jsonl"), "--num_negatives", "50", "--range_max", "10"],
         "error: num_negatives: 50 do not fit in ranks 0..10"),
        (["--output", str(tmp_path / "o.jsonl"), "--num_negatives", "70"],  # more than the 59 other positives
         f"error: {pairs}: no anchor kept 70 negatives under these settings"),
    ]
    for extra, message in cases:
        assert mine_negatives.main(["--train_file", pairs, "--model", encoder] + extra) == 2
        err = capsys.readouterr().err  # (progress bars of the model's loading may come first)
        assert message in err.strip().splitlines()[-1] and "Traceback" not in err, err


def test_train_on_mined_pairs_with_a_guide_model(encoder, pairs, tmp_path, tiny_args):
    mined = tmp_path / "mined.jsonl"
    assert mine_negatives.main(["--train_file", pairs, "--model", encoder, "--output", str(mined),
                                "--num_negatives", "1"]) == 0  # fmt: skip
    extra = ["--train_file", str(mined), "--per_device_train_batch_size", "8", "--max_steps", "3",
             "--logging_steps", "1", "--eval_steps", "3", "--save_steps", "3", "--guide_model", encoder,
             "--guide_margin", "0.01", "--hard_negative_weight", "0.5", "--loss", "hcl"]  # fmt: skip
    trainer = train.run(tiny_args + extra)
    assert trainer.layout.group_size == 3 and trainer.batches.no_duplicates and trainer.guide is not None
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 3 and all("guide_removed" in entry for entry in logged)
    assert all(entry["nonfinite_fallback"] == 0 for entry in logged)
    assert 0 < sum(entry["guide_removed"] for entry in logged) / 3 < 15  # of 15 negatives per anchor
    saved = RunRecord.from_json(json.loads((tmp_path / "out" / "simcse_config.json").read_text()))
    assert saved.data.format == "pairs" and saved.data.negatives_per_example == 1
    assert saved.method.hard_negative_weight == 0.5 and saved.method.no_duplicates is True
    assert saved.method.guide.model == os.path.basename(encoder) and saved.method.contrast_form is None
    card = (tmp_path / "out" / "README.md").read_text(encoding="utf-8")
    assert "| data_format | `pairs` |" in card and "| guide_model |" in card and encoder not in card


def test_the_guide_embeds_as_sentence_transformers_does(encoder):
    """simcse_hn.data.guide.Guide: its own tokenisation of the texts and a forward without gradient give the
    sentence-transformers model's encode()."""
    from sentence_transformers import SentenceTransformer

    from simcse_hn.data.guide import load_guide

    texts = ["A man is playing a guitar.", "The weather is cold today.", "short"]
    guide = load_guide(encoder)
    guide.train()
    assert not guide.training and not any(p.requires_grad for p in guide.parameters())
    got = guide(guide.tokenize(texts))
    assert not got.requires_grad
    want = SentenceTransformer(encoder, device="cpu").encode(texts, convert_to_tensor=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
