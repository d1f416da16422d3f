"""Vendor kernels (``DevicePlugin.kernels``): declared by strings, preferred
over the host's lowering in every caller, switched off by the environment or
a configuration scope, and a failing kernel named and replaced by the
reference lowering.

The client is per process, so the device tests run scripts in children:
cpu_ref's real C++ (XLA FFI) softmax and plain-jax softmax backward, and
deliberately broken plugins registered in code.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from conftest import REPO, run_python

# Child scripts compare against torch CPU and print one JSON line.
_PRELUDE = """
import json, warnings
import torch
import pjrt_host
warnings.simplefilter("always")
torch.manual_seed(0)
"""


def _run(code: str, env: dict[str, str] | None = None, tmp_path=None, setup: str = "") -> tuple[dict, str]:
    paths = [str(REPO), str(REPO / "plugins" / "cpu_ref")]
    if tmp_path is not None:
        paths.insert(0, str(tmp_path))
    child_env = {"PYTHONPATH": os.pathsep.join(paths), "PJRT_DEVICE": "cpu_ref", **(env or {})}
    proc = run_python(["-c", textwrap.dedent(_PRELUDE) + setup + textwrap.dedent(code)], env=child_env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    last = [line for line in proc.stdout.splitlines() if line.startswith("{")][-1]
    return json.loads(last), proc.stderr


# ------------------------------------------------------------------ the contract, without a device


def test_declarations_are_strings_normalised_with_the_environment(monkeypatch):
    from pjrt_host import DevicePlugin, Kernel

    class Acme(DevicePlugin):
        kernels = {"_softmax": "acme.k:softmax", "aten::addmm.default": Kernel("acme.k:addmm", dtypes=["float32"])}

    monkeypatch.setenv("PJRT_HOST_PLUGIN_KERNELS", "strict,-aten::addmm")
    declared = Acme().declared_kernels
    assert declared.kernels == (("aten::_softmax", Kernel("acme.k:softmax")),
                                ("aten::addmm", Kernel("acme.k:addmm", dtypes=("float32",))))
    assert (declared.mode, declared.dropped) == ("strict", ("aten::addmm",))
    assert "Acme" in declared.plugin
    # stable text: it keys programs kept on disk
    assert "0x" not in repr(declared)


def test_bad_declarations_and_settings_are_named():
    from pjrt_host import DevicePlugin, EnvironmentSettingError, Kernel
    from pjrt_host._env import parse_plugin_kernels
    from pjrt_host._plugin import lowering_option_problems

    class Bad(DevicePlugin):
        kernels = {"aten::_softmax": "no_colon", "aten::relu": 3, "aten::tanh": Kernel("m:f", ranks=(-1,))}

    problems = lowering_option_problems(Bad())
    assert any("aten::_softmax has fn='no_colon', expected 'module:function'" in p for p in problems), problems
    assert any("aten::relu is 3" in p for p in problems), problems
    assert any("ranks=(-1,)" in p for p in problems), problems
    with pytest.raises(ValueError, match="declares kernels the host cannot read"):
        Bad().declared_kernels
    with pytest.raises(EnvironmentSettingError, match="'maybe' is not understood"):
        parse_plugin_kernels("maybe", "PJRT_HOST_PLUGIN_KERNELS")
    assert parse_plugin_kernels("0", "X") == ("off", frozenset())
    assert parse_plugin_kernels("-_softmax, strict", "X") == ("strict", frozenset({"aten::_softmax"}))


def test_config_refuses_a_bad_plugin_kernels_value():
    import pjrt_host

    with pytest.raises(ValueError, match="plugin_kernels"):
        with pjrt_host.config(plugin_kernels="sometimes"):
            pass


def test_listing_plugins_imports_no_kernel_and_no_jax():
    code = ("import sys, runpy; sys.argv = ['pjrt_host', 'list', '--json']\n"
            "try:\n    runpy.run_module('pjrt_host', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('LOADED', sorted(m for m in sys.modules if m in ('jax', 'torch') or '_kernels' in m))")
    proc = run_python(["-c", code], env={"PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'plugins' / 'cpu_ref'}"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LOADED []" in proc.stdout, proc.stdout[-500:]


# ------------------------------------------------------------------ cpu_ref's kernels, end to end


def test_cpu_ref_kernels_run_in_every_caller_and_match_torch_cpu():
    result, stderr = _run("""
        from pjrt_host import plugin_kernel_stats

        def traced():
            return {k.split()[0]: v["traced"] for k, v in plugin_kernel_stats().items()}

        def close(a, b):
            # float32's tolerance, absolute at the tensor's scale: a gradient
            # is a sum of 37 terms up to ~10, whose order differs from CPU's
            scale = max(1.0, float(b.detach().abs().max()))
            return bool(torch.allclose(a.detach().cpu(), b.detach(), rtol=1.3e-6, atol=1e-5 * scale))

        x = torch.randn(6, 37)
        w = torch.randn(37, 37)
        out = {}
        # eager, op by op, with backward through the declared backward kernel
        xj = x.to("jax").requires_grad_()
        y = torch.softmax(xj @ w.to("jax"), -1)
        (y * torch.arange(37.0).to("jax")).sum().backward()
        xc = x.clone().requires_grad_()
        yc = torch.softmax(xc @ w, -1)
        (yc * torch.arange(37.0)).sum().backward()
        out["eager"] = close(y, yc) and close(xj.grad, xc.grad)
        out["after_eager"] = traced()
        # a dimension other than the last: the condition sends it to the reference lowering
        out["dim0"] = close(torch.softmax(x.to("jax"), 0), torch.softmax(x, 0))
        out["after_dim0"] = traced()
        # fused eager
        with pjrt_host.config(eager="fused"):
            z = torch.softmax(x.to("jax") * 3, -1)
        out["fused"] = close(z, torch.softmax(x * 3, -1))
        out["after_fused"] = traced()
        # torch.compile
        f = torch.compile(lambda a: torch.softmax(a @ a.T, -1), backend="jax")
        out["compile"] = close(f(x.to("jax")), torch.softmax(x @ x.T, -1))
        out["after_compile"] = traced()
        # assume_pure, forward and backward (jax differentiates the custom call by its rule)
        g = pjrt_host.assume_pure(lambda a: torch.softmax(a * 2, -1))
        xp = x.to("jax").requires_grad_()
        (g(xp) * torch.arange(37.0).to("jax")).sum().backward()
        xq = x.clone().requires_grad_()
        (torch.softmax(xq * 2, -1) * torch.arange(37.0)).sum().backward()
        out["pure"] = close(g(x.to("jax")), torch.softmax(x * 2, -1)) and close(xp.grad, xq.grad)
        out["after_pure"] = traced()
        # a configuration scope turns them off: nothing more is traced with the kernel
        with pjrt_host.config(plugin_kernels=False):
            out["off"] = close(torch.softmax(x.to("jax") * 5, -1), torch.softmax(x * 5, -1))
        out["after_off"] = traced()
        with pjrt_host.config(plugin_kernels="-aten::_softmax"):
            out["dropped"] = close(torch.softmax(x.to("jax") * 7, -1), torch.softmax(x * 7, -1))
        out["after_dropped"] = traced()
        # a fused segment recorded with kernels off and run outside the scope
        # keeps its scope's setting (the context is made per configuration)
        with pjrt_host.config(eager="fused", plugin_kernels=False):
            late = torch.softmax(x.to("jax") * 11, -1)
        out["late"] = close(late, torch.softmax(x * 11, -1))
        out["after_late"] = traced()
        out["fallbacks"] = sum(v["fallbacks"] for v in plugin_kernel_stats().values())
        print(json.dumps(out))
    """)
    assert "kernel" not in stderr.lower() or "warning" not in stderr.lower(), stderr[-3000:]
    assert result["eager"] and result["dim0"] and result["fused"] and result["compile"] and result["pure"], result
    assert result["off"] and result["dropped"], result
    soft, back = "aten::_softmax", "aten::_softmax_backward_data"
    assert result["after_eager"][soft] >= 1 and result["after_eager"][back] >= 1, result
    assert result["after_dim0"] == result["after_eager"], result
    for before, after in (("after_dim0", "after_fused"), ("after_fused", "after_compile"),
                          ("after_compile", "after_pure")):
        assert result[after][soft] > result[before][soft], (before, after, result)
    assert result["after_off"] == result["after_pure"], result
    assert result["after_dropped"] == result["after_off"], result
    assert result["late"] and result["after_late"] == result["after_dropped"], result
    assert result["fallbacks"] == 0, result


@pytest.mark.parametrize("setting", ["0", "-aten::_softmax"])
def test_the_environment_turns_kernels_off(setting):
    result, _ = _run("""
        from pjrt_host import plugin_kernel_stats
        x = torch.randn(4, 9, requires_grad=True)
        xj = x.detach().to("jax").requires_grad_()
        y = torch.softmax(xj, -1)
        y.sum().backward()
        ok = bool(torch.allclose(y.detach().cpu(), torch.softmax(x, -1), rtol=1.3e-6, atol=1e-5))
        print(json.dumps({"ok": ok, "traced": sorted(k.split()[0] for k, v in plugin_kernel_stats().items()
                                                     if v["traced"])}))
    """, env={"PJRT_HOST_PLUGIN_KERNELS": setting})
    assert result["ok"]
    expected = [] if setting == "0" else ["aten::_softmax_backward_data"]
    assert result["traced"] == expected, result


def test_a_missing_compiler_falls_back_to_the_reference_with_one_warning(tmp_path):
    result, stderr = _run("""
        from pjrt_host import plugin_kernel_stats
        x = torch.randn(5, 8)
        a = torch.softmax(x.to("jax"), -1).cpu()
        b = torch.softmax(x.to("jax") * 2, -1).cpu()
        ok = torch.allclose(a, torch.softmax(x, -1), atol=1e-6) and torch.allclose(b, torch.softmax(x * 2, -1), atol=1e-6)
        print(json.dumps({"ok": bool(ok), "stats": plugin_kernel_stats()}))
    """, env={"CXX": str(tmp_path / "no-such-compiler"), "PJRT_HOST_CPU_REF_KERNEL_CACHE": str(tmp_path / "cache")})
    assert result["ok"]
    assert not any(k.startswith("aten::_softmax ") for k in result["stats"]), result
    warned = [line for line in stderr.splitlines() if "RuntimeWarning" in line]
    assert len(warned) == 1, stderr[-3000:]
    assert "CPU (reference)" in warned[0] and "aten::_softmax" in warned[0], warned
    assert "pjrt_host_cpu_ref._kernels.softmax:softmax" in warned[0] and "C++ compiler" in warned[0], warned


# ------------------------------------------------------------------ broken kernels


_BROKEN = '''
import ctypes
import jax
import jax.numpy as jnp

def raises(x, *args, **kwargs):
    raise RuntimeError("the Acme kernel has a bug")

def wrong_shape(x, dim, half_to_float=False, *, dtype=None):
    return x[..., :1]

def wrong_dtype(x):
    return jnp.tanh(x).astype(jnp.float16)
'''

_NO_TARGET = '''
import ctypes, sys
import jax
# a real library that lacks the handler the module registers
_lib = ctypes.cdll.LoadLibrary(sys.argv[1] if len(sys.argv) > 1 else LIB)
jax.ffi.register_ffi_target("acme_sigmoid", jax.ffi.pycapsule(_lib.AcmeSigmoid), platform="cpu")

def sigmoid(x):
    return jax.ffi.ffi_call("acme_sigmoid", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
'''

_BROKEN_PLUGIN = """
from pjrt_host import DevicePlugin, Kernel

