"""The sentence-transformers files of a saved folder, so that `SentenceTransformer(folder)` gives
`SimCSEModel.encode`'s embeddings. Written directly in the classic module format of the models on the Hub, which every
sentence-transformers version from 2.x to 6.x loads (6.x's own format does not load in 5.x: "No module named
'sentence_transformers.base'"), next to the encoder and tokenizer that `SimCSEModel.save_pretrained` wrote, so the
encoder's weights are written once per save.

* Module 0 is the Transformer: the folder itself (config.json, model.safetensors, the tokenizer) with
  sentence_bert_config.json (`max_seq_length`, and `config_args` to return every layer for the layer poolers).
* `cls`, `cls_before_pooler`: Pooling(cls); with `cls` and `mlp_only_train=False` a Dense(tanh) module carrying the MLP
  head follows.
* `avg`: Pooling(mean). `last`: Pooling(lasttoken), the last token whose attention mask is 1 (either padding side).
* `avg_first_last` / `avg_top2` have no Pooling mode: a WeightedLayerPooling with weights 1 on the two layers and 0
  elsewhere averages them, then Pooling(mean).
"""

from __future__ import annotations

import os

import torch
import transformers
from safetensors.torch import save_file
from torch import Tensor, nn

from simcse_hn.files import write_json

# SimCSE's pooler -> sentence-transformers Pooling mode, applied to the tokens of `LAYER_POOLERS` or the last layer.
ST_POOLING = {"cls": "cls", "cls_before_pooler": "cls", "avg": "mean", "avg_first_last": "mean", "avg_top2": "mean",
              "last": "lasttoken"}  # fmt: skip
LAYER_POOLERS = ("avg_first_last", "avg_top2")
_MODULE_TYPE = "sentence_transformers.models.{}"
_POOLING_MODES = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")
_POOLING_NAMES = {"cls": "cls_token", "mean": "mean_tokens", "lasttoken": "lasttoken"}


def layer_weights(pooler: str, num_layers: int) -> tuple[int, Tensor]:
    """WeightedLayerPooling over hidden_states[layer_start:] that equals SimCSE's average of two layers."""
    if pooler == "avg_first_last":  # (hidden_states[1] + hidden_states[-1]) / 2
        layer_start, weights = 1, torch.zeros(num_layers)
        weights[0] += 1
        weights[-1] += 1
    else:  # avg_top2: (hidden_states[-2] + hidden_states[-1]) / 2
        layer_start, weights = num_layers - 1, torch.ones(2)
    return layer_start, weights


def head_as_encoder_pooler(
    encoder: nn.Module, encoder_state: dict[str, Tensor], head_state: dict[str, Tensor]
) -> dict[str, Tensor]:
    """The MLP head as the encoder's own pooler (dense + tanh over the first token), as SimCSE's released checkpoints
    store it, so `AutoModel(...).pooler_output` is the sentence embedding: the pooler's entries of the encoder's
    state dict, taken from the head's (`head_state`: dense.weight, dense.bias), or {} when the architecture has no
    such pooler. SimCSEModel never uses (and freezes) that pooler, so this changes nothing for training or resuming.
    Only the modules' structure is read: their weights may be shards (FSDP, ZeRO-3)."""
    pooler = getattr(encoder, "pooler", None)
    dense = getattr(pooler, "dense", None)
    if not (isinstance(dense, nn.Linear) and isinstance(getattr(pooler, "activation", None), nn.Tanh)):
        return {}
    keys = {"weight": "pooler.dense.weight", "bias": "pooler.dense.bias"}
    if any(key not in encoder_state for key in keys.values()):
        return {}
    if encoder_state[keys["weight"]].shape != head_state["dense.weight"].shape:
        return {}
    return {key: head_state[f"dense.{name}"].to(encoder_state[key].dtype).clone() for name, key in keys.items()}


def _st_version() -> dict[str, str]:
    try:
        # a slow import: only where its models are used
        from sentence_transformers import __version__ as st_version
    except ImportError:
        st_version = "not installed"
    return {"sentence_transformers": st_version, "transformers": transformers.__version__,
            "pytorch": torch.__version__}  # fmt: skip


def write_sentence_transformers_files(
    output_dir: str, model, max_seq_length: int | None, head_state: dict[str, Tensor] | None = None
) -> list[str]:
    """Write modules.json and the module folders for `model`'s evaluation pooler into `output_dir`, which already
    holds the encoder and tokenizer. `max_seq_length`: the inference limit sentence-transformers truncates to;
    `head_state`: the MLP head's weights (dense.weight, dense.bias; default: the module's own).
    -> the files written, relative to output_dir."""
    hidden_size, num_layers = model.config.hidden_size, model.config.num_hidden_layers
    modules, written = [("Transformer", "")], []

    def module_dir(name: str) -> str:
        path = f"{len(modules)}_{name}"
        modules.append((name, path))
        os.makedirs(os.path.join(output_dir, path), exist_ok=True)
        return path

    if model.pooler in LAYER_POOLERS:
        layer_start, weights = layer_weights(model.pooler, num_layers)
        path = module_dir("WeightedLayerPooling")
        config = {"word_embedding_dimension": hidden_size, "layer_start": layer_start, "num_hidden_layers": num_layers}
        write_json(os.path.join(output_dir, path, "config.json"), config)
        save_file({"layer_weights": weights.contiguous()}, os.path.join(output_dir, path, "model.safetensors"))
        written += [f"{path}/config.json", f"{path}/model.safetensors"]
    path = module_dir("Pooling")
    mode = _POOLING_NAMES[ST_POOLING[model.pooler]]
    config = {"word_embedding_dimension": hidden_size, "include_prompt": True}
    config.update({f"pooling_mode_{m}": m == mode for m in _POOLING_MODES})
    write_json(os.path.join(output_dir, path, "config.json"), config)
    written.append(f"{path}/config.json")
    if model.pooler == "cls" and not model.mlp_only_train:
        head = head_state if head_state is not None else model.mlp.state_dict()
        out_features, in_features = head["dense.weight"].shape
        path = module_dir("Dense")
        config = {"in_features": in_features, "out_features": out_features, "bias": True,
                  "activation_function": "torch.nn.modules.activation.Tanh"}  # fmt: skip
        write_json(os.path.join(output_dir, path, "config.json"), config)
        weights = {"linear.weight": head["dense.weight"].detach(), "linear.bias": head["dense.bias"].detach()}
        save_file({k: v.contiguous() for k, v in weights.items()}, os.path.join(output_dir, path, "model.safetensors"))
        written += [f"{path}/config.json", f"{path}/model.safetensors"]

    entries = [
        {"idx": i, "name": str(i), "path": path, "type": _MODULE_TYPE.format(name)}
        for i, (name, path) in enumerate(modules)
    ]
    write_json(os.path.join(output_dir, "modules.json"), entries)
    transformer = {"do_lower_case": False}
    if max_seq_length is not None:
        transformer["max_seq_length"] = int(max_seq_length)
    if model.pooler in LAYER_POOLERS:  # the encoder must return every layer's hidden states
        transformer["config_args"] = {"output_hidden_states": True}
    write_json(os.path.join(output_dir, "sentence_bert_config.json"), transformer)
    st_config = {"__version__": _st_version(), "model_type": "SentenceTransformer", "prompts": {},
                 "default_prompt_name": None, "similarity_fn_name": "cosine"}  # fmt: skip
    write_json(os.path.join(output_dir, "config_sentence_transformers.json"), st_config)
    return written + ["modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"]
