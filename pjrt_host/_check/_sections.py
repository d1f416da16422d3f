"""The sections of ``python -m pjrt_host check``, each run in its own child
process by ``_check/__init__.py``.

A section is a function of a :class:`Recorder`.  Each check runs inside
``rec.check(name)``: an exception fails that check with its first line and
the section goes on.  The recorder rewrites the result file after every
check, so if the process dies (a plugin that segfaults), the parent still
has every earlier check and the name of the one that was running.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator

from .._plugin import lowering_option_problems

__all__ = ["run_section"]


class Skip(Exception):
    """Raised inside a check: the check does not apply here (the reason)."""


class Expected(Exception):
    """Raised inside a check: a declared or host-wide limitation (the reason)."""


class Recorder:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.result: dict[str, Any] = {"checks": [], "figures": [], "running": None}
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.result, default=str))
        os.replace(tmp, self.path)

    @staticmethod
    def progress(message: str) -> None:
        print(f"progress: {message}", flush=True)

    def add(self, name: str, status: str, detail: str = "", **extra: Any) -> None:
        self.result["checks"].append({"name": name, "status": status, "detail": detail, **extra})
        self._write()

    @contextlib.contextmanager
    def check(self, name: str) -> Iterator[dict[str, Any]]:
        """Run a check; the body may put ``detail`` (and other keys) in the
        yielded dict, or raise Skip / Expected."""
        self.result["running"] = name
        self._write()
        info: dict[str, Any] = {}
        try:
            yield info
        except Skip as why:
            self.add(name, "skip", str(why))
        except Expected as why:
            self.add(name, "expected", str(why))
        except Exception as err:  # the check fails; the section goes on
            detail = _error_text(err)
            self.add(name, "fail", detail, **{k: v for k, v in info.items() if k != "detail"})
        else:
            self.add(name, info.pop("status", "pass"), info.pop("detail", ""), **info)
        finally:
            self.result["running"] = None
            self._write()

    def figure(self, name: str, value: float | None, unit: str, reference: float | None = None,
               reference_name: str | None = None, note: str | None = None, peak: float | None = None) -> None:
        fig = {"name": name, "value": value, "unit": unit}
        if reference is not None:
            fig.update(reference=reference, reference_name=reference_name,
                       ratio=(value / reference) if value is not None and reference else None)
        if peak is not None:
            fig["peak"] = peak
        if note:
            fig["note"] = note
        self.result["figures"].append(fig)
        self._write()

    def finish(self, **extra: Any) -> None:
        checks = self.result["checks"]
        self.result.update(extra)
        if "status" not in self.result:
            self.result["status"] = "fail" if any(c["status"] == "fail" for c in checks) else "pass"
        self.result["running"] = None
        self._write()


def _error_text(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    where = traceback.extract_tb(err.__traceback__)
    if where and isinstance(err, AssertionError) and not str(err):
        frame = where[-1]
        text += f" at {Path(frame.filename).name}:{frame.lineno}: {frame.line}"
    return text


def _first_line(text: str) -> str:
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def _record(name: str) -> Any:
    from .. import _registry

    for r in _registry.plugins():
        if r.name == name and r.ok:
            return r
    raise RuntimeError(f"plugin {name!r} is not installed or not usable")


# ---------------------------------------------------------------- contract

_CLIENT_OPTION_TYPES = (str, int, float, bool, list)


def contract(rec: Recorder, name: str, quick: bool, **_: Any) -> None:
    import torch

    record = _record(name)
    plugin = record.plugin

    with rec.check("properties") as info:
        problems = []
        for attr, kind in (("priority", int), ("jaxlib_backend", str)):
            value = getattr(plugin, attr)
            if not isinstance(value, kind) or isinstance(value, bool):
                problems.append(f"{attr} is {value!r}, expected {kind.__name__}")
        problems += lowering_option_problems(plugin)
        for src, dst in dict(plugin.unsupported_dtypes).items():
            for n in (src, dst):
                if not isinstance(getattr(torch, str(n), None), torch.dtype):
                    problems.append(f"unsupported_dtypes names {n!r}, which is not a torch dtype "
                                    "(use names like 'float64')")
        for dev in plugin.zero_copy_torch_devices:
            try:
                torch.device(dev)
            except Exception:
                problems.append(f"zero_copy_torch_devices names {dev!r}, which is not a torch device type")
        chips = plugin.physical_chip_count()
        if not isinstance(chips, int) or isinstance(chips, bool) or chips < 0:
            problems.append(f"physical_chip_count() is {chips!r}, expected an int >= 0")
        host = plugin.host_index()
        if host is not None and (not isinstance(host, int) or host < 0):
            problems.append(f"host_index() is {host!r}, expected None or an int >= 0")
        for key, value in dict(plugin.client_create_options()).items():
            if not isinstance(key, str) or not isinstance(value, _CLIENT_OPTION_TYPES):
                problems.append(f"client_create_options()[{key!r}] is {value!r}, not a PJRT named value "
                                "(str, int, float, bool or list of int)")
        if problems:
            raise AssertionError("; ".join(problems))
        info["detail"] = (f"priority {plugin.priority}, dense_gather_factor {plugin.dense_gather_factor}, "
                          f"conv_as_matmul_max_positions {plugin.conv_as_matmul_max_positions}, "
                          f"unsupported_dtypes {dict(plugin.unsupported_dtypes)}, zero_copy_torch_devices "
                          f"{list(plugin.zero_copy_torch_devices)}, physical_chip_count {chips}")

    with rec.check("library") as info:
        library = record.library
        if library is None:
            info["detail"] = f"built into jaxlib (backend {plugin.jaxlib_backend!r})"
        else:
            if not os.path.isfile(library):
                raise AssertionError(f"library_path() is {library!r}, which is not a file")
            from .._doctor import read_capi_version

            version = read_capi_version(library)
            if "major" not in version:
                raise AssertionError(f"{library} is not a PJRT C API library: {version.get('error')}")
            if version["major"] != 0:
                raise AssertionError(f"{library} implements PJRT C API {version['major']}.{version['minor']}; "
                                     "jaxlib supports major version 0")
            from .._runtime import _api_problem

            problem = _api_problem(library)
            if problem:
                raise AssertionError(f"{library} is not a usable PJRT library: {problem}")
            info["detail"] = f"{library}: PJRT C API {version['major']}.{version['minor']}"
            info["capi_version"] = [version["major"], version["minor"]]

    from .. import _runtime

    with rec.check("client") as info:
        try:
            rt = _runtime.runtime()
            devices = rt.devices
        except Exception as err:
            rec.result["unusable"] = f"no client: {_first_line(err)}"
            raise
        if not devices:
            rec.result["unusable"] = "the client has no devices"
            raise AssertionError("the client came up with no devices")
        info["detail"] = f"{len(devices)} device(s), platform {devices[0].platform}, backend {rt.backend}"
    if rec.result.get("unusable"):
        for name_ in ("devices", "mesh order"):
            rec.add(name_, "skip", "no client")
        return

    with rec.check("devices") as info:
        rows = []
        count = torch.jax.device_count()
        assert count == len(devices), f"torch.jax.device_count() is {count}, the client has {len(devices)}"
        for i, d in enumerate(devices):
            stats = None
            try:
                stats = d.memory_stats()
            except Exception:
                pass
            limit = (stats or {}).get("bytes_limit")
            t = torch.arange(4.0, device=f"jax:{i}") * 2
            assert t.cpu().tolist() == [0.0, 2.0, 4.0, 6.0], f"jax:{i} computed {t.cpu().tolist()}"
            rows.append({"index": i, "id": d.id, "kind": d.device_kind, "platform": d.platform,
                         "process": d.process_index, "memory_bytes": limit})
        info["devices"] = rows
        memory = ", ".join(f"{r['memory_bytes'] / 2**30:.1f} GiB" if r["memory_bytes"] else "host memory"
                           for r in rows[:4])
        info["detail"] = f"{len(rows)} x {rows[0]['kind']} ({memory}{', ...' if len(rows) > 4 else ''})"

    with rec.check("mesh order") as info:
        order = plugin.mesh_device_order((len(devices),), list(devices))
        if order is not None:
            assert sorted(order) == list(range(len(devices))), \
                f"mesh_device_order((n,), devices) returned {order}, not a permutation of range({len(devices)})"
        info["detail"] = "default order" if order is None else f"plugin order {order}"


# ---------------------------------------------------------------- dtypes

_DTYPE_NAMES = ("float32", "float64", "float16", "bfloat16", "complex64", "complex128", "complex32",
                "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool",
                "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")


def _pattern(torch: Any, dtype: Any) -> Any:
    """Every byte pattern we can: random bytes (NaN payloads, subnormals,
    both zeros included) plus each float dtype's named special values."""
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.randint(0, 2, (257,), generator=g).bool()
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (257 * size,), dtype=torch.uint8, generator=g)
    t = raw.view(dtype)
    if dtype.is_floating_point and size >= 2:
        info = torch.finfo(dtype)
        specials = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), info.tiny, info.max, info.min,
                    info.eps, 1.0, -1.0]
        special = torch.tensor(specials, dtype=torch.float64).to(dtype)
        t = torch.cat([t, special])
    return t


