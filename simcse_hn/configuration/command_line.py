"""The command line's first steps, light on purpose (argparse, yaml, no torch, no transformers), shared by the real
parser (`configuration.parser.parse_args`) and the front that answers before torch is imported (`cli.front`): the
`--config` YAML turned into flags, and argparse's messages turned into one line that names the field and, for a
misspelt name, the closest known one."""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

import yaml

from simcse_hn.errors import ConfigError, did_you_mean

# Fields that say the same thing in two ways: one given on the command line replaces the other given in the YAML.
ALTERNATIVE_FIELDS = (("train_file", "dataset_name"),)
# train.py's first check of the run (cli/train.py), which the front makes too
TRAIN_SOURCE_REQUIRED = "train_file: required (a text/jsonl/csv file), or dataset_name (a Hub dataset id)"


@dataclass(frozen=True)
class ConfiguredArgv:
    """A command line with its `--config` YAML: `argv`, the YAML's keys as flags followed by the command line's own
    (which therefore win); `config`, the YAML's mapping; `rest`, the command line without `--config FILE`."""

    argv: list[str]
    config: dict
    path: str | None
    rest: list[str]

    @property
    def given(self) -> set[str]:
        """The fields the command line sets (`--name value`, `--name=value`): the YAML's value of each is not read."""
        return given_flags(self.rest)

    def located(self, error: ConfigError) -> ConfigError:
        """`error`, with the YAML file named when the field it names came from there and not from the command
        line."""
        name = str(error).split(":")[0]
        if name in self.config and name not in self.given:
            return ConfigError(f"{error} (in {self.path})")
        return error


def given_flags(rest: list[str]) -> set[str]:
    """The names of the flags in a command line (`--name value` or `--name=value`)."""
    return {item.split("=", 1)[0][2:] for item in rest if item.startswith("--")}


def configured_argv(argv: list[str] | None, known: set[str], takes_lists: set[str]) -> ConfiguredArgv:
    """Read `--config FILE` out of `argv` and put its keys in front as flags. `known`: every field's name (another
    key is an error naming the closest); `takes_lists`: the fields that take several values."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known_args, rest = pre.parse_known_args(argv)
    config = load_yaml(known_args.config) if known_args.config else {}
    given = given_flags(rest)
    for alternatives in ALTERNATIVE_FIELDS:  # a source given on the command line replaces the YAML's other one
        if any(name in given for name in alternatives):
            config = {k: v for k, v in config.items() if k not in alternatives or k in given}
    # a key the command line gives too is not read from the YAML: its value there, never used, cannot fail the run
    read = {key: value for key, value in config.items() if key not in given}
    yaml_argv = yaml_to_argv(read, known_args.config, known, takes_lists)
    return ConfiguredArgv(yaml_argv + rest, config, known_args.config, rest)


def yaml_to_argv(config: dict, path: str, known: set[str], takes_lists: set[str]) -> list[str]:
    argv = []
    for key, value in config.items():
        if key not in known:
            raise ConfigError(f"{key}: unknown key in {path}{did_you_mean(str(key), known, str)}")
        if value is None:
            continue
        if isinstance(value, dict):
            value = json.dumps(value)
        if isinstance(value, list) and key not in takes_lists:
            raise ConfigError(f"{key}: expected one value, got a list {value} (in {path})")
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


_ARGUMENT = re.compile(r"argument (-*[\w-]+)(?:/-[\w-]+)*: (.*)")
_CHOICE = re.compile(r"invalid choice: '(.*)' \(choose from (.*)\)")


def one_line(message: str, dashes: bool = False) -> str:
    """argparse's error `message` as one line naming the flag: 'learning_rate: invalid float value: ...' (`dashes`:
    '--learning_rate: ...', as a command whose names are flags, not YAML keys, says it); a misspelt choice with the
    closest one."""
    match = _ARGUMENT.match(message)
    if not match:
        return message
    flag, problem = match.groups()
    choice = _CHOICE.match(problem)
    hint = did_you_mean(choice.group(1), [c.strip("'") for c in choice.group(2).split(", ")]) if choice else ""
    if hint:
        problem = f"invalid choice: {choice.group(1)!r}{hint}; choose from {choice.group(2)}"
    return f"{flag if dashes else flag.lstrip('-')}: {problem}"


def unknown_arguments(extras: list[str], flags: Iterable[str], command: str) -> str:
    """The one line for what a parser did not recognise (`extras`, in order): the first unknown flag with the
    closest known one of `flags` (their names, no dashes), or a stray value."""
    flags = list(flags)
    for item in extras:
        if item.startswith("-") and len(item) > 1:
            flag = item.split("=", 1)[0]
            hint = did_you_mean(flag, flags, lambda name: f"--{name}")
            return f"{flag}: no such flag{hint}; {command} --help lists them"
    return f"{extras[0]!r}: a value without a flag; flags come as --NAME VALUE ({command} --help)"
