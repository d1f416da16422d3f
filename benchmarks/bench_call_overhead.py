"""What one call costs: a 4-layer, 64-wide MLP at batch 1 under no_grad,
every form measured in the same run (interleaved rounds, best of each):

- torch CPU eager, and torch.compile(backend='eager') on CPU: their
  difference is what issue 19 called dynamo's own per-call cost;
- torch.compile with a backend whose compiled function returns its
  precomputed result at once, on the same 'jax' tensors: dynamo's own cost
  measured directly (frame, guards, stream bookkeeping), and the same under
  AOTAutograd (its runtime wrappers added) -- the floor any backend pays;
- the same network as one ``jax.jit`` call on the device;
- torch.compile(backend='jax') on 'jax' tensors;
- pjrt_host.assume_pure(model) on 'jax' tensors.

Goals (issue 19): compiled <= jax.jit + dynamo's own cost + 10 us;
assume_pure <= jax.jit + 15 us.

    python benchmarks/bench_call_overhead.py [--rounds 7] [--calls 2000]
"""

from __future__ import annotations

import argparse
import copy

import torch

import pjrt_host
from bench_compile import best_per_call as per_call  # interleaved rounds, best of each

nn = torch.nn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp

    torch.manual_seed(0)
    cpu = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(64, 64), nn.ReLU())]).eval()
    dev = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(64, 64), nn.ReLU())]).eval()
    dev.load_state_dict(cpu.state_dict())
    dev = dev.to("jax")
    x_cpu = torch.randn(1, 64)
    x_dev = x_cpu.to("jax")
    eager_cpu = torch.compile(cpu, backend="eager")
    with torch.no_grad():
        precomputed = dev(x_dev)

    def noop_backend(gm, example_inputs):
        return lambda *args: (precomputed,)

    def noop_compiler(gm, example_inputs):
        def run(args):
            return [precomputed]
        run._boxed_call = True
        return run

    from torch._dynamo.backends.common import aot_autograd

    dynamo_only = torch.compile(copy.deepcopy(dev), backend=noop_backend)
    aot_only = torch.compile(copy.deepcopy(dev), backend=aot_autograd(fw_compiler=noop_compiler))
    compiled = torch.compile(dev, backend="jax")
    pure = pjrt_host.assume_pure(dev)

    device = pjrt_host.devices()[0]
    params = [(jax.device_put(jnp.asarray(m.weight.detach().numpy()), device),
               jax.device_put(jnp.asarray(m.bias.detach().numpy()), device)) for m in cpu if isinstance(m, nn.Linear)]

    @jax.jit
    def mlp(ps, h):
        for w, b in ps:
            h = jax.nn.relu(h @ w.T + b)
        return h

    x_jax = jax.device_put(jnp.asarray(x_cpu.numpy()), device)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x_dev).cpu(), cpu(x_cpu), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(pure(x_dev).cpu(), cpu(x_cpu), rtol=1e-4, atol=1e-5)
        t = per_call({
            "torch CPU eager": lambda: cpu(x_cpu),
            "torch.compile eager (CPU)": lambda: eager_cpu(x_cpu),
            "jax.jit": lambda: mlp(params, x_jax),
            "dynamo, no-op backend": lambda: dynamo_only(x_dev),
            "dynamo + AOT, no-op": lambda: aot_only(x_dev),
            "torch.compile jax": lambda: compiled(x_dev),
            "assume_pure": lambda: pure(x_dev),
        }, args.calls, args.rounds)
    us = {k: v * 1e6 for k, v in t.items()}
    for k, v in us.items():
        print(f"{k:28} {v:8.1f} us")
    dynamo = us["torch.compile eager (CPU)"] - us["torch CPU eager"]
    goal_c = us["jax.jit"] + dynamo + 10
    goal_direct = us["jax.jit"] + us["dynamo, no-op backend"] + 10
    goal_p = us["jax.jit"] + 15
    print(f"dynamo's own cost: {dynamo:.1f} us as issue 19 defines it (eager backend minus eager on CPU); "
          f"{us['dynamo, no-op backend']:.1f} us measured directly (no-op backend)")
    print(f"compiled: {us['torch.compile jax']:.1f} us, goal <= {goal_c:.1f} (jax.jit + dynamo + 10, issue's "
          f"definition): ratio {us['torch.compile jax'] / goal_c:.2f}; <= {goal_direct:.1f} with dynamo's cost "
          f"measured directly: ratio {us['torch.compile jax'] / goal_direct:.2f}")
    print(f"assume_pure: {us['assume_pure']:.1f} us, goal <= {goal_p:.1f} (jax.jit + 15): "
          f"ratio {us['assume_pure'] / goal_p:.2f}")


if __name__ == "__main__":
    main()