class Acme(DevicePlugin):
    display_name = "Acme test device"
    jaxlib_backend = "cpu"
    kernels = {
        "aten::relu": "acme_kernels:raises",
        "aten::_softmax": "acme_kernels:wrong_shape",
        "aten::tanh": Kernel("acme_kernels:wrong_dtype", dtypes=("float32",)),
        "aten::sigmoid": "acme_no_target:sigmoid",
    }

pjrt_host.register_plugin("acme", Acme)
pjrt_host.select("acme")
"""


@pytest.fixture
def broken_kernels(tmp_path, libs):
    (tmp_path / "acme_kernels.py").write_text(_BROKEN)
    (tmp_path / "acme_no_target.py").write_text(_NO_TARGET.replace("LIB", repr(libs["no_symbol"])))
    return tmp_path


def test_broken_kernels_are_named_and_the_reference_runs(broken_kernels):
    result, stderr = _run(setup=_BROKEN_PLUGIN, code="""
        from pjrt_host import plugin_kernel_stats
        x = torch.randn(4, 6)
        out = {}
        for name, fn in (("relu", torch.relu), ("softmax", lambda t: torch.softmax(t, -1)),
                         ("tanh", torch.tanh), ("sigmoid", torch.sigmoid)):
            for scale in (1.0, 2.0):  # a second call: still correct, warned once
                got = fn(x.to("jax") * scale).cpu()
                out[f"{name}{scale}"] = bool(torch.allclose(got, fn(x * scale), rtol=1.3e-6, atol=1e-5)
                                             and got.dtype == fn(x).dtype)
        out["stats"] = plugin_kernel_stats()
        print(json.dumps(out))
    """, env={"PJRT_DEVICE": "acme"}, tmp_path=broken_kernels)
    assert all(v for k, v in result.items() if k != "stats"), result
    warned = [line for line in stderr.splitlines() if "RuntimeWarning: pjrt_host: plugin Acme test device" in line]
    assert len(warned) == 4, stderr[-4000:]
    text = "\n".join(warned)
    assert "kernel acme_kernels:raises for aten::relu raised RuntimeError while traced: the Acme kernel has a bug" in text
    assert ("kernel acme_kernels:wrong_shape for aten::_softmax returned shape (4, 1), float32 where the reference "
            "lowering gives shape (4, 6), float32") in text
    assert "kernel acme_kernels:wrong_dtype for aten::tanh returned shape (4, 6), float16" in text
    assert "kernel acme_no_target:sigmoid for aten::sigmoid cannot be loaded (AttributeError" in text
    assert "AcmeSigmoid" in text
    relu = result["stats"]["aten::relu acme_kernels:raises"]
    assert relu["traced"] == 0 and relu["fallbacks"] >= 1, result


def test_strict_mode_raises_the_kernel_error(broken_kernels):
    result, _ = _run(setup=_BROKEN_PLUGIN, code="""
        from pjrt_host._lowerings._kernels import KernelError
        x = torch.randn(4, 6).to("jax")
        out = {}
        # a kernel that cannot be loaded fails every op of the scope: the
        # kernels are loaded when the scope's first op runs
        with pjrt_host.config(plugin_kernels="strict"):
            try:
                torch.relu(x).cpu()
            except KernelError as err:
                out["load"] = [err.op, err.kernel]
        with pjrt_host.config(plugin_kernels="strict,-aten::sigmoid"):
            try:
                torch.relu(x).cpu()
            except KernelError as err:
                out["error"] = str(err)
                out["fields"] = [err.plugin, err.op, err.kernel]
        out["relaxed"] = bool(torch.equal(torch.relu(x).cpu(), torch.relu(x.cpu())))
        print(json.dumps(out))
    """, env={"PJRT_DEVICE": "acme"}, tmp_path=broken_kernels)
    assert result["load"] == ["aten::sigmoid", "acme_no_target:sigmoid"], result
    assert "the Acme kernel has a bug" in result["error"], result
    assert result["fields"][1:] == ["aten::relu", "acme_kernels:raises"], result
    assert result["relaxed"], result


def test_a_second_process_loads_programs_that_call_the_kernel_from_disk(tmp_path):
    """The custom-call target is registered when the lowering context is
    made, before a program kept on disk is loaded untraced."""
    code = """
        x = torch.arange(24.0).reshape(4, 6) / 7
        got = torch.softmax(x.to("jax"), -1).cpu()
        stats = torch.jax.program_cache_stats()
        print(json.dumps({"ok": bool(torch.allclose(got, torch.softmax(x, -1), rtol=1.3e-6, atol=1e-6)),
                          "untraced": stats["untraced"]}))
    """
    env = {"PJRT_HOST_CACHE_DIR": str(tmp_path / "programs")}
    first, _ = _run(code, env=env)
    second, _ = _run(code, env=env)
    assert first["ok"] and second["ok"], (first, second)
    assert second["untraced"] >= 1, second


_SCALED_PLUGIN = """
from pjrt_host import DevicePlugin

