"""cpu_ref's vendor kernels against the host's own lowerings, measured in the same run.

    python benchmarks/bench_kernels.py [--repeats 30] [--baseline CHECKOUT]

1. The C++ (XLA FFI) ``aten::_softmax`` kernel and the plain-jax
   ``aten::_softmax_backward_data`` kernel against the reference lowering
   of the same op, each compiled alone (``jax.jit`` of ``_lowerings.invoke``
   with and without the plugin's kernels), on float32 inputs of several
   shapes; then ``torch.softmax`` forward + backward on the 'jax' device
   with ``pjrt_host.config(plugin_kernels=...)`` on and off.
2. What declaring kernels costs where nothing may be imported:
   ``python -m pjrt_host list`` and ``import torch`` (pjrt_host's autoload),
   with this checkout against ``--baseline`` (a checkout without vendor
   kernels, e.g. the main branch), alternated run by run.

Ratios are kernel / reference: below 1 the kernel is faster.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_compile import best_per_call  # noqa: E402  (interleaved rounds, best of each)


def kernels_against_lowerings(repeats: int) -> None:

    import jax
    import numpy as np
    import torch

    import pjrt_host
    from pjrt_host import _lowerings, _registry

    device = pjrt_host.devices()[0]
    plugin = _registry.selected_record().plugin
    declared = plugin.declared_kernels._replace(mode="on", dropped=())
    options = {"conv_as_matmul_max_positions": plugin.conv_as_matmul_max_positions}
    with_kernels = _lowerings.LoweringContext(**options, declared_kernels=declared, kernel_setting=("strict", ()))
    reference = _lowerings.LoweringContext(**options)
    softmax = _lowerings.lookup(torch.ops.aten._softmax.default)
    backward = _lowerings.lookup(torch.ops.aten._softmax_backward_data.default)
    print(f"plugin: {declared.plugin}; {os.cpu_count()} CPUs")
    print(f"{'op':<30} {'shape':>14} {'kernel ms':>10} {'lowering ms':>12} {'ratio':>7}")
    rng = np.random.default_rng(0)
    for shape in ((64, 1024), (512, 1024), (4096, 1024), (8192, 64), (128, 32000)):
        x = jax.device_put(rng.standard_normal(shape, dtype=np.float32), device)
        g = jax.device_put(rng.standard_normal(shape, dtype=np.float32), device)
        for name, lowering, args in (("aten::_softmax", softmax, lambda a, b: (a, -1, False)),
                                     ("aten::_softmax_backward_data", backward,
                                      lambda a, b: (b, jax.nn.softmax(a, -1), -1, torch.float32))):
            runs = {}
            for label, ctx in (("kernel", with_kernels), ("lowering", reference)):
                run = jax.jit(lambda a, b, ctx=ctx, lowering=lowering, args=args:
                              _lowerings.invoke(lowering, args(a, b), {}, ctx, jax.numpy.float32))
                runs[label] = lambda run=run: jax.block_until_ready(run(x, g))
            best = best_per_call(runs, repeats, rounds=5)
            times = [best["kernel"], best["lowering"]]
            print(f"{name:<30} {str(shape):>14} {times[0] * 1e3:>10.3f} {times[1] * 1e3:>12.3f} "
                  f"{times[0] / times[1]:>7.2f}")
    # the op as users call it: eager forward + backward, kernels on and off
    x = torch.randn(512, 1024)
    weight = torch.randn(1024).to("jax")

    def step() -> None:
        xj = x.to("jax").requires_grad_()
        (torch.softmax(xj, -1) * weight).sum().backward()
        xj.grad.cpu()

    def with_kernels_set(setting: bool):
        def run() -> None:
            with pjrt_host.config(plugin_kernels=setting):
                step()
        return run

    best = best_per_call({"on": with_kernels_set(True), "off": with_kernels_set(False)}, max(1, repeats // 3), 5)
    times = [best["on"], best["off"]]
    print(f"{'eager softmax fwd+bwd':<30} {'(512, 1024)':>14} {times[0] * 1e3:>10.3f} {times[1] * 1e3:>12.3f} "
          f"{times[0] / times[1]:>7.2f}")
    print("traced:", {k: v["traced"] for k, v in pjrt_host.plugin_kernel_stats().items()})


def _timed(args: list[str], path: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PJRT_")}
    env["PYTHONPATH"] = os.pathsep.join([path, os.path.join(path, "plugins", "cpu_ref")])
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def import_cost(baseline: str, runs: int) -> None:
    print(f"\nthis checkout against {baseline} ({runs} runs each, alternated; median)")
    for what, args in (("python -m pjrt_host list", ["-m", "pjrt_host", "list"]),
                       ("import torch", ["-c", "import torch"])):
        ours, theirs = [], []
        for _ in range(runs):
            ours.append(_timed(args, str(REPO)))
            theirs.append(_timed(args, baseline))
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"{what:<28} {a * 1e3:8.1f} ms  baseline {b * 1e3:8.1f} ms  ratio {a / b:5.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--baseline", help="a checkout without vendor kernels, for the import-cost comparison")
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    os.environ.setdefault("PJRT_DEVICE", "cpu_ref")
    kernels_against_lowerings(args.repeats)
    if args.baseline:
        import_cost(args.baseline, args.runs)


if __name__ == "__main__":
    main()
