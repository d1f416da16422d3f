"""Discovery of real distributions: good, broken, conflicting, switched off."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import pjrt_host
from pjrt_host import Status

PLUGIN_GROUP = "torch_xla.plugins"


def records(name: str) -> list[pjrt_host.PluginRecord]:
    return [r for r in pjrt_host.plugins() if r.name == name]


def only(name: str) -> pjrt_host.PluginRecord:
    found = records(name)
    assert len(found) == 1, found
    return found[0]


def test_import_pjrt_host_imports_neither_torch_nor_jax():
    from conftest import run_python

    proc = run_python(["-c", "import sys, pjrt_host; pjrt_host.plugins(); "
                       "print(sorted(m for m in ('jax', 'jaxlib', 'torch') if m in sys.modules))"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_good_plugin_is_discovered_with_its_distribution(in_process_site):
    in_process_site.add_plugin("acme-pjrt", "acme", "priority = 7\ndisplay_name = 'Acme'", version="2.3")
    record = only("acme")
    assert record.ok and record.status == Status.OK
    assert (record.distribution, record.version) == ("acme-pjrt", "2.3")
    assert record.source == "torch_xla entry point"
    assert record.target == "acme_pjrt:Plugin"
    assert isinstance(record.plugin, pjrt_host.DevicePlugin)
    assert record.plugin.priority == 7 and record.plugin.describe() == "Acme"
    assert record.library is None


def test_entry_point_name_is_case_insensitive(in_process_site):
    in_process_site.add_plugin("loud-pjrt", "LOUD", "")
    assert only("loud").ok


def test_module_that_does_not_import(in_process_site):
    in_process_site.add_dist("broken-import", entry_points={PLUGIN_GROUP: {"brokenimp": "broken_import:Plugin"}},
                             files={"broken_import.py": "raise ImportError('needs libfoo 3')\n"})
    record = only("brokenimp")
    assert record.status == Status.IMPORT_FAILED
    assert "ImportError: needs libfoo 3" in record.reason and "broken-import" in record.reason
    assert isinstance(record.error, ImportError)


def test_module_that_exits_does_not_take_discovery_down(in_process_site):
    in_process_site.add_dist("exits", entry_points={PLUGIN_GROUP: {"exits": "exits_mod:Plugin"}},
                             files={"exits_mod.py": "import sys\nsys.exit(3)\n"})
    in_process_site.add_plugin("fine-pjrt", "fine", "")
    assert only("exits").status == Status.IMPORT_FAILED
    assert only("fine").ok


def test_constructor_that_raises(in_process_site):
    in_process_site.add_plugin("ctor-pjrt", "ctor", """
        def __init__(self):
            raise RuntimeError("licence server unreachable")
    """)
    record = only("ctor")
    assert record.status == Status.CONSTRUCTOR_FAILED
    assert "RuntimeError: licence server unreachable" in record.reason


def test_library_path_that_raises(in_process_site):
    in_process_site.add_plugin("lp-pjrt", "lp", """
        def library_path(self):
            raise FileNotFoundError("install acme-runtime")
    """)
    record = only("lp")
    assert record.status == Status.LIBRARY_PATH_FAILED
    assert "install acme-runtime" in record.reason and isinstance(record.error, FileNotFoundError)


def test_missing_library_file(in_process_site, tmp_path):
    missing = tmp_path / "nowhere" / "libacme.so"
    in_process_site.add_plugin("miss-pjrt", "miss", f"def library_path(self):\n    return {str(missing)!r}")
    record = only("miss")
    assert record.status == Status.LIBRARY_UNUSABLE
    assert record.reason == f"library file {missing} does not exist"


@pytest.mark.parametrize("kind, expected", [
    ("not_elf", "is not a shared library"),
    ("no_symbol", "is a shared library but not a PJRT plugin: it does not export GetPjrtApi"),
])
def test_library_that_is_not_a_pjrt_plugin(in_process_site, libs, kind, expected):
    in_process_site.add_plugin(f"{kind}-pjrt", kind, f"def library_path(self):\n    return {libs[kind]!r}")
    record = only(kind)
    assert record.status == Status.LIBRARY_UNUSABLE
    assert expected in record.reason


def test_library_exporting_the_entry_point_is_accepted(in_process_site, libs):
    in_process_site.add_plugin("real-pjrt", "real", f"def library_path(self):\n    return {libs['null_api']!r}")
    record = only("real")
    assert record.ok and record.library == libs["null_api"]


def test_relative_library_path_is_refused(in_process_site):
    in_process_site.add_plugin("rel-pjrt", "rel", "def library_path(self):\n    return 'libacme.so'")
    assert "is not absolute" in only("rel").reason


def test_not_a_device_plugin(in_process_site):
    in_process_site.add_dist("func-pjrt", entry_points={PLUGIN_GROUP: {"func": "func_pjrt:make"}},
                             files={"func_pjrt.py": "def make():\n    return None\n"})
    record = only("func")
    assert record.status == Status.NOT_A_PLUGIN
    assert "not a subclass of pjrt_host.DevicePlugin" in record.reason


def test_torch_xla_style_class_is_adapted(in_process_site):
    # A class written against torch_xla's DevicePlugin, not ours.
    in_process_site.add_dist("txla-pjrt", entry_points={PLUGIN_GROUP: {"txla": "txla_pjrt:Plugin"}},
                             files={"txla_pjrt.py": "class Plugin:\n    def library_path(self):\n        return None\n"
                                                    "    def physical_chip_count(self):\n        return 3\n"})
    record = only("txla")
    assert record.ok
    assert record.plugin.physical_chip_count() == 3
    assert record.plugin.requires_xla_coordinator() is False  # default filled in


def test_two_distributions_claiming_one_name(in_process_site):
    in_process_site.add_plugin("first-pjrt", "twin", "")
    in_process_site.add_plugin("second-pjrt", "twin", "")
    found = records("twin")
    assert {r.distribution for r in found} == {"first-pjrt", "second-pjrt"}
    for record in found:
        assert record.status == Status.CONFLICT
        assert "first-pjrt 1.0" in record.reason and "second-pjrt 1.0" in record.reason
        assert "uninstall all but one" in record.reason


def test_same_distribution_twice_on_path_is_not_a_conflict(in_process_site, monkeypatch):
    in_process_site.add_plugin("dup-pjrt", "dup", "")
    monkeypatch.syspath_prepend(str(in_process_site.path))  # a second sys.path entry
    assert only("dup").ok


def test_autoload_can_be_disabled(in_process_site, monkeypatch):
    in_process_site.add_plugin("acme-pjrt", "acme", "")
    monkeypatch.setenv("PJRT_HOST_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert pjrt_host.plugins() == []


def test_allow_list_restricts_loading(in_process_site, monkeypatch):
    in_process_site.add_plugin("acme-pjrt", "acme", "")
    in_process_site.add_dist("boom", entry_points={PLUGIN_GROUP: {"boom": "boom_mod:Plugin"}},
                             files={"boom_mod.py": "raise RuntimeError('must not be imported')\n"})
    monkeypatch.setenv("PJRT_HOST_PLUGINS", "ACME")
    assert [r.name for r in pjrt_host.plugins()] == ["acme"]
    assert "boom_mod" not in sys.modules


def test_register_plugin_in_code_shadows_entry_point(in_process_site):
    in_process_site.add_plugin("acme-pjrt", "acme", "")

    class Mine(pjrt_host.DevicePlugin):
        priority = 1

    record = pjrt_host.register_plugin("ACME", Mine)
    assert record.source == "registered in code" and record.ok
    entry = [r for r in records("acme") if r.source != "registered in code"]
    assert entry[0].status == Status.SHADOWED
    assert pjrt_host.select("acme").plugin.priority == 1


def test_register_plugin_instance(in_process_site):
    class Mine(pjrt_host.DevicePlugin):
        pass

    instance = Mine()
    assert pjrt_host.register_plugin("mine", instance).plugin is instance


def test_jax_plugin_is_listed_without_importing_it(in_process_site, libs):
    lib = Path(libs["null_api"])
    in_process_site.add_dist(
        "jax-fake-pjrt", "0.10.2",
        entry_points={"jax_plugins": {"xla_fake": "jax_plugins_fake"}},
        files={"jax_plugins_fake/__init__.py": "raise RuntimeError('jax plugins are not imported by list')\n",
               "jax_plugins_fake/xla_fake_plugin.so": ""},
    )
    # The distribution's shared object: a real library exporting GetPjrtApi.
    (in_process_site.path / "jax_plugins_fake" / "xla_fake_plugin.so").write_bytes(lib.read_bytes())
    record = only("xla_fake")
    assert record.source == "jax plugin" and record.ok
    assert record.library == str(in_process_site.path / "jax_plugins_fake" / "xla_fake_plugin.so")
    assert record.plugin.physical_chip_count() == 0  # never a default choice
    assert "jax_plugins_fake" not in sys.modules


def test_hooks_see_registration(in_process_site):
    seen = []

    class Watcher:
        @pjrt_host.hookimpl
        def pjrt_host_plugin_registered(self, name, record):
            seen.append((name, record.status))

    pjrt_host.plugin_manager().register(Watcher())
    in_process_site.add_plugin("acme-pjrt", "acme", "")
    pjrt_host.plugins()
    assert ("acme", "ok") in seen
