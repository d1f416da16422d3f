"""The package's import structure: modules import strictly downward.

Read from the sources (AST), not by importing, so a cycle that only works
thanks to a function-level import is caught too: every intra-package import
counts, wherever it is written, except the few listed below with their
reason.
"""

from __future__ import annotations

import ast
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



