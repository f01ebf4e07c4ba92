"""An objective's options: a dataclass whose fields carry their help, default and check, written once.

    @dataclass(frozen=True)
    class FocalOptions(ObjectiveOptions):
        gamma: float = option(2.0, "Focusing exponent gamma >= 0.", check=lambda v: v >= 0, must="be >= 0")

The objective's `Options` class is the only place an option is declared: the training configuration makes one flag
per field (`--{prefix}_{field}`, e.g. `--hcl_beta`), `--loss_options '{"gamma": 2}'` and a YAML `loss_options:`
mapping are validated by it, and the model card and `simcse_config.json` record `as_dict()`.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from simcse_hn.errors import did_you_mean


def option(
    default: Any,
    help: str,
    *,
    check: Callable[[Any], bool] | None = None,
    must: str = "",
    choices: tuple[str, ...] | None = None,
) -> Any:
    """A field of an objective's options: `default`, the `--help` text, and optionally a `check` of the value with
    what it `must` be ("be >= 0"), or the `choices` a string takes. Float values must also be finite."""
    metadata = {"help": help, "check": check, "must": must, "choices": choices}
    return dataclasses.field(default=default, metadata=metadata)


def _finite_check(value: Any) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


@dataclass(frozen=True)
class TrainingShape:
    """What the resolved training run is, for an objective's own refusals (`check_for_training`): the in-batch
    negatives of one anchor (and how they arise, for messages), the sharding engine (None, 'FSDP', 'DeepSpeed
    ZeRO-3', ...), the data format ('sentences' or 'pairs', as resolved from the data), whether the corpus is
    streamed, GradCache's mini-batch (None: off) and the guide model (None, 'self' or its name)."""

    negatives_per_anchor: int
    negatives_note: str = ""
    engine: str | None = None
    data_format: str = "sentences"
    streaming: bool = False
    cache_minibatch_size: int | None = None
    guide_model: str | None = None


@dataclass(frozen=True)
class ObjectiveOptions:
    """Base of every objective's options. Construction validates each field: a bad value raises ValueError
    "`name`: must ..., got ..." (one line), which the configuration reports under the field's flag."""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            value = _coerce(value, hints[f.name], f.name)
            object.__setattr__(self, f.name, value)
            choices = f.metadata.get("choices")
            if choices is not None and value not in choices:
                raise ValueError(f"{f.name}: must be one of {', '.join(choices)}, got {value!r}")
            if not _finite_check(value):
                raise ValueError(f"{f.name}: must be a finite number, got {value}")
            check = f.metadata.get("check")
            if check is not None and value is not None and not check(value):
                raise ValueError(f"{f.name}: must {f.metadata.get('must') or 'pass its check'}, got {value!r}")

    def check_for_training(self, shape: TrainingShape) -> None:
        """Settings the class accepts (tests use them: the neutral settings) that a training run should not, or that
        do not fit the run's shape: e.g. DCL's tau_plus = 0, which is InfoNCE. Raises ValueError "`name`: ..." like
        the field checks."""

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str = "loss_options") -> ObjectiveOptions:
        """Options from a mapping (a YAML `loss_options:` or `--loss_options` JSON); an unknown key is a ValueError
        that lists the known ones."""
        known = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in known:
                listing = ", ".join(known) if known else "none"
                hint = did_you_mean(str(key), known)
                raise ValueError(f"{key}: not an option of this objective{hint} (in {where}; its options: {listing})")
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class NoOptions(ObjectiveOptions):
    """An objective without options (InfoNCE)."""


def option_fields(options: type[ObjectiveOptions]) -> list[tuple[dataclasses.Field[Any], Any]]:
    """The fields of an options class with their resolved types (the annotations are strings here)."""
    hints = typing.get_type_hints(options)
    return [(f, hints[f.name]) for f in dataclasses.fields(options)]


def _coerce(value: Any, annotation: Any, name: str) -> Any:
    """YAML and JSON give an int where a float is meant (`beta: 1`) and a bool is not an int: accept the first, refuse
    what has the wrong type in one line."""
    allowed = typing.get_args(annotation) or (annotation,)
    if value is None:
        if type(None) in allowed:
            return None
        raise ValueError(f"{name}: must be given a value, got None")
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if bool in allowed and isinstance(value, bool):
        return value
    if int in allowed and isinstance(value, int) and not isinstance(value, bool):
        return value
    if int in allowed and isinstance(value, float) and value.is_integer():
        return int(value)
    for kind in (float, str):
        if kind in allowed and isinstance(value, kind) and not isinstance(value, bool):
            return value
    names = " or ".join("None" if a is type(None) else getattr(a, "__name__", str(a)) for a in allowed)
    raise ValueError(f"{name}: must be {names}, got {value!r}")
