"""The package's import structure: modules import strictly downward.

Read from the sources (AST), not by importing, so a cycle that only works
thanks to a function-level import is caught too: every intra-package import
counts, wherever it is written, except the few listed below with their
reason.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import REPO

PACKAGE = REPO / "pjrt_host"

# Function-level imports that point upward on purpose, with why.
ALLOWED_UPWARD = {
    # autoload runs inside `import torch` and must stay cheap: the package
    # names the device and imports its registration only when torch calls in.
    ("pjrt_host._torch", "pjrt_host._torch._boot._privateuse1"),
    ("pjrt_host._torch", "pjrt_host._torch._boot._builtin"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path, modules: dict[str, Path], tree: ast.Module | None = None) -> set[str]:
    """Intra-package modules ``name`` imports (module-level or not), read
    from ``path`` (or from ``tree``, parsed from it already)."""
    is_package = path.name == "__init__.py"
    base = name.split(".") if is_package else name.split(".")[:-1]
    found: set[str] = set()
    tree = ast.parse(path.read_text()) if tree is None else tree
    type_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block.test)
                 for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue  # `if TYPE_CHECKING:` imports never run
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                root = ".".join(base[: len(base) - node.level + 1])
                target = f"{root}.{node.module}" if node.module else root
            else:
                target = node.module or ""
            # `from . import _x` names a submodule; `from . import NAME` the package.
            targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and target.startswith("pjrt_host"):
                found.add(target)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {name: {t for t in imports_of(name, path, modules) if (name, t) not in ALLOWED_UPWARD}
            for name, path in modules.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_checker_sees_function_level_cycles(tmp_path):
    """The checker itself: a cycle closed by an import inside a function is found."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    assert find_cycle(edges) == ["a", "b", "c", "a"]
    pkg = tmp_path / "pjrt_host"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_a.py").write_text("from . import _b\n")
    (pkg / "_b.py").write_text("def f():\n    from ._a import g\n")
    modules = {"pjrt_host": pkg / "__init__.py", "pjrt_host._a": pkg / "_a.py", "pjrt_host._b": pkg / "_b.py"}
    assert imports_of("pjrt_host._b", pkg / "_b.py", modules) == {"pjrt_host._a"}
    assert imports_of("pjrt_host._a", pkg / "_a.py", modules) == {"pjrt_host._b"}


# The package's layers, lowest first: a module imports only from its own
# layer or below, wherever the import is written (function-level included).
# A name is a module or a subpackage (everything under it).
PACKAGE_LAYERS = [
    ["pjrt_host._errors", "pjrt_host._internals"],  # _internals: data, imports nothing
    ["pjrt_host.env"],  # the public settings parsers, for plugins too
    ["pjrt_host._env", "pjrt_host._jax_settings", "pjrt_host._plugin", "pjrt_host._hookspecs", "pjrt_host._library"],
    ["pjrt_host._discovery"],
    ["pjrt_host._registry", "pjrt_host._doctor"],
    ["pjrt_host._program_files"],  # the program cache's files: a private directory, sealed entries
    ["pjrt_host._peers"],  # what this process heard of dead ranks
    ["pjrt_host._coordination_service"],  # jax's coordination service in a process of its own
    ["pjrt_host._process", "pjrt_host._program_cache"],
    ["pjrt_host._runtime"],
    ["pjrt_host._collectives", "pjrt_host._launch"],
    ["pjrt_host._lowerings"],  # ATen -> JAX: imports nothing else of pjrt_host (test below)
    ["pjrt_host._torch"],  # the 'jax' device
    ["pjrt_host._compile"],  # graphs over the device (its door: _compile._door)
    ["pjrt_host.interop", "pjrt_host.spmd", "pjrt_host.distributed", "pjrt_host.lightning"],
    ["pjrt_host"],  # the facade: its lazy names reach down into every layer
    ["pjrt_host._check"],  # the report card exercises the public API
    ["pjrt_host._cli", "pjrt_host.__main__"],
]


