"""The package's shape, drawn from its own source (ast, nothing of it imported): no import circle, each subpackage
imports only the layers below it, no import of the package hidden in a function, no module over 400 lines outside
losses/ (the trainer: 300); the row layout worked out in one place (losses.targets.RowLayout); every private member
of another library it uses listed in simcse_hn.private_api. The checks run on the real package and, to show they can
fail, on small packages written here with each fault."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "simcse_hn"
MAX_LINES = 400
# Bottom to top: a module may import its own layer and the layers below it. The first layer is the package's
# top-level modules (errors, files, provenance); `testing` the tiny models and test stand-ins; `cli` the console
# scripts' code.
LAYERS = ("", "testing", "losses", "data", "modeling", "configuration", "evaluation", "training", "export", "study",
          "cli")
# Arrows that still run upward, each with its reason; a new one fails the check.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}
# Modules allowed over MAX_LINES for now, each with its reason.
KNOWN_LONG: dict[str, str] = {}
# Modules held to a lower cap than MAX_LINES, each with its reason.
CAPS: dict[str, int] = {
    "simcse_hn.training.trainer": 300,  # adapters for loss, evaluation and saving; the batches are training.batches'
}
# Where a function-level import of the package is allowed: entry points, which nothing in the package imports.
LAZY_ALLOWED = ("cli",)


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> tuple[dict[str, set[str]], dict[str, list[tuple[str, int]]], dict[str, int]]:
    """-> (module -> the package's modules it imports, module -> [(function-level import, line)], module -> lines).
    `from pkg import name` is an arrow to pkg.name when that is a module, else to pkg; importing a module also runs
    its parent packages' __init__, so those are arrows too (but for the importing module's own packages)."""
    files = {module_name(root, path): path for path in sorted(root.rglob("*.py"))}
    graph, lazy, lines = {}, {}, {}
    for name, path in files.items():
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        lines[name] = len(source.splitlines())
        top = {id(node) for node in tree.body}
        targets, hidden = set(), []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in files]
                imported = found or [node.module]
            elif isinstance(node, ast.Import):
                imported = [a.name for a in node.names]
            else:
                continue
            imported = [m for m in imported if m == root.name or m.startswith(root.name + ".")]
            if imported and id(node) not in top:
                hidden += [(m, node.lineno) for m in imported]
            ancestors = {name.rsplit(".", k)[0] for k in range(1, name.count(".") + 1)}
            for target in imported:
                while target and target not in ancestors:  # a module's own packages are already running
                    if target in files and target != name:
                        targets.add(target)
                    target = target.rpartition(".")[0]
        graph[name], lazy[name] = targets, hidden
    return graph, lazy, lines


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each strongly connected group of modules (Tarjan), sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def subpackage(root: Path, module: str) -> str:
    """'data' for simcse_hn.data and simcse_hn.data.pairs, '' for a top-level module such as simcse_hn.files."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (root / parts[1]).is_dir()) else ""


def layer(root: Path, module: str) -> int:
    sub = subpackage(root, module)
    return LAYERS.index(sub) if sub in LAYERS else -1


def problems(root: Path, known_upward=None, known_long=None) -> list[str]:
    known_upward = KNOWN_UPWARD if known_upward is None else known_upward
    known_long = KNOWN_LONG if known_long is None else known_long
    graph, lazy, lines = import_graph(root)
    found = [f"import circle: {' <-> '.join(group)}" for group in cycles(graph)]
    for module, targets in sorted(graph.items()):
        if layer(root, module) < 0:
            found.append(f"{module}: in no layer of LAYERS")
        for target in sorted(targets):
            known = any(m == module and (t == target or t.startswith(target + ".")) for m, t in known_upward)
            if layer(root, target) > layer(root, module) and not known:
                found.append(f"upward import: {module} -> {target}")
        sub = subpackage(root, module)
        cap = CAPS.get(module.replace(root.name, "simcse_hn", 1), MAX_LINES)
        if sub != "losses" and lines[module] > cap and module not in known_long:
            found.append(f"{module}: {lines[module]} lines (> {cap})")
        if sub not in LAZY_ALLOWED:
            found += [f"{module}:{line}: function-level import of {target}" for target, line in lazy[module]]
    return found


def test_the_package_has_no_circle_no_upward_arrow_no_hidden_import_and_no_long_module():
    assert problems(PACKAGE) == []


