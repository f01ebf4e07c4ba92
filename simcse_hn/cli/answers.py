"""The command line's early answers: what a command can answer before torch and transformers are imported (about
7 s of imports on an idle 2-core machine, far more on a busy one). --help; an unknown or misspelt flag, a bad value or
choice (with the closest name); a --config YAML that is missing, malformed or has an unknown key; a train or eval
file, a local model folder or an STS data folder that is not there. Each is one `error: ...` line and exit status 2.

The answers read the command's flag table (simcse_hn/cli/flags/COMMAND.json, written from the real parser by
`python -m simcse_hn.cli.reference`) and the argument classes that need no torch (ModelArguments, DataArguments),
and share their checks with the command (configuration.command_line, files.check_model_folder, choices): they
refuse only what the command would refuse, in the same words; then the command runs (cli/front.py), and its parser
stays the one authority on a valid run (tests/test_front.py). With several faults the answer may name a different
one first than the command would.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from simcse_hn.choices import GUIDE_SELF, POOLERS, installed_objective_names, unknown_objective
from simcse_hn.cli import flag_table
from simcse_hn.configuration.arguments import DataArguments, ModelArguments
from simcse_hn.configuration.command_line import TRAIN_SOURCE_REQUIRED, configured_argv, one_line, unknown_arguments
from simcse_hn.data.sts import STS_DATA_HINT
from simcse_hn.errors import ConfigError, DataError, UserError, did_you_mean
from simcse_hn.files import PACKAGED_MODELS, check_builtin, check_model_folder, is_local_path, no_model_folder

# train.py --help: the flags most runs set, by --help's groups; every other one is behind --help-all, --help FLAG
# and docs/reference.md
COMMON_FLAGS = (
    "help",
    "config",
    "model_name_or_path",
    "pooler",
    "train_file",
    "dataset_name",
    "eval_file",
    "max_seq_length",
    "loss",
    "temperature",
    "per_device_train_batch_size",
    "learning_rate",
    "num_train_epochs",
    "max_steps",
    "output_dir",
    "eval_strategy",
    "eval_steps",
    "eval_on_start",
)
HELP_ALL = "--help-all"


class _Front(argparse.ArgumentParser):
    """A parser rebuilt from a flag table that raises its error as one line naming the flag (--flag)."""

    def error(self, message):
        raise ConfigError(one_line(message, dashes=True))


class _TrainFront(argparse.ArgumentParser):
    """train.py's: the flag named as the YAML key it also is, and -h however abbreviated (--hel) the common flags
    (`table` set)."""

    table: dict | None = None

    def error(self, message):
        raise ConfigError(one_line(message))

    def print_help(self, file=None):
        (file or sys.stdout).write(short_help(self.table) if self.table is not None else self.format_help())


# --- train.py ---


def answer_train(argv: list[str] | None = None) -> int | None:
    """Help or one error line for train.py's command line, printed; -> the exit status, or None when the run
    should go on."""
    argv = list(sys.argv[1:] if argv is None else argv)
    table = flag_table.load("train")
    try:
        code = train_help(table, argv)
        if code is None:
            check_train(table, argv)
    except SystemExit as e:  # argparse's own -h
        return int(e.code or 0)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return code


def check_train(table: dict, argv: list[str]) -> None:
    """What train.py would refuse before loading a model, checked as it checks it (ConfigError, one line)."""
    fields = table["fields"]
    known = {name for names in fields.values() for name in names}
    configured = configured_argv(argv, known, set(table["list_fields"]))
    parser = flag_table.rebuild(table, _TrainFront)
    parser.table = table
    try:
        namespace, extras = parser.parse_known_args(configured.argv)
        if extras:
            raise ConfigError(unknown_arguments(extras, known, parser.prog))
        values = vars(namespace)
        model = ModelArguments(**{name: values[name] for name in fields["model"]})
        data = DataArguments(**{name: values[name] for name in fields["data"]})
        loss = values["loss"]
        objectives = [*table["objectives"], *installed_objective_names()]
        if ":" not in loss and loss not in objectives:
            raise ConfigError(f"loss: {unknown_objective(loss, objectives)}")
    except ConfigError as e:
        raise configured.located(e) from None
    if data.train_source is None:
        raise ConfigError(TRAIN_SOURCE_REQUIRED)
    models = [("model_name_or_path", model.model_name_or_path), ("guide_model", values["guide_model"])]
    models += [("topic_encoder", values["topic_encoder"])] if values["topic_batches"] else []
    for field, name in models:
        if name is not None and name != GUIDE_SELF and name not in PACKAGED_MODELS:
            check_model_folder(name, field)


def train_help(table: dict, argv: list[str]) -> int | None:
    """--help-all: every flag, as the real parser prints them; --help FLAG or GROUP: that one; -h, --help: the common
    flags. -> the exit status, or None when `argv` asks for no help."""
    parser = flag_table.rebuild(table, _TrainFront)
    if HELP_ALL in argv:
        print(parser.format_help(), end="")
        return 0
    for index, item in enumerate(argv):
        if item in ("-h", "--help"):
            topic = argv[index + 1] if index + 1 < len(argv) and not argv[index + 1].startswith("-") else None
            print(short_help(table) if topic is None else topic_help(table, topic), end="")
            return 0
    return None


def short_help(table: dict) -> str:
    """The common flags, each by its underscore spelling with a short placeholder (--help-all: as the parser has
    them)."""
    flags = [_brief(flag) for flag in table["flags"] if _name(flag) in COMMON_FLAGS]
    count = sum(flag["action"] != "help" for flag in table["flags"])
    parser = flag_table.rebuild(
        table,
        flags=flags,
        description="Train a SimCSE sentence encoder (simcse-hn): the common flags. Every flag "
        f"({count}): {HELP_ALL}, or docs/reference.md; one flag or group: --help FLAG (--help objective, "
        "--help training, ...).",
        epilog="Each flag also goes in a --config YAML file as `name: value`; flags on the command line win.",
    )
    return parser.format_help()


def topic_help(table: dict, topic: str) -> str:
    """One flag (`loss`, `--loss`), or one group by its first word (`objective`, `hcl`, `training`)."""
    name = topic.lstrip("-").replace("-", "_")
    flags = [flag for flag in table["flags"] if _name(flag) == name]
    if not flags:
        titles = {_group_word(group["title"]): index for index, group in enumerate(table["groups"])}
        if name.lower() not in titles:
            shown = {f"--{n}": n for n in map(_name, table["flags"]) if n} | {title: title for title in titles}
            hint = did_you_mean(name, shown, str)
            raise ConfigError(f"--help {topic}: no such flag or group{hint}")
        flags = [flag for flag in table["flags"] if flag["group"] == titles[name.lower()]]
    return flag_table.rebuild(table, flags=flags, usage=argparse.SUPPRESS, description=None, epilog=None).format_help()


_PLACEHOLDERS = {"int": "N", "float": "X", "string_to_bool": "BOOL"}


def _brief(flag: dict) -> dict:
    if flag["action"] == "help":
        return flag | {"help": "show these common flags and exit"}
    options = [option for option in flag["option_strings"] if "-" not in option[2:]]
    path = flag["dest"].endswith(("_file", "_dir", "_path"))
    placeholder = "FILE.yaml" if flag["dest"] == "config" else "PATH" if path else _PLACEHOLDERS.get(flag["type"])
    if flag["metavar"] is None and not flag["choices"]:
        flag = flag | {"metavar": placeholder or flag["dest"].upper().rsplit("_", 1)[-1]}
    return flag | {"option_strings": options}


def _name(flag: dict) -> str | None:
    long = [option for option in flag["option_strings"] if option.startswith("--")]
    return long[0][2:] if long else None


def _group_word(title: str) -> str:
    return title.split()[0].lower() if title else ""


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its usage and error as one `error: ...` line and an unknown flag named with the closest known
    one: for the commands that build their parser without heavy imports (study, negatives, mine). Subcommands'
    parsers are of this class too; `flag_names`: the names of the flags added, no dashes (a parser with
    subcommands adds theirs)."""

    def __init__(self, *args, **kwargs):
        self.flag_names: list[str] = []
        super().__init__(*args, **kwargs)

    def add_argument(self, *names, **kwargs):
        self.flag_names += [name[2:] for name in names if name.startswith("--")]
        return super().add_argument(*names, **kwargs)

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self.exit(2, f"error: {unknown_arguments(extras, self.flag_names, self.prog)}\n")
        return namespace

    def error(self, message):
        self.exit(2, f"error: {one_line(message, dashes=True)}\n")


