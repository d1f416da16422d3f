"""The two folders of the device that hold rules, each checked here.

``_torch/_boot/`` is what runs inside ``import torch``: at module level
(what runs when a module is imported) it reaches only itself, the patches
installed then (``_torch/_patches/``) and the light modules listed below,
and nothing reached that way imports jax or jaxlib.

``_torch/_patches/`` is the only code that changes torch or another
library: no module outside it assigns an attribute of torch or of another
library, calls ``setattr`` / ``delattr`` on one, or marks a replacement
``_pjrt_host`` (read from the sources, AST).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO
from test_layers import all_modules, imports_of

BOOT_FOLDERS = ("pjrt_host._torch._boot", "pjrt_host._torch._patches")

# Modules outside the two folders that run inside `import torch`, with why
# each is light (what they import at module level is held to the same rule).
LIGHT_AT_BOOT = {
    "pjrt_host": "the facade: lazy names only (test_discovery: it imports neither torch nor jax)",
    "pjrt_host._torch": "DEVICE_NAME and autoload, what torch's entry point calls",
    "pjrt_host._torch._devices": "the device's name and index rules; jax only inside functions",
    "pjrt_host._torch._rng": "per-device seeds, kept before the device loads (torch.jax.manual_seed)",
    "pjrt_host._torch._hiding": "never_traced marks the kernels as they are registered",
    "pjrt_host._torch._loader": "the kernels' way to the device: loads it at their first call",
    "pjrt_host._torch._torch_accelerator": "the wrappers of torch.accelerator, installed at import",
    "pjrt_host._torch._storage_bridge": "the wrappers of torch.UntypedStorage and torch.load, installed at import",
    "pjrt_host._torch._modules": "the wrappers of nn.Module._apply, installed at import",
    "pjrt_host._torch._generators": "the wrapper of torch.Generator, installed at import",
    "pjrt_host._torch._backward": "the wrapper of autograd's backward (installed with the device)",
    "pjrt_host._torch._c10d": "the 'pjrt' process group (the subpackage: every module of it), registered with "
                              "torch.distributed at import; jax only inside functions",
    "pjrt_host._env": "environment settings (PJRT_HOST_SKIP_PATCHES)",
    "pjrt_host.env": "the settings parsers _env reads with",
    "pjrt_host._errors": "the exception family",
    "pjrt_host._jax_settings": "names of jax settings; jax only inside functions",
    "pjrt_host._registry": "which plugin is selected (torch.jax.is_available), without importing it",
    "pjrt_host._discovery": "the registry's entry-point scan",
    "pjrt_host._plugin": "the plugin contract",
    "pjrt_host._library": "reading a PJRT library's headers without loading it",
    "pjrt_host._runtime": "the client, created at the first 'jax' tensor; jax only inside functions",
    "pjrt_host._program_cache": "where compiled programs are kept; jax only inside functions",
    "pjrt_host._program_files": "the program cache's files: the standard library only",
}

HEAVY = ("jax", "jaxlib")

# Modules outside _torch/_patches that change another library, with why.
CHANGES_ELSEWHERE = {
    # Lightning's connectors are wrapped by the Lightning integration itself,
    # which only runs once the user imports Lightning (the import hook of
    # _patches._lightning imports it); the device cannot import Lightning.
    "pjrt_host.lightning._register": "Lightning's accelerator connectors (registered on import of pjrt_host.lightning)",
    # jax's own state has one module per concern, with tests of their own.
    "pjrt_host._jax_settings": "every jax setting and cache switch (test_layers: jax settings change in one module)",
    "pjrt_host._runtime": "jax's backend table, where the plugin's client is made (the only code on jaxlib's plugin API)",
    "pjrt_host._process": "jax.distributed's start-up, for the one call that joins a coordination service run in a "
                          "process of its own (test_dead_peers)",
}


def _in_boot(module: str) -> bool:
    return any(module == f or module.startswith(f + ".") for f in BOOT_FOLDERS)


def _under(module: str, name: str) -> bool:
    return module == name or module.startswith(name + ".")


def _module_level(tree: ast.Module) -> list[ast.stmt]:
    """The statements that run when the module is imported: everything but
    function bodies (class bodies run; ``if TYPE_CHECKING:`` never does)."""
    found: list[ast.stmt] = []

    def walk(body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test):
                walk(stmt.orelse)
                continue
            found.append(stmt)
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(stmt, field, None)
                if isinstance(inner, list):
                    walk([s for s in inner if isinstance(s, ast.stmt)] +
                         [s for h in inner if isinstance(h, ast.ExceptHandler) for s in h.body])
    walk(tree.body)
    return found


def module_level_imports(name: str, path: Path, modules: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(modules of pjrt_host, top-level names of other packages) that
    ``name`` imports when it is imported."""
    tree = ast.parse(path.read_text())
    shallow = ast.Module(body=[s for s in _module_level(tree) if isinstance(s, (ast.Import, ast.ImportFrom))],
                         type_ignores=[])
    ours = imports_of(name, path, modules, shallow)
    # `from .x import y` runs the package of x too
    ours |= {m.rpartition(".")[0] for m in ours if m.rpartition(".")[0] in modules}
    others = set()
    for node in shallow.body:
        if isinstance(node, ast.Import):
            others |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            others.add(node.module.split(".")[0])
    return ours, others - {"pjrt_host", "__future__"}