def test_every_known_exception_is_still_needed():
    graph, _, lines = import_graph(PACKAGE)
    assert [pair for pair in KNOWN_UPWARD if pair[1] not in graph.get(pair[0], ())] == []
    assert [module for module in KNOWN_LONG if lines.get(module, 0) <= MAX_LINES] == []


def write_package(root: Path, files: dict[str, str]) -> Path:
    package = root / "simcse_hn"
    for name, text in {"__init__.py": "", **files}.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(text)
    return package


@pytest.mark.parametrize(
    "files, expected",
    [
        ({"data/a.py": "from simcse_hn.data import b\n", "data/b.py": "from simcse_hn.data.a import x\n"},
         "import circle: simcse_hn.data.a <-> simcse_hn.data.b"),
        ({"data/a.py": "from simcse_hn.training.t import x\n", "training/t.py": ""},
         "upward import: simcse_hn.data.a -> simcse_hn.training.t"),
        ({"data/a.py": "def f():\n    from simcse_hn.losses.b import x\n", "losses/b.py": ""},
         "simcse_hn.data.a:2: function-level import of simcse_hn.losses.b"),
        ({"data/a.py": "x = 1\n" * 401}, "simcse_hn.data.a: 401 lines (> 400)"),
        ({"training/trainer.py": "x = 1\n" * 301}, "simcse_hn.training.trainer: 301 lines (> 300)"),
        ({"stray/a.py": ""}, "simcse_hn.stray.a: in no layer of LAYERS"),
    ],
)
def test_each_check_fails_on_its_fault(tmp_path, files, expected):
    package = write_package(tmp_path, files)
    assert expected in problems(package, known_upward={}, known_long={})


def test_a_long_module_in_losses_and_a_lazy_import_in_cli_pass(tmp_path):
    package = write_package(tmp_path, {"losses/a.py": "x = 1\n" * 401,
                                       "cli/run.py": "def main():\n    from simcse_hn.losses.a import x\n"})
    assert problems(package, known_upward={}, known_long={}) == []


# --- no function over MAX_FUNCTION_LINES lines ---

MAX_FUNCTION_LINES = 100


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """'module:line name: N lines' for every function or method (nested ones too) longer than `limit` lines, from its
    `def` to its last line."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found.append(f"{module_name(root, path)}:{node.lineno} {node.name}: {length} lines")
    return found


def test_no_function_of_the_package_is_over_100_lines():
    assert long_functions(PACKAGE) == []


def test_the_function_length_check_fails_on_a_long_function_and_a_long_method(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(100))
    method = body.replace("    x", "        x")
    files = {
        "data/a.py": f"def short():\n    return 1\n\n\ndef long():\n{body}",
        "cli/b.py": f"class C:\n    def method(self):\n{method}",
    }
    package = write_package(tmp_path, files)
    assert long_functions(package) == ["simcse_hn.cli.b:2 method: 101 lines", "simcse_hn.data.a:5 long: 101 lines"]


def imported_roots(path: Path) -> set[str]:
    """The top-level names a Python file imports (absolute imports only)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def cross_imports(root: Path) -> list[str]:
    """Files of tests/ that import bench, and files of bench/ that import a module of tests/."""
    test_modules = {"tests"} | {path.stem for path in (root / "tests").glob("*.py")}
    found = [f"tests/{p.name} imports bench" for p in (root / "tests").glob("*.py") if "bench" in imported_roots(p)]
    return found + [f"bench/{p.name} imports tests" for p in (root / "bench").glob("*.py")
                    if imported_roots(p) & test_modules]  # fmt: skip


def test_bench_and_tests_never_import_each_other(tmp_path):
    """The benches' own checks live in bench/ (bench/test_*.py); what both need is in simcse_hn.testing."""
    assert cross_imports(PACKAGE.parent) == []
    for folder, text in (("tests", "from bench import common\n"), ("bench", "from conftest import ROOT\n")):
        (tmp_path / "tests").mkdir(exist_ok=True)
        (tmp_path / "bench").mkdir(exist_ok=True)
        (tmp_path / "tests" / "conftest.py").write_text("ROOT = 1\n")
        (tmp_path / folder / "faulty.py").write_text(text)
    assert sorted(cross_imports(tmp_path)) == ["bench/faulty.py imports tests", "tests/faulty.py imports bench"]


# --- the row layout, said in one place ---

