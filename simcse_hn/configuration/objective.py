"""The objective's part of the training configuration, made from the objectives' own descriptions.

* One flag per option of each built-in objective, `--{prefix}_{option}` (`--hcl_beta`), with the option's help and
  choices; its default is None, meaning "not given": the objective's Options class holds the real default, once.
* `--loss_options '{"gamma": 2}'` (YAML: a `loss_options:` mapping) gives any objective's options, a user's own too.
* `resolve_objective_arguments` turns `--loss` and those into the objective class and its validated options, with
  one-line errors that name the flag: a bad value, an option of another objective than the selected one. What the
  objective refuses of the run it would train in (`check_for_training`, the contrast form) is checked with the rest of
  the resolved run, in simcse_hn.configuration.resolved.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from simcse_hn.errors import ConfigError
from simcse_hn.losses.base import ContrastiveLoss
from simcse_hn.losses.options import ObjectiveOptions, TrainingShape, option_fields
from simcse_hn.losses.registry import (
    BUILTIN,
    ObjectiveError,
    flag_prefix,
    objective_class_path,
    objective_source,
    resolve_objective,
)


def _flag_fields() -> list[tuple[str, Any, dataclasses.Field[Any]]]:
    made = []
    for cls in BUILTIN.values():
        prefix = flag_prefix(cls)
        for item, annotation in option_fields(cls.Options):
            optional = annotation if type(None) in typing.get_args(annotation) else annotation | None
            metadata: dict[str, Any] = {"help": f"{item.metadata['help']} (default: {item.default})"}
            if item.metadata.get("choices"):
                metadata["choices"] = item.metadata["choices"]
            made.append((f"{prefix}_{item.name}", optional, dataclasses.field(default=None, metadata=metadata)))
    return made


# The flags of the built-in objectives' options, a dataclass the training arguments inherit.
ObjectiveFlags = dataclasses.make_dataclass("ObjectiveFlags", _flag_fields())

# --help groups: one per built-in objective with options, in the registry's order
HELP_GROUPS = {
    f"{cls.display_name()} (--loss {cls.name})": (f"{flag_prefix(cls)}_",)
    for cls in BUILTIN.values()
    if dataclasses.fields(cls.Options)
}
LOSS_METAVAR = "{" + ",".join(BUILTIN) + "}|module:Class"
LOSS_HELP = (
    "Contrastive objective: a built-in name, an installed package's objective (entry point group "
    "simcse_hn.objectives), or your own class as package.module:Class or path/to/file.py:Class "
    "(docs/writing-an-objective.md)."
)


@dataclass(frozen=True)
class ResolvedObjective:
    """The objective a run trains: its class and validated options."""

    cls: type[ContrastiveLoss]
    options: ObjectiveOptions
    flags: Mapping[str, str] = dataclasses.field(default_factory=dict)  # option -> the flag it came from

    def record(self) -> dict[str, Any]:
        """What simcse_config.json and the card say of it: plain data, never imported back. A user's objective adds
        its file (`file`: the path as given, or its folder and name: registry.objective_file_record) and the sha256
        of its bytes, which a resume compares."""
        return {
            "name": self.cls.name or self.cls.__qualname__,
            "title": self.cls.display_name(),
            "class": objective_class_path(self.cls),
            "options": self.options.as_dict(),
            "summary": self.cls.summary,
            "citation": self.cls.citation,
            **(objective_source(self.cls) or {}),
        }


def _flag_name(cls: type[ContrastiveLoss], option: str) -> str:
    return f"{flag_prefix(cls)}_{option}"


def option_error(error: ValueError, flags: Mapping[str, str]) -> ConfigError:
    """An Options ValueError "key: ..." as a ConfigError naming the flag the value came from (or loss_options)."""
    message = str(error).strip().splitlines()[0]
    match = re.match(r"(\w+): ", message)
    if match is None:
        return ConfigError(f"loss_options: {message}")
    key, rest = match.group(1), message[match.end():]
    if key in flags:
        return ConfigError(f"{flags[key]}: {rest}")
    return ConfigError(f"loss_options: {message}")


def _parse_loss_options(text: str | dict[str, Any] | None) -> dict[str, Any]:
    if text is None or text == "":
        return {}
    if isinstance(text, dict):
        return dict(text)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"loss_options: not a JSON mapping ({e.msg} at character {e.pos}): {text!r}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"loss_options: must be a mapping of option: value, got {text!r}")
    return value


def resolve_objective_arguments(args: Any, shape: TrainingShape | None = None) -> ResolvedObjective:
    """`args.loss`, the built-in objectives' flags and `args.loss_options` -> the objective and its options.
    Raises ConfigError (one line). `shape`: the run's facts, for the objective's own training checks (train.py
    makes them once the data is resolved: simcse_hn.configuration.resolved)."""
    try:
        cls = resolve_objective(args.loss)
    except ObjectiveError as e:
        raise ConfigError(f"loss: {e}") from None
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(ObjectiveFlags)}
    given = {name: value for name, value in given.items() if value is not None}
    own_prefix = flag_prefix(cls)
    own: dict[str, Any] = {}
    flags: dict[str, str] = {}  # option -> the flag it came from
    for other in BUILTIN.values():
        prefix = flag_prefix(other)
        for item, _ in option_fields(other.Options):
            flag = f"{prefix}_{item.name}"
            if flag not in given:
                continue
            if other is cls:
                own[item.name], flags[item.name] = given[flag], flag
                continue
            try:  # a bad value is named as such first, whichever objective is selected
                other.Options(**{item.name: given[flag]})
            except ValueError as e:
                raise option_error(e, {item.name: flag}) from None
            hint = ""
            if own_prefix is not None and item.name in {f.name for f in dataclasses.fields(cls.Options)}:
                hint = f"; set {_flag_name(cls, item.name)}"
            raise ConfigError(f"{flag}: not used by --loss {args.loss}{hint} ({flag} is an option of --loss "
                              f"{other.name})")  # fmt: skip
    mapping = _parse_loss_options(args.loss_options)
    for key, value in mapping.items():
        if key in own and own[key] != value:
            raise ConfigError(f"loss_options: {key} is {value!r} there and {own[key]!r} in --{flags[key]}")
        own[key] = value
    try:
        options = cls.Options.from_mapping(own, where="loss_options")
        if shape is not None:
            options.check_for_training(shape)
    except ValueError as e:
        raise option_error(e, flags) from None
    return ResolvedObjective(cls, options, flags)
