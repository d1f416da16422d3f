"""XLA compile options against the compiler's defaults, on the selected
plugin's device: what they save in compile time and cost in run time.  The
options are the plugin's ``compile_options``, or ``--options`` (JSON).

Part 1, jax alone in this process (the plugin's device, no pjrt_host op):
programs of the kinds the host compiles -- one elementwise op, a softmax,
a transformer layer's fused forward (layer norm, two matmuls, gelu,
attention) -- each compiled at 8 new shapes with either set of options
(median compile time) and run 300 times (best of 5 rounds).

Part 2, pjrt_host in fresh processes with the program cache off: the GPT-2
training step of ``bench_cold_start.py`` (4 layers, width 128, AdamW, batch
4 x 64) in fused eager, with the options and with none (set as the
plugin's ``compile_options`` before its client exists): the first
step, a first step at a new length (48), the steady step, and the XLA
compile seconds of the whole run.

    python benchmarks/bench_compile_options.py [--steps 6]
        [--options '{"xla_backend_optimization_level": 2}']

Ratios: the options over the compiler's defaults (below 1: less).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from bench_cold_start import fresh_process

CHILD = r"""
import json, sys, time
options = json.loads(sys.argv[1])
steps = int(sys.argv[2])
from pjrt_host import _registry
# before the client exists: these options reach every program
type(_registry.selected_record().plugin).compile_options = options
import torch, transformers
from pjrt_host import _program_cache
transformers.set_seed(0)
config = transformers.GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=1000, n_positions=128)
model = transformers.GPT2LMHeadModel(config).to("jax")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(0)

def step(length):
    ids = torch.randint(0, 1000, (4, length), generator=g).to("jax")
    t = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    value = loss.item()
    return time.perf_counter() - t, value

first, _ = step(64)
times = [step(64)[0] for _ in range(steps)]
new_length, _ = step(48)
print(json.dumps({"first": first, "steady": min(times), "new_length": new_length,
                  "compile_seconds": torch.jax.program_cache_stats()["compile_seconds"],
                  "options": _program_cache.compile_options()}))
"""


def _programs():
    import jax
    import jax.numpy as jnp

    def layer(x, w1, w2, g, b):
        h = (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + b
        y = jax.nn.gelu(h @ w1) @ w2
        a = jax.nn.softmax(y @ y.T / 8.0, -1)
        return a @ y + x

    return [("one op (x * 1.0001 + 2)", lambda x, *_: x * 1.0001 + 2),
            ("softmax", lambda x, *_: jax.nn.softmax(x, -1)),
            ("a transformer layer, fused", layer)]


def jax_alone(options: dict) -> list[tuple[str, float, float, float, float]]:
    import jax
    import numpy as np

    import pjrt_host

    device = pjrt_host.devices()[0]
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((128, 512), np.float32) * 0.05, rng.standard_normal((512, 128), np.float32) * 0.05,
               np.ones(128, np.float32), np.zeros(128, np.float32)]
    weights = [jax.device_put(w, device) for w in weights]
    jax.jit(lambda x: x + 1).lower(np.ones(3, np.float32)).compile()  # the compiler's own first use
    rows = []
    for name, fn in _programs():
        def compile_time(opts: dict | None) -> float:
            times = []
            for n in range(40, 48):  # a new shape each time: no cache answers
                x = jax.device_put(rng.standard_normal((n, 128), np.float32), device)
                lowered = jax.jit(fn).lower(x, *weights)
                t = time.perf_counter()
                lowered.compile(compiler_options=opts)
                times.append(time.perf_counter() - t)
            return statistics.median(times)

        def run_time(opts: dict | None) -> float:
            x = jax.device_put(rng.standard_normal((256, 128), np.float32), device)
            program = jax.jit(fn).lower(x, *weights).compile(compiler_options=opts)
            for _ in range(30):
                program(x, *weights).block_until_ready()
            best = float("inf")
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(300):
                    program(x, *weights).block_until_ready()
                best = min(best, (time.perf_counter() - t) / 300)
            return best

        rows.append((name, compile_time(None), compile_time(options), run_time(None), run_time(options)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--options", type=json.loads, default=None,
                        help="XLA compile options as JSON (default: the plugin's compile_options)")
    args = parser.parse_args()
    os.environ["PJRT_HOST_PROGRAM_CACHE"] = "0"  # every compile here compiles: no disk cache answers

    import pjrt_host

    plugin = pjrt_host.selected().plugin
    options = args.options if args.options is not None else dict(plugin.compile_options)
    type(plugin).compile_options = {}  # part 1 passes the options to each compile itself
    pjrt_host.devices()
    print(f"plugin {pjrt_host.selected().name}: options {options} against the compiler's defaults")
    if not options:
        print("no options to compare: give --options")
        return
    print(f"{'program':32s} {'compile: defaults':>18s} {'options':>9s} {'ratio':>6s}   "
          f"{'run: defaults':>13s} {'options':>9s} {'ratio':>6s}")
    for name, c0, c1, r0, r1 in jax_alone(options):
        print(f"{name:32s} {c0 * 1e3:15.1f} ms {c1 * 1e3:6.1f} ms {c1 / c0:5.2f}x   "
              f"{r0 * 1e6:10.1f} us {r1 * 1e6:6.1f} us {r1 / r0:5.2f}x")
    env = {"PJRT_HOST_PROGRAM_CACHE": "0", "PJRT_HOST_EAGER": "fused"}
    base = fresh_process(CHILD, ["{}", str(args.steps)], env)
    ours = fresh_process(CHILD, [json.dumps(options), str(args.steps)], env)
    assert base["options"] is None and ours["options"] == options, (base["options"], ours["options"])
    print()
    print("GPT-2 training step, fused eager, program cache off (seconds):")
    print(f"{'':22s} {'first step':>11s} {'new length':>11s} {'steady':>9s} {'XLA compile':>12s}")
    for label, r in (("compiler defaults", base), ("the options", ours)):
        print(f"{label:22s} {r['first']:10.3f}s {r['new_length']:10.3f}s {r['steady']:8.4f}s "
              f"{r['compile_seconds']:11.2f}s")
    print("options / defaults:    " + " ".join(f"{ours[k] / base[k]:10.2f}x " for k in
                                              ("first", "new_length", "steady", "compile_seconds")))


if __name__ == "__main__":
    main()
