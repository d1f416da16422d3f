"""The ``performance`` section: figures against plain jax measured in the
same run (transfers, dispatch, matmul, compiled calls, a two-process
all-reduce)."""

from __future__ import annotations

import time
from typing import Any, Callable

from ._recorder import Recorder, Skip
from ._support import plugin_record
from ._two_processes import launch_workers

__all__ = ["performance"]


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

    from ... import _runtime

    note_peak = "no peak reported by the plugin or PJRT"
    device = _runtime.runtime().devices[0]
    sync = torch.jax.synchronize
    declared = dict(plugin_record(name).plugin.unsupported_dtypes)

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

    chips = plugin_record(name).plugin.physical_chip_count()
    with rec.check("all-reduce bus bandwidth, 2 processes") as info:
        mib = 4 if quick else 64
        result = launch_workers("bandwidth", timeout=300 if quick else 600, extra=[str(mib)])
        if "error" in result:
            if chips < 2:
                raise Skip(f"2 processes on a host with {chips} device(s) did not start: {result['error']}")
            raise AssertionError(result["error"])
        busbw = result["ranks"]["0"]["busbw_gbs"]
        rec.figure(f"all_reduce {mib} MiB, 2 processes (torch.distributed)", busbw, "GB/s",
                   note="bus bandwidth, as nccl-tests count it")
        info["detail"] = f"{busbw:.2f} GB/s"
