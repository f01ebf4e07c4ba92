"""docs/reference.md and the flag tables, written from the code.

The page: the names that code makes at import time, so that each can be found by grep (every flag made from the
objectives' options, `ObjectiveFlags`, made with `dataclasses.make_dataclass` in simcse_hn/configuration/objective.py,
and every `SimCSE{Title}Loss`, made with `globals().update` in simcse_hn/export/st_losses.py), then every flag of
train.py. The tables: simcse_hn/cli/flags/COMMAND.json, each command's flags as its real parser builds them, which the
command line's front reads to answer --help and bad flags before torch is imported (simcse_hn/cli/front.py).

    python -m simcse_hn.cli.reference           # writes docs/reference.md and simcse_hn/cli/flags/*.json
    python -m simcse_hn.cli.reference --check   # exit 1, naming the command, when either differs

tests/test_reference.py and tests/test_front.py run the check: a new objective, option or flag (a transformers
release with new TrainingArguments too) is a page and a table to regenerate in the same commit.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from simcse_hn.cli import flag_table
from simcse_hn.configuration.help_format import states_default

COMMAND = "python -m simcse_hn.cli.reference"
PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"


def cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def type_name(annotation: object) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def tables() -> dict[str, dict]:
    """Each command's flag table, from its real parser (the imports are the commands' own: torch, transformers)."""
    from simcse_hn.cli import compare, curves, mteb_check, sts
    from simcse_hn.configuration import parser
    from simcse_hn.losses import BUILTIN

    train = flag_table.describe(parser.build_parser())
    train |= {"fields": parser.field_names(), "list_fields": parser.list_fields(), "objectives": list(BUILTIN)}
    found = {"train": train}
    for name, module in (("sts", sts), ("compare", compare), ("curves", curves), ("mteb_check", mteb_check)):
        found[name] = flag_table.describe(module.build_parser())
    return found


def markdown(train: dict | None = None) -> str:
    from simcse_hn.configuration.objective import ObjectiveFlags
    from simcse_hn.export import st_losses
    from simcse_hn.losses import BUILTIN
    from simcse_hn.losses.options import option_fields
    from simcse_hn.losses.registry import flag_prefix

    flags = {item.name: item for item in dataclasses.fields(ObjectiveFlags)}
    lines = [
        "# Reference: the names made from the objectives",
        "",
        "[README](../README.md) · [training](training.md) · [losses](losses.md) · [hub](hub.md)",
        "",
        "Some names are made by code when the package is imported, so no source file spells them out: the objectives'",
        "flags (`ObjectiveFlags`, `dataclasses.make_dataclass` in `simcse_hn/configuration/objective.py`) and the",
        "sentence-transformers losses (`globals().update` in `simcse_hn/export/st_losses.py`). This page lists them.",
        f"It is written by `{COMMAND}`; `tests/test_reference.py` fails when it differs from the code.",
        "",
        "## The objectives' flags",
        "",
        "One flag per option of each built-in objective, used with its `--loss`; a flag left out keeps the option's",
        "default. Any objective's options, yours too, also go in `--loss_options` ([training](training.md)).",
        "",
        "| flag | with | type | default | choices | help |",
        "|---|---|---|---|---|---|",
    ]
    for cls in BUILTIN.values():
        for item, annotation in option_fields(cls.Options):
            flag = flags[f"{flag_prefix(cls)}_{item.name}"]
            choices = ", ".join(f"`{c}`" for c in item.metadata.get("choices") or ())
            lines.append(f"| `--{flag.name}` | `--loss {cls.name}` | `{cell(type_name(annotation))}` | "
                         f"`{item.default!r}` | {choices} | {cell(item.metadata['help'])} |")  # fmt: skip
    lines += [
        "",
        "## The sentence-transformers losses",
        "",
        "In `simcse_hn.export.st_losses`, for `SentenceTransformerTrainer` ([hub](hub.md)): `SimCSELoss(model,",
        "objective, **options)` takes any objective; each built-in one also has a class of its own, the objective",
        "fixed.",
        "",
        "| class | objective | options |",
        "|---|---|---|",
    ]
    for name in st_losses.__all__:
        loss = getattr(st_losses, name)
        objective = loss.objective
        if loss is st_losses.SimCSELoss:
            lines.append(f"| `{name}` | any: a built-in name or a class (default `{objective}`) | the objective's |")
            continue
        options = ", ".join(f"`{f.name}`" for f in dataclasses.fields(BUILTIN[objective].Options)) or "none"
        lines.append(f"| `{name}` | `{objective}` | {options} |")
    lines += train_flags(train or tables()["train"])
    return "\n".join(lines) + "\n"


def train_flags(table: dict) -> list[str]:
    """The page's last section: every flag of train.py, by --help's groups, from its flag table."""
    lines = [
        "",
        "## Every flag of train.py",
        "",
        "`python train.py --help` shows the common flags; `--help-all` prints every one, `--help FLAG` one flag, and",
        "`--help GROUP` one group (`model`, `data`, `objective`, `hcl`, `training`, ...). The same flags, by group;",
        "the last group is transformers' `TrainingArguments`, with SimCSE's defaults (installed release: its help).",
        "Each flag also goes in a `--config` YAML as `name: value`.",
    ]
    for index, group in enumerate(table["groups"]):
        flags = [flag for flag in table["flags"] if flag["group"] == index and flag["action"] != "help"]
        if not flags:
            continue
        lines += ["", f"### {group['title']}", "", "| flag | value | default | help |", "|---|---|---|---|"]
        for flag in flags:
            names = ", ".join(f"`{name}`" for name in flag["option_strings"] if "-" not in name[2:])
            default = flag["default"]["shown"] if isinstance(flag["default"], dict) else flag["default"]
            hidden = flag["action"] != "store" or default == argparse.SUPPRESS or states_default(flag["help"])
            shown = "" if hidden else f"`{cell(default)}`"
            lines.append(f"| {names} | {cell(value_name(flag))} | {shown} | {cell(flag['help'] or '')} |")
    return lines


def value_name(flag: dict) -> str:
    """What a flag takes, as a reader names it: a choice's values, a type's name, nothing for a switch."""
    if flag["action"] in ("store_true", "store_false", "store_const"):
        return "(none)"
    if flag["choices"]:
        return " / ".join(flag["choices"])
    kind = flag["type"]
    shown = (
        kind["enum"]
        if isinstance(kind, dict)
        else {"string_to_bool": "true / false", "choice": "text"}.get(kind, kind or "text")
    )
    return f"{shown} ..." if flag["nargs"] in ("+", "*") else f"[{shown}]" if flag["nargs"] == "?" else shown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing: exit 1 when the page differs")
    parser.add_argument("--page", type=Path, default=PAGE, help="the page (default: docs/reference.md)")
    parser.add_argument("--tables", type=Path, default=flag_table.TABLES, help="the flag tables' folder")
    args = parser.parse_args(argv)
    found = tables()
    files = {args.page: markdown(found["train"])}
    files |= {args.tables / f"{name}.json": flag_table.dumps(table) for name, table in found.items()}
    if args.check:
        stale = [
            path for path, text in files.items() if not path.is_file() or path.read_text(encoding="utf-8") != text
        ]
        for path in stale:
            print(f"{path.name} differs from the code: run `{COMMAND}`", file=sys.stderr)
        return 1 if stale else 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