class Scaled(DevicePlugin):
    display_name = "Scaled test device"
    jaxlib_backend = "cpu"
    kernels = {"aten::tanh": "scaled_kernels:tanh"}

pjrt_host.register_plugin("scaled", Scaled)
pjrt_host.select("scaled")
"""


def test_a_kernel_changed_without_a_new_plugin_version_is_traced_anew(tmp_path):
    """Programs kept on disk are keyed by the kernels' source as by
    pjrt_host's own: a vendor who edits a kernel and keeps the version gets
    the new kernel's numbers in the next process, not the old program."""
    code = """
        x = torch.linspace(-2, 2, 12)
        got = torch.tanh(x.to("jax")).cpu()
        print(json.dumps({"ratio": float((got / torch.tanh(x)).mean()),
                          "untraced": torch.jax.program_cache_stats()["untraced"]}))
    """
    env = {"PJRT_DEVICE": "scaled", "PJRT_HOST_CACHE_DIR": str(tmp_path / "programs")}
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "scaled_kernels.py").write_text("import jax.numpy as jnp\n\ndef tanh(x):\n    return jnp.tanh(x)\n")
    first, _ = _run(code, env=env, tmp_path=kernels, setup=_SCALED_PLUGIN)
    again, _ = _run(code, env=env, tmp_path=kernels, setup=_SCALED_PLUGIN)
    (kernels / "scaled_kernels.py").write_text("import jax.numpy as jnp\n\ndef tanh(x):\n    return 2 * jnp.tanh(x)\n")
    changed, _ = _run(code, env=env, tmp_path=kernels, setup=_SCALED_PLUGIN)
    assert abs(first["ratio"] - 1) < 1e-5 and abs(again["ratio"] - 1) < 1e-5, (first, again)
    assert again["untraced"] >= 1, again  # the same kernel: loaded from disk
    assert abs(changed["ratio"] - 2) < 1e-5, changed  # the edited kernel ran, not the kept program


