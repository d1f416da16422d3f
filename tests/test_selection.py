"""Selection: PJRT_DEVICE, priority, select(), and the errors users see."""

from __future__ import annotations

import pytest

import pjrt_host
from pjrt_host import PluginLoadError, PluginNotFoundError


def test_pjrt_device_is_case_insensitive(in_process_site, monkeypatch):
    in_process_site.add_plugin("acme-pjrt", "acme", "")
    monkeypatch.setenv("PJRT_DEVICE", "AcMe")
    assert pjrt_host.selected().name == "acme"


def test_default_is_highest_priority_with_chips(in_process_site):
    in_process_site.add_plugin("low-pjrt", "low", "priority = 5")
    in_process_site.add_plugin("high-pjrt", "high", "priority = 500")
    in_process_site.add_plugin("absent-pjrt", "absent", "priority = 900\ndef physical_chip_count(self):\n    return 0")
    in_process_site.add_plugin("broken-pjrt", "broken", "priority = 999\ndef __init__(self):\n    raise ValueError('x')")
    assert pjrt_host.selected().name == "high"


def test_default_choice_is_logged(in_process_site, caplog):
    in_process_site.add_plugin("high-pjrt", "high", "priority = 500")
    with caplog.at_level("INFO", logger="pjrt_host"):
        pjrt_host.selected()
    assert "chose plugin 'high' from high-pjrt 1.0 (priority 500)" in caplog.text


def test_unknown_name_lists_installed_and_says_how_to_install(in_process_site, monkeypatch):
    in_process_site.add_plugin("acme-pjrt", "acme", "")
    monkeypatch.setenv("PJRT_DEVICE", "nope")
    with pytest.raises(PluginNotFoundError) as info:
        pjrt_host.selected()
    text = str(info.value)
    assert "PJRT_DEVICE=nope: no plugin named 'nope'" in text
    assert "acme (ok)" in text
    assert "pip install" in text and "register_plugin" in text


def test_selecting_a_broken_plugin_names_plugin_distribution_and_cause(in_process_site):
    in_process_site.add_plugin("ctor-pjrt", "ctor", "def __init__(self):\n    raise RuntimeError('licence expired')")
    with pytest.raises(PluginLoadError) as info:
        pjrt_host.select("ctor")
    err = info.value
    assert err.plugin == "ctor" and err.distribution == "ctor-pjrt"
    assert "plugin 'ctor' from ctor-pjrt 1.0 cannot be used" in str(err)
    assert "licence expired" in str(err)
    assert "Fix or reinstall ctor-pjrt, or choose another plugin" in str(err)
    assert isinstance(err.__cause__, RuntimeError)


def test_select_overrides_environment_and_none_restores_it(in_process_site, monkeypatch):
    in_process_site.add_plugin("a-pjrt", "a", "")
    in_process_site.add_plugin("b-pjrt", "b", "")
    monkeypatch.setenv("PJRT_DEVICE", "a")
    assert pjrt_host.select("B").name == "b"
    assert pjrt_host.selected().name == "b"
    assert pjrt_host.select(None).name == "a"


def test_no_plugins_at_all(in_process_site, monkeypatch):
    monkeypatch.setenv("PJRT_HOST_DISABLE_PLUGIN_AUTOLOAD", "1")
    with pytest.raises(PluginNotFoundError, match="no usable device plugin is installed. No plugins are installed."):
        pjrt_host.selected()


def test_select_is_refused_once_a_client_exists():
    from conftest import run_python

    code = (
        "import pjrt_host\n"
        "pjrt_host.devices()\n"
        "try:\n"
        "    pjrt_host.select('cpu_ref')\n"
        "except pjrt_host.SelectionError as e:\n"
        "    print(e)\n"
    )
    proc = run_python(["-c", code])
    assert proc.returncode == 0, proc.stderr
    assert "cannot select 'cpu_ref': the PJRT client of plugin 'cpu_ref' already exists" in proc.stdout
