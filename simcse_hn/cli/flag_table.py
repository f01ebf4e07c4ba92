"""A command's flags as data, so that the command line can be answered before torch and transformers are imported.

`describe(parser)` reads every flag of a real parser (names, action, type, choices, default, help, group) into a
table; `python -m simcse_hn.cli.reference` writes one per command into simcse_hn/cli/flags/COMMAND.json. `rebuild`
makes an argparse parser from a table, with light stand-ins for the types (`string_to_bool`, a choice, an Enum): it
prints the same --help and refuses the same bad flags and values as the real parser, which stays the one authority
on a valid run (tests/test_front.py holds the two to that on many inputs). A type without a light stand-in is taken
as any text here, and checked by the real parser after the imports."""

from __future__ import annotations

import argparse
import enum
import json
from collections.abc import Callable
from pathlib import Path

from simcse_hn.configuration.help_format import DefaultsHelpFormatter

TABLES = Path(__file__).resolve().parent / "flags"
# argparse's action classes by the names add_argument takes (their class names are argparse's own)
ACTIONS = {
    "_StoreAction": "store",
    "_StoreConstAction": "store_const",
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "_AppendAction": "append",
    "_AppendConstAction": "append_const",
    "_CountAction": "count",
    "_HelpAction": "help",
    "_VersionAction": "version",
    "BooleanOptionalAction": "boolean_optional",
}
_FORMATTERS = {
    cls.__name__: cls
    for cls in (
        argparse.HelpFormatter,
        argparse.ArgumentDefaultsHelpFormatter,
        argparse.RawDescriptionHelpFormatter,
        argparse.RawTextHelpFormatter,
        DefaultsHelpFormatter,
    )
}
_PLAIN_TYPES = {"int": int, "float": float, "str": str, "dict": dict}
_TRUE, _FALSE = ("yes", "true", "t", "y", "1"), ("no", "false", "f", "n", "0")


def load(command: str) -> dict:
    with open(TABLES / f"{command}.json", encoding="utf-8") as f:
        return json.load(f)


def write(command: str, table: dict) -> None:
    (TABLES / f"{command}.json").write_text(dumps(table), encoding="utf-8")


def dumps(table: dict) -> str:
    return json.dumps(table, indent=1, ensure_ascii=False) + "\n"


# --- from a real parser ---


def describe(parser: argparse.ArgumentParser) -> dict:
    """Every flag of `parser`, in its order, with what rebuilding it takes (subparsers and mutually exclusive groups
    are not described: the commands that have them build their parser without heavy imports)."""
    if _FORMATTERS.get(parser.formatter_class.__name__) is not parser.formatter_class:
        raise ValueError(f"{parser.formatter_class}: no light stand-in for this help formatter")
    groups = parser._action_groups
    flags = []
    for action in parser._actions:
        kind = ACTIONS.get(type(action).__name__)
        if kind is None:
            raise ValueError(f"{action.option_strings or action.dest}: {type(action).__name__} is not described")
        flags.append(
            {
                "group": groups.index(action.container),
                "option_strings": list(action.option_strings),
                "dest": action.dest,
                "action": kind,
                "nargs": action.nargs,
                "const": _value(action.const),
                "default": _value(action.default),
                "type": _type(action),
                "choices": None if action.choices is None else [_choice(c) for c in action.choices],
                "required": action.required,
                "help": action.help,
                "metavar": list(action.metavar) if isinstance(action.metavar, tuple) else action.metavar,
            }
        )
    return {
        "usage": parser.usage,
        "description": parser.description,
        "epilog": parser.epilog,
        "formatter": parser.formatter_class.__name__,
        "allow_abbrev": parser.allow_abbrev,
        "groups": [{"title": group.title, "description": group.description} for group in groups],
        "flags": flags,
    }


def _value(value: object) -> object:
    """A default or constant as JSON when it is one; else {"shown": its text}, which --help prints alike."""
    plain = (type(None), bool, int, float, str)
    if isinstance(value, plain) or (isinstance(value, list) and all(isinstance(v, plain) for v in value)):
        return value
    return {"shown": str(value)}


def _choice(choice: object) -> str:
    if not isinstance(choice, str):
        raise ValueError(f"{choice!r}: only text choices are described")
    return choice


