"""The ``dtypes`` section: every dtype's values to the device and back,
bit-exactly, through the path the plugin declares."""

from __future__ import annotations

from typing import Any

from ._recorder import Expected, Recorder, first_line
from ._support import plugin_record

__all__ = ["dtypes"]


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

    from ..._lowerings._dtypes import jax_dtype

    plugin = plugin_record(name).plugin
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
                    with_error = first_line(refusal)
                if with_error is None:
                    raise AssertionError(f"jax has no {dtype_name} ({first_line(err)}) but .to('jax') did not "
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