def _bits(torch: Any, t: Any) -> Any:
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.contiguous().view(torch.uint8)


def _usable_torch_devices(torch: Any, device_types: Any) -> list[str]:
    """Those of ``device_types`` torch has a usable device of here."""
    return [d for d in device_types
            if d == "cpu" or getattr(getattr(torch, d, None), "is_available", lambda: False)()]


def dtypes(rec: Recorder, name: str, quick: bool, **_: Any) -> None:
    import torch

    from .._lowerings._dtypes import jax_dtype

    plugin = _record(name).plugin
    declared = dict(plugin.unsupported_dtypes)
    zero_copy = tuple(plugin.zero_copy_torch_devices)
    # CPU tensors go through DLPack where the plugin declares it, else through
    # host memory (where numpy has no bfloat16 or float8): the report says
    # which one these checks ran.  Tensors of the other declared devices move
    # through DLPack as well, checked where torch has such a device.
    cpu_path = "through DLPack" if "cpu" in zero_copy else "through host memory"
    others = _usable_torch_devices(torch, [d for d in zero_copy if d != "cpu"])
    for dtype_name in _DTYPE_NAMES:
        dtype = getattr(torch, dtype_name, None)
        if not isinstance(dtype, torch.dtype):
            continue
        try:
            host = _pattern(torch, dtype)
        except Exception:
            continue  # torch CPU cannot make it either
        with rec.check(dtype_name) as info:
            try:
                jax_dtype(dtype)
            except Exception as err:
                # Not the plugin's limitation: jax has no such dtype.  The
                # host must refuse it with an error that says what to use.
                with_error = None
                try:
                    host.to("jax")
                except TypeError as refusal:
                    with_error = _first_line(refusal)
                if with_error is None:
                    raise AssertionError(f"jax has no {dtype_name} ({_first_line(err)}) but .to('jax') did not "
                                         "raise a TypeError") from None
                raise Expected(f"jax has no {dtype_name}: refused on every plugin with {with_error!r}") from None
            target = getattr(torch, declared[dtype_name]) if dtype_name in declared else dtype
            dev = host.to("jax")
            assert dev.dtype == target, f"on the device it is {dev.dtype}, expected {target}"
            back = dev.cpu()
            copied = dev.clone().cpu()
            want = host.to(target)
            for what, got in (("round trip", back), ("device copy", copied)):
                assert got.dtype == target, f"{what} gives {got.dtype}, expected {target}"
                if not torch.equal(_bits(torch, got), _bits(torch, want)):
                    differ = int((_bits(torch, got) != _bits(torch, want)).sum())
                    raise AssertionError(f"{what} ({cpu_path}) is not bit-exact: {differ} of "
                                         f"{want.numel() * want.element_size()} bytes differ")
            for device_type in others:
                got = host.to(device_type).to("jax").to(device_type).cpu()
                if not torch.equal(_bits(torch, got), _bits(torch, want)):
                    raise AssertionError(f"torch {device_type} -> 'jax' -> {device_type} (DLPack, "
                                         "zero_copy_torch_devices) is not bit-exact")
            if target != dtype:
                info["status"] = "expected"
                info["detail"] = f"declared unsupported: held as {declared[dtype_name]}, values round-trip as such"
            else:
                info["detail"] = (f"{host.numel()} values bit-exact, both ways ({cpu_path}"
                                  f"{''.join(f'; from {d} through DLPack' for d in others)}) and through a device "
                                  "copy")


