"""Every dtype jax holds moves between torch CPU and the 'jax' device, both
ways, bit-exactly (NaN payloads, negative zero, subnormals), on a plugin
that hands its arrays to torch CPU through DLPack (cpu_ref) and on one that does not
(every other plugin: the data goes through host memory, where numpy has no
bfloat16 or float8).  Each plugin runs in its own child process, as a user
selects it (PJRT_DEVICE), the second installed as a real distribution."""

from __future__ import annotations

import json
import textwrap

import pytest

from conftest import run_python

pytest.importorskip("torch")

_NO_ZERO_COPY = """
    jaxlib_backend = "cpu"  # jaxlib's CPU client, but no zero_copy_torch_devices
"""

# Prints one JSON line: per dtype torch and jax share, "ok" or what went
# wrong; per dtype torch CPU can make and jax cannot hold, the refusal.
_WORKER = textwrap.dedent(r"""
    import json
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    from pjrt_host import interop
    from pjrt_host._torch import _conversion

    def tbytes(t):
        t = t.reshape(-1).clone(memory_format=torch.contiguous_format)  # any layout, as its elements in order
        return t.to(torch.uint8) if t.dtype == torch.bool else t.view(torch.uint8)

    def jbytes(a):
        return torch.from_numpy(np.asarray(a).reshape(-1).view(np.uint8).copy())

    def pattern(dtype):
        g = torch.Generator().manual_seed(0)
        if dtype == torch.bool:
            return torch.randint(0, 2, (1024,), generator=g).bool()
        k = dtype.itemsize
        raw = torch.randint(0, 256, (1024, k), dtype=torch.uint8, generator=g)
        # little-endian: the sign / exponent byte last
        special = [[0] * k, [0] * (k - 1) + [0x80], [0xFF] * k, [0xFF] * (k - 1) + [0x7F],
                   [1] + [0] * (k - 1), [0x55] * k]
        return torch.cat([raw, torch.tensor(special, dtype=torch.uint8)]).view(dtype).reshape(-1)

    def same(what, got, want):
        assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
        assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        a, b = tbytes(got), tbytes(want)
        if not torch.equal(a, b):
            raise AssertionError(f"{what}: {int((a != b).sum())} of {b.numel()} bytes differ")

    def moves(dtype):
        host = pattern(dtype)
        dev = host.to("jax")
        assert dev.device.type == "jax" and dev.dtype == dtype, (dev.device, dev.dtype)
        # the device holds the very bytes, not just something that comes back
        held = jbytes(interop.jax_view(dev))
        assert torch.equal(held, tbytes(host)), "the device array's bytes differ from the tensor's"
        same(".cpu()", dev.cpu(), host)
        # one copy each way: neither side aliases the other
        src = host.clone()
        moved = src.to("jax")
        part = src[7:100].to("jax")  # a view into a larger storage, at an offset
        src.view(torch.uint8).zero_() if dtype != torch.bool else src.zero_()
        same("after writing the source", moved.cpu(), host)
        same("after writing the source of a view", part.cpu(), host[7:100])
        back = dev.cpu()
        back.view(torch.uint8).zero_() if dtype != torch.bool else back.zero_()
        same("after writing the copy", dev.cpu(), host)
        same(".to('cpu') of a device copy", dev.clone().to("cpu"), host)
        for what, t in (("0-d", host[-5]), ("empty", host[:0].reshape(0, 4)),
                        ("transposed", host[:256].reshape(16, 16).t()), ("strided", host[::3]),
                        ("offset", host[7:100]),
                        # contiguous, but a size-1 dimension with another stride
                        ("size-1 dimension", host[:16].as_strided((8, 1), (1, 5))),
                        ("one element, stride 5", host[3:].as_strided((1,), (5,)))):
            same(f"{what} round trip", t.to("jax").cpu(), t)
        into = torch.empty(64, dtype=dtype, device="jax")
        into.copy_(host[:64])
        same("device.copy_(cpu)", into.cpu(), host[:64])
        out = torch.empty(64, dtype=dtype)
        out.copy_(dev[64:128])
        same("cpu.copy_(device)", out, host[64:128])
        same("torch.tensor(..., device='jax')", torch.tensor(host[:16].clone(), device="jax").cpu(), host[:16])
        # from jax: an array jax made (of its own dtype) read into torch
        with jax.enable_x64(True):
            made = jnp.asarray(host.view(torch.uint8).numpy().view(np.dtype(getattr(jnp, str(dtype)[6:]))))
            same("a jax array to torch", interop.torch_view(made).cpu(), host)

    results, refused, unmade = {}, {}, []
    # each dtype once, by its own name (torch.float is torch.float32)
    every = {str(d).split(".")[1]: d for d in vars(torch).values() if isinstance(d, torch.dtype)}
    for name, dtype in sorted(every.items()):
        try:
            torch.zeros(2, dtype=dtype).clone()
        except Exception:
            # a torch shell dtype (int4, bits8, ...): torch CPU cannot compute
            # with it, and pjrt_host holds none (its bytes have no meaning)
            try:
                dtype.is_signed  # torch refuses the question for quantized dtypes
                shell = torch.zeros(2, dtype=torch.uint8).view(dtype)
            except Exception:  # quantized: torch routes these tensors to a backend of its own
                unmade.append(name)
                continue
            try:
                shell.to("jax")
                refused[name] = None
            except Exception as err:
                refused[name] = f"{type(err).__name__}: {err}"
            continue
        if hasattr(jnp, name):
            try:
                moves(dtype)
                results[name] = "ok"
            except Exception as err:
                results[name] = f"{type(err).__name__}: {err}"
        else:
            try:
                torch.zeros(2, dtype=dtype).to("jax")
                refused[name] = None
            except Exception as err:
                refused[name] = f"{type(err).__name__}: {err}"
    # the issue's own example
    try:
        f8 = torch.tensor([1., 2.]).to(torch.float8_e4m3fn).to("jax")
        example = [str(f8.dtype), f8.float().cpu().tolist()]
    except Exception as err:
        example = f"{type(err).__name__}: {err}"
    print(json.dumps({"zero_copy": list(_conversion.zero_copy_devices()), "results": results,
                      "refused": refused, "unmade": unmade, "example": example}))
""")


