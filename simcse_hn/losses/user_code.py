"""The code of a user's objective beyond its own file: every module of the user's that the file imports, directly or
through another (its import statements, function-level ones too, and the modules its namespace holds once imported),
by name with the sha256 of its file. A module of the user's is one outside the standard library, outside
site-packages and dist-packages, and not simcse-hn's own: what a `pip install -U` does not change, but an edit does.
A resume compares them (simcse_hn.training.resumed), so a changed helper is refused like a changed objective file."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import sys
import sysconfig
from types import ModuleType

PACKAGE_DIR = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LIBRARY_DIRS = tuple(
    os.path.realpath(path) + os.sep
    for key in ("stdlib", "platstdlib", "purelib", "platlib")
    if (path := sysconfig.get_paths().get(key))
)


def is_users_file(path: str) -> bool:
    """Whether `path` is a module file of the user's (not the standard library's, an installed package's or
    simcse-hn's)."""
    real = os.path.realpath(path)
    parts = real.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return False
    return not real.startswith((*_LIBRARY_DIRS, PACKAGE_DIR + os.sep))


def imported_user_modules(module: ModuleType) -> dict[str, str]:
    """module name -> sha256 of its file, for every module of the user's that `module` imports (itself excluded)."""
    found: dict[str, str] = {}
    seen = {module.__name__}
    todo = [(module.__name__, getattr(module, "__file__", None))]
    while todo:
        name, file = todo.pop()
        for other, other_file in _imports(name, file):
            if other in seen:
                continue
            seen.add(other)
            if other_file and os.path.isfile(other_file) and is_users_file(other_file):
                with open(other_file, "rb") as f:
                    found[other] = hashlib.sha256(f.read()).hexdigest()
                todo.append((other, other_file))
    return dict(sorted(found.items()))


def _imports(name: str, file: str | None) -> list[tuple[str, str | None]]:
    """(module name, file) of what module `name` (its file `file`) imports: its import statements, resolved without
    importing anything new, and the modules its namespace holds or takes objects from."""
    names: list[str] = []
    loaded = sys.modules.get(name)
    if loaded is not None:
        for value in vars(loaded).values():
            if isinstance(value, ModuleType):
                names.append(value.__name__)
            elif isinstance(getattr(value, "__module__", None), str):
                names.append(value.__module__)
    if file and file.endswith(".py") and os.path.isfile(file):
        package = loaded.__package__ if loaded is not None else None
        names += _statement_imports(file, package)
    return [(other, _file_of(other)) for other in dict.fromkeys(names) if other != name]


def _statement_imports(file: str, package: str | None) -> list[str]:
    with open(file, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=file)
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                if not package:
                    continue
                try:
                    base = importlib.util.resolve_name("." * node.level + base, package)
                except ImportError:
                    continue
            names.append(base)
            names += [f"{base}.{alias.name}" for alias in node.names]  # `from pkg import submodule`
    return [name for name in names if name]


def _file_of(name: str) -> str | None:
    """The file of module `name`: the imported module's, else where the import system would find it (a function-level
    import not run yet); None when it is not a module or cannot be found."""
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__file__", None)
    parent = name.rpartition(".")[0]
    if parent and parent not in sys.modules:
        return None  # finding it would import its package: a package not imported is not the user's code in use
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return None
    return spec.origin if spec is not None and spec.has_location else None
