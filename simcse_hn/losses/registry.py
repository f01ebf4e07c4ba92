"""Which objectives exist and how a name becomes one.

`--loss` takes a built-in name (`infonce`, `dcl`, `hcl`, `hardness`, `progcl`, `unremix`), the name of an objective
an installed package declares in the `simcse_hn.objectives` entry-point group, or a user's own class as
`package.module:Class` or `path/to/file.py:Class`. Naming a module runs it: only the command line and a local YAML the
user passes go through `resolve_objective`; nothing that loads a saved folder does (an objective is training-only).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import sys
from typing import Any

from simcse_hn.choices import OBJECTIVE_ENTRY_POINTS, unknown_objective
from simcse_hn.losses.base import ContrastiveLoss, ReweightingLoss
from simcse_hn.losses.hardness import HardnessLoss
from simcse_hn.losses.hcl import DCLLoss, HCLLoss
from simcse_hn.losses.infonce import InfoNCELoss
from simcse_hn.losses.progcl import ProGCLLoss
from simcse_hn.losses.unremix import UnReMixLoss
from simcse_hn.losses.user_code import imported_user_modules

ENTRY_POINTS = OBJECTIVE_ENTRY_POINTS
BUILTIN: dict[str, type[ContrastiveLoss]] = {
    cls.name: cls for cls in (InfoNCELoss, DCLLoss, HCLLoss, HardnessLoss, ProGCLLoss, UnReMixLoss)
}
# the default `--loss` and every comparison's baseline: plain InfoNCE, which every other objective reduces to in its
# neutral setting
BASELINE = InfoNCELoss.name


class ObjectiveError(ValueError):
    """A `--loss` that names no usable objective (one line)."""


def installed_objectives() -> dict[str, importlib.metadata.EntryPoint]:
    """Objectives that installed packages declare (`[project.entry-points."simcse_hn.objectives"]`), by name;
    not loaded."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINTS)}


def is_user_objective(name: str) -> bool:
    """Whether `--loss name` names code of the user's (a module or file) rather than a registered name."""
    return ":" in name


def resolve_objective(name: str) -> type[ContrastiveLoss]:
    """The objective class that `--loss name` means (see the module's docstring). Raises ObjectiveError."""
    if name in BUILTIN:
        return BUILTIN[name]
    if is_user_objective(name):
        module_name, _, attribute = name.rpartition(":")
        cls = getattr(_import(module_name, name), attribute, None) if attribute else None
        if cls is None:
            raise ObjectiveError(f"{name!r}: {module_name} has no class {attribute!r}")
        return _checked(cls, name)
    installed = installed_objectives()
    if name in installed:
        return _checked(installed[name].load(), name)
    raise ObjectiveError(unknown_objective(name, [*BUILTIN, *sorted(installed)]))


def _import(module_name: str, name: str) -> Any:
    if module_name.endswith(".py"):
        path = os.path.abspath(module_name)
        if not os.path.isfile(path):
            raise ObjectiveError(f"{name!r}: file not found: {module_name}")
        key = "simcse_hn_objective_" + "".join(c if c.isalnum() else "_" for c in path)
        if key not in sys.modules:  # the same file named twice (both processes' config, a resume) runs once
            spec = importlib.util.spec_from_file_location(key, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            # what records name (never this machine's absolute path): the file's name, and with its folder
            module.__objective_file__ = os.path.basename(path)  # type: ignore[attr-defined]  # a new module attribute
            module.__objective_path__ = objective_file_record(module_name)  # type: ignore[attr-defined]
            sys.modules[key] = module
            try:
                spec.loader.exec_module(module)
            except Exception as e:
                del sys.modules[key]
                raise ObjectiveError(f"{name!r}: importing {_where(e, path, module_name)} failed: "
                                     f"{type(e).__name__}: {_first_line(e)}") from None  # fmt: skip
        return sys.modules[key]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise ObjectiveError(
            f"{name!r}: {e} (name your class as path/to/file.py:Class, or as package.module:Class with the package's "
            "folder on PYTHONPATH)"
        ) from None
    except Exception as e:
        source = getattr(e, "filename", None) or _module_file(e) or module_name
        raise ObjectiveError(f"{name!r}: importing {_where(e, source, source)} failed: "
                             f"{type(e).__name__}: {_first_line(e)}") from None  # fmt: skip


def _module_file(error: BaseException) -> str | None:
    """The file of the innermost module body that `error` passed through (the module being imported)."""
    found, tb = None, error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "<module>":
            found = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return found


def _where(error: BaseException, path: str, shown: str) -> str:
    """`shown:LINE`, the line of file `path` that `error` came from (a SyntaxError's own, else the innermost frame
    in that file), or `shown` when no frame is in it."""
    if isinstance(error, SyntaxError) and error.filename and os.path.abspath(error.filename) == os.path.abspath(path):
        return f"{shown}:{error.lineno}"
    line, tb = None, error.__traceback__
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename) == os.path.abspath(path):
            line = tb.tb_lineno
        tb = tb.tb_next
    return shown if line is None else f"{shown}:{line}"


