"""The package's shape, drawn from its own imports (ast, nothing imported): no import circle, each subpackage imports
only the layers below it, no import of the package hidden in a function, no module over 400 lines outside losses/.
The checks run on the real package and, to show they can fail, on small packages written here with each fault."""

from __future__ import annotations

import ast
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
        if sub != "losses" and lines[module] > MAX_LINES and module not in known_long:
            found.append(f"{module}: {lines[module]} lines (> {MAX_LINES})")
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