def _type(action: argparse.Action) -> object:
    """The flag's type by name: a plain one, 'string_to_bool' (transformers' booleans), 'choice' (a choice among
    texts, which HfArgumentParser maps to itself), an Enum's name and values, or 'text' (no light stand-in)."""
    kind = action.type
    if kind is None:
        return None
    name = getattr(kind, "__name__", "")
    if getattr(kind, "__origin__", kind) in _PLAIN_TYPES.values():
        return getattr(kind, "__origin__", kind).__name__
    if name == "string_to_bool":
        return "string_to_bool"
    if name == "<lambda>" and action.choices is not None:
        return "choice"
    if isinstance(kind, enum.EnumMeta):
        return {"enum": name, "values": [str(member.value) for member in kind]}
    return "text"


# --- back into a parser ---


class _Shown:
    """A default that --help prints as the real parser does but that is not parsed (a value only the real types
    make)."""

    def __init__(self, text: str):
        self.text = text

    def __str__(self) -> str:
        return self.text


def _light_type(spec: object) -> Callable[[str], object] | None:
    if spec is None or spec in ("choice", "text"):
        return None
    if spec == "string_to_bool":
        return string_to_bool
    if isinstance(spec, dict):  # an Enum: argparse names it in its message, as it names the real one
        values = spec["values"]

        def member(value: str) -> str:
            if value not in values:
                raise ValueError(value)
            return value

        member.__name__ = spec["enum"]
        return member
    return _PLAIN_TYPES[spec]


def string_to_bool(value: str | bool) -> bool:
    """transformers.hf_argparser.string_to_bool, whose message argparse prints as it is."""
    if isinstance(value, bool):
        return value
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise argparse.ArgumentTypeError(
        f"Truthy value expected: got {value} but expected one of yes/no, true/false, t/f, y/n, 1/0 (case insensitive)."
    )


def _restore(value: object) -> object:
    if value == argparse.SUPPRESS:  # argparse knows it by identity
        return argparse.SUPPRESS
    return _Shown(value["shown"]) if isinstance(value, dict) else value


def rebuild(table: dict, parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser, flags=None, **kwargs):
    """An argparse parser with the table's flags (`flags`: a subset of them, for a shorter --help); `kwargs` replace
    the table's usage, description or epilog."""
    settings = {"usage": table["usage"], "description": table["description"], "epilog": table["epilog"], **kwargs}
    parser = parser_class(
        **settings,
        formatter_class=_FORMATTERS[table["formatter"]],
        allow_abbrev=table["allow_abbrev"],
        add_help=False,
    )
    # argparse files a flag in its own first two groups by its form; the others in --help's order, an empty one unseen
    groups = [parser, parser] + [parser.add_argument_group(g["title"], g["description"]) for g in table["groups"][2:]]
    for flag in table["flags"] if flags is None else flags:
        groups[flag["group"]].add_argument(*flag["option_strings"] or [flag["dest"]], **_arguments(flag))
    return parser


def _arguments(flag: dict) -> dict:
    action = flag["action"]
    arguments = {"action": argparse.BooleanOptionalAction if action == "boolean_optional" else action}
    if flag["option_strings"]:
        arguments["dest"] = flag["dest"]
    if flag["help"] is not None:
        arguments["help"] = flag["help"]
    if action in ("help", "version"):
        return arguments
    arguments["default"] = _restore(flag["default"])
    if action in ("store_true", "store_false", "count"):
        return arguments | ({"required": True} if flag["required"] else {})
    if action in ("store_const", "append_const"):
        return arguments | {"const": _restore(flag["const"])}
    arguments |= {"nargs": flag["nargs"], "type": _light_type(flag["type"]), "choices": flag["choices"]}
    if flag["nargs"] == "?":
        arguments["const"] = _restore(flag["const"])
    if flag["option_strings"] and flag["required"]:
        arguments["required"] = True
    if flag["metavar"] is not None:
        arguments["metavar"] = tuple(flag["metavar"]) if isinstance(flag["metavar"], list) else flag["metavar"]
    return arguments


def flag_names(table: dict) -> list[str]:
    """Every flag's name without dashes, in the table's order (its first long spelling)."""
    names = []
    for flag in table["flags"]:
        long = [s for s in flag["option_strings"] if s.startswith("--")]
        if long:
            names.append(long[0][2:])
    return names
