"""A plan file read as it stands (its YAML and the line of each key, for messages that name it), light on purpose:
`simcse-hn-study` reads it before torch is imported, so a missing or malformed plan is one line at once."""

from __future__ import annotations

import os

import yaml

from simcse_hn.errors import ConfigError


def key_lines(text: str) -> dict[tuple, int]:
    """(key, subkey, ...) -> the line it is on, for messages that name the line."""
    lines: dict[tuple, int] = {}

    def walk(node, path: tuple) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                lines[(*path, key.value)] = key.start_mark.line + 1
                walk(value, (*path, key.value))

    try:
        walk(yaml.compose(text), ())
    except yaml.YAMLError:
        pass
    return lines


def problem_line(path: str, lines: dict[tuple, int], where: tuple, message: str) -> str:
    """`file:line: key.subkey: message`, on the line of the longest part of `where` the file holds."""
    line = next((lines[where[:k]] for k in range(len(where), 0, -1) if where[:k] in lines), None)
    return f"{path}{f':{line}' if line else ''}: {'.'.join(map(str, where))}: {message}"


def read_plan(path: str) -> tuple[dict, dict[tuple, int]]:
    """The plan's mapping and the line of each key; a missing, malformed or non-mapping file is a ConfigError."""
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: no such plan")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = mark.line + 1 if mark else "?"
        raise ConfigError(f"{path}:{where}: malformed YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a plan is a mapping of key: value, got {type(raw).__name__}")
    return raw, key_lines(text)