# Where the row layout ([a, a', ...] or [a, p, n_1..n_k]) is defined: simcse_hn.losses.targets.RowLayout (and the
# targets it builds).
LAYOUT_HOME = "simcse_hn.losses.targets"
# Modules that still re-derive it, each with its reason; a new one fails the check, and a mended one must leave here.
KNOWN_LAYOUT: dict[str, str] = {}


def _named(node: ast.AST, name: str) -> bool:
    return (isinstance(node, ast.Name) and node.id == name) or (isinstance(node, ast.Attribute) and node.attr == name)


def _is_two(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value == 2


def layout_rederivations(root: Path) -> dict[str, list[str]]:
    """module -> the places (line: what) where it works the row layout out itself: `group_size or 2`, `% group_size`,
    `repeat_interleave(2)` (each text twice), a slice of every second row, a row index halved (`// 2`)."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        module = module_name(root, path)
        if module == LAYOUT_HOME.replace("simcse_hn", root.name, 1):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            what = None
            if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and _is_two(node.values[-1]):
                what = "... or 2" if any(_named(v, "group_size") for v in node.values) else None
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and _named(node.right, "group_size"):
                what = "% group_size"
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv) and _is_two(node.right):
                what = "// 2"
            elif isinstance(node, ast.Call) and _named(node.func, "repeat_interleave") and node.args:
                what = "repeat_interleave(2)" if _is_two(node.args[0]) else None
            elif isinstance(node, ast.Slice) and _is_two(node.step):
                what = "a slice of every second row"
            if what:
                found.setdefault(module, []).append(f"{node.lineno}: {what}")
    return found


def test_the_row_layout_is_worked_out_in_one_place():
    found = layout_rederivations(PACKAGE)
    assert {module: places for module, places in found.items() if module not in KNOWN_LAYOUT} == {}
    assert [module for module in KNOWN_LAYOUT if module not in found] == []  # a mended module leaves the list


@pytest.mark.parametrize(
    "source, expected",
    [
        ("chunk = size * (group_size or 2)\n", "1: ... or 2"),
        ("keep = rows[rows % self.group_size != 0]\n", "1: % group_size"),
        ("rows = ids.repeat_interleave(2)\n", "1: repeat_interleave(2)"),
        ("first = rows[0::2]\n", "1: a slice of every second row"),
        ("text = texts[row // 2]\n", "1: // 2"),
    ],
)
def test_the_layout_check_fails_on_each_rederivation(tmp_path, source, expected):
    package = write_package(tmp_path, {"training/queue.py": source, "losses/targets.py": source})
    assert layout_rederivations(package) == {"simcse_hn.training.queue": [expected]}  # the home is exempt


# --- every private member of another library, listed (simcse_hn.private_api) ---

# Underscored names that are documented, public API: the standard library's (namedtuple's, os._exit), and the two
# methods evaluate's docs tell a new metric to implement (evaluate.Metric's `_info` and `_compute`)
DOCUMENTED = {"_asdict", "_replace", "_fields", "_make", "_exit", "_info", "_compute"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in DOCUMENTED


def private_members_used(root: Path) -> dict[str, str]:
    """name -> the first place (module:line) where the package relies on a private member of another library: a
    method of a class of it that overrides one of its base's (a base imported from another library), or a private
    name it reaches on anything but itself that the package does not define (`torch._foreach_norm`,
    `super()._get_grad_norm`, `result._round_scores`). Read from the source: nothing of the package is run."""
    trees = {module_name(root, path): ast.parse(path.read_text(encoding="utf-8")) for path in root.rglob("*.py")}
    defined = set()  # private names the package defines: functions, classes, attributes of self / cls, class fields
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _named(node.value, "self"):
                defined.add(node.attr)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _named(node.value, "cls"):
                defined.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
    found: dict[str, str] = {}
    for module, tree in sorted(trees.items()):
        imported = {alias.asname or alias.name: f"{node.module}.{alias.name}" for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and not node.module.startswith(root.name) for alias in node.names}  # fmt: skip
        imported |= {alias.asname or alias.name: alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                     for alias in node.names if not alias.name.startswith(root.name)}  # fmt: skip
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [_import(path) for path in (_dotted(base, imported) for base in node.bases) if path]
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and _private(item.name):
                        if any(hasattr(base, item.name) for base in bases):
                            found.setdefault(item.name, f"{module}:{item.lineno}")
            elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in defined:
                found.setdefault(node.attr, f"{module}:{node.lineno}")
            elif (name := _private_by_name(node)) is not None:
                found.setdefault(name, f"{module}:{node.lineno}")
    return found


def _private_by_name(node: ast.AST) -> str | None:
    """A private name reached through a string on anything but `self`/`cls` (whatever the package defines: a name
    read on another object is that object's): `getattr(x, "_name")`, hasattr, setattr, delattr, `vars(x)["_name"]`,
    `x.__dict__["_name"]`."""
    target = name = None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2:
        if node.func.id in ("getattr", "hasattr", "setattr", "delattr"):
            target, name = node.args[0], node.args[1]
    elif isinstance(node, ast.Subscript):
        value = node.value
        if isinstance(value, ast.Call) and _named(value.func, "vars") and value.args:
            target, name = value.args[0], node.slice
        elif isinstance(value, ast.Attribute) and value.attr == "__dict__":
            target, name = value.value, node.slice
    if not (isinstance(name, ast.Constant) and isinstance(name.value, str) and _private(name.value)):
        return None
    return None if _named(target, "self") or _named(target, "cls") else name.value


def _dotted(node: ast.AST, imported: dict[str, str]) -> str | None:
    """The import path of a base class written `Name` or `module.Name` (`argparse.HelpFormatter`), when its first
    name was imported from another library; else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in imported:
        return None
    return ".".join([imported[node.id], *reversed(parts)])


def _import(path: str) -> object:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name, None)


def private_member_problems(root: Path, listed: set[str]) -> list[str]:
    used = private_members_used(root)
    unlisted = [f"{where}: {name} is private to another library and not in simcse_hn.private_api"
                for name, where in used.items() if name not in listed]  # fmt: skip
    return sorted(unlisted + [f"{name}: listed in simcse_hn.private_api, used nowhere" for name in listed - set(used)])


def test_every_private_member_of_another_library_is_listed():
    from simcse_hn.private_api import PRIVATE_MEMBERS

    assert private_member_problems(PACKAGE, {member.name for member in PRIVATE_MEMBERS}) == []


# private names reached through strings: getattr, hasattr, setattr, vars(...)[...], __dict__[...]
BY_NAME = """def f(model, data, m):
    a = getattr(model, "_orig_mod", model)
    b = hasattr(data, "_fingerprint")
    setattr(m, "_flag", 1)
    return vars(m)["_hidden"], m.__dict__["_state"], getattr(m, "_own")


class D:
    def g(self):
        self._own = 1
        return getattr(self, "_own")
"""


def test_the_private_member_check_fails_on_an_unlisted_use_and_a_stale_entry(tmp_path):
    package = write_package(tmp_path, {
        "training/a.py": "import torch\n\ndef f(xs):\n    return torch._foreach_abs(xs)\n",
        "configuration/p.py": "from transformers import HfArgumentParser\n\n\nclass P(HfArgumentParser):\n"
                              "    def _add_dataclass_arguments(self, dtype):\n        self._own = 1\n"
                              "        return self._own\n",
        "configuration/f.py": "import argparse\n\n\nclass F(argparse.HelpFormatter):\n"
                              "    def _get_help_string(self, action):\n        return action.help\n",
        "modeling/s.py": BY_NAME,
    })  # fmt: skip
    unlisted = "is private to another library and not in simcse_hn.private_api"
    assert private_member_problems(package, {"_run_exitfuncs"}) == [
        "_run_exitfuncs: listed in simcse_hn.private_api, used nowhere",
        f"simcse_hn.configuration.f:5: _get_help_string {unlisted}",
        f"simcse_hn.configuration.p:5: _add_dataclass_arguments {unlisted}",
        f"simcse_hn.modeling.s:2: _orig_mod {unlisted}",
        f"simcse_hn.modeling.s:3: _fingerprint {unlisted}",
        f"simcse_hn.modeling.s:4: _flag {unlisted}",
        f"simcse_hn.modeling.s:5: _hidden {unlisted}",
        f"simcse_hn.modeling.s:5: _own {unlisted}",  # defined on self in D, read on another object here
        f"simcse_hn.modeling.s:5: _state {unlisted}",
        f"simcse_hn.training.a:4: _foreach_abs {unlisted}",
    ]
    listed = {"_foreach_abs", "_add_dataclass_arguments", "_orig_mod", "_fingerprint", "_flag", "_hidden"}
    listed |= {"_own", "_state", "_get_help_string"}
    assert private_member_problems(package, listed) == []
