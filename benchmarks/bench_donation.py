"""Peak memory of a compiled AdamW step: buffer donation.

A compiled optimizer step overwrites the parameters and the optimizer state.
Without donation the old and the new arrays are alive together during the
call, so the step needs about twice their memory; with donation XLA writes
the new values into the old buffers.  Three runs, each in its own process,
over the same parameters (``--mb`` MB of float32):

* ``compiled``: ``torch.compile(opt.step, backend='jax')`` on 'jax';
* ``compiled, no donation``: the same with ``PJRT_HOST_DONATE=0``;
* ``jax.jit``: a hand-written AdamW step, ``jax.jit(..., donate_argnums=...)``.

Each prints the peak resident memory during two steps above the process's
memory before the parameters were made, as a multiple of parameters +
gradients + optimizer state (4x the parameters).  Goals: ``compiled`` <= 1.15x,
and within 5% of ``jax.jit``.  On cpu_ref device memory is host memory, so the
process's peak RSS (Linux VmHWM, reset before the measured steps) is the
device's peak.

    python benchmarks/bench_donation.py [--mb 256]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

LAYERS = 8


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS


def child(kind: str, mb: int) -> dict:
    import torch

    import jax
    import jax.numpy as jnp

    width = int((mb * 2**20 / 4 / LAYERS) ** 0.5)
    # The runtime up first (its threads and caches are not the step's memory).
    if kind == "jax":
        jax.block_until_ready(jax.jit(lambda x: x + 1)(jnp.ones(4)))
    else:
        import pjrt_host  # noqa: F401

        (torch.ones(4, device="jax") + 1).cpu()
    before = _rss_kb("VmRSS")
    if kind == "jax":

        keys = jax.random.split(jax.random.PRNGKey(0), LAYERS)
        params = [jax.random.normal(k, (width, width), jnp.float32) * 0.01 for k in keys]
        grads = [jnp.full((width, width), 1e-3, jnp.float32) for _ in range(LAYERS)]
        m = [jnp.zeros_like(p) for p in params]
        v = [jnp.zeros_like(p) for p in params]

        def adamw(params, m, v, grads, t):
            lr, b1, b2, eps, wd = 1e-3, 0.9, 0.999, 1e-8, 1e-2
            out_p, out_m, out_v = [], [], []
            for p, mi, vi, g in zip(params, m, v, grads):
                p = p * (1 - lr * wd)
                mi = b1 * mi + (1 - b1) * g
                vi = b2 * vi + (1 - b2) * g * g
                mhat = mi / (1 - b1 ** t)
                vhat = vi / (1 - b2 ** t)
                out_p.append(p - lr * mhat / (jnp.sqrt(vhat) + eps))
                out_m.append(mi)
                out_v.append(vi)
            return out_p, out_m, out_v

        step = jax.jit(adamw, donate_argnums=(0, 1, 2))
        params, m, v = step(params, m, v, grads, 1.0)  # compile
        jax.block_until_ready(params)
        _reset_peak()
        for t in (2.0, 3.0):
            params, m, v = step(params, m, v, grads, t)
        jax.block_until_ready(params)
        state = 4 * LAYERS * width * width * 4
    else:
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(width, width, device="jax") * 0.01) for _ in range(LAYERS)]
        for p in params:
            p.grad = torch.full_like(p, 1e-3)
        opt = torch.optim.AdamW(params, lr=1e-3)
        step = torch.compile(opt.step, backend="jax")
        step()  # compiles; makes the optimizer state
        torch.jax.synchronize()
        _reset_peak()
        for _ in range(2):
            step()
        torch.jax.synchronize()
        state = 4 * LAYERS * width * width * 4
    peak = _rss_kb("VmHWM")
    return {"peak_bytes": (peak - before) * 1024, "state_bytes": state}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=256, help="parameter megabytes (float32)")
    parser.add_argument("--child", choices=["compiled", "jax"])
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.mb)))
        return
    runs = {"compiled": ("compiled", {}), "compiled, no donation": ("compiled", {"PJRT_HOST_DONATE": "0"}),
            "jax.jit": ("jax", {})}
    results = {}
    for name, (kind, env) in runs.items():
        out = subprocess.run([sys.executable, __file__, "--child", kind, "--mb", str(args.mb)],
                             env={**os.environ, **env}, capture_output=True, text=True, check=True)
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    state = results["jax.jit"]["state_bytes"]
    print(f"AdamW step over {args.mb} MB of float32 parameters ({LAYERS} layers); "
          f"parameters + gradients + state = {state / 2**20:.0f} MB")
    for name, r in results.items():
        print(f"  {name:22s} peak {r['peak_bytes'] / 2**20:7.0f} MB = {r['peak_bytes'] / r['state_bytes']:.2f}x")
    ratio = results["compiled"]["peak_bytes"] / results["jax.jit"]["peak_bytes"]
    print(f"compiled / jax.jit peak: {ratio:.3f}")


if __name__ == "__main__":
    main()
