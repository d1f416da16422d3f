"""The device arrives with `import torch` alone (torch's `torch.backends`
entry points), TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns it off, `import
pjrt_host` turns it on, and CPU-only programs are unchanged: same results
on torch's own OpInfo samples, torch.compile with inductor on CPU still
works, and nothing imports jax until a 'jax' tensor is made."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent


def start(code: str, *, autoload: bool = True, extra_env: dict | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PJRT_", "PYTEST_", "TORCH_DEVICE_BACKEND"))}
    env.update(extra_env or {})
    if not autoload:
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: int = 300) -> subprocess.CompletedProcess:
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def run(code: str, *, autoload: bool = True, timeout: int = 300,
        extra_env: dict | None = None) -> subprocess.CompletedProcess:
    return finish(start(code, autoload=autoload, extra_env=extra_env), timeout)


def test_plain_import_torch_makes_the_device_work():
    out = run("""
        import sys
        import torch
        assert "jax" not in sys.modules, "import torch must not import jax"
        a = torch.randn(100, device='jax')
        print(a)
        assert "jax" in sys.modules and a.device.type == "jax"
        assert torch.jax.is_available()
        print("OK", a.shape)
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "device='jax:0'" in out.stdout and "OK torch.Size([100])" in out.stdout


def test_torch_builds_with_their_own_accelerator_keep_it_unless_asked():
    """torch makes a registered PrivateUse1 device the accelerator, and its
    autograd then fails every CUDA backward (pytorch/pytorch#161129): on a
    machine where torch has a usable accelerator of its own, `import torch`
    alone must not register 'jax'; PJRT_DEVICE=NAME or `import pjrt_host`
    does.  torch's answer is simulated (torch._C._get_accelerator), the
    registration is the real one."""
    code = """
        import os, torch
        torch._C._get_accelerator = lambda: torch.device("cuda")  # what torch says on a GPU machine
        torch.__spec__._initializing = True    # as while `import torch` loads its entry points
        from pjrt_host import _torch
        torch.__spec__._initializing = False
        _torch.autoload()                      # what torch's entry point calls
        print("implicit:", torch._C._get_privateuse1_backend_name())
        os.environ["PJRT_DEVICE"] = "cpu_ref"
        _torch.autoload()
        print("PJRT_DEVICE:", torch._C._get_privateuse1_backend_name(), torch.ones(2, device="jax").device)
    """
    out = run(code, autoload=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "implicit: privateuseone" in out.stdout and "PJRT_DEVICE: jax jax:0" in out.stdout
    explicit = run("""
        import torch
        torch._C._get_accelerator = lambda: torch.device("cuda")
        import pjrt_host                        # an explicit request
        print(torch.ones(2, device="jax").device)
    """, autoload=False)
    assert explicit.returncode == 0 and "jax:0" in explicit.stdout, explicit.stderr[-3000:]


def test_autoload_off_disables_the_device():
    out = run("""
        import torch
        assert not hasattr(torch, "jax")
        try:
            torch.zeros(1, device='jax')
        except RuntimeError as err:
            print("refused:", err)
        else:
            raise AssertionError("device='jax' worked with autoload off")
    """, autoload=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "refused" in out.stdout


def test_import_pjrt_host_enables_it_with_autoload_off():
    out = run("""
        import sys
        import torch
        import pjrt_host
        assert "jax" not in sys.modules
        print(torch.ones(2, device='jax') * 2)
    """, autoload=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "tensor([2., 2.], device='jax:0')" in out.stdout


def test_import_pjrt_host_alone_imports_neither_torch_nor_jax():
    out = run("""
        import sys
        import pjrt_host
        pjrt_host.config
        print(sorted(m for m in ("torch", "jax", "jaxlib") if m in sys.modules))
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"


def test_inductor_and_dataloader_on_cpu_still_work_and_need_no_jax():
    out = run("""
        import sys
        import torch
        def f(x, y):
            return (x.sin() * y).relu().sum(0) + torch.cumsum(x, 1)[:, -1]
        x, y = torch.randn(8, 8), torch.randn(8)
        compiled = torch.compile(f)  # the default backend: inductor
        torch.testing.assert_close(compiled(x, y), f(x, y))
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU())
        cm = torch.compile(m)
        inp = torch.randn(2, 4)
        torch.testing.assert_close(cm(inp), m(inp))
        assert torch.accelerator.current_accelerator().type == "jax"
        # DataLoader(pin_memory=True) pins for the accelerator: it must still
        # work, as it did before the device existed (unpinned).
        from torch.utils.data import DataLoader, TensorDataset
        batches = list(DataLoader(TensorDataset(torch.arange(6.0)), batch_size=3, pin_memory=True))
        assert [b[0].tolist() for b in batches] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
        print("jax imported:", "jax" in sys.modules)
    """, timeout=420)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "jax imported: False" in out.stdout


def test_compiled_cpu_code_pays_nothing_per_call_for_the_device():
    """torch.compile of CPU code in a process that has not used the device
    runs as without pjrt_host: dynamo asks torch.accelerator.is_available()
    as it traces, and with an accelerator available it reads the
    accelerator's current stream on every call (a Python device-guard round
    trip, +10% on a small graph).  Once the device is in use, it is
    available, compiling included."""
    out = run("""
        import torch
        m = torch.compile(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()), backend="eager")
        x = torch.randn(2, 8)
        m(x)
        reads = []
        real = torch.accelerator.current_stream
        torch.accelerator.current_stream = lambda *a, **k: reads.append(a) or real(*a, **k)
        for _ in range(5):
            m(x)
        print("stream reads:", len(reads))
        print("available:", torch.accelerator.is_available(), torch.jax.is_available())
        y = torch.ones(3, device="jax")
        seen = []
        def f(t):
            seen.append(torch.accelerator.is_available())
            return t * 2
        assert torch.compile(f, backend="jax")(y).cpu().tolist() == [2.0, 2.0, 2.0]
        print("available while compiling after use:", seen)
    """)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "stream reads: 0" in out.stdout
    assert "available: True True" in out.stdout
    assert "available while compiling after use: [True]" in out.stdout


def test_cpu_results_unchanged_on_torch_opinfo_samples():
    # torch's own OpInfo database (the data its CPU test-suite runs on): the
    # same ops on the same samples give bit-identical results with the device
    # backend loaded and without it.
    script = str(HERE / "_torch_cpu_digest.py")
    code = f"import runpy, sys; sys.argv = ['x', '70', '8']; runpy.run_path({script!r}, run_name='__main__')"
    procs = start(code), start(code, autoload=False)  # side by side: half the wall time
    with_device, without = finish(procs[0], 400), finish(procs[1], 400)
    assert with_device.returncode == 0, with_device.stderr[-3000:]
    assert without.returncode == 0, without.stderr[-3000:]
    a = json.loads(with_device.stdout.strip().splitlines()[-1])
    b = json.loads(without.stdout.strip().splitlines()[-1])
    assert len(a["ops"]) > 45
    different = sorted(k for k in a["ops"] if a["ops"][k] != b["ops"].get(k))
    assert not different, f"CPU results changed with the device loaded: {different}"
    assert a["accelerator"] == "jax" and b["accelerator"] == "None"
    assert not a["jax_imported"]


PATCH_STATE = """
    import json, sys, torch
    from pjrt_host._torch import _hiding, _patches

    def resolve(path):
        obj = torch
        for part in path.split(".")[1:]:
            obj = getattr(obj, part)
        return obj

    def patched():
        names = {n for n in _patches.PATCHES if " " not in n and getattr(resolve(n), "_pjrt_host", False)}
        if getattr(type(torch._C.Generator).__call__, "_pjrt_host", False):
            names.add("torch._C.Generator.__call__ (its metaclass)")
        if _hiding.at_first_compile is not None:  # armed: dynamo's method is replaced at the first compile
            names |= {n for n in _patches.PATCHES if n.endswith("(at the first compile)")}
        from pjrt_host._torch._patches import _import_hooks
        for n in _patches.PATCHES:
            if n.endswith(" (when imported)"):  # armed: an import hook replaces it when its module is imported
                path = n[:-len(" (when imported)")]
                module = path.rsplit(".", 1)[0]
                if module in sys.modules:
                    if getattr(resolve(path), "_pjrt_host", False):
                        names.add(n)
                elif module in _import_hooks._hooks:
                    names.add(n)
        return sorted(names)

    before = patched()
    x = torch.ones(3, device='jax', requires_grad=True)
    (x * 2).sum().backward()
    assert x.grad.cpu().tolist() == [2.0, 2.0, 2.0]
    print(json.dumps({"before": before, "after": patched()}))
"""


def test_patches_are_the_inventory_deferred_where_possible_and_can_be_switched_off():
    """Every patch of _patches.PATCHES is installed at import, except
    the backward hook (only after the first 'jax' tensor);
    PJRT_HOST_SKIP_PATCHES turns named ones or all off, and the device still
    computes and differentiates without them."""
    from pjrt_host._torch import _patches

    everything = set(_patches.PATCHES)
    backward = {n for n, (key, _) in _patches.PATCHES.items() if key == "backward"}
    keys = {patch.key for patch in _patches.INVENTORY}
    assert {key for key, _ in _patches.PATCHES.values()} <= keys
    assert len(keys) == len(_patches.INVENTORY), "a key names one row"

    default = run(PATCH_STATE)
    assert default.returncode == 0, default.stderr[-3000:]
    state = json.loads(default.stdout.strip().splitlines()[-1])
    assert set(state["before"]) == everything - backward
    assert set(state["after"]) == everything

    off = run(PATCH_STATE, extra_env={"PJRT_HOST_SKIP_PATCHES": "all"})
    assert off.returncode == 0, off.stderr[-3000:]
    assert json.loads(off.stdout.strip().splitlines()[-1]) == {"before": [], "after": []}

    some = run(PATCH_STATE, extra_env={"PJRT_HOST_SKIP_PATCHES": "backward, pin_memory"})
    assert some.returncode == 0, some.stderr[-3000:]
    pin = {n for n, (key, _) in _patches.PATCHES.items() if key == "pin_memory"}
    assert set(json.loads(some.stdout.strip().splitlines()[-1])["after"]) == everything - backward - pin

    # a typo is named once with the key meant (and skips nothing); beside
    # it, the keys that do name a patch are still skipped
    mixed = run(PATCH_STATE, extra_env={"PJRT_HOST_SKIP_PATCHES": "backwards,pin_memory"})
    assert mixed.returncode == 0, mixed.stderr[-3000:]
    assert mixed.stderr.count("PJRT_HOST_SKIP_PATCHES names ['backwards']") == 1, mixed.stderr[-3000:]
    assert "'backward'" in mixed.stderr
    assert set(json.loads(mixed.stdout.strip().splitlines()[-1])["after"]) == everything - pin


_X64_PROGRAM = """
    import json, torch, jax, jax.numpy as jnp, pjrt_host
    from pjrt_host import interop, spmd
    big = 2 ** 40
    x = torch.arange(3, device='jax') + big                       # eager int64
    d = torch.tensor([1 / 3], dtype=torch.float64, device='jax')   # eager float64
    compiled = torch.compile(lambda a: (a * 2).sum(), backend='jax')(x)
    through_jax = interop.call_jax(lambda a: a + big, x)
    pure = pjrt_host.assume_pure(lambda a: a - 1)(x)
    xg = x.clone().double().requires_grad_()
    interop.call_jax(lambda a: (a * a).sum(), xg).backward()      # backward from the autograd engine
    sharded = torch.arange(8, device='jax') + big
    spmd.mark_sharding(sharded, spmd.get_1d_mesh('x'), ('x',))
    print(json.dumps({
        "user": [str(jnp.array(1.0).dtype), str(jnp.arange(3).dtype), str(jnp.zeros(2).dtype)],
        "x": x.cpu().tolist(), "x_dtype": str(x.dtype), "d": d.cpu().item(),
        "compiled": compiled.item(), "through_jax": through_jax.cpu().tolist(), "pure": pure.cpu().tolist(),
        "grad": xg.grad.cpu().tolist(), "sharded": sharded.sum().item(),
        "jax_view": str(interop.jax_view(x).dtype),
    }))
"""


@pytest.mark.parametrize("mode", ["scoped", "process"])
def test_users_own_jax_code_keeps_jax_defaults_while_the_device_keeps_64_bits(mode):
    # Issue: after the first 'jax' tensor, jnp.array(1.0) was float64 and
    # jnp.arange(3) int64 process-wide.  Now only pjrt_host's own calls run
    # with jax's 64-bit types (PJRT_HOST_JAX_X64=process restores the old way).
    env = {"PJRT_HOST_CPU_REF_DEVICES": "2"} | ({"PJRT_HOST_JAX_X64": mode} if mode == "process" else {})
    proc = run(_X64_PROGRAM, extra_env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    big = 2 ** 40
    assert out["user"] == (["float32", "int32", "float32"] if mode == "scoped" else ["float64", "int64", "float64"])
    assert out["x"] == [big, big + 1, big + 2] and out["x_dtype"] == "torch.int64"
    assert out["d"] == 1 / 3  # float64 kept to the last bit
    assert out["compiled"] == 2 * (3 * big + 3)
    assert out["through_jax"] == [2 * big, 2 * big + 1, 2 * big + 2]
    assert out["pure"] == [big - 1, big, big + 1]
    assert out["grad"] == [2.0 * v for v in (big, big + 1, big + 2)]
    assert out["sharded"] == 8 * big + 28
    assert out["jax_view"] == "int64"


def test_the_x64_scope_uses_jax_state_directly():
    # pjrt_host swaps jax's thread-local enable_x64 value itself (0.1 us per
    # op) instead of entering its context manager (0.4 us); a jax release
    # that renames swap_local/set_local or adds a thread-local hook would
    # silently fall back to the slow form: fail here instead.
    import jax

    from pjrt_host import _jax_settings

    assert _jax_settings.fast_x64_scope()
    seen = []
    scoped = _jax_settings.x64_scope(lambda: seen.append(jax.numpy.arange(2).dtype))
    with jax.enable_x64(False):
        scoped()
        assert jax.numpy.arange(2).dtype == "int32"  # restored after the call
    assert str(seen[0]) == "int64"