# --- the argparse commands ---


def answer(command: str, argv: list[str] | None) -> int | None:
    """Help or one error line for an argparse command's command line (with the command's own checks of its flags
    that need no heavy import: CHECKS), printed; -> the exit status, or None when the command should run."""
    table = flag_table.load(command)
    parser = flag_table.rebuild(table, _Front)
    try:
        namespace, extras = parser.parse_known_args(argv)
        if extras:
            raise ConfigError(unknown_arguments(extras, flag_table.flag_names(table), parser.prog))
        if command in CHECKS:
            CHECKS[command](namespace)
    except SystemExit as e:  # -h
        return int(e.code or 0)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return None


def check_sts_flags(args: argparse.Namespace) -> None:
    """What eval/sts.py refuses of its flags alone, before torch is imported (the front) and before any task file is
    read (cli.sts.run): a local --model or --baseline path that is not there, a --data_dir that is no folder, an
    unknown --pooler. DataError, one line."""
    if is_local_path(args.model) and not os.path.isdir(args.model):
        raise DataError(no_model_folder(args.model, "--model"))
    check_builtin(args.model, "--model")
    for spec in args.baseline:
        head, _, tail = spec.rpartition(":")
        name = head if head and tail in POOLERS else spec
        check_builtin(name, f"--baseline {spec}")
        if is_local_path(name) and not os.path.isdir(name):  # the words of evaluation.reports.parse_baseline
            poolers = ", ".join(POOLERS)
            raise DataError(
                f"--baseline {spec}: {name!r} is neither a model folder nor a Hub id (the pooler, after ':', is one "
                f"of {poolers})"
            )
    if args.data_dir is not None and not os.path.isdir(args.data_dir):
        raise DataError(f"--data_dir: no such folder: {args.data_dir} ({STS_DATA_HINT})")
    if args.pooler is not None and args.pooler not in POOLERS:
        hint = did_you_mean(args.pooler, POOLERS)
        raise DataError(f"--pooler: no pooler {args.pooler!r}{hint}; choose from {', '.join(POOLERS)}")


CHECKS: dict[str, Callable[[argparse.Namespace], None]] = {"sts": check_sts_flags}