def _run(site, device: str) -> dict:
    proc = run_python(["-c", _WORKER], site=site, env={"PJRT_DEVICE": device}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def moved(tmp_path_factory) -> dict[str, dict]:
    from conftest import Site

    site = Site(tmp_path_factory.mktemp("transfers") / "site")
    site.add_plugin("nozerocopy-plugin", "nozerocopy", _NO_ZERO_COPY)
    return {"cpu_ref": _run(site, "cpu_ref"), "nozerocopy": _run(site, "nozerocopy")}


_SHARED = {"bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16", "bfloat16",
           "float32", "float64", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
           "float8_e5m2fnuz", "float8_e8m0fnu"}


@pytest.mark.parametrize("plugin", ["cpu_ref", "nozerocopy"])
def test_every_dtype_jax_holds_moves_both_ways_bit_exactly(moved, plugin):
    got = moved[plugin]
    assert got["zero_copy"] == (["cpu"] if plugin == "cpu_ref" else [])
    # at least the dtypes these versions of torch and jax are known to share
    assert _SHARED <= set(got["results"]), sorted(_SHARED - set(got["results"]))
    failed = {k: v for k, v in got["results"].items() if v != "ok"}
    assert not failed, json.dumps(failed, indent=1)
    assert got["example"] == ["torch.float8_e4m3fn", [1.0, 2.0]]


@pytest.mark.parametrize("plugin", ["cpu_ref", "nozerocopy"])
def test_a_dtype_jax_cannot_hold_is_refused_naming_it_and_what_to_use(moved, plugin):
    refused = moved[plugin]["refused"]
    assert {"complex32", "float4_e2m1fn_x2", "int4", "uint4"} <= set(refused), sorted(refused)
    for name, error in refused.items():
        assert error is not None, f"torch.{name} moved to 'jax', which has no such dtype"
        assert error.startswith("TypeError: pjrt_host: torch dtype torch.") and name in error, error
        assert "; use " in error, error


# A program still running at exit, reading a tensor moved from torch CPU.
# The program and the interpreter's shutdown overlap; whichever ends first,
# the process exits cleanly.  When the device held the tensor through a DLPack
# import, the worker that finished the program took Python's lock from inside
# the interpreter's shutdown and the process aborted ("terminate called
# without an active exception"), in about half of these runs.
_EXIT_WHILE_RUNNING = textwrap.dedent(r"""
    import sys
    import torch
    n = int(sys.argv[1])
    w = torch.randn(n, n).to("jax")
    (w @ w).cpu()  # compiled: the last program starts at once
    moved = torch.randn(n, n).to("jax")
    last = w @ moved
    del moved
""")


def test_exiting_while_a_program_reads_a_moved_tensor_exits_cleanly():
    for n in (800, 1000, 1200):
        proc = run_python(["-c", _EXIT_WHILE_RUNNING, str(n)], env={"PJRT_DEVICE": "cpu_ref", "PJRT_HOST_EAGER": "op"})
        assert proc.returncode == 0, (n, proc.returncode, proc.stderr[-3000:])
