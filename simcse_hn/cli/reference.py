"""docs/reference.md, written from the code: the names that code makes at import time, so that each can be found by
grep. Every flag made from the objectives' options (`ObjectiveFlags`, made with `dataclasses.make_dataclass` in
simcse_hn/configuration/objective.py) and every `SimCSE{Title}Loss` (made with `globals().update` in
simcse_hn/export/st_losses.py).

    python -m simcse_hn.cli.reference           # writes docs/reference.md
    python -m simcse_hn.cli.reference --check   # exit 1, naming the command, when docs/reference.md differs

tests/test_reference.py runs the check: a new objective or option is a page to regenerate in the same commit.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

COMMAND = "python -m simcse_hn.cli.reference"
PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"


def cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def type_name(annotation: object) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def markdown() -> str:
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
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing: exit 1 when the page differs")
    parser.add_argument("--page", type=Path, default=PAGE, help="the page (default: docs/reference.md)")
    args = parser.parse_args(argv)
    text = markdown()
    if args.check:
        same = args.page.is_file() and args.page.read_text(encoding="utf-8") == text
        if not same:
            print(f"{args.page.name} differs from the code: run `{COMMAND}`", file=sys.stderr)
        return 0 if same else 1
    args.page.write_text(text, encoding="utf-8")
    print(f"wrote {args.page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
