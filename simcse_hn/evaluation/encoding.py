"""Encoders for the STS suite: `load_encoder` picks the backend (a simcse-hn folder through SimCSEModel, any other
sentence-transformers model through its own modules) and returns an encode function that batches by token length."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch
from torch import Tensor

from simcse_hn.errors import DataError
from simcse_hn.files import SIMCSE_CONFIG
from simcse_hn.modeling.batching import (
    iter_prepared_batches,
    map_batches,
    place_rows,
    restore_order,
    token_length_order,
)
from simcse_hn.modeling.loading import inference_max_length, load_tokenizer, model_max_length
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.testing.models import BUILTIN_MODELS

logger = logging.getLogger(__name__)

EncodeFn = Callable[[list[str]], Tensor]


def _has_file(name_or_path: str, filename: str) -> bool:
    if os.path.isdir(name_or_path):
        return os.path.isfile(os.path.join(name_or_path, filename))
    try:  # a Hub id: the cache offline, the Hub online
        from huggingface_hub import hf_hub_download

        hf_hub_download(name_or_path, filename)
        return True
    except Exception:
        return False


def encoder_backend(name_or_path: str, pooler: str | None = None) -> str:
    """'simcse' when a pooler is given or the model was saved by SimCSEModel (its own pooler, any of the five);
    'sentence-transformers' for other folders or Hub ids with modules.json; otherwise 'simcse' (pooler `cls`)."""
    if pooler is not None or name_or_path in BUILTIN_MODELS or _has_file(name_or_path, SIMCSE_CONFIG):
        return "simcse"
    if _has_file(name_or_path, "modules.json"):
        return "sentence-transformers"
    logger.warning("%s: neither simcse_config.json nor modules.json; using SimCSEModel's default pooler", name_or_path)
    return "simcse"


def token_length_batches(
    encode_batch: Callable[[list[str]], Tensor],
    tokenizer,
    batch_size: int,
    max_length: int | None = None,
    show_progress_bar: bool | str = False,
) -> EncodeFn:
    """An encoder that feeds `encode_batch` batches of equal token length, longest first, and restores the order.

    Encoders sort by character count (SentenceTransformer.encode); on the STS suite that leaves a third of the tokens
    in a batch as padding (MiniLM's tokenizer, batch 32), token counts under 1 %. This tokenises once for the order,
    and `encode_batch` tokenises again: the price of calling an encoder that takes text.
    """

    def encode(sentences: list[str]) -> Tensor:
        if not sentences:
            return encode_batch(sentences)
        _, batches = token_length_order(tokenizer, sentences, batch_size, max_length)
        texts = [[sentences[i] for i in batch] for batch in batches]
        pieces = map_batches(encode_batch, texts, None, show_progress_bar)  # one batch after the other
        return restore_order(torch.cat(pieces), [i for batch in batches for i in batch])

    return encode


def simcse_encode_fn(
    model, tokenizer, batch_size: int = 128, max_length: int | None = None, show_progress_bar: bool | str = False
) -> EncodeFn:
    """SimCSEModel.encode: tokenised once, batches of equal token length."""

    def encode(sentences: list[str]) -> Tensor:
        return model.encode(sentences, tokenizer, batch_size, max_length, show_progress_bar)

    return encode


# Modules whose forward is all `encode` adds to the tokenizer's features (no routing by task, no prompt handling)
PLAIN_MODULES = frozenset({"Transformer", "Pooling", "Normalize", "Dense", "LayerNorm", "Dropout"})


def _plain_sentence_transformer(model) -> bool:
    """A text model whose `encode` is its modules' forward over its tokenizer's features: only PLAIN_MODULES, no
    default prompt, no truncated dimension."""
    prompts = getattr(model, "prompts", None) or {}
    default = getattr(model, "default_prompt_name", None)
    return (
        callable(getattr(model, "tokenize", None))
        and all(type(module).__name__ in PLAIN_MODULES for module in model)
        and not (default and prompts.get(default))
        and getattr(model, "truncate_dim", None) is None
    )


def sentence_transformers_encode_fn(
    model, batch_size: int = 128, show_progress_bar: bool | str = False, side_by_side: bool = True
) -> EncodeFn:
    """A SentenceTransformer's embeddings in batches of equal token length. A plain text model (`_plain_sentence_
    transformer`) runs its own modules' forward on features its own `preprocess` made in this thread, each text
    tokenised once (`iter_prepared_batches`), so the batches can run side by side on a CPU's cores (unless
    `side_by_side` is False); anything else goes through `encode`, one batch after the other."""

    def encode_batch(sentences: list[str]) -> Tensor:
        embeddings = model.encode(
            sentences, batch_size=max(len(sentences), 1), show_progress_bar=False, convert_to_tensor=True
        )  # (n, D)
        return embeddings.float().cpu()

    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:  # a model without a text tokenizer: its own batching
        return lambda sentences: (
            model.encode(
                sentences, batch_size=batch_size, show_progress_bar=bool(show_progress_bar), convert_to_tensor=True
            )
            .float()
            .cpu()
        )
    if not _plain_sentence_transformer(model):
        return token_length_batches(encode_batch, tokenizer, batch_size, model.max_seq_length, show_progress_bar)

    # a slow import: only where its models are used
    from sentence_transformers.util import batch_to_device

    # the first module's own preprocess, as SentenceTransformer.preprocess calls it once it has checked each input's
    # modality (a tenth of the tokenising time on the STS suite; the inputs here are texts for a text model)
    first = model[0]
    prepare = getattr(first, "preprocess", None) or first.tokenize  # sentence-transformers < 6: `tokenize`

    def forward(features: dict[str, Tensor]) -> Tensor:
        with torch.inference_mode():
            return model(batch_to_device(features, model.device))["sentence_embedding"].float().cpu()  # (n, D)

    def encode(sentences: list[str]) -> Tensor:
        if not sentences:
            return encode_batch(sentences)
        model.eval()
        order: list[int] = []
        copies: dict[int, int] = {}  # a text tokenised as an earlier one: that one's embedding

        def batches():  # tokenised in this thread while the first batches already run (map_batches)
            for indices, features in iter_prepared_batches(prepare, sentences, batch_size, copies=copies):
                order.extend(indices)
                yield features

        device = model.device if side_by_side else None
        pieces = map_batches(forward, batches(), device, show_progress_bar)  # how many batches: known at the end
        return place_rows(torch.cat(pieces), order, copies, len(sentences))  # (n - len(copies), D) -> (n, D)

    return encode


def load_encoder(
    name_or_path: str,
    pooler: str | None = None,
    device: str | None = None,
    batch_size: int = 128,
    max_seq_length: int | None = None,
    show_progress_bar: bool | str = False,
) -> tuple[EncodeFn, dict]:
    """-> (encode, info): info holds "backend", "pooler" (None for sentence-transformers), "modules", "device" and
    "max_seq_length", the length inputs are truncated to. Without `max_seq_length` both backends use the model's own
    inference length (a sentence-transformers model's max_seq_length, else the encoder's limit), so a base model and
    a model trained from it are scored alike. `show_progress_bar`: True, or the bar's name (what the encoding is
    for: simcse_hn.progress)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if encoder_backend(name_or_path, pooler) == "sentence-transformers":
        # a slow import: only where its models are used
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(name_or_path, device=device)
        if max_seq_length is not None:
            _check_length(name_or_path, getattr(getattr(model[0], "auto_model", None), "config", None), max_seq_length)
            model.max_seq_length = max_seq_length
        modules = [type(module).__name__ for module in model]
        info = {"backend": "sentence-transformers", "pooler": None, "modules": modules, "device": device,
                "max_seq_length": model.max_seq_length}  # fmt: skip
        return sentence_transformers_encode_fn(model, batch_size, show_progress_bar), info

    model = SimCSEModel.from_pretrained(name_or_path, pooler=pooler).to(device)
    tokenizer = load_tokenizer(name_or_path)
    if max_seq_length is not None:
        _check_length(name_or_path, model.config, max_seq_length)
    length = max_seq_length or inference_max_length(name_or_path, model.config, tokenizer)
    info = {"backend": "simcse", "pooler": model.pooler, "modules": None, "device": device, "max_seq_length": length}
    return simcse_encode_fn(model, tokenizer, batch_size, length, show_progress_bar), info


def _check_length(name_or_path: str, config, max_seq_length: int) -> None:
    """A --max_seq_length beyond the encoder's position embeddings fails in the middle of encoding: refused now."""
    limit = model_max_length(config) if config is not None else None
    if limit is not None and max_seq_length > limit:
        raise DataError(f"--max_seq_length: {max_seq_length} is above the {limit} positions of {name_or_path}")


# --- reports: the SimCSE paper's table and a chart, for one run or several side by side ---
