"""LoRA adapters (peft) on the encoder: which weights train, and how a saved folder gets plain weights.

* `add_lora` wraps the encoder in a `peft.PeftModel` (only the adapter trains; SimCSE's MLP head, outside the encoder,
  trains as before).
* A save works on a state dict (the one the Trainer gathers under FSDP or ZeRO-3, or the model's own): `split_lora`
  merges each adapted Linear, W + scaling * B @ A (peft's own scaling and layout), into plain encoder keys, so the
  folder is an ordinary transformers + sentence-transformers model, and returns the adapter's weights, written beside
  it in peft's format (`adapter/`: adapter_config.json + adapter_model.safetensors; `PeftModel.from_pretrained(base,
  folder + "/adapter")` loads it). Resuming loads the adapter back (`load_adapter`); the base weights are the base
  model's, frozen.

peft is an optional dependency (`pip install 'simcse-hn[lora]'`): `require_peft` is the one-line error without it.
"""

from __future__ import annotations

import os

from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from simcse_hn.choices import require_peft
from simcse_hn.errors import ConfigError

ADAPTER_WEIGHTS = "adapter_model.safetensors"  # peft's names, so peft loads the folder
ADAPTER_CONFIG = "adapter_config.json"
_PREFIX = "base_model.model."  # PeftModel's prefix before the wrapped encoder's own keys
_ADAPTER = "default"


def is_lora(encoder: nn.Module) -> bool:
    """Whether `encoder` is a peft model (without importing peft when it is not installed)."""
    return hasattr(encoder, "peft_config") and hasattr(encoder, "get_base_model")


def add_lora(
    encoder: nn.Module, r: int, alpha: float, dropout: float, target_modules: list[str] | None
) -> nn.Module:
    """`encoder` with LoRA adapters of rank r on `target_modules` (None: peft's default for the architecture, e.g.
    BERT's query/value, Llama's q_proj/v_proj); every other encoder weight frozen. -> the peft model"""
    require_peft()
    from peft import LoraConfig, get_peft_model  # peft: the optional lora extra
    from peft.tuners.lora import Linear

    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules, bias="none")
    try:
        model = get_peft_model(encoder, config)
    except ValueError as e:  # no such module in the encoder, no default targets for the architecture
        message = str(e).strip().splitlines()[0]
        raise ConfigError(f"lora_target_modules: {message}") from None
    adapted = [name for name, module in model.named_modules() if hasattr(module, "lora_A")]
    others = [name for name in adapted if not isinstance(model.get_submodule(name), Linear)]
    if others:  # the merge below is the Linear one
        raise ConfigError(f"lora_target_modules: only Linear layers can be adapted, not {others[0]}")
    return model


def _adapted_linears(encoder: nn.Module) -> dict[str, tuple[float, bool]]:
    """Plain-key prefix of every adapted Linear -> (scaling, fan_in_fan_out), read from the modules (their structure,
    not their weights, which FSDP or ZeRO-3 may hold elsewhere)."""
    out = {}
    for name, module in encoder.named_modules():
        if hasattr(module, "lora_A") and _ADAPTER in getattr(module, "scaling", {}):
            out[name.removeprefix(_PREFIX)] = (float(module.scaling[_ADAPTER]), bool(module.fan_in_fan_out))
    return out


def split_lora(encoder: nn.Module, state: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The peft model's state dict (keys as `encoder.state_dict()`) -> (plain encoder state with every adapter merged
    into its Linear, the adapter's own state in the peft model's keys)."""
    plain, adapter = {}, {}
    for key, value in state.items():
        if ".lora_" in key:
            adapter[key] = value
        else:
            plain[key.removeprefix(_PREFIX).replace(".base_layer.", ".")] = value
    for prefix, (scaling, fan_in_fan_out) in _adapted_linears(encoder).items():
        weight = plain[f"{prefix}.weight"]
        a = adapter[f"{_PREFIX}{prefix}.lora_A.{_ADAPTER}.weight"].float()  # (r, in)
        b = adapter[f"{_PREFIX}{prefix}.lora_B.{_ADAPTER}.weight"].float()  # (out, r)
        delta = b @ a * scaling  # (out, in)
        plain[f"{prefix}.weight"] = (weight.float() + (delta.T if fan_in_fan_out else delta)).to(weight.dtype)
    return plain, adapter


def save_adapter(encoder: nn.Module, adapter_state: dict[str, Tensor], folder: str, base_name: str | None) -> list:
    """Write the adapter in peft's format into `folder`; `base_name`: the base model recorded in its config (a Hub id,
    or a local model's folder name: no path of this machine). -> the files written, relative to folder"""
    from peft import get_peft_model_state_dict  # peft: the optional lora extra

    os.makedirs(folder, exist_ok=True)
    weights = get_peft_model_state_dict(encoder, state_dict=adapter_state, adapter_name=_ADAPTER)
    save_file({k: v.detach().contiguous() for k, v in weights.items()}, os.path.join(folder, ADAPTER_WEIGHTS))
    config = encoder.peft_config[_ADAPTER]
    recorded = config.base_model_name_or_path
    config.base_model_name_or_path = base_name
    try:
        config.save_pretrained(folder)
    finally:
        config.base_model_name_or_path = recorded
    return [ADAPTER_CONFIG, ADAPTER_WEIGHTS]


def load_adapter(encoder: nn.Module, folder: str) -> None:
    """Load the adapter weights `save_adapter` wrote into the peft model `encoder` (checkpoint resume)."""
    from peft import set_peft_model_state_dict  # peft: the optional lora extra

    weights = load_file(os.path.join(folder, ADAPTER_WEIGHTS))
    result = set_peft_model_state_dict(encoder, weights, adapter_name=_ADAPTER)
    unexpected = [key for key in result.unexpected_keys if ".lora_" in key]
    if unexpected:
        raise ValueError(f"{folder}: adapter weights that the model has no place for: {unexpected[:3]}")