# ---------------------------------------------------------------- ops


def ops(rec: Recorder, name: str, quick: bool, ops_filter: str | None = None, **_: Any) -> None:
    import collections

    import torch

    try:
        from . import _opinfo
    except ImportError as err:
        rec.finish(status="skip", reason=f"torch's OpInfo database cannot be imported ({_first_line(err)}); "
                                         "pip install 'pjrt-host[check]' (it needs expecttest)")
        return
    declared = dict(_record(name).plugin.unsupported_dtypes)
    dtypes = [getattr(torch, n) for n in ("float32", "int64", "bool", "bfloat16") if n not in declared]
    cases = _opinfo.cases(tuple(dtypes))
    if ops_filter:
        pattern = re.compile(ops_filter)
        cases = [(op, dt) for op, dt in cases if pattern.search(_opinfo.case_id(op, dt))]
    limit = 1 if quick else 3
    by_family: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    failures: dict[str, list[str]] = collections.defaultdict(list)
    started = time.time()
    rec.progress(f"{len(cases)} cases ({', '.join(str(d).removeprefix('torch.') for d in dtypes)}), "
                 f"{limit} distinct sample(s) each")
    for i, (op, dtype) in enumerate(cases, 1):
        case = _opinfo.case_id(op, dtype)
        rec.result["running"] = case
        if i % 25 == 1:
            rec._write()
        outcome = _opinfo.run(op, dtype, limit=limit)
        fam = _opinfo.family(op)
        status = {"xfailed": "expected", "stale": "passed"}.get(outcome.status, outcome.status)
        by_family[fam][status] += 1
        if status == "failed":
            failures[fam].append(f"{case}: {_first_line(outcome.detail)[:300]}")
        if i % 100 == 0 or i == len(cases):
            failed = sum(c["failed"] for c in by_family.values())
            rec.progress(f"{i}/{len(cases)} cases, {failed} failed ({time.time() - started:.0f} s)")
    rec.result["running"] = None
    totals: collections.Counter = collections.Counter()
    for fam in sorted(by_family):
        counts = by_family[fam]
        totals.update(counts)
        text = ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "expected", "skipped") if counts[k])
        if failures[fam]:
            text += "; " + "; ".join(failures[fam][:5]) + ("; ..." if len(failures[fam]) > 5 else "")
        rec.add(fam, "fail" if counts["failed"] else "pass", text, counts=dict(counts), failures=failures[fam])
    ran = totals["passed"] + totals["failed"]
    rec.figure("ops passed", 100.0 * totals["passed"] / ran if ran else None, "%",
               note=f"{totals['passed']} of {ran} cases run; {totals['expected']} reviewed expected failures, "
                    f"{totals['skipped']} skipped")