def layer_of(module: str) -> int:
    best, found = -1, None
    for level, names in enumerate(PACKAGE_LAYERS):
        for name in names:
            # "pjrt_host" (the facade) holds only itself
            inside = module.startswith(name + ".") and name != "pjrt_host"
            if (module == name or inside) and len(name) > best:
                best, found = len(name), level
    assert found is not None, f"{module} is in no layer of PACKAGE_LAYERS (tests/test_layers.py): add it"
    return found


def test_no_import_runs_up_the_package_layers():
    upward = []
    for name, targets in graph().items():
        for target in sorted(targets):
            if layer_of(target) > layer_of(name):
                upward.append(f"{name} -> {target}")
    assert upward == [], "imports that run up the layers (docs/architecture.md):\n" + "\n".join(upward)


def test_compile_reaches_the_device_through_its_door():
    """``_compile._door`` is the backend's one door into ``_torch``."""
    around = sorted(f"{name} -> {target}" for name, targets in graph().items()
                    if name.startswith("pjrt_host._compile") and name != "pjrt_host._compile._door"
                    for target in targets if target.startswith("pjrt_host._torch"))
    assert around == [], "_compile modules that go around _compile._door:\n" + "\n".join(around)


def test_the_lowering_table_imports_nothing_else_of_pjrt_host():
    edges = graph()
    for name, targets in edges.items():
        if name.startswith("pjrt_host._lowerings"):
            outside = sorted(t for t in targets if not t.startswith("pjrt_host._lowerings"))
            assert outside == [], f"{name} imports {outside}: lowerings get what they need through LoweringContext"


@pytest.mark.parametrize("module", ["_tensor", "_conversion", "_meta", "_engine", "_view_ops", "_storage_ops",
                                    "_factories", "_cpu_fallback", "_devices", "_dtype_policy", "_strided", "_config",
                                    "_rng", "_printing"])
def test_nothing_below_routing_imports_the_dispatcher(module):
    """Only registration (which installs it) may import _dispatch."""
    targets = graph()[f"pjrt_host._torch.{module}"]
    assert "pjrt_host._torch._dispatch" not in targets
    assert "pjrt_host._torch._boot._privateuse1" not in targets


def test_jax_settings_change_in_one_module():
    offenders = []
    for name, path in all_modules().items():
        if name == "pjrt_host._jax_settings":
            continue
        text = path.read_text()
        if "jax.config.update(" in text or "config.update(\"jax_" in text:
            offenders.append(name)
    assert offenders == [], f"process-wide jax settings changed outside pjrt_host._jax_settings: {offenders}"





#: A 'jax' tensor's data: its storage, its view, a storage's array.
_TENSOR_INTERNALS = frozenset({"_storage", "_view", "_array"})


def test_only_the_device_and_its_door_read_a_tensors_storage():
    """Outside ``_torch`` (the device itself) only ``_compile._door`` reads a
    tensor's storage or view: the compile backend, ``spmd`` and the rest
    work on the arrays and handles the door gives, so a change of the
    storage model is a change in ``_torch`` and the door only."""
    offenders = []
    for name, path in all_modules().items():
        if name.startswith("pjrt_host._torch") or name == "pjrt_host._compile._door":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in _TENSOR_INTERNALS:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} .{node.attr}")
    assert offenders == [], f"a tensor's storage read outside pjrt_host._torch and the door: {offenders}"


# ---------------------------------------------------------------- the device's own layers

TORCH = "pjrt_host._torch"
TABLE_FILE = PACKAGE / "_torch" / "__init__.py"
_ROW = re.compile(r"^(\d+)\s+``([\w./]+)``\s+\S")


