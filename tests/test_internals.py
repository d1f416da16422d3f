"""pjrt_host._internals lists every private torch / jax internal the sources
touch: read from the sources (AST), compared with the list both ways, and
each listed internal looked up in the installed torch, jax and jaxlib, so
that an upgrade which removes one fails here, naming the entry.

The rule for what is private is in pjrt_host/_internals.py's docstring.
The file lists of the entries are documentation (engineers move code
between files): the test checks that one listed file of each entry exists
(or a file of its name elsewhere in the sources), and its failures print
where the scanner finds each name now.
"""

from __future__ import annotations

import ast
import importlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO
from pjrt_host._internals import INTERNALS, by_name

ROOTS = ("torch", "jax", "jaxlib")
SOURCES = ("pjrt_host", "plugins")


def is_private(segment: str) -> bool:
    # Markers pjrt_host sets on torch's objects are its own.
    if segment.startswith("_pjrt_host"):
        return False
    return segment.startswith("_") and not (segment.startswith("__") and segment.endswith("__"))


def listed_form(dotted: str) -> str | None:
    """``dotted`` up to its last private segment and one more; None when no
    segment is private."""
    segments = dotted.split(".")
    last = max((i for i, s in enumerate(segments) if is_private(s)), default=None)
    return None if last is None else ".".join(segments[: last + 2])


