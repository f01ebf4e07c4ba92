"""Reliability, class 3: a model folder without tokenizer files is a one-line error before any model loads, not a run
on [CLS] [UNK] [SEP] (transformers 5 builds the config's tokenizer class with an empty vocabulary there); a
tokenizer can be given separately with --tokenizer_name_or_path."""

from __future__ import annotations

import pytest
from test_hub import train_args

from simcse_hn.cli import train
from simcse_hn.modeling.loading import load_tokenizer
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.testing.models import build_tiny_bert


@pytest.fixture
def encoder_only(tmp_path):
    """A folder with the tiny encoder's config and weights and no tokenizer files, and its tokenizer elsewhere."""
    encoder, tokenizer = build_tiny_bert()
    encoder.save_pretrained(tmp_path / "encoder")
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    return tmp_path / "encoder", tmp_path / "tokenizer"


def test_a_model_folder_without_tokenizer_files_is_a_one_line_error(tmp_path, encoder_only, capsys, monkeypatch):
    encoder, _ = encoder_only

    def no_model_loads(*args, **kwargs):
        raise AssertionError("a model was loaded before the tokenizer was checked")

    monkeypatch.setattr(SimCSEModel, "from_pretrained", no_model_loads)
    assert train.main(train_args(tmp_path / "out", "--model_name_or_path", str(encoder))) == 2
    assert capsys.readouterr().err == (
        f"error: model_name_or_path: {encoder} has no tokenizer files (its vocabulary would be the 5 special tokens "
        "only); add them, or pass --tokenizer_name_or_path\n"
    )


def test_a_tokenizer_given_separately_is_the_one_trained_with_and_saved(tmp_path, encoder_only):
    encoder, tokenizer_dir = encoder_only
    out = tmp_path / "out"
    trainer = train.run(
        train_args(out, "--model_name_or_path", str(encoder), "--tokenizer_name_or_path", str(tokenizer_dir))
    )
    reference = build_tiny_bert()[1]
    sentence = "a man is playing a guitar."
    ids = trainer.data_collator([sentence, "another one"])["input_ids"][0]
    expected = reference(sentence)["input_ids"]
    assert ids[: len(expected)].tolist() == expected and reference.unk_token_id not in expected
    assert load_tokenizer(str(out)).get_vocab() == reference.get_vocab()  # the folder is complete again
