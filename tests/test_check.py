"""``python -m pjrt_host check``: the report card, run as a vendor runs it
(the CLI in a child process) on cpu_ref and on deliberately broken plugins
installed as real distributions.  Each broken plugin must fail exactly the
sections its defect touches, with the reason, and the report must still
come out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli

pytest.importorskip("torch")

# The OpInfo sweep itself is tests/test_opinfo.py's job (the same harness);
# here a few cases of each dtype show the ops section is wired up.
OPS = r"^(add|sum|matmul|index_select|sort|cat)-"

_BROKEN_DTYPE = """
    from pjrt_host_cpu_ref import CpuRefPlugin

    class Plugin(CpuRefPlugin):
        # float64 declared as held in complex32, which no device can hold
        unsupported_dtypes = {"float64": "complex32"}
"""

_NO_ZERO_COPY = """
    from pjrt_host_cpu_ref import CpuRefPlugin

    class Plugin(CpuRefPlugin):
        # Like every plugin but cpu_ref: CPU tensors reach the device
        # through host memory, where numpy has no bfloat16 or float8.
        zero_copy_torch_devices = ()
"""

_NO_COLLECTIVES = """
    import jax
    from pjrt_host_cpu_ref import CpuRefPlugin

    class Plugin(CpuRefPlugin):
        # Joins the processes but gives the CPU client no cross-process
        # collectives implementation: every collective across them fails.
        def configure_multiprocess(self, local_rank, local_world_size):
            super().configure_multiprocess(local_rank, local_world_size)
            jax.config.update("jax_cpu_collectives_implementation", None)
"""

_HANGS = """
    import time
    from pjrt_host_cpu_ref import CpuRefPlugin

    class Plugin(CpuRefPlugin):
        def configure_single_process(self):
            time.sleep(600)  # a client that never comes up
"""


def _install(site, name: str, source: str) -> None:
    import textwrap

    module = f"{name}_plugin"
    site.add_dist(f"{name}-plugin", entry_points={"torch_xla.plugins": {name: f"{module}:Plugin"}},
                  files={f"{module}.py": textwrap.dedent(source)})


def _check(tmp_path: Path, *args: str, site=None, env=None, timeout: float = 600) -> tuple[int, str, dict, str]:
    out_json, out_md = tmp_path / "report.json", tmp_path / "report.md"
    proc = run_cli("check", *args, "--json", str(out_json), "--report", str(out_md), site=site, env=env,
                   timeout=timeout)
    assert out_json.exists(), f"no JSON report: {proc.stdout[-2000:]} {proc.stderr[-2000:]}"
    assert out_md.exists(), "no Markdown report"
    return proc.returncode, proc.stdout, json.loads(out_json.read_text()), out_md.read_text()


def _sections(doc: dict) -> dict[str, str]:
    return {s["name"]: s["status"] for s in doc["sections"]}


def _failed_checks(doc: dict, section: str) -> list[dict]:
    return [c for s in doc["sections"] if s["name"] == section for c in s["checks"] if c["status"] == "fail"]


def test_cpu_ref_quick_passes_every_section(tmp_path):
    code, out, doc, md = _check(tmp_path, "cpu_ref", "--quick", "--ops", OPS)
    assert code == 0, out
    assert doc["schema"] == "pjrt_host.check/1"
    assert doc["summary"] == {"status": "pass", "exit_code": 0, "reason": None, "sections": {
        "contract": "pass", "dtypes": "pass", "ops": "pass", "compile": "pass", "kernels": "pass", "memory": "pass",
        "collectives": "pass", "performance": "pass"}}
    by_name = {s["name"]: s for s in doc["sections"]}
    # every section ran real checks, and nothing failed
    for name, section in by_name.items():
        assert section["checks"], name
        assert not [c for c in section["checks"] if c["status"] == "fail"], (name, section["checks"])
    dtypes = {c["name"]: c["status"] for c in by_name["dtypes"]["checks"]}
    assert dtypes["bfloat16"] == dtypes["float8_e4m3fn"] == dtypes["uint64"] == "pass"
    assert "through DLPack" in by_name["dtypes"]["checks"][0]["detail"]  # cpu_ref's zero_copy_torch_devices
    assert dtypes["complex32"] == "expected"  # jax has none: refused on every plugin
    ops = by_name["ops"]
    assert sum(c["counts"].get("passed", 0) for c in ops["checks"]) >= 20
    figures = {f["name"] for f in by_name["performance"]["figures"]}
    assert {"host -> device", "device -> host", "eager op (a + b, 16 floats)",
            "matmul float32 1024x1024", "matmul bfloat16 1024x1024"} <= figures
    assert all(f["value"] and f["value"] > 0 for f in by_name["performance"]["figures"])
    kernels = {c["name"]: c["status"] for c in by_name["kernels"]["checks"]}
    assert kernels["aten::_softmax -> pjrt_host_cpu_ref._kernels.softmax:softmax: values"] == "pass", kernels
    assert {f["name"] for f in by_name["kernels"]["figures"]} == {"aten::_softmax kernel time",
                                                                 "aten::_softmax_backward_data kernel time"}
    # the human table: a progress line per section and the verdict
    assert "[3/8] Ops" in out and "cases, 0 failed" in out
    assert out.rstrip().splitlines()[-1].startswith("PASS: every conformance section passed")
    assert md.startswith("# pjrt_host report card: `cpu_ref`") and "| collectives | **pass** |" in md


def test_a_declared_dtype_the_device_cannot_hold_fails_the_dtypes_section(tmp_path, site):
    _install(site, "baddtype", _BROKEN_DTYPE)
    code, out, doc, _ = _check(tmp_path, "baddtype", "--quick", "--only", "contract,dtypes", site=site)
    assert code == 1, out
    assert _sections(doc) == {"contract": "pass", "dtypes": "fail"}
    failed = _failed_checks(doc, "dtypes")
    assert [c["name"] for c in failed] == ["float64"]
    assert "complex32" in failed[0]["detail"]
    assert "FAIL float64:" in out and out.rstrip().splitlines()[-1].startswith("FAIL: dtypes")


def test_a_plugin_without_zero_copy_passes_the_dtypes_section(tmp_path, site):
    """Every dtype's bit-exact round trip runs through host memory here; a
    host defect on that path (float8 once failed it) must not fail the
    plugin's report card."""
    _install(site, "nozerocopy", _NO_ZERO_COPY)
    code, out, doc, _ = _check(tmp_path, "nozerocopy", "--quick", "--only", "contract,dtypes", site=site)
    assert code == 0, out
    assert _sections(doc) == {"contract": "pass", "dtypes": "pass"}
    checks = {c["name"]: c for s in doc["sections"] if s["name"] == "dtypes" for c in s["checks"]}
    for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                 "float8_e8m0fnu", "uint64", "complex128", "bool"):
        assert checks[name]["status"] == "pass", checks[name]
        assert "through host memory" in checks[name]["detail"], checks[name]
    assert checks["complex32"]["status"] == "expected"