def _first_line(error: BaseException) -> str:
    if isinstance(error, SyntaxError):
        return error.msg
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else ""


def objective_file_record(module_name: str) -> str:
    """How records name an objective's file: the path as given when it is relative (`path/to/focal.py`), the parent
    folder and the file's name when it is absolute (`users_code/focal.py`): never a machine's absolute path."""
    if not os.path.isabs(module_name):
        return module_name.replace(os.sep, "/")
    parent, base = os.path.split(os.path.normpath(module_name))
    return f"{os.path.basename(parent)}/{base}" if os.path.basename(parent) else base


def objective_source(cls: type[ContrastiveLoss]) -> dict[str, Any] | None:
    """A user's objective's file as records name it (`objective_file_record`), the sha256 of its bytes and of every
    module of the user's it imports (`imports`, user_code.imported_user_modules), which a resume compares (so the file
    may move, not change); None for a class without a file (a built-in's is the package's code)."""
    if cls.name in BUILTIN and BUILTIN[cls.name] is cls:
        return None
    module = sys.modules.get(cls.__module__)
    file = getattr(module, "__file__", None)
    if module is None or not file or not os.path.isfile(file):
        return None
    with open(file, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    shown = getattr(module, "__objective_path__", None) or cls.__module__.replace(".", "/") + ".py"
    return {"file": shown, "sha256": digest, "imports": imported_user_modules(module)}


def _checked(cls: Any, name: str) -> type[ContrastiveLoss]:
    if not (isinstance(cls, type) and issubclass(cls, ContrastiveLoss)):
        raise ObjectiveError(f"{name!r} is not a simcse_hn.losses.ContrastiveLoss subclass")
    if cls.per_anchor is ContrastiveLoss.per_anchor or (
        issubclass(cls, ReweightingLoss) and cls.per_anchor is ReweightingLoss.per_anchor
        and cls.log_weights is ReweightingLoss.log_weights
    ):
        raise ObjectiveError(f"{name!r} defines neither per_anchor nor log_weights")
    return cls


def objective_class_path(cls: type[ContrastiveLoss]) -> str:
    """`module:Class` of an objective (`file.py:Class` for one loaded from a file, without its folder): what a record
    names, never imported from a record."""
    source = getattr(sys.modules.get(cls.__module__), "__objective_file__", None)
    return f"{source or cls.__module__}:{cls.__qualname__}"


def portable_loss_name(name: str) -> str:
    """A `--loss` value as records keep it: a file's name without its folder (`path/to/focal.py:Focal` ->
    `focal.py:Focal`), anything else as given."""
    module_name, _, attribute = name.rpartition(":")
    if is_user_objective(name) and module_name.endswith(".py"):
        return f"{os.path.basename(module_name)}:{attribute}"
    return name


def flag_prefix(cls: type[ContrastiveLoss]) -> str | None:
    """The configuration's flag prefix of a built-in objective's options (`hcl` -> --hcl_beta); None for others,
    whose options come through loss_options only."""
    if cls.name not in BUILTIN or BUILTIN[cls.name] is not cls:
        return None
    return cls.flag_prefix or cls.name


def build_loss(name: str | type[ContrastiveLoss], temperature: float = 0.05, **options: Any) -> ContrastiveLoss:
    """The objective `name` (a `--loss` value or a class) with its options, validated. Raises ValueError."""
    cls = resolve_objective(name) if isinstance(name, str) else _checked(name, name.__name__)
    return cls(temperature, **options)


def benchmark_settings() -> dict[str, tuple[str, dict[str, Any]]]:
    """Every built-in objective and its named variants, as the benches and tests run them: {"progcl-mix":
    ("progcl", {"mode": "mix"}), "hcl": ("hcl", {}), ...}; InfoNCE, the baseline, first (bench.common.timed_settings
    adds what timed runs need)."""
    settings: dict[str, tuple[str, dict[str, Any]]] = {}
    for name, cls in BUILTIN.items():
        if not cls.variants:
            settings[name] = (name, {})
        for variant, options in cls.variants.items():
            settings[f"{name}-{variant}"] = (name, dict(options))
    return settings


def setting_flags(name: str, options: dict[str, Any]) -> list[str]:
    """train.py arguments of a setting from `benchmark_settings`: --loss and its options as --loss_options."""
    return ["--loss", name] + (["--loss_options", json.dumps(options)] if options else [])
