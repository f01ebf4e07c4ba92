"""What a run can say about where its numbers came from: the hash of the training data as read and the identity of the
code that ran (a hash of the package's own sources, the git commit and whether the checkout was dirty). train.py
records both in simcse_config.json; eval/sts.py records its own and the model's, and can refuse to mix them."""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import shlex
import subprocess
import sys
from collections.abc import Iterable
from typing import Any

from simcse_hn.errors import UserError
from simcse_hn.files import portable_name

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
CHECKOUT = os.path.dirname(PACKAGE_DIR)  # the tree holding the package (a checkout or site-packages)
_CODE_PATTERNS = ("simcse_hn/**/*.py", "train.py", "eval/*.py")


def _local_files(paths: Iterable[str]) -> list[str]:
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            files += [p for p in glob.glob(os.path.join(path, "**", "*"), recursive=True) if os.path.isfile(p)]
        else:
            files.append(path)
    return sorted(set(files))


def data_sha256(source: str | Iterable[str] | Any) -> str:
    """The sha256 of the training data as read: the bytes of the local files (a folder by its files, in sorted
    relative order, each file's relative name hashed with its bytes so a rename counts); for a Hub dataset
    (a `datasets` object, or a name that is no local path) its id with its fingerprint or revision when known."""
    digest = hashlib.sha256()
    if isinstance(source, str):
        source = [source]
    if isinstance(source, (list, tuple)) and all(isinstance(p, str) and os.path.exists(p) for p in source):
        files = _local_files(source)
        root = os.path.commonpath([os.path.dirname(f) for f in files]) if files else "."
        for path in files:
            digest.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            digest.update(b"\0")
        return digest.hexdigest()
    if isinstance(source, (list, tuple)):  # a Hub id (with no local file of that name)
        digest.update(("hub:" + "|".join(str(s) for s in source)).encode())
        return digest.hexdigest()
    info = getattr(source, "info", None)
    name = getattr(info, "dataset_name", None) or getattr(info, "builder_name", None)
    fingerprint = getattr(source, "_fingerprint", None)
    if fingerprint is None:
        raise UserError(f"cannot hash the training data: {type(source).__name__} has no fingerprint")
    digest.update(f"dataset:{name}:{fingerprint}".encode())
    return digest.hexdigest()


def source_sha256(root: str = CHECKOUT) -> str:
    """sha256 over the package's sources and the train/eval scripts under `root`, each by its relative name, sorted."""
    digest = hashlib.sha256()
    files = sorted({p for pattern in _CODE_PATTERNS for p in glob.glob(os.path.join(root, pattern), recursive=True)})
    for path in files:
        digest.update(os.path.relpath(path, root).replace(os.sep, "/").encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(f.read())
        digest.update(b"\0")
    return digest.hexdigest()


def _git(root: str, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def code_identity(root: str = CHECKOUT) -> dict[str, Any]:
    """The code that runs: its source hash, where the package was imported from (portable name), and the git commit
    and dirty flag when `root` is a git checkout (None otherwise; never an error)."""
    identity: dict[str, Any] = {
        "source_sha256": source_sha256(root),
        "package": portable_name(PACKAGE_DIR if root == CHECKOUT else os.path.join(root, "simcse_hn")),
        "git_commit": None,
        "git_dirty": None,
    }
    toplevel = _git(root, "rev-parse", "--show-toplevel")
    if toplevel is not None and os.path.realpath(toplevel) == os.path.realpath(root):
        identity["git_commit"] = _git(root, "rev-parse", "HEAD")
        status = _git(root, "status", "--porcelain", "--", "simcse_hn", "train.py", "eval")
        identity["git_dirty"] = None if status is None else bool(status)
    return identity


def check_own_checkout(script: str, allow_other: bool = False) -> str | None:
    """When `script` runs from a checkout (a tree holding simcse_hn/), the imported package must be that tree's: a
    UserError naming both otherwise, or (allow_other) a one-line warning returned. None when all is well."""
    tree = os.path.dirname(os.path.dirname(os.path.abspath(script)))
    if not os.path.isdir(os.path.join(tree, "simcse_hn")):
        return None  # an installed script: the installed package is its code
    if os.path.realpath(os.path.join(tree, "simcse_hn")) == os.path.realpath(PACKAGE_DIR):
        return None
    problem = f"{os.path.basename(script)} is in {tree} but imported simcse_hn from {PACKAGE_DIR}"
    if not allow_other:
        raise UserError(f"{problem} (run with PYTHONPATH={tree}, or --allow_other_code)")
    return problem


def command_line(program: str, args: Iterable[str]) -> str:
    """The command that made a record, as a reader would type it again: `program` and the arguments, quoted, with
    every value of a flag that names a token or a secret left out and every local path said as files.portable_name
    says it (a card goes to the Hub: no machine's absolute path, no credential)."""
    words, secret = [], False
    for arg in args:
        flag, equals, value = arg.partition("=")
        if secret:
            arg, secret = "***", False
        elif flag.startswith("--") and any(word in flag.lower() for word in ("token", "secret", "password")):
            secret = not equals
            arg = f"{flag}=***" if equals else arg
        elif os.path.isabs(arg):
            arg = portable_name(arg) or arg
        words.append(arg)
    return " ".join([program, *(shlex.quote(word) for word in words)])


def invoked_as(script: str, console: str) -> str:
    """How the running program was started, for command_line: `python train.py` (or `accelerate launch train.py`
    under a launcher's several processes) when sys.argv[0] is the checkout's `script`, else its console `console`."""
    if os.path.basename(sys.argv[0] or "") != os.path.basename(script):
        return console
    launcher = "accelerate launch" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "python"
    return f"{launcher} {script}"


def given_flags(parser: argparse.ArgumentParser, args: argparse.Namespace, required: tuple[str, ...]) -> list[str]:
    """The flags of `args` (`--{dest}`, as the parser names them) that a user passed, as arguments again, in the
    parser's order: the `required` ones, and every other whose value is not the parser's default. A switch that is
    on is its flag alone; a list is the flag once per item."""
    defaults = vars(parser.parse_args([word for name in required for word in (f"--{name}", "-")]))
    words: list[str] = []
    for key, value in vars(args).items():
        if key not in required and (value is None or value is False or value == defaults.get(key)):
            continue
        if value is True:
            words.append(f"--{key}")
        elif isinstance(value, list):
            words += [word for item in value for word in (f"--{key}", str(item))]
        else:
            words += [f"--{key}", str(value)]
    return words


def run_command(
    program: str, parser: argparse.ArgumentParser, args: argparse.Namespace, required: tuple[str, ...]
) -> str:
    """command_line of a parsed run: `program` and the flags the user passed (given_flags)."""
    return command_line(program, given_flags(parser, args, required))
