"""Decoder-only encoders (Llama-style, `builtin:tiny-llama`) with last-token or mean pooling: the last real token is
found from the attention mask whichever side the tokenizer pads, SimCSE's recipe trains them, and the saved folder
loads in sentence-transformers (Pooling `lasttoken`) and transformers (the card's snippet) with the same embeddings."""

from __future__ import annotations

import json

import pytest
import torch
from test_hub import run_snippet, snippet, train_args
from transformers import AutoConfig, AutoTokenizer

from simcse_hn.cli import train
from simcse_hn.export.model_card import write_model_card
from simcse_hn.modeling.loading import load_tokenizer
from simcse_hn.modeling.model import SimCSEModel, last_token
from simcse_hn.testing.models import TINY_LLAMA

SENTENCES = ["A man is playing a large guitar on the stage.", "Someone plays.", "The weather is cold today!"]


def test_last_token_is_the_last_position_with_attention_mask_one():
    hidden = torch.randn(4, 6, 3)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]])
    want = []
    for row in range(4):  # written out: the largest index whose mask is 1, the last position for an empty row
        ones = [t for t in range(6) if mask[row, t] == 1]
        want.append(hidden[row, ones[-1] if ones else 5])
    torch.testing.assert_close(last_token(hidden, mask), torch.stack(want), rtol=0, atol=0)


@pytest.mark.parametrize("pooler", ["last", "avg"])
def test_either_padding_side_gives_each_sentence_alone(pooler):
    """Right padding: a causal model's real tokens never see the padding after them. Left padding shifts every
    position by the same amount, which rotary position embeddings do not see. Both equal one sentence per batch."""
    model = SimCSEModel.from_pretrained(TINY_LLAMA, pooler=pooler)
    tokenizer = load_tokenizer(TINY_LLAMA)
    alone = torch.cat([model.encode([s], tokenizer) for s in SENTENCES])
    for side in ("right", "left"):
        tokenizer.padding_side = side
        torch.testing.assert_close(model.encode(SENTENCES, tokenizer), alone, rtol=0, atol=1e-5, msg=side)
    ids = tokenizer(SENTENCES[1])["input_ids"]
    assert (ids[0], ids[-1]) == (tokenizer.bos_token_id, tokenizer.eos_token_id)  # the last token is </s>


def test_simcse_trains_a_decoder_and_the_folder_loads_in_both_libraries(tmp_path):
    from sentence_transformers import SentenceTransformer

    out = tmp_path / "out"
    initial = SimCSEModel.from_pretrained(TINY_LLAMA, pooler="last").state_dict()
    trainer = train.run(train_args(out, "--model_name_or_path", TINY_LLAMA, "--pooler", "last", "--max_steps", "3",
                                   "--learning_rate", "1e-2"))  # fmt: skip
    still = [n for n, p in trainer.model.named_parameters() if p.requires_grad and torch.equal(p, initial[n])]
    assert not still, f"parameters that did not train: {still}"
    assert AutoConfig.from_pretrained(str(out)).model_type == "llama"
    pooling = json.loads((out / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_lasttoken"] and not pooling["pooling_mode_cls_token"]

    expected = trainer.model.encode(SENTENCES, trainer.processing_class)
    st = SentenceTransformer(str(out), device="cpu")
    torch.testing.assert_close(st.encode(SENTENCES, convert_to_tensor=True), expected, rtol=0, atol=1e-5)
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert (tokenizer.pad_token, tokenizer.padding_side) == ("<pad>", "right")
    reloaded = SimCSEModel.from_pretrained(str(out))
    assert reloaded.pooler == "last"
    torch.testing.assert_close(reloaded.encode(SENTENCES, tokenizer), expected, rtol=0, atol=1e-6)
    write_model_card(str(out))
    card = (out / "README.md").read_text()
    reference = trainer.model.encode(["A man is playing a guitar.", "Someone plays an instrument."],
                                     trainer.processing_class)  # fmt: skip
    torch.testing.assert_close(run_snippet(snippet(card, "transformers"), out), reference, rtol=0, atol=1e-5)


def test_a_tokenizer_without_a_padding_token_pads_with_its_end_token(tmp_path):
    """Most decoder-only tokenizers (Llama's, Qwen's) have no padding token; the mask, not the token, marks the end."""
    tokenizer = load_tokenizer(TINY_LLAMA)
    tokenizer.pad_token = None
    tokenizer.save_pretrained(str(tmp_path))
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config.get("pad_token") is None
    loaded = load_tokenizer(str(tmp_path))
    assert loaded.pad_token == loaded.eos_token == "</s>"
    batch = loaded(SENTENCES, padding=True, return_tensors="pt")
    assert batch["input_ids"].shape[0] == 3
