"""train.py's help formatter, standard library only: the flag tables' light `--help` (cli.flag_table) uses it too."""

from __future__ import annotations

import argparse


def states_default(help_text: str | None) -> bool:
    """Whether a flag's help names its default itself (then neither --help nor the reference adds argparse's)."""
    return bool(help_text) and "(default: " in help_text


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's "(default: ...)" after each flag's help, except where the help states its default itself: a
    built-in objective's option flag is None when unset (the objective's own default applies, which its help names),
    and argparse would add "(default: None)" after it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if states_default(action.help):
            return action.help
        return super()._get_help_string(action)
