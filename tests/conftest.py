"""Shared fixtures: real distributions on a temporary site directory, real
shared libraries built with the C compiler, and the CLI run as users run it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent

# Tests that use jax directly (not through pjrt_host) must not make jax
# start every installed vendor plugin (libtpu takes a lock file, the CUDA
# plugin logs a traceback without a GPU). Child processes get the user's
# real environment back: run_python drops this.
_OUR_JAX_PLATFORMS = "JAX_PLATFORMS" not in os.environ
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# The suite keeps its compiled programs in a directory of its own, made new
# for each run (children too, unless a test sets the variable): it neither
# fills the user's cache nor depends on what an earlier run left there.
if "PJRT_HOST_CACHE_DIR" not in os.environ:
    import atexit
    import tempfile

    _PROGRAMS = tempfile.mkdtemp(prefix="pjrt_host_test_programs_")
    os.environ["PJRT_HOST_CACHE_DIR"] = _PROGRAMS
    atexit.register(shutil.rmtree, _PROGRAMS, ignore_errors=True)


# Every call fused eager replays without the engine is checked against the
# engine's key (its replay lane must never take a call for another).
os.environ.setdefault("PJRT_HOST_CHECK_REPLAY", "1")


# Opt-in tests: long sweeps and many-parametrisation runs that rarely catch
# what the default run misses. `pytest --slow` (or PJRT_HOST_SLOW_TESTS=1)
# runs them; the default run (CI) skips them with a reason that says how.
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", help="also run tests marked slow (long sweeps)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--slow") or os.environ.get("PJRT_HOST_SLOW_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with `pytest --slow` or PJRT_HOST_SLOW_TESTS=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


class Site:
    """A directory of installed distributions (``*.dist-info`` with
    ``entry_points.txt``), usable on ``sys.path`` or ``PYTHONPATH``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)

    def add_dist(
        self,
        name: str,
        version: str = "1.0",
        *,
        entry_points: dict[str, dict[str, str]] | None = None,
        files: dict[str, str] | None = None,
        requires: list[str] | None = None,
    ) -> Path:
        """Install distribution ``name``: its modules (``files``: relative
        path -> source) and a dist-info with its entry points."""
        for rel, source in (files or {}).items():
            target = self.path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(textwrap.dedent(source))
        info = self.path / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        meta = [f"Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
        meta += [f"Requires-Dist: {r}" for r in requires or []]
        (info / "METADATA").write_text("\n".join(meta) + "\n")
        lines = []
        for group, eps in (entry_points or {}).items():
            lines.append(f"[{group}]")
            lines += [f"{k} = {v}" for k, v in eps.items()]
            lines.append("")
        (info / "entry_points.txt").write_text("\n".join(lines))
        record = [f"{rel},," for rel in (files or {})]
        record += [f"{info.name}/METADATA,,", f"{info.name}/entry_points.txt,,", f"{info.name}/RECORD,,"]
        (info / "RECORD").write_text("\n".join(record) + "\n")
        return info

    def add_plugin(self, dist: str, name: str, body: str, module: str | None = None, version: str = "1.0") -> None:
        """A torch_xla.plugins distribution whose module defines ``Plugin``
        (a DevicePlugin subclass with ``body`` as its class body)."""
        module = module or dist.replace("-", "_")
        source = "from pjrt_host import DevicePlugin\n\nclass Plugin(DevicePlugin):\n" + textwrap.indent(
            textwrap.dedent(body).strip() or "pass", "    ") + "\n"
        self.add_dist(dist, version, entry_points={"torch_xla.plugins": {name: f"{module}:Plugin"}},
                      files={f"{module}.py": source})


@pytest.fixture
def site(tmp_path: Path) -> Site:
    return Site(tmp_path / "site")


@pytest.fixture
def in_process_site(site: Site, monkeypatch: pytest.MonkeyPatch):
    """``site`` on sys.path, and a fresh registry that only sees it and the
    plugins installed in the environment."""
    from pjrt_host import _registry

    monkeypatch.syspath_prepend(str(site.path))
    for var in ("PJRT_DEVICE", "PJRT_HOST_PLUGINS", "PJRT_HOST_DISABLE_PLUGIN_AUTOLOAD"):
        monkeypatch.delenv(var, raising=False)
    _registry.reset_for_tests()
    yield site
    _registry.reset_for_tests()
    # Plugin modules imported from this site must not leak into the next
    # test, which may install a different module under the same name.
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", "") or "").startswith(str(site.path)):
            del sys.modules[name]


def _cc() -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("a C compiler is needed to build test PJRT libraries")
    return cc


@pytest.fixture(scope="session")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Real shared libraries: ``null_api`` exports GetPjrtApi returning
    NULL; ``null_functions`` returns a PJRT_Api of version 0.80 whose
    function pointers are all NULL (the first call through it crashes);
    ``no_symbol`` is a shared library without it; ``not_elf`` is text."""
    out = tmp_path_factory.mktemp("libs")
    cc = _cc()
    sources = {
        "null_api": "void* GetPjrtApi(void) { return 0; }\n",
        "null_functions": textwrap.dedent("""\
            #include <stddef.h>
            static size_t api[512];
            void* GetPjrtApi(void) {
              api[0] = sizeof(api);      /* PJRT_Api.struct_size */
              api[2] = 24;               /* PJRT_Api_Version.struct_size */
              ((int*)&api[4])[1] = 80;   /* minor version; major 0 */
              return api;
            }
            """),
        "no_symbol": "int something_else(void) { return 1; }\n",
    }
    paths = {}
    for name, code in sources.items():
        src = out / f"{name}.c"
        src.write_text(code)
        lib = out / f"lib{name}.so"
        subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
        paths[name] = str(lib)
    not_elf = out / "libnot_elf.so"
    not_elf.write_text("this is not a library\n")
    paths["not_elf"] = str(not_elf)
    return paths


def run_python(args: list[str], *, site: Site | None = None, env: dict[str, str] | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS`` in a clean child environment with ``site`` on its path."""
    child = {k: v for k, v in os.environ.items()
             if not k.startswith(("PJRT_", "PYTEST_")) or k == "PJRT_HOST_CACHE_DIR"}
    if _OUR_JAX_PLATFORMS:
        child.pop("JAX_PLATFORMS", None)
    # a child that aborts or faults leaves every thread's Python stack in
    # its stderr, which the failing assert shows
    child.setdefault("PYTHONFAULTHANDLER", "1")
    if site is not None:
        child["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site.path), child.get("PYTHONPATH")]))
    child.update(env or {})
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=child,
                          timeout=timeout, stdin=subprocess.DEVNULL, cwd=str(REPO))


def run_cli(*args: str, site: Site | None = None, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_python(["-m", "pjrt_host", *args], site=site, env=env, timeout=timeout)


def list_json(site: Site | None = None, *extra: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = run_cli("list", "--json", *extra, site=site, env=env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    data["by_name"] = {}
    for row in data["plugins"]:
        data["by_name"].setdefault(row["name"], []).append(row)
    return data
