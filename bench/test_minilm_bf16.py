"""bench/minilm_bf16.py on a tiny folder: a bfloat16 copy that loads and equals the original cast, and a folder it did
not make is left alone."""

from __future__ import annotations

import pytest
import torch

from bench.common import base_shaped_model
from bench.minilm_bf16 import write_copy


def test_copy_is_the_cast_weights_and_loads(tmp_path):
    from transformers import AutoModel

    source = tmp_path / "model"
    base_shaped_model(source, layers=1, hidden=32, heads=2, intermediate=64)
    out = tmp_path / "copy"
    write_copy(source, out)
    write_copy(source, out)  # its own earlier copy is replaced
    original = AutoModel.from_pretrained(source).state_dict()
    copied = AutoModel.from_pretrained(out, dtype=torch.bfloat16).state_dict()
    assert copied.keys() == original.keys()
    for key, value in original.items():
        assert copied[key].dtype == torch.bfloat16
        assert torch.equal(copied[key], value.to(torch.bfloat16)), key


def test_a_folder_it_did_not_make_is_refused(tmp_path):
    source = tmp_path / "model"
    base_shaped_model(source, layers=1, hidden=32, heads=2, intermediate=64)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(SystemExit, match="was not made by this script"):
        write_copy(source, mine)
    assert (mine / "notes.txt").read_text() == "keep"