def torch_layer_table(text: str | None = None) -> dict[str, int]:
    """The layer table of ``_torch/__init__.py``'s docstring: row -> layer.
    A row is a module's name below ``_torch`` (``__init__`` for the package
    itself), or a subpackage ending in ``/`` (all its modules, one row)."""
    doc = ast.get_docstring(ast.parse(TABLE_FILE.read_text() if text is None else text)) or ""
    rows: dict[str, int] = {}
    for line in doc.splitlines():
        match = _ROW.match(line)
        if match:
            assert match.group(2) not in rows, f"{match.group(2)} is in the layer table twice"
            rows[match.group(2)] = int(match.group(1))
    return rows


def torch_row(module: str, rows: dict[str, int]) -> str | None:
    """The table row holding ``module`` (a name under pjrt_host._torch), or None."""
    rest = module[len(TORCH) + 1:] if module != TORCH else "__init__"
    for row in rows:
        if row.endswith("/") and (rest == row[:-1] or rest.startswith(row[:-1] + ".")):
            return row
    return rest if rest in rows else None


def _is_torch(module: str) -> bool:
    return module == TORCH or module.startswith(TORCH + ".")


def test_the_torch_layer_table_lists_every_module_and_nothing_else():
    rows = torch_layer_table()
    edges = graph()
    unlisted = []
    for name in sorted(m for m in all_modules() if _is_torch(m)):
        if torch_row(name, rows) is not None:
            continue
        below = sorted({rows[r] for t in edges[name] if _is_torch(t) and (r := torch_row(t, rows)) is not None})
        above = sorted({rows[r] for m, ts in edges.items() if name in ts and _is_torch(m)
                        and (r := torch_row(m, rows)) is not None})
        lowest = max(below, default=-1) + 1
        where = f"at layer {lowest} or higher" + (f", below {min(above)} (its importers' lowest layer)" if above else "")
        if above and lowest >= min(above):
            where += f"; the rows that import it move up above {lowest} first"
        unlisted.append(f"{name}: add the row\n    {lowest:<7}``{name[len(TORCH) + 1:]}``  <its one job>\n  to the "
                        f"table in pjrt_host/_torch/__init__.py's docstring, {where}; a module imports only rows "
                        f"of lower layers")
    assert unlisted == [], "modules missing from the layer table:\n" + "\n".join(unlisted)
    gone = sorted(row for row in rows if not any(torch_row(m, rows) == row for m in all_modules() if _is_torch(m)))
    assert gone == [], f"rows of the layer table (pjrt_host/_torch/__init__.py) that name no module: {gone}"


def test_every_import_in_the_device_goes_down_its_layer_table():
    """A module imports only rows of lower layers (function-level imports
    included); modules of one row (a subpackage) may import each other."""
    rows = torch_layer_table()
    wrong = []
    for name, targets in graph().items():
        if not _is_torch(name) or torch_row(name, rows) is None:
            continue  # an unlisted module fails the test above
        here = torch_row(name, rows)
        for target in sorted(targets):
            there = torch_row(target, rows) if _is_torch(target) else None
            if there is None or there == here:
                continue
            if rows[there] >= rows[here]:
                wrong.append(f"{name} (layer {rows[here]}) imports {target} (layer {rows[there]})")
    assert wrong == [], ("imports that do not go down the layer table of pjrt_host/_torch/__init__.py (move the "
                         "importer up, the imported module down, or the import's code to where it belongs):\n"
                         + "\n".join(wrong))


def test_the_layer_table_checker_itself():
    text = '"""\n=====\n3      ``_a``    a job\n                 more of it\n1      ``_sub/``  a subpackage\n"""\n'
    rows = torch_layer_table(text)
    assert rows == {"_a": 3, "_sub/": 1}
    assert torch_row(f"{TORCH}._sub._x", rows) == "_sub/" and torch_row(f"{TORCH}._sub", rows) == "_sub/"
    assert torch_row(f"{TORCH}._a", rows) == "_a" and torch_row(f"{TORCH}._b", rows) is None
    assert torch_row(TORCH, {"__init__": 0}) == "__init__"