# ------------------------------------------------------------------ info and the report card


def test_info_lists_the_kernels_without_importing_them():
    from conftest import run_cli

    env = {"PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'plugins' / 'cpu_ref'}", "PJRT_HOST_PLUGIN_KERNELS": "-_softmax"}
    proc = run_cli("info", "cpu_ref", "--json", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    kernels = json.loads(proc.stdout)["kernels"]
    assert kernels == [
        "aten::_softmax -> pjrt_host_cpu_ref._kernels.softmax:softmax [float32; when "
        "pjrt_host_cpu_ref._kernels.softmax:softmax_applies] (off: PJRT_HOST_PLUGIN_KERNELS)",
        "aten::_softmax_backward_data -> pjrt_host_cpu_ref._kernels.backward:softmax_backward [when "
        "pjrt_host_cpu_ref._kernels.backward:applies]",
    ]


def test_the_report_card_names_a_wrong_kernel_with_its_op_and_sample(site, tmp_path):
    from conftest import run_cli

    site.add_dist("acme-kernels", files={"acme_kernels.py": """
        import jax.numpy as jnp

        def softmax(x, dim, half_to_float=False, *, dtype=None):
            return jnp.exp(x) / jnp.sum(jnp.exp(x), axis=dim, keepdims=True) * 1.01  # 1% off

        def relu(x):
            return jnp.maximum(x, 0)
    """})
    site.add_plugin("acme-pjrt", "acme", """
        display_name = "Acme"
        jaxlib_backend = "cpu"
        kernels = {"aten::_softmax": "acme_kernels:softmax", "aten::relu": "acme_kernels:relu"}
    """)
    report = tmp_path / "acme.json"
    env = {"PYTHONPATH": os.pathsep.join([str(site.path), str(REPO)])}
    proc = run_cli("check", "acme", "--quick", "--only", "kernels", "--json", str(report), site=site, env=env,
                   timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    section = next(s for s in json.loads(report.read_text())["sections"] if s["name"] == "kernels")
    checks = {c["name"]: c for c in section["checks"]}
    values = checks["aten::_softmax -> acme_kernels:softmax: values"]
    assert values["status"] == "fail", values
    assert values["detail"].startswith("AssertionError: plugin Acme (acme_pjrt.Plugin)'s kernel acme_kernels:softmax "
                                       "for aten::_softmax differs from the host's lowering: Tensor-likes are not "
                                       "close"), values
    assert "(sample: (float32[" in values["detail"], values
    assert checks["aten::relu -> acme_kernels:relu: values"]["status"] == "pass", checks
    assert {f["name"] for f in section["figures"]} >= {"aten::relu kernel time"}, section["figures"]
