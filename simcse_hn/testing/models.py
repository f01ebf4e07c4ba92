"""Tiny models and tokenizers built in code, for tests and offline runs: `builtin:tiny-bert` (BERT) and
`builtin:tiny-llama` (a decoder-only encoder). Nothing is downloaded."""

from __future__ import annotations

import logging
import string

import torch
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import (
    BertConfig,
    BertModel,
    BertTokenizerFast,
    LlamaConfig,
    LlamaModel,
    PreTrainedTokenizerFast,
)

logger = logging.getLogger(__name__)


TINY_MODEL = "builtin:tiny-bert"
TINY_LLAMA = "builtin:tiny-llama"  # a decoder-only encoder (Llama architecture), for LLM-style embedders
BUILTIN_MODELS = (TINY_MODEL, TINY_LLAMA)


_TINY_CHARS = string.ascii_lowercase + string.digits + string.punctuation
_TINY_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(_TINY_CHARS) + [f"##{c}" for c in _TINY_CHARS]


def tiny_bert_config(dropout: float = 0.1) -> BertConfig:
    return BertConfig(
        vocab_size=len(_TINY_VOCAB),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )


def build_tiny_bert(seed: int = 0, dropout: float = 0.1) -> tuple[BertModel, BertTokenizerFast]:
    """A 2-layer, 32-wide BERT with a character-level WordPiece vocabulary, built in code (no download)."""
    tokenizer = BertTokenizerFast(
        vocab={token: i for i, token in enumerate(_TINY_VOCAB)}, do_lower_case=True, model_max_length=128
    )  # 128: the position embeddings of tiny_bert_config
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        encoder = BertModel(tiny_bert_config(dropout))
    return encoder, tokenizer


_LLAMA_SPECIAL = ["<pad>", "<unk>", "<s>", "</s>"]
_LLAMA_VOCAB = _LLAMA_SPECIAL + [" "] + list(_TINY_CHARS)


def tiny_llama_config(dropout: float = 0.1) -> LlamaConfig:
    """Llama's only dropout is on the attention weights: SimCSE's two views differ by it."""
    return LlamaConfig(
        vocab_size=len(_LLAMA_VOCAB),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        attention_dropout=dropout,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
    )


def build_tiny_llama(seed: int = 0, dropout: float = 0.1) -> tuple[LlamaModel, PreTrainedTokenizerFast]:
    """A 2-layer, 32-wide Llama with a character-level tokenizer that wraps each sentence in <s> ... </s> (so that
    last-token pooling reads the end-of-sequence token, as LLM embedders do) and pads on the right; built in code."""
    vocab = {token: i for i, token in enumerate(_LLAMA_VOCAB)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B </s>", special_tokens=[("<s>", 2), ("</s>", 3)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
        model_max_length=128, padding_side="right",
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        encoder = LlamaModel(tiny_llama_config(dropout))
    return encoder, tokenizer


def build_builtin(name: str, seed: int = 0, dropout: float = 0.1):
    """-> (encoder, tokenizer) of a builtin model (TINY_MODEL, TINY_LLAMA)."""
    return (build_tiny_bert if name == TINY_MODEL else build_tiny_llama)(seed=seed, dropout=dropout)