def test_a_client_without_cross_process_collectives_fails_only_collectives(tmp_path, site):
    _install(site, "nocoll", _NO_COLLECTIVES)
    code, out, doc, _ = _check(tmp_path, "nocoll", "--quick", "--only", "contract,collectives", site=site,
                               env={"PJRT_HOST_CPU_REF_DEVICES": "2"})
    assert code == 1, out
    assert _sections(doc) == {"contract": "pass", "collectives": "fail"}
    failed = _failed_checks(doc, "collectives")
    assert [c["name"] for c in failed] == ["2 processes: torch.distributed and pjrt_host.spmd collectives"]
    # the rank and the collective that failed, in XLA's words
    assert "rank 0" in failed[0]["detail"] and "all_reduce" in failed[0]["detail"]
    assert "Multiprocess computations aren't implemented" in failed[0]["detail"]
    # the local (one-process) collectives still pass
    local = [c for s in doc["sections"] if s["name"] == "collectives" for c in s["checks"] if "local" in c["name"]]
    assert local and local[0]["status"] == "pass"


@pytest.mark.parametrize("lib", ["not_elf", "null_functions"])
def test_a_library_that_is_not_pjrt_makes_the_plugin_unusable(tmp_path, site, libs, lib):
    site.add_plugin("notpjrt-plugin", "notpjrt", f"def library_path(self):\n    return {libs[lib]!r}")
    code, out, doc, md = _check(tmp_path, "notpjrt", "--quick", site=site)
    assert code == 2, out
    assert doc["summary"]["status"] == "unusable"
    sections = _sections(doc)
    assert sections.pop("contract") == "fail"
    assert set(sections.values()) == {"skip"} and len(sections) == 7  # every other section
    reason = doc["summary"]["reason"]
    assert libs[lib] in reason and "reinstall notpjrt-plugin" in reason
    assert "UNUSABLE: plugin 'notpjrt' cannot be used" in out
    assert "**UNUSABLE**" in md


def test_a_hanging_client_fails_within_the_time_limit(tmp_path, site):
    _install(site, "hangs", _HANGS)
    code, out, doc, _ = _check(tmp_path, "hangs", "--quick", "--only", "contract", site=site,
                               env={"PJRT_HOST_CHECK_TIMEOUT": "10"}, timeout=120)
    assert code == 2, out
    failed = _failed_checks(doc, "contract")
    assert failed[-1]["name"] == "client"
    assert "did not finish within 10 s in check 'client'" in failed[-1]["detail"]


@pytest.mark.parametrize("name", ["cuda", "tpu"])
def test_vendor_plugins_without_their_hardware_exit_2_with_the_plugins_reason(tmp_path, name):
    code, out, doc, _ = _check(tmp_path, name, "--quick")
    assert code == 2, out
    reason = doc["summary"]["reason"]
    assert f"plugin '{name}'" in reason and "device was found on this machine" in reason


def test_unknown_plugin_and_unknown_section(tmp_path):
    code, out, doc, _ = _check(tmp_path, "nosuchdevice")
    assert code == 2 and "no plugin named 'nosuchdevice' is installed" in doc["summary"]["reason"]
    proc = run_cli("check", "cpu_ref", "--only", "opz")
    assert proc.returncode == 2 and "no section 'opz'" in proc.stderr