# ---------------------------------------------------------------- compile and interop


def _close(torch: Any, got: Any, want: Any, what: str, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    try:
        torch.testing.assert_close(got.detach().cpu(), want.detach().cpu(), rtol=rtol, atol=atol)
    except AssertionError as err:
        raise AssertionError(f"{what} differs from torch CPU: {' '.join(str(err).split())[:300]}") from None


def _train_step_matches(torch: Any, make: Callable[[], Any], inputs: Any, compile_fn: Callable[[Any], Any],
                        what: str, buffers: bool = False) -> None:
    """One forward + backward of ``make()`` on CPU and, compiled, on the
    device: output, every gradient (and buffers) as torch CPU's."""
    torch.manual_seed(0)
    cpu_model = make()
    dev_model = make()
    dev_model.load_state_dict(cpu_model.state_dict())
    dev_model = dev_model.to("jax")
    run = compile_fn(dev_model)
    want = cpu_model(inputs)
    got = run(inputs.to("jax"))
    _close(torch, got, want, f"{what} output")
    want.square().mean().backward()
    got.square().mean().backward()
    for (n, p), q in zip(cpu_model.named_parameters(), dev_model.parameters()):
        assert q.grad is not None, f"{what}: no gradient for {n}"
        _close(torch, q.grad, p.grad, f"{what} gradient of {n}", rtol=1e-3, atol=1e-4)
    if buffers:
        for (n, b), c in zip(cpu_model.named_buffers(), dev_model.buffers()):
            _close(torch, c, b, f"{what} buffer {n}")


def _mlp(torch: Any) -> Any:
    nn = torch.nn
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 8))


