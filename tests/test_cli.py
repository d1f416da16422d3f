"""``python -m pjrt_host``, run as users run it, with the wording they see."""

from __future__ import annotations

import json

from conftest import list_json, run_cli, run_python

HANG = """
def configure_single_process(self):
    import time
    time.sleep(600)
"""
CRASH = """
def configure_single_process(self):
    import os
    os.abort()
"""


def test_list_shows_every_plugin_and_exits_zero_with_broken_ones(site, libs):
    site.add_plugin("acme-pjrt", "acme", "priority = 300\ndisplay_name = 'Acme'", version="2.0")
    site.add_plugin("ctor-pjrt", "ctor", "def __init__(self):\n    raise RuntimeError('licence expired')")
    site.add_plugin("nosym-pjrt", "nosym", f"def library_path(self):\n    return {libs['no_symbol']!r}")
    proc = run_cli("list", site=site)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["NAME", "DISTRIBUTION", "SOURCE", "LIBRARY", "SELECTED", "STATUS"]
    acme = next(line for line in lines if line.startswith("acme "))
    assert "acme-pjrt 2.0" in acme and "torch_xla entry point" in acme and "(built into jaxlib)" in acme
    assert " * " in acme and acme.rstrip().endswith("ok")
    ctor = next(line for line in lines if line.startswith("ctor "))
    assert "constructor failed: ctor_pjrt.Plugin() raised RuntimeError: licence expired" in ctor
    nosym = next(line for line in lines if line.startswith("nosym "))
    assert libs["no_symbol"] in nosym and "does not export GetPjrtApi" in nosym


def test_list_json(site):
    site.add_plugin("acme-pjrt", "acme", "priority = 300")
    data = list_json(site)
    assert data["selected"] == "acme"
    row = data["by_name"]["acme"][0]
    assert row["distribution"] == "acme-pjrt" and row["status"] == "ok" and row["selected"] is True
    assert row["priority"] == 300


def test_list_imports_neither_torch_nor_jax(site):
    site.add_plugin("acme-pjrt", "acme", "")
    code = ("import sys\nfrom pjrt_host._cli import main\nmain(['list'])\n"
            "print('HEAVY', sorted(m for m in ('jax', 'jaxlib', 'torch') if m in sys.modules))")
    proc = run_python(["-c", code], site=site)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout


def test_list_with_no_plugins_says_how_to_install():
    proc = run_cli("list", env={"PJRT_HOST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert proc.returncode == 0
    assert "No PJRT plugins found. Install a plugin distribution (e.g. `pip install pjrt-host-cpu-ref`)" in proc.stdout


def test_probe_shows_devices_and_survives_hanging_and_crashing_plugins(site):
    site.add_plugin("hang-pjrt", "hang", HANG)
    site.add_plugin("crash-pjrt", "crash", CRASH)
    data = list_json(site, "--probe", "--timeout", "12",
                     env={"PJRT_HOST_CPU_REF_DEVICES": "3", "PJRT_HOST_PLUGINS": "cpu_ref,hang,crash"})
    assert data["by_name"]["cpu_ref"][0]["probe"]["devices"] == 3
    hang = data["by_name"]["hang"][0]["probe"]
    assert hang["devices"] is None and hang["error"].startswith("timed out after 12 s")
    crash = data["by_name"]["crash"][0]["probe"]
    assert crash["devices"] is None and "crashed the process (signal 6)" in crash["error"]


def test_probe_text_reports_the_reason_for_no_devices(site, libs):
    site.add_plugin("nullapi-pjrt", "nullapi", f"def library_path(self):\n    return {libs['null_api']!r}")
    proc = run_cli("list", "--probe", site=site, env={"PJRT_HOST_PLUGINS": "nullapi"})
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("nullapi "))
    assert "no devices: the PJRT library " in line and "GetPjrtApi() returned NULL" in line


def test_info_shows_the_contract_members(site):
    site.add_plugin("acme-pjrt", "acme", """
        priority = 300
        dense_gather_factor = 64
        unsupported_dtypes = {"float64": "float32"}
        def client_create_options(self):
            return {"memory_fraction": 0.5}
    """)
    proc = run_cli("info", "ACME", "--json", site=site)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["class"] == "acme_pjrt.Plugin"
    assert info["dense_gather_factor"] == 64
    assert info["unsupported_dtypes"] == {"float64": "float32"}
    assert info["client_create_options"] == {"memory_fraction": 0.5}
    assert info["physical_chip_count"] == 1 and info["requires_xla_coordinator"] is False
    assert info["is_host_cpu"] is False  # a plugin is an accelerator unless it says otherwise

    text = run_cli("info", "acme", site=site).stdout
    assert "dense_gather_factor: 64" in text


def test_info_of_unknown_plugin_fails_with_the_list(site):
    site.add_plugin("acme-pjrt", "acme", "")
    proc = run_cli("info", "nope", site=site)
    assert proc.returncode == 1
    assert "no plugin named 'nope'" in proc.stderr and "acme (ok)" in proc.stderr


def test_doctor_flags_version_skew_and_broken_plugins(site, libs):
    site.add_dist("old-pjrt", "1.0", entry_points={"torch_xla.plugins": {"old": "old_pjrt:Plugin"}},
                  files={"old_pjrt.py": "from pjrt_host import DevicePlugin\nclass Plugin(DevicePlugin):\n    pass\n"},
                  requires=["jaxlib<0.5"])
    site.add_plugin("ctor-pjrt", "ctor", "def __init__(self):\n    raise RuntimeError('licence expired')")
    proc = run_cli("doctor", site=site)
    assert proc.returncode == 1, proc.stdout
    out = proc.stdout
    assert "[warning] plugin 'old' (old-pjrt 1.0) requires jaxlib<0.5 but jaxlib" in out
    assert "fix: pip install 'jaxlib<0.5'" in out
    assert "[error] plugin 'ctor' (ctor-pjrt 1.0): constructor failed" in out
    assert "[ok] plugin 'cpu_ref'" in out


def test_doctor_reads_the_c_api_version_of_a_library(site, libs):
    site.add_plugin("nullapi-pjrt", "nullapi", f"def library_path(self):\n    return {libs['null_api']!r}")
    proc = run_cli("doctor", "--json", site=site)
    findings = json.loads(proc.stdout)
    mine = [f for f in findings if "nullapi" in f["what"]]
    assert mine and mine[0]["level"] == "error" and "GetPjrtApi() returned NULL" in mine[0]["what"]


def test_main_module_without_command_prints_help():
    proc = run_cli()
    assert proc.returncode == 2 and "list" in proc.stdout


def _tiny_wheel(where) -> str:
    """A wheel of a small plugin distribution, built here (a zip with a
    RECORD of sha256 hashes, as any build backend writes)."""
    import base64
    import hashlib
    import zipfile

    info = "tiny_pjrt-1.0.dist-info"
    files = {
        "tiny_pjrt/__init__.py": "from pjrt_host import DevicePlugin\n\nclass Plugin(DevicePlugin):\n    pass\n",
        "tiny_pjrt/table.txt": "numbers the plugin reads\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: tiny-pjrt\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": "[torch_xla.plugins]\ntiny = tiny_pjrt:Plugin\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    wheel = where / "tiny_pjrt-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return str(wheel)


def test_doctor_verify_names_a_changed_or_missing_file_of_a_pip_installed_plugin(tmp_path):
    import subprocess
    import sys

    from conftest import Site

    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                           "--target", str(target), _tiny_wheel(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = Site(target)
    env = {"PJRT_HOST_PLUGINS": "cpu_ref,tiny"}
    clean = run_cli("doctor", "--verify", site=site, env=env)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    # pip's RECORD lists the two files, the metadata and what pip adds
    # (INSTALLER ...), each with its hash; bytecode pip compiled without one
    import re

    listed = re.search(r"\[ok\] tiny-pjrt 1.0: (\d+) of \1 files listed with a hash match their RECORD", clean.stdout)
    assert listed and int(listed.group(1)) >= 6, clean.stdout
    listed = int(listed.group(1))
    # this repository's own (editable) install: said what was and was not checked
    assert "pjrt-host " in clean.stdout and "RECORD" in clean.stdout

    (target / "tiny_pjrt" / "table.txt").write_text("numbers someone changed\n")
    (target / "tiny_pjrt-1.0.dist-info" / "entry_points.txt").unlink()
    (target / "tiny_pjrt-1.0.dist-info" / "entry_points.txt").write_text("[torch_xla.plugins]\ntiny = tiny_pjrt:Plugin\n\n")
    (target / "tiny_pjrt-1.0.dist-info" / "INSTALLER").unlink()
    tampered = run_cli("doctor", "--verify", site=site, env=env)
    assert tampered.returncode == 1, tampered.stdout + tampered.stderr
    out = tampered.stdout
    assert (f"[error] tiny-pjrt 1.0: {target / 'tiny_pjrt' / 'table.txt'} differs from the sha256 in its RECORD "
            "(changed after it was installed)") in out, out
    assert f"{target / 'tiny_pjrt-1.0.dist-info' / 'entry_points.txt'} differs" in out
    assert f"[error] tiny-pjrt 1.0: {target / 'tiny_pjrt-1.0.dist-info' / 'INSTALLER'} is missing (RECORD lists it)" in out
    assert "fix: pip install --force-reinstall --no-deps 'tiny-pjrt==1.0'" in out
    assert f"[error] tiny-pjrt 1.0: {listed - 3} of {listed} files listed with a hash match their RECORD" in out
    assert "__init__.py differs" not in out


def test_doctor_verify_without_hashes_says_nothing_was_verified(site):
    site.add_plugin("bare-pjrt", "bare", "")  # a RECORD with no hashes
    proc = run_cli("doctor", "--verify", site=site, env={"PJRT_HOST_PLUGINS": "bare"})
    assert "[warning] bare-pjrt 1.0: 0 of 0 files listed with a hash match their RECORD (4 listed without one, " \
           "not checked): nothing could be verified" in proc.stdout, proc.stdout


def test_doctor_verify_imports_neither_torch_nor_jax(site):
    site.add_plugin("bare-pjrt", "bare", "")
    code = ("import sys\nfrom pjrt_host._cli import main\nmain(['doctor', '--verify'])\n"
            "print('HEAVY', sorted(m for m in ('jax', 'jaxlib', 'torch') if m in sys.modules))")
    proc = run_python(["-c", code], site=site, env={"PJRT_HOST_PLUGINS": "cpu_ref,bare"})
    assert "HEAVY []" in proc.stdout, proc.stdout + proc.stderr


INTERNAL_COMMANDS = ("_check_section", "_probe", "_capi_version")


def test_help_lists_only_the_public_commands_and_the_internal_ones_still_run(tmp_path):
    """The package's own child-process commands are not offered to users
    (argparse printed them as ``==SUPPRESS==``), in ``--help`` or in the
    error for an unknown command, yet each still runs."""
    proc = run_python(["-m", "pjrt_host", "--help"])
    assert proc.returncode == 0, proc.stderr
    for public in ("list", "info", "doctor", "check", "launch"):
        assert f"    {public} " in proc.stdout, proc.stdout
    for name in (*INTERNAL_COMMANDS, "SUPPRESS"):
        assert name not in proc.stdout, proc.stdout
    unknown = run_cli("nope")
    assert unknown.returncode == 2 and "invalid choice: 'nope'" in unknown.stderr, unknown.stderr
    assert "'launch'" in unknown.stderr and not any(name in unknown.stderr for name in INTERNAL_COMMANDS)
    for name in INTERNAL_COMMANDS:
        usage = run_cli(name, "--help")
        assert usage.returncode == 0 and f"python -m pjrt_host {name}" in usage.stdout, usage.stderr
    missing = tmp_path / "missing.so"
    capi = run_cli("_capi_version", str(missing))
    assert capi.returncode == 0 and str(missing) in json.loads(capi.stdout)["error"], capi.stdout