def _constant_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name) and call.func.id in ("getattr", "hasattr", "setattr", "delattr") \
            and len(call.args) >= 2 and isinstance(call.args[1], ast.Constant) and isinstance(call.args[1].value, str):
        return call.args[1].value
    return None


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` (and ``getattr(a.b, "c")``) as ["a", "b", "c"]."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *parts[::-1]]
    if isinstance(node, ast.Call) and (name := _constant_name(node)) is not None:
        inner = _chain(node.args[0])
        if inner is not None:
            return [*inner, name, *parts[::-1]]
    return None


def defined_names(trees: list[ast.AST]) -> set[str]:
    """Every name the sources define (functions, classes, assignments,
    attributes set, arguments, imports, keywords): a private attribute with
    one of these names may be pjrt_host's own."""
    defined: set[str] = set()
    for tree in trees:
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(n.name)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                defined.add(n.id)
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                defined.add(n.attr)
            elif isinstance(n, ast.arg):
                defined.add(n.arg)
            elif isinstance(n, ast.alias):
                defined.add((n.asname or n.name).split(".")[0])
            elif isinstance(n, ast.keyword) and n.arg:
                defined.add(n.arg)
    return defined


def internals_of(tree: ast.AST, defined: set[str]) -> set[str]:
    """The private internals one module touches, in their listed form."""
    aliases: dict[str, str] = {}  # local name -> the torch / jax name it stands for
    imported: set[str] = set()  # local names of any import (their private attributes are that library's)
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                local = a.asname or a.name.split(".")[0]
                imported.add(local)
                if a.name.split(".")[0] in ROOTS:
                    aliases[local] = a.name if a.asname else local
                    used.add(a.name)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                imported.add(a.asname or a.name)
                if node.module.split(".")[0] in ROOTS:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                    used.add(f"{node.module}.{a.name}")
    for node in ast.walk(tree):  # `C = torch._C`
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            chain = _chain(node.value)
            if chain and chain[0] in aliases:
                aliases.setdefault(node.targets[0].id, ".".join([aliases[chain[0]], *chain[1:]]))
    # `a.b.c` is read once, from its outermost node; the inner ones (`a.b`)
    # are looked at only for a private attribute of an object (`f._schema.x`).
    inner_ids = {id(child) for parent in ast.walk(tree) if isinstance(parent, ast.Attribute)
                 for child in ast.iter_child_nodes(parent)}
    foreign_roots = {*aliases, *imported, "self", "cls"}
    for node in ast.walk(tree):
        chain, attr = None, None
        if isinstance(node, ast.Attribute) and id(node) not in inner_ids:
            chain, attr = _chain(node), node.attr
        elif isinstance(node, ast.Call) and (name := _constant_name(node)) is not None:
            inner = _chain(node.args[0])
            chain, attr = (None if inner is None else [*inner, name]), name
        if chain and chain[0] in aliases:
            used.add(".".join([aliases[chain[0]], *chain[1:]]))
        elif attr is not None and is_private(attr) and attr not in defined \
                and not (chain and chain[0] in foreign_roots):
            used.add("." + attr)  # a private attribute of an object pjrt_host does not define
        if isinstance(node, ast.Attribute) and id(node) in inner_ids and is_private(node.attr) \
                and node.attr not in defined:
            inner_chain = _chain(node)
            if inner_chain is None or inner_chain[0] not in foreign_roots:
                used.add("." + node.attr)
    return {form for form in map(listed_form_or_attribute, used) if form}


def listed_form_or_attribute(name: str) -> str | None:
    return name if name.startswith(".") else listed_form(name)


def source_files() -> list[Path]:
    return sorted(p for folder in SOURCES for p in (REPO / folder).rglob("*.py")
                  if not any(part.endswith(".egg-info") or part == "build" for part in p.parts))


@pytest.fixture(scope="module")
def used() -> dict[str, set[str]]:
    """Each internal the sources touch -> the files touching it."""
    paths = source_files()
    trees = {path: ast.parse(path.read_text()) for path in paths}
    defined = defined_names(list(trees.values()))
    found: dict[str, set[str]] = defaultdict(set)
    for path, tree in trees.items():
        for name in internals_of(tree, defined):
            found[name].add(str(path.relative_to(REPO)))
    return found


def test_every_internal_used_is_listed(used):
    listed = by_name()
    missing = sorted(name for name in used if name not in listed)
    assert missing == [], (
        "private torch / jax internals used but not listed in pjrt_host/_internals.py (add an entry: why, "
        "the fallback, the tests that pin it):\n" + "\n".join(f"  {name}  ({', '.join(sorted(used[name]))})"
                                                             for name in missing))


def test_every_listed_internal_is_still_used(used):
    stale = sorted(name for name in by_name() if name not in used)
    assert stale == [], f"pjrt_host/_internals.py lists internals no source uses any more; remove them: {stale}"


def test_the_entries_are_complete(used):
    names_here = {p.name for p in source_files()}
    seen: set[str] = set()
    for entry in INTERNALS:
        label = entry.names[0]
        assert entry.names and entry.why and entry.fallback and entry.files, label
        assert not seen & set(entry.names), f"{label}: a name is listed twice"
        seen |= set(entry.names)
        # A file moved to another package keeps its name: moves between
        # packages do not break the list; a file gone or renamed does.
        assert any((REPO / f).is_file() or Path(f).name in names_here for f in entry.files), (
            f"{label}: none of its files exists any more; the sources using its names now: "
            f"{sorted(set().union(*(used.get(n, set()) for n in entry.names)))}")
        attributes = [n for n in entry.names if n.startswith(".")]
        assert not attributes or entry.probe, f"{label}: an attribute entry needs a probe"


def test_every_pin_is_a_test_that_exists():
    tests = {p.name: p.read_text() for p in (REPO / "tests").glob("test_*.py")}
    every = "\n".join(tests.values())
    for entry in INTERNALS:
        for pin in entry.pins:
            path, _, function = pin.partition("::")
            if function:
                assert f"def {function}(" in every, f"{entry.names[0]}: the pin {pin} is no test any more"
            else:
                assert Path(path).name in tests, f"{entry.names[0]}: the pin {pin} is no test file any more"


def resolve(dotted: str) -> Any:
    """The object ``dotted`` names: the longest importable module prefix,
    then attributes."""
    segments = dotted.split(".")
    for cut in range(len(segments), 0, -1):
        try:
            value = importlib.import_module(".".join(segments[:cut]))
        except ImportError:
            continue
        for segment in segments[cut:]:
            value = getattr(value, segment)
        return value
    raise ImportError(dotted)


def test_every_listed_internal_exists_in_the_installed_torch_and_jax():
    """The pin of last resort: a torch or jax upgrade that removes or renames
    an internal fails here, naming it."""
    import jax
    import torch

    gone = []
    for entry in INTERNALS:
        for name in entry.names:
            try:
                if name.startswith("."):
                    # The probe is this repository's own data (pjrt_host/_internals.py).
                    owner = eval(entry.probe, {"torch": torch, "jax": jax})  # noqa: S307
                    if not hasattr(owner, name[1:]):
                        raise AttributeError(f"{entry.probe} has no {name[1:]}")
                else:
                    resolve(name)
            except (ImportError, AttributeError) as err:
                gone.append(f"{name}: {type(err).__name__}: {err}\n    why: {entry.why}\n"
                            f"    if it is gone: {entry.fallback}")
    assert gone == [], (f"internals missing from torch {torch.__version__} / jax {jax.__version__} "
                        "(pjrt_host/_internals.py):\n" + "\n".join(gone))


def test_a_missing_internal_is_an_error_not_a_pass():
    import torch  # noqa: F401

    assert resolve("torch.utils._pytree.tree_map") is not None
    for name in ("torch._C._no_such_internal", "jax._src.no_such_module", "torch.no_such_module._x"):
        with pytest.raises((ImportError, AttributeError)):
            resolve(name)


def test_the_scanner_sees_every_form():
    """The rule itself, on a module written for it."""
    source = '''
import torch
import torch.utils._pytree as pytree
from torch._dynamo import eval_frame as ef
from jax._src import xla_bridge
import os

C = torch._C

class Mine:
    def __init__(self):
        self._own = 1

def f(op, x):
    torch._C._foo(x)                 # a private function
    torch._C.DispatchKey.PrivateUse1 # a public name in a private module
    C._bar                           # through an alias
    getattr(torch._C, "_baz")        # by a constant name
    ef._FrameAction.SKIP
    pytree.tree_map
    xla_bridge._backends
    xla_bridge.get_backend()
    op._schema                       # an attribute pjrt_host does not define
    x._own                           # one it defines
    os._exit                         # another library's
    torch.Tensor.__torch_dispatch__  # a dunder
    torch.nn.Linear                  # public
    torch.Tensor.pin_memory._pjrt_host_marker
'''
    tree = ast.parse(source)
    assert internals_of(tree, defined_names([tree])) == {
        "torch._C._foo", "torch._C.DispatchKey", "torch._C._bar", "torch._C._baz", "torch._dynamo.eval_frame",
        "torch._dynamo.eval_frame._FrameAction.SKIP", "torch.utils._pytree", "torch.utils._pytree.tree_map",
        "jax._src.xla_bridge", "jax._src.xla_bridge._backends", "torch._C", "._schema"}