def boot_closure() -> dict[str, tuple[set[str], set[str]]]:
    """Every module ``import torch`` may import through the boot folders,
    with what each imports at module level."""
    modules = all_modules()
    todo = [m for m in modules if _in_boot(m)]
    seen: dict[str, tuple[set[str], set[str]]] = {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen[name] = module_level_imports(name, modules[name], modules)
        todo.extend(seen[name][0] - set(seen))
    return seen


def test_boot_modules_reach_only_their_folders_and_listed_light_modules():
    def light(target: str) -> bool:
        return target in LIGHT_AT_BOOT or _under(target, "pjrt_host._torch._c10d")

    outside = sorted(f"{name} imports {target} at module level" for name, (ours, _) in boot_closure().items()
                     for target in ours if not _in_boot(target) and not light(target))
    assert outside == [], (
        "modules that run inside `import torch` (pjrt_host/_torch/_boot, _patches, and what they import at module "
        "level) reach a module not known to be light; import it inside the function that needs it, or add it to "
        "LIGHT_AT_BOOT (tests/test_torch_folders.py) with why it is light:\n" + "\n".join(outside))


def test_nothing_that_runs_inside_import_torch_imports_jax_at_module_level():
    heavy = sorted(f"{name} imports {other}" for name, (_, others) in boot_closure().items()
                   for other in others if other in HEAVY)
    assert heavy == [], "modules that run inside `import torch` import jax at module level:\n" + "\n".join(heavy)


def test_importing_every_boot_module_leaves_jax_unimported():
    names = sorted(m for m in all_modules() if _in_boot(m))
    code = textwrap.dedent(f"""
        import importlib, json, sys
        import torch
        for name in {names!r}:
            importlib.import_module(name)
        print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PJRT_", "PYTEST_"))}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240,
                         cwd=str(REPO))
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_boot_checker_sees_module_level_imports_only(tmp_path):
    pkg = tmp_path / "pjrt_host"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_a.py").write_text("import jax\nfrom . import _b\ntry:\n    import jaxlib\nexcept ImportError:\n    pass\n"
                               "class C:\n    from . import _c\n"
                               "def f():\n    from . import _d\n    import torch\n")
    for leaf in "bcd":
        (pkg / f"_{leaf}.py").write_text("")
    modules = {"pjrt_host": pkg / "__init__.py", **{f"pjrt_host._{x}": pkg / f"_{x}.py" for x in "abcd"}}
    ours, others = module_level_imports("pjrt_host._a", pkg / "_a.py", modules)
    assert ours == {"pjrt_host._b", "pjrt_host._c", "pjrt_host"} and others == {"jax", "jaxlib"}


# ---------------------------------------------------------------- _patches


#: Modules whose mappings are the process's own state, not a library's
#: (``os.environ[...] = ``, ``sys.modules[...] = ``).
PROCESS_STATE = {"os", "sys"}


def foreign_changes(source: str) -> list[str]:
    """Where ``source`` changes an object of another package: an attribute
    or an item (not of ``os`` / ``sys``) assigned or deleted, or ``setattr`` /
    ``delattr`` called, on a name
    imported from a package other than pjrt_host (or a name bound to an
    attribute of one: ``cls = torch.nn.Module``, ``meta = type(torch.x)``,
    ``m = getattr(torch, 'x')``); and every ``_pjrt_host`` marker set (what a
    replacement carries)."""
    tree = ast.parse(source)
    foreign: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            foreign |= {(a.asname or a.name).split(".")[0] for a in node.names if not a.name.startswith("pjrt_host")}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module and \
                not node.module.startswith(("pjrt_host", "__future__")):
            foreign |= {a.asname or a.name for a in node.names}

    def root(expr: ast.expr) -> str | None:
        while True:
            if isinstance(expr, ast.Name):
                return expr.id
            if isinstance(expr, (ast.Attribute, ast.Subscript)):
                expr = expr.value
            elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in ("type", "getattr") \
                    and expr.args:
                expr = expr.args[0]
            else:
                return None

    changed = True
    while changed:  # names bound to what a foreign name reaches
        changed = False
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and root(node.value) in foreign:
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id not in foreign:
                        foreign.add(target.id)
                        changed = True
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and (target.attr == "_pjrt_host" or root(target.value) in foreign) \
                    or isinstance(target, ast.Subscript) and root(target.value) in foreign - PROCESS_STATE:
                found.append(f"line {node.lineno}: {ast.unparse(target)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") \
                and node.args and root(node.args[0]) in foreign:
            found.append(f"line {node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_only_the_patches_folder_changes_torch_or_other_libraries():
    offenders = []
    for name, path in sorted(all_modules().items()):
        if _under(name, "pjrt_host._torch._patches") or name in CHANGES_ELSEWHERE:
            continue
        for where in foreign_changes(path.read_text()):
            offenders.append(f"{name} {where}")
    assert offenders == [], (
        "changes to torch or other libraries outside pjrt_host/_torch/_patches (make the wrapper where the feature "
        "lives, and assign it from a row of _patches.INVENTORY):\n" + "\n".join(offenders))


def test_the_patch_checker_sees_assignments_onto_other_packages():
    source = textwrap.dedent("""
        import torch
        import torch.distributed as dist
        from torch._dynamo.variables import torch_function as tf
        import threading
        from . import _ours

        cls = tf.TensorWithTFOverrideVariable
        meta = type(torch._C.Generator)
        local = threading.local()

        def f(fn, owner):
            torch.Tensor.foo = 1
            cls.var_getattr = fn
            setattr(meta, "__call__", fn)
            dist.Backend.default_device_backend_map["jax"] = "pjrt"
            fn._pjrt_host = True
            local.stack = []
            _ours.value = 2
            owner.x = 3
    """)
    assert sorted(w.split(": ", 1)[1] for w in foreign_changes(source)) == sorted([
        "torch.Tensor.foo", "cls.var_getattr", "fn._pjrt_host", "setattr(meta, '__call__', fn)",
        "dist.Backend.default_device_backend_map['jax']"])


def test_an_import_hook_runs_a_function_or_imports_a_name_after_the_library(tmp_path, monkeypatch, caplog):
    """``_patches._import_hooks``: a hook runs right after its module's own
    code; a string names a module imported then (how the device reaches
    pjrt_host.lightning without importing upward); a hook that fails is
    logged and the library still imports."""
    pytest.importorskip("torch")
    from pjrt_host._torch._patches import _import_hooks

    for name in ("hooked_lib", "hooked_registration", "hooked_broken"):
        (tmp_path / f"{name}.py").write_text(f"LOADED = {name!r}\n")
    (tmp_path / "hooked_registration.py").write_text("import hooked_lib\nhooked_lib.REGISTERED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    hooks = {"hooked_lib": "hooked_registration",
             "hooked_broken": lambda module: seen.append(module.LOADED) or 1 / 0}
    try:
        _import_hooks.after_import(hooks)
        assert "hooked_lib" not in sys.modules  # nothing is imported by installing
        import hooked_lib  # noqa: F401

        assert sys.modules["hooked_lib"].REGISTERED and "hooked_registration" in sys.modules
        with caplog.at_level("WARNING"):
            import hooked_broken  # noqa: F401
        assert seen == ["hooked_broken"] and sys.modules["hooked_broken"].LOADED == "hooked_broken"
        assert "could not adapt hooked_broken" in caplog.text and "ZeroDivisionError" in caplog.text
    finally:
        for name in hooks:
            _import_hooks._hooks.pop(name, None)
        for name in ("hooked_lib", "hooked_registration", "hooked_broken"):
            sys.modules.pop(name, None)
