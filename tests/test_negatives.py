"""eval/negatives.py: the hardest in-batch negatives and each objective's weight on them."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FIXTURES

from simcse_hn.losses import build_loss
from simcse_hn.training.step import contrastive_loss

pytestmark = pytest.mark.usefixtures("one_thread")


def load_script():
    import importlib

    return importlib.import_module("simcse_hn.cli.negatives")


def test_report_lists_the_most_similar_negatives_with_each_objectives_weight(tmp_path, capsys):
    negatives = load_script()
    out = tmp_path / "report"
    argv = ["builtin:tiny-bert", str(FIXTURES / "tiny_corpus.txt"), "--batch_size", "16", "--batches", "2",
            "--anchors", "3", "--top", "4", "--objectives", "infonce,hcl,unremix", "--output", str(out)]  # fmt: skip
    assert negatives.main(argv) == 0
    report = json.loads((out / "negatives.json").read_text())
    assert len(report["batches"]) == 2 and report["objectives"] == ["infonce", "hcl", "unremix"]
    for batch in report["batches"]:
        assert len(batch["anchors"]) == 3
        for anchor in batch["anchors"]:
            cosines = [n["cosine"] for n in anchor["negatives"]]
            assert len(cosines) == 4 and cosines == sorted(cosines, reverse=True)  # the most similar first
            assert all(n["weights"]["infonce"] == 1.0 for n in anchor["negatives"])
            hcl = [n["weights"]["hcl"] for n in anchor["negatives"]]
            assert hcl == sorted(hcl, reverse=True) and hcl[0] > 1  # HCL up-weights the hardest
        assert {"harder_than_positive", "top1pct_weight_share"} <= set(batch["diagnostics"]["hcl"])
    text = (out / "negatives.md").read_text()
    assert text in capsys.readouterr().out and "| negative | cosine | infonce | hcl | unremix |" in text


def test_weights_are_the_losses_own(tmp_path):
    """weigh_batch's HCL weights equal HCLLoss's on the same rows (dropout off, so the rows are reproducible)."""
    from simcse_hn.modeling.model import SimCSEModel
    from simcse_hn.testing.models import build_tiny_bert

    negatives = load_script()
    encoder, tokenizer = build_tiny_bert(dropout=0.0)
    model = SimCSEModel(encoder, pooler="avg")
    texts = (FIXTURES / "tiny_corpus.txt").read_text().splitlines()[:8]
    sim, weights, mask, _ = negatives.weigh_batch(model, tokenizer, texts, ["hcl"], 0.05, 32)
    from simcse_hn.data.collator import SimCSECollator

    batch = SimCSECollator(tokenizer, 32)(texts)
    batch.pop("text_ids"), batch.pop("num_truncated")
    with torch.no_grad():
        want = contrastive_loss(build_loss("hcl"), model.train()(**batch).embeddings).weights
    torch.testing.assert_close(weights["hcl"], want.double(), rtol=1e-6, atol=1e-9)
    assert not mask.diagonal().any()


def test_bad_arguments_are_one_line_errors(tmp_path, capsys):
    negatives = load_script()
    corpus = str(FIXTURES / "tiny_corpus.txt")
    for argv, message in [
        (["builtin:tiny-bert", corpus, "--objectives", "supcon"], "--objectives: unknown loss 'supcon'"),
        (["builtin:tiny-bert", corpus, "--batch_size", "1"], "--batch_size must be >= 2"),
        (["builtin:tiny-bert", str(tmp_path / "missing.txt")], "missing.txt: file not found"),
    ]:
        assert negatives.main(argv + ["--output", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and message in err and "\n" not in err