def _cnn(torch: Any) -> Any:
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 4))


def _block(torch: Any) -> Any:
    return torch.nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)


def compile_interop(rec: Recorder, name: str, quick: bool, **_: Any) -> None:
    import torch

    import pjrt_host
    from pjrt_host import interop

    def compiled(m: Any) -> Any:
        return torch.compile(m, backend="jax", fullgraph=True)

    g = torch.Generator().manual_seed(1)
    x_mlp = torch.randn(8, 16, generator=g)
    x_cnn = torch.randn(4, 3, 12, 12, generator=g)
    x_seq = torch.randn(2, 6, 32, generator=g)
    for label, make, x, bufs in (("torch.compile MLP", _mlp, x_mlp, False),
                                 ("torch.compile CNN with BatchNorm", _cnn, x_cnn, True),
                                 ("torch.compile transformer block", _block, x_seq, False)):
        with rec.check(label) as info:
            _train_step_matches(torch, lambda m=make: m(torch), x, compiled, label, buffers=bufs)
            info["detail"] = "forward, backward" + (" and BatchNorm statistics" if bufs else "") + " as torch CPU"
        torch._dynamo.reset()

    with rec.check("assume_pure") as info:
        _train_step_matches(torch, lambda: _block(torch), x_seq, pjrt_host.assume_pure, "assume_pure block")
        info["detail"] = "a transformer block: forward and backward as torch CPU"

    with rec.check("call_jax") as info:
        import jax.numpy as jnp

        x = torch.randn(64, generator=g)
        xd = x.to("jax").requires_grad_()
        y = interop.call_jax(lambda a: jnp.sin(a) * a, xd)
        _close(torch, y, torch.sin(x) * x, "call_jax(sin(a) * a)")
        y.sum().backward()
        _close(torch, xd.grad, torch.cos(x) * x + torch.sin(x), "gradient through call_jax")
        info["detail"] = "a jax function on 'jax' tensors, forward and backward"

    plugin = _record(name).plugin
    declared = tuple(plugin.zero_copy_torch_devices)
    if not declared:
        rec.add("DLPack zero-copy", "skip", "the plugin declares no zero_copy_torch_devices")
    for device_type in declared:
        with rec.check(f"DLPack zero-copy with torch {device_type!r}") as info:
            _dlpack_zero_copy(torch, device_type, info)


def _dlpack_zero_copy(torch: Any, device_type: str, info: dict) -> None:
    import jax
    import jax.dlpack

    from .. import _runtime

    module = getattr(torch, device_type, None)
    if device_type != "cpu" and not (module is not None and getattr(module, "is_available", lambda: False)()):
        raise Skip(f"torch has no usable {device_type!r} device in this process")
    ours = set(_runtime.runtime().devices)
    t = torch.arange(1024, dtype=torch.float32, device=device_type) * 0.5
    arr = jax.dlpack.from_dlpack(t)
    assert set(arr.devices()) <= ours, f"from_dlpack placed the array on {arr.devices()}, not the plugin's devices"
    assert arr.unsafe_buffer_pointer() == t.data_ptr(), "jax.dlpack.from_dlpack copied the tensor (pointers differ)"
    back = torch.from_dlpack(arr)
    assert back.data_ptr() == t.data_ptr(), "torch.from_dlpack copied the array (pointers differ)"
    moved = t.to("jax")
    assert torch.equal(moved.to(device_type), t), "values differ after .to('jax') and back"
    info["detail"] = f"torch {device_type} tensor <-> jax array share memory both ways"


# ---------------------------------------------------------------- memory


