"""The console scripts' and train.py's, eval/*.py's entry: the command line's early answers first
(simcse_hn/cli/answers.py: --help, a bad flag, value or file, in a fraction of a second, before torch and
transformers are imported), then the command itself, imported only now.

`simcse-hn-train` / `python train.py`: `train`; `simcse-hn-sts` / `eval/sts.py`: `sts`; `compare`, `curves`,
`mteb_check` likewise.
"""

from __future__ import annotations

import sys

from simcse_hn.cli.answers import answer, answer_train


def train(argv: list[str] | None = None) -> None:
    """`simcse-hn-train` and `python train.py`: the front's answer, else the run (cli.train.console)."""
    code = answer_train(argv)
    if code is not None:
        sys.exit(code)
    from simcse_hn.cli.train import console

    console(argv)


def sts(argv: list[str] | None = None, script: str | None = None) -> int:
    """`simcse-hn-sts` and eval/sts.py (`script`: that file, whose checkout must be the one imported)."""
    code = answer("sts", argv)
    if code is not None:
        return code
    from simcse_hn.cli.sts import main

    return main(argv, script=script)


def compare(argv: list[str] | None = None) -> int:
    code = answer("compare", argv)
    if code is not None:
        return code
    from simcse_hn.cli.compare import main

    return main(argv)


def curves(argv: list[str] | None = None) -> int:
    code = answer("curves", argv)
    if code is not None:
        return code
    from simcse_hn.cli.curves import main

    return main(argv)


def mteb_check(argv: list[str] | None = None) -> int:
    code = answer("mteb_check", argv)
    if code is not None:
        return code
    from simcse_hn.cli.mteb_check import main

    return main(argv)
