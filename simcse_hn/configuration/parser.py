"""Command-line and YAML configuration.

`parse_args(argv)`: `--config file.yaml` gives defaults, CLI flags override them. YAML values go through the same
argparse type conversion as flags, then every dataclass validates itself in `__post_init__`, so a bad value fails
with a one-line `ConfigError` naming the field, before any model or data is loaded."""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import types
import typing
from dataclasses import fields

import yaml
from transformers import HfArgumentParser

from simcse_hn.configuration.arguments import DataArguments, ModelArguments, check_field
from simcse_hn.configuration.data_format import declared_data
from simcse_hn.configuration.objective import HELP_GROUPS as OBJECTIVE_HELP_GROUPS
from simcse_hn.configuration.resolved import resolve_run
from simcse_hn.configuration.training_arguments import SimCSETrainingArguments
from simcse_hn.errors import ConfigError

ARGUMENT_CLASSES = (ModelArguments, DataArguments, SimCSETrainingArguments)
# Fields that say the same thing in two ways: one given on the command line replaces the other given in the YAML.
ALTERNATIVE_FIELDS = (("train_file", "dataset_name"),)


# --help: simcse-hn's own flags first, in these groups (in this order), then the Trainer's. A field goes to the
# first group whose prefix or name matches.
HELP_GROUPS = {
    "objective": ("loss", "loss_options", "temperature", "contrast_form"),
    **OBJECTIVE_HELP_GROUPS,
    "scale and speed": ("gather_across_devices", "cache_minibatch_size", "length_groups"),
}
HELP_OVERRIDES = {  # the Trainer's own help where simcse-hn gives the flag more meaning
    "resume_from_checkpoint": "A checkpoint folder, or 'true' for the newest whole checkpoint of this run in "
    "output_dir (ones not whole, or foreign, are skipped with a warning).",
}


class _Parser(HfArgumentParser):
    def __init__(self, dataclass_types):
        super().__init__(
            dataclass_types,
            usage="train.py [--config FILE.yaml] [--FLAG VALUE ...]  (or: accelerate launch train.py ...)",
            description="Train a SimCSE sentence encoder (simcse-hn). simcse-hn's own flags come first, by group; "
            "the Trainer's follow.",
        )
        # listed for --help only; parse_args reads it before this parser sees the flags
        self.add_argument("--config", default=argparse.SUPPRESS, help="A YAML file of flags; flags given on the "
                          "command line override it (configs/*.yaml).")  # fmt: skip

    def error(self, message):  # argparse would print usage and exit(2); we want one line naming the field
        match = re.match(r"argument --([\w]+)(?:/--[\w-]+)*: (.*)", message)
        raise ConfigError(f"{match.group(1)}: {match.group(2)}" if match else message)

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


def _yaml_to_argv(config: dict, path: str, known: set[str], takes_lists: set[str]) -> list[str]:
    argv = []
    for key, value in config.items():
        check_field(key in known, key, f"unknown key in {path}")
        if value is None:
            continue
        if isinstance(value, dict):
            value = json.dumps(value)
        if isinstance(value, list):
            check_field(key in takes_lists, key, f"expected one value, got a list {value} (in {path})")
        values = value if isinstance(value, list) else [value]
        argv.append(f"--{key}")
        argv.extend(str(v).lower() if isinstance(v, bool) else str(v) for v in values)
    return argv


def load_yaml(path: str) -> dict:
    if not os.path.isfile(path):
        raise ConfigError(f"config: file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"config: malformed YAML in {path}{where}: {problem}") from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ConfigError(f"config: {path} must be a mapping of key: value, got {type(config).__name__}")
    return config


def parse_args(argv: list[str] | None = None) -> tuple[ModelArguments, DataArguments, SimCSETrainingArguments]:
    """YAML `--config` gives defaults, CLI flags override them. Raises ConfigError (one line) on a bad value."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known_args, rest = pre.parse_known_args(argv)
    known = {f.name for cls in ARGUMENT_CLASSES for f in fields(cls) if f.init}
    # from the annotations: HfArgumentParser rewrites a field's `str | list[str]` type to `str` in place
    hints = [typing.get_type_hints(cls) for cls in ARGUMENT_CLASSES]
    takes_lists = {name for types in hints for name, annotation in types.items() if "list" in str(annotation)}
    parser = _Parser(ARGUMENT_CLASSES)
    config = load_yaml(known_args.config) if known_args.config else {}
    for alternatives in ALTERNATIVE_FIELDS:  # a source given on the command line replaces the YAML's other one
        if any(f"--{name}" in rest for name in alternatives):
            config = {k: v for k, v in config.items() if k not in alternatives or f"--{k}" in rest}
    yaml_argv = _yaml_to_argv(config, known_args.config, known, takes_lists)
    try:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses(args=yaml_argv + rest)
        # the combinations the configuration alone shows (train.py checks the same, complete, on the resolved data)
        resolve_run(data_args, training_args, declared_data(data_args)).check()
    except ConfigError as e:
        name = str(e).split(":")[0]
        if name in config and f"--{name}" not in rest:
            raise ConfigError(f"{e} (in {known_args.config})") from None
        raise
    except ValueError as e:  # TrainingArguments' own checks
        raise ConfigError(str(e).strip().splitlines()[0]) from None
    except ImportError as e:  # a launch config for DeepSpeed without deepspeed installed
        raise ConfigError(f"deepspeed: {str(e).strip().splitlines()[0]} (pip install deepspeed)") from None
    return model_args, data_args, training_args