def memory(rec: Recorder, name: str, quick: bool, **_: Any) -> None:
    import torch

    mod = torch.jax
    with rec.check("statistics") as info:
        stats = mod.memory_stats()
        for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current"):
            assert key in stats, f"torch.jax.memory_stats() lacks {key!r}"
        free, total = mod.mem_get_info()
        assert 0 < free <= total, f"torch.jax.mem_get_info() is ({free}, {total})"
        info["detail"] = f"source: {stats.get('source')}; free {free / 2**30:.1f} of {total / 2**30:.1f} GiB"

    with rec.check("statistics move with allocations") as info:
        gc.collect()
        mod.synchronize()
        before = mod.memory_allocated()
        n = 64 * 2**20
        x = torch.ones(n // 4, device="jax")
        mod.synchronize()
        during = mod.memory_allocated()
        assert during - before >= n, f"allocating 64 MiB moved memory_allocated() by {during - before} bytes"
        assert mod.max_memory_allocated() >= during, "max_memory_allocated() is below memory_allocated()"
        del x
        gc.collect()
        mod.synchronize()
        after = mod.memory_allocated()
        assert after - before < n, f"memory_allocated() stayed {after - before} bytes up after del"
        info["detail"] = f"+{(during - before) / 2**20:.0f} MiB, then back to +{(after - before) / 2**20:.0f} MiB"

    with rec.check("one oversized request raises torch.OutOfMemoryError") as info:
        free, total = mod.mem_get_info()
        device_memory = mod.memory_stats().get("source") == "device"
        # On device memory: a little more than is free (the device's own
        # out-of-memory path).  On host memory: more than the whole machine,
        # refused before any page is touched -- never fill a host's RAM.
        request = free + max(total // 20, 256 * 2**20) if device_memory else total + 2**30
        try:
            big = torch.ones(request // 4, dtype=torch.float32, device="jax")
            mod.synchronize()
            del big
        except torch.OutOfMemoryError as err:
            message = str(err)
            assert name in message, f"the error does not name the plugin: {_first_line(message)}"
            info["detail"] = f"{request / 2**30:.1f} GiB: {_first_line(message)[:160]}"
        else:
            raise AssertionError(f"allocating {request / 2**30:.1f} GiB (free {free / 2**30:.1f} GiB) succeeded")

    with rec.check("usable after out of memory") as info:
        gc.collect()
        y = torch.arange(1000.0, device="jax")
        assert float((y * 2).sum()) == 999000.0, "wrong result after an out-of-memory error"
        info["detail"] = "computes correctly"


# ---------------------------------------------------------------- collectives


def collectives(rec: Recorder, name: str, quick: bool, **_: Any) -> None:
    import torch

    from pjrt_host import spmd

    n = torch.jax.device_count()
    with rec.check(f"all-reduce / all-gather / reduce-scatter over {n} local device(s) (pjrt_host.spmd)") as info:
        mesh = spmd.get_1d_mesh("x")
        base = torch.arange(n * 8.0).reshape(n * 2, 4)
        t = base.to("jax")
        spmd.mark_sharding(t, mesh, ("x", None))
        _close(torch, t.sum(), base.sum(), "all-reduce (sum of a sharded tensor)")
        gathered = t * 1.0
        spmd.mark_sharding(gathered, mesh, (None, None))
        _close(torch, gathered, base, "all-gather (replicating a sharded tensor)")
        rows = torch.arange(n * 4.0 * n).reshape(n, 4 * n)
        r = rows.to("jax")
        spmd.mark_sharding(r, mesh, ("x", None))
        scattered = spmd.with_sharding_constraint(r.sum(0), mesh, ("x",))
        _close(torch, scattered, rows.sum(0), "reduce-scatter (sum over the sharded dim, result sharded)")
        info["detail"] = f"{n} device(s): values as torch CPU"

    chips = _record(name).plugin.physical_chip_count()
    with rec.check("2 processes: torch.distributed and pjrt_host.spmd collectives") as info:
        result = _launch_workers("collectives", timeout=300 if quick else 600)
        if "error" in result:
            if chips < 2:
                raise Skip(f"2 processes on a host with {chips} device(s) did not start: {result['error']}")
            raise AssertionError(result["error"])
        ranks = result["ranks"]
        info["detail"] = (f"world of 2, backend {ranks['0'].get('backend')!r}: all_reduce, all_gather_into_tensor, "
                          "reduce_scatter_tensor, broadcast; spmd sum over both processes' devices")


def _launch_workers(mode: str, timeout: float, extra: list[str] | None = None) -> dict[str, Any]:
    """Run ``_mp_worker MODE`` in 2 processes under ``python -m pjrt_host
    launch``; {"ranks": {rank: its JSON}} or {"error": why}."""
    import signal

    with tempfile.TemporaryDirectory(prefix="pjrt_host_check_mp_") as tmp:
        argv = [sys.executable, "-m", "pjrt_host", "launch", "--nproc-per-node", "2", "-m",
                "pjrt_host._check._mp_worker", mode, tmp, *(extra or [])]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            return {"error": f"the 2 processes did not finish within {timeout:.0f} s (a hang in a collective?); "
                             f"last output: {_tail(output)}"}
        ranks = {}
        for r in (0, 1):
            path = Path(tmp) / f"rank{r}.json"
            if path.exists():
                ranks[str(r)] = json.loads(path.read_text())
        errors = [f"rank {r}: {out['error']}" for r, out in sorted(ranks.items()) if out.get("error")]
        if errors:
            return {"error": "; ".join(errors)}
        if proc.returncode != 0 or len(ranks) != 2:
            return {"error": f"exit status {proc.returncode}; {len(ranks)} of 2 ranks reported; "
                             f"last output: {_tail(output)}"}
        return {"ranks": ranks}


_NOISE = re.compile(r"^([WEI]\d{4} |\*+$|pjrt_host launch:|File |Traceback|\^+$)|grpc_|elastic/multiprocessing")


def _tail(output: str) -> str:
    """The lines of the ranks' output that say what went wrong: the first
    error lines, without the launcher's own reports."""
    lines = [line.strip() for line in (output or "").splitlines() if line.strip()]
    lines = [line for line in lines if not _NOISE.search(line)]
    interesting = [line for line in lines if re.search(r"Error|ERROR|error|Exception|Fatal|Check failed", line)]
    return " | ".join(interesting[:2] if interesting else lines[-3:])[:600]


# ---------------------------------------------------------------- performance


def _timed(fn: Callable[[], Any], repeat: int) -> float:
    """Best of ``repeat`` seconds for fn()."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def performance(rec: Recorder, name: str, quick: bool, **_: Any) -> None:
    import jax
    import jax.numpy as jnp
    import torch

    from .. import _runtime

    note_peak = "no peak reported by the plugin or PJRT"
    device = _runtime.runtime().devices[0]
    sync = torch.jax.synchronize
    declared = dict(_record(name).plugin.unsupported_dtypes)

    with rec.check("host <-> device bandwidth") as info:
        nbytes = (64 if quick else 256) * 2**20
        host = torch.ones(nbytes // 4)
        holder: list = []

        def h2d() -> None:
            holder[:] = [host.to("jax")]
            sync()
        up = nbytes / _timed(h2d, 5) / 1e9
        dev = holder[0]
        down = nbytes / _timed(lambda: dev.cpu(), 5) / 1e9
        rec.figure("host -> device", up, "GB/s", note=f"{nbytes >> 20} MiB float32; {note_peak}")
        rec.figure("device -> host", down, "GB/s", note=f"{nbytes >> 20} MiB float32")
        info["detail"] = f"{up:.2f} / {down:.2f} GB/s"
        holder.clear()  # free the device copy before the next probe

    with rec.check("per-op dispatch latency") as info:
        a, b = torch.ones(16, device="jax"), torch.ones(16, device="jax")
        steps = 300 if quick else 2000

        def eager() -> None:
            c = a
            for _ in range(steps):
                c = c + b
            sync()
        xa, xb = jax.device_put(jnp.ones(16), device), jax.device_put(jnp.ones(16), device)

        def plain() -> None:
            c = xa
            for _ in range(steps):
                c = c + xb
            c.block_until_ready()
        eager(), plain()
        ours = _timed(eager, 5) / steps * 1e6
        ref = _timed(plain, 5) / steps * 1e6
        rec.figure("eager op (a + b, 16 floats)", ours, "us", reference=ref, reference_name="plain jax")
        info["detail"] = f"{ours:.1f} us vs {ref:.1f} us in plain jax"

    for dtype_name in ("float32", "bfloat16"):
        with rec.check(f"matmul throughput {dtype_name}") as info:
            if dtype_name in declared:
                raise Skip(f"{dtype_name} is declared unsupported")
            n = 1024 if quick else 4096
            dtype = getattr(torch, dtype_name)
            a = torch.randn(n, n).to(dtype).to("jax")
            b = torch.randn(n, n).to(dtype).to("jax")

            def mm() -> None:
                (a @ b)
                sync()
            mm()
            ja, jb = jax.device_put(jnp.ones((n, n), dtype_name), device), jax.device_put(jnp.ones((n, n), dtype_name),
                                                                                       device)
            jmm = jax.jit(jnp.matmul)
            jmm(ja, jb).block_until_ready()
            flops = 2 * n ** 3
            ours = flops / _timed(mm, 5) / 1e12
            ref = flops / _timed(lambda: jmm(ja, jb).block_until_ready(), 5) / 1e12
            rec.figure(f"matmul {dtype_name} {n}x{n}", ours, "TFLOP/s", reference=ref, reference_name="jax.jit",
                       note=note_peak)
            info["detail"] = f"{ours:.3f} TFLOP/s vs {ref:.3f} in jax.jit"

    with rec.check("compiled-call overhead") as info:
        torch.manual_seed(0)
        nn = torch.nn
        layers = [nn.Linear(64, 64) for _ in range(4)]
        model = nn.Sequential(*[m for layer in layers for m in (layer, nn.ReLU())]).to("jax")
        fn = torch.compile(model, backend="jax")
        x = torch.randn(1, 64, device="jax")
        params = [(jax.device_put(jnp.asarray(layer.weight.detach().numpy()), device),
                   jax.device_put(jnp.asarray(layer.bias.detach().numpy()), device)) for layer in layers]

        @jax.jit
        def jmlp(ps: Any, h: Any) -> Any:
            for w, bias in ps:
                h = jax.nn.relu(h @ w.T + bias)
            return h
        jx = jax.device_put(jnp.ones((1, 64)), device)
        calls = 200 if quick else 2000
        with torch.no_grad():
            for _ in range(5):
                fn(x)
            sync()

            def ours_loop() -> None:
                for _ in range(calls):
                    fn(x)
                sync()
            for _ in range(5):
                jmlp(params, jx)

            def ref_loop() -> None:
                for _ in range(calls):
                    jmlp(params, jx)
                jmlp(params, jx).block_until_ready()
            ours = _timed(ours_loop, 3) / calls * 1e6
            ref = _timed(ref_loop, 3) / calls * 1e6
        rec.figure("torch.compile call (4 x Linear(64), batch 1)", ours, "us", reference=ref,
                   reference_name="jax.jit")
        info["detail"] = f"{ours:.1f} us vs {ref:.1f} us for jax.jit"

    chips = _record(name).plugin.physical_chip_count()
    with rec.check("all-reduce bus bandwidth, 2 processes") as info:
        mib = 4 if quick else 64
        result = _launch_workers("bandwidth", timeout=300 if quick else 600, extra=[str(mib)])
        if "error" in result:
            if chips < 2:
                raise Skip(f"2 processes on a host with {chips} device(s) did not start: {result['error']}")
            raise AssertionError(result["error"])
        busbw = result["ranks"]["0"]["busbw_gbs"]
        rec.figure(f"all_reduce {mib} MiB, 2 processes (torch.distributed)", busbw, "GB/s",
                   note="bus bandwidth, as nccl-tests count it")
        info["detail"] = f"{busbw:.2f} GB/s"


# ---------------------------------------------------------------- entry point

_SECTIONS: dict[str, Callable[..., None]] = {
    "contract": contract, "dtypes": dtypes, "ops": ops, "compile": compile_interop, "memory": memory,
    "collectives": collectives, "performance": performance,
}


def run_section(section: str, name: str, result_file: Path, quick: bool, ops_filter: str | None) -> int:
    import warnings

    warnings.simplefilter("ignore")  # the report says what matters; warnings would bury the progress lines
    rec = Recorder(result_file)
    try:
        _SECTIONS[section](rec, name, quick, ops_filter=ops_filter)
    except Exception as err:  # outside any check: the section itself could not run
        rec.add("section", "fail", _error_text(err))
    rec.finish()
    return 0
