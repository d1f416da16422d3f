"""How long jax's lowering and XLA's compile hold Python's GIL (issue 45,
item 2: compiles off the critical path).  A program compiled on a thread
only helps if Python can go on recording or dispatching meanwhile.

A background thread traces and lowers (``jax.jit(f).lower(...)``), then
compiles (``.compile()``), programs of three sizes: one elementwise op, a
small fused segment (a layer norm and a GELU), and a transformer block
(layer norm, q/k/v projections, softmax attention, an MLP of width 4x).
Meanwhile the main thread spins in a pure-Python loop; its CPU share
during the phase, against its share beside a thread that only sleeps
(measured in the same run: what the OS gives it on a loaded machine), says
how much of the phase the other thread held the GIL: held = 1 - share /
idle share.  0.00: Python ran on throughout; 0.50: the two threads took
turns (both running Python); 1.00: the main thread never ran.

    python benchmarks/bench_compile_gil.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import threading
import time

import jax
import jax.numpy as jnp


def _programs() -> dict:
    def elementwise(x):
        return x * 1.0001 + 0.0001

    def segment(x, g, b):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        y = (x - m) / jnp.sqrt(v + 1e-5) * g + b
        return jax.nn.gelu(y)

    def block(x, wq, wk, wv, wo, w1, w2):
        m = x.mean(-1, keepdims=True)
        h = (x - m) / jnp.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)
        q, k, v = h @ wq, h @ wk, h @ wv
        p = jax.nn.softmax(q @ k.swapaxes(-1, -2) / 8.0, axis=-1)
        x = x + (p @ v) @ wo
        return x + jax.nn.gelu(x @ w1) @ w2

    d = 128
    x = jnp.ones((4, 64, d))
    w = jnp.ones((d, d))
    return {
        "one elementwise op": (elementwise, (jnp.ones(128),)),
        "a layer norm + GELU segment": (segment, (x, jnp.ones(d), jnp.ones(d))),
        "a transformer block": (block, (x, w, w, w, w, jnp.ones((d, 4 * d)), jnp.ones((4 * d, d)))),
    }


def _spin_while(busy: threading.Event) -> tuple[float, float]:
    """Run a Python loop while ``busy`` is set; (wall seconds, this
    thread's CPU seconds): its CPU share is what the GIL (and the cores the
    OS gave it) let it run."""
    wall, cpu = time.perf_counter(), time.thread_time()
    while busy.is_set():
        pass
    return time.perf_counter() - wall, time.thread_time() - cpu


def _phase(work) -> tuple[float, float, object]:
    """(seconds the phase took, the main thread's CPU share meanwhile, its
    result)."""
    busy = threading.Event()
    busy.set()
    box: dict = {}

    def run():
        t = time.perf_counter()
        box["result"] = work()
        box["seconds"] = time.perf_counter() - t
        busy.clear()

    thread = threading.Thread(target=run)
    thread.start()
    seconds, cpu = _spin_while(busy)
    thread.join()
    return box["seconds"], cpu / seconds, box["result"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    jax.jit(lambda a: a + 1)(jnp.ones(3)).block_until_ready()  # the backend up before anything is timed
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}; share of each phase the other thread held "
          f"the GIL, median of {args.repeats}")
    idle = sorted(_phase(lambda: time.sleep(0.3))[1] for _ in range(args.repeats))[args.repeats // 2]
    print(f"  the main thread's CPU share beside a sleeping thread: {idle:.2f}")
    for name, (fn, example) in _programs().items():
        rows = []
        for _ in range(args.repeats):
            # a fresh function each time: nothing comes from jax's caches
            fresh = (lambda f: (lambda *a: f(*a)))(fn)
            lower_s, lower_share, lowered = _phase(lambda: jax.jit(fresh).lower(*example))
            compile_s, compile_share, _ = _phase(lambda: lowered.compile())
            lower_held, compile_held = max(0.0, 1 - lower_share / idle), max(0.0, 1 - compile_share / idle)
            rows.append((lower_s, lower_held, compile_s, compile_held))
        mid = args.repeats // 2
        lower_s, lower_held, compile_s, compile_held = (sorted(r[i] for r in rows)[mid] for i in range(4))
        print(f"  {name:<28} trace+lower {lower_s * 1e3:6.1f} ms, GIL held {lower_held:.2f}; "
              f"compile {compile_s * 1e3:6.1f} ms, GIL held {compile_held:.2f}")


if __name__ == "__main__":
    main()
