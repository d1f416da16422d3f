"""The ``contract`` section: the plugin's declared properties, its library,
its client and devices, its mesh order."""

from __future__ import annotations

import os
from typing import Any

from ..._plugin import lowering_option_problems
from ._recorder import Recorder, first_line
from ._support import plugin_record

__all__ = ["contract"]


_CLIENT_OPTION_TYPES = (str, int, float, bool, list)


def contract(rec: Recorder, name: str, quick: bool, **_: Any) -> None:
    import torch

    record = plugin_record(name)
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
        for key, value in dict(plugin.compile_options).items():
            if not isinstance(key, str) or not isinstance(value, (str, int, float, bool)):
                problems.append(f"compile_options[{key!r}] is {value!r}, not an XLA option value "
                                "(str, int, float or bool)")
        if problems:
            raise AssertionError("; ".join(problems))
        info["detail"] = (f"priority {plugin.priority}, dense_gather_factor {plugin.dense_gather_factor}, "
                          f"conv_as_matmul_max_positions {plugin.conv_as_matmul_max_positions}, "
                          f"widen_16bit_matmul_operands {plugin.widen_16bit_matmul_operands}, "
                          f"compile_options {dict(plugin.compile_options)}, "
                          f"unsupported_dtypes {dict(plugin.unsupported_dtypes)}, zero_copy_torch_devices "
                          f"{list(plugin.zero_copy_torch_devices)}, physical_chip_count {chips}")

    with rec.check("library") as info:
        library = record.library
        if library is None:
            info["detail"] = f"built into jaxlib (backend {plugin.jaxlib_backend!r})"
        else:
            if not os.path.isfile(library):
                raise AssertionError(f"library_path() is {library!r}, which is not a file")
            from ..._doctor import read_capi_version

            version = read_capi_version(library)
            if "major" not in version:
                raise AssertionError(f"{library} is not a PJRT C API library: {version.get('error')}")
            if version["major"] != 0:
                raise AssertionError(f"{library} implements PJRT C API {version['major']}.{version['minor']}; "
                                     "jaxlib supports major version 0")
            from ..._runtime import _api_problem

            problem = _api_problem(library)
            if problem:
                raise AssertionError(f"{library} is not a usable PJRT library: {problem}")
            info["detail"] = f"{library}: PJRT C API {version['major']}.{version['minor']}"
            info["capi_version"] = [version["major"], version["minor"]]

    from ... import _runtime

    with rec.check("client") as info:
        try:
            rt = _runtime.runtime()
            devices = rt.devices
        except Exception as err:
            rec.result["unusable"] = f"no client: {first_line(err)}"
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
