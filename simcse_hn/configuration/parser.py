"""Command-line and YAML configuration.

`parse_args(argv)`: `--config file.yaml` gives defaults, CLI flags override them. YAML values go through the same
argparse type conversion as flags, then every dataclass validates itself in `__post_init__`, so a bad value fails
with a one-line `ConfigError` naming the field, before any model or data is loaded."""

from __future__ import annotations

import argparse
import copy
import re
import types
import typing
from dataclasses import fields

from transformers import HfArgumentParser

from simcse_hn.configuration.arguments import DataArguments, ModelArguments
from simcse_hn.configuration.command_line import ConfiguredArgv, configured_argv, one_line, unknown_arguments
from simcse_hn.configuration.data_format import declared_data
from simcse_hn.configuration.help_format import DefaultsHelpFormatter
from simcse_hn.configuration.objective import HELP_GROUPS as OBJECTIVE_HELP_GROUPS
from simcse_hn.configuration.resolved import resolve_run
from simcse_hn.configuration.training_arguments import SimCSETrainingArguments
from simcse_hn.errors import ConfigError

ARGUMENT_CLASSES = (ModelArguments, DataArguments, SimCSETrainingArguments)
DATACLASS_NAMES = ("model", "data", "training")


# --help: simcse-hn's own flags first, in these groups (in this order), then the Trainer's. A field goes to the
# first group whose prefix or name matches.
HELP_GROUPS = {
    "objective": ("loss", "loss_options", "temperature", "contrast_form"),
    **OBJECTIVE_HELP_GROUPS,
    "scale and speed": ("gather_across_devices", "cache_minibatch_size", "length_groups"),
}
HELP_OVERRIDES = {  # the Trainer's own help where simcse-hn gives the flag more meaning
    "disable_tqdm": "Hide the progress bars. Default: shown in a terminal or notebook, hidden when stderr is not "
    "one (a log file gets each logged line, no bar redraws).",
    "resume_from_checkpoint": "A checkpoint folder, or 'true' for the newest whole checkpoint of this run in "
    "output_dir (ones not whole, or foreign, are skipped with a warning).",
}


class _Parser(HfArgumentParser):
    def __init__(self, dataclass_types):
        super().__init__(
            dataclass_types,
            formatter_class=DefaultsHelpFormatter,
            usage="train.py [--config FILE.yaml] [--FLAG VALUE ...]  (or: accelerate launch train.py ...)",
            description="Train a SimCSE sentence encoder (simcse-hn). simcse-hn's own flags come first, by group; "
            "the Trainer's follow.",
        )
        # listed for --help only; parse_args reads it before this parser sees the flags
        self.add_argument("--config", default=argparse.SUPPRESS, help="A YAML file of flags; flags given on the "
                          "command line override it (configs/*.yaml).")  # fmt: skip

    def error(self, message):  # argparse would print usage and exit(2); we want one line naming the field
        raise ConfigError(one_line(message))

    def _add_dataclass_arguments(self, dtype):
        if dtype is not SimCSETrainingArguments:
            return super()._add_dataclass_arguments(dtype)
        hints = typing.get_type_hints(dtype)
        groups = {title: self.add_argument_group(title) for title in HELP_GROUPS}
        trainer = self.add_argument_group("training (transformers.TrainingArguments, with SimCSE's defaults)")
        for item in fields(dtype):
            if not item.init:
                continue
            item.type = hints[item.name]
            title = next((t for t, keys in HELP_GROUPS.items() if item.name.startswith(keys)), None)
            if item.name in HELP_OVERRIDES:  # a copy: the field object is the dataclass's own
                item = copy.copy(item)
                item.metadata = types.MappingProxyType({**item.metadata, "help": HELP_OVERRIDES[item.name]})
            self._parse_dataclass_field(groups[title] if title else trainer, item)


def build_parser() -> HfArgumentParser:
    """train.py's parser: every flag of the three argument classes, simcse-hn's first (--help's order)."""
    return _Parser(ARGUMENT_CLASSES)


def field_names() -> dict[str, list[str]]:
    """Each argument class's fields, by the dataclass HfArgumentParser builds from them (model, data, training)."""
    return {name: [f.name for f in fields(cls) if f.init] for name, cls in zip(DATACLASS_NAMES, ARGUMENT_CLASSES)}


def list_fields() -> list[str]:
    """The fields that take several values (a YAML list), from the annotations: HfArgumentParser rewrites a field's
    `str | list[str]` type to `str` in place."""
    hints = [typing.get_type_hints(cls) for cls in ARGUMENT_CLASSES]
    return sorted(name for types in hints for name, annotation in types.items() if "list" in str(annotation))


def parse_args(argv: list[str] | None = None) -> tuple[ModelArguments, DataArguments, SimCSETrainingArguments]:
    """YAML `--config` gives defaults, CLI flags override them. Raises ConfigError (one line) on a bad value."""
    known = {name for names in field_names().values() for name in names}
    parser = build_parser()
    configured = configured_argv(argv, known, set(list_fields()))
    try:
        _no_empty_values(parser, configured)
        _, extras = parser.parse_known_args(configured.argv)  # a misspelt flag first: it often explains the rest
        if extras:
            raise ConfigError(unknown_arguments(extras, known, parser.prog))
        model_args, data_args, training_args = parser.parse_args_into_dataclasses(args=configured.argv)
        # the combinations the configuration alone shows (train.py checks the same, complete, on the resolved data)
        resolve_run(data_args, training_args, declared_data(data_args)).check()
    except ConfigError as e:
        raise configured.located(e) from None
    except ValueError as e:  # TrainingArguments' own checks
        raise configured.located(ConfigError(_named(str(e).strip().splitlines()[0], known))) from None
    except ImportError as e:  # a launch config for DeepSpeed without deepspeed installed
        raise ConfigError(f"deepspeed: {str(e).strip().splitlines()[0]} (pip install deepspeed)") from None
    return model_args, data_args, training_args


def _no_empty_values(parser: HfArgumentParser, configured: ConfiguredArgv) -> None:
    """A YAML key without a value (`learning_rate:` reads as null) where the flag's default is not None: a value
    forgotten, which would silently leave the default. Null where the default is None is that default."""
    for key, value in configured.config.items():
        default = parser.get_default(key)
        if value is None and default is not None and key not in configured.given:
            hint = f"give one, or leave the key out for the default {default!r}"
            raise ConfigError(f"{key}: no value (YAML reads it as null); {hint}")


def _named(message: str, known: set[str]) -> str:
    """A message of TrainingArguments' own ('Got warmup_steps = -1.0, Expected ...') led by the field it names, as
    every other error is: 'warmup_steps: Got ...'; as it is when it names none."""
    words = re.findall(r"--([a-z][a-z0-9_]*)", message) + re.findall(r"[a-z][a-z0-9]*_[a-z0-9_]+", message)
    name = next((word for word in words if word in known), None)
    return f"{name}: {message}" if name and not message.startswith(f"{name}:") else message
