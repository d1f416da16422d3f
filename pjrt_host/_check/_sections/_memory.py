"""The ``memory`` section: memory statistics, out-of-memory as
torch.OutOfMemoryError, and a device that still works after it."""

from __future__ import annotations

import gc
from typing import Any

from ._recorder import Recorder, first_line

__all__ = ["memory"]


def memory(rec: Recorder, name: str, quick: bool, **_: Any) -> None:
    import torch

    mod = torch.jax
    with rec.check("statistics") as info:
        stats = mod.memory_stats()
        for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current"):
            assert key in stats, f"torch.jax.memory_stats() lacks {key!r}"
        free, total = mod.mem_get_info()
        assert 0 < free <= total, f"torch.jax.mem_get_info() is ({free}, {total})"
        info["detail"] = f"source: {mod.memory_stats_source()}; free {free / 2**30:.1f} of {total / 2**30:.1f} GiB"

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
            assert name in message, f"the error does not name the plugin: {first_line(message)}"
            info["detail"] = f"{request / 2**30:.1f} GiB: {first_line(message)[:160]}"
        else:
            raise AssertionError(f"allocating {request / 2**30:.1f} GiB (free {free / 2**30:.1f} GiB) succeeded")

    with rec.check("usable after out of memory") as info:
        gc.collect()
        y = torch.arange(1000.0, device="jax")
        assert float((y * 2).sum()) == 999000.0, "wrong result after an out-of-memory error"
        info["detail"] = "computes correctly"
