"""CPU cost of having pjrt_host installed: torch CPU ops and `import torch`,
with the 'jax' device autoloaded and with TORCH_DEVICE_BACKEND_AUTOLOAD=0,
measured in the same run (alternating child processes) and printed as
ratios (1.00 = no cost).

    python benchmarks/bench_cpu_overhead.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(r"""
    import json, sys, time
    t0 = time.perf_counter()
    import torch
    import_s = time.perf_counter() - t0

    def per_call(fn, n):
        for _ in range(max(n // 10, 5)):
            fn()
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - t) / n)
        return best * 1e6

    torch.manual_seed(0)
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    big = torch.randn(512, 512)
    lin = torch.nn.Linear(64, 64)
    x = torch.randn(32, 64, requires_grad=True)

    def fwd_bwd():
        lin(x).relu().sum().backward()

    ops = {
        "add 64x64": (lambda: a + b, 20000),
        "mul_ 64x64": (lambda: a.mul_(1.0), 20000),
        "matmul 512": (lambda: big @ big, 200),
        "slice+sum": (lambda: a[1:10, ::2].sum(), 20000),
        "zeros(64,64)": (lambda: torch.zeros(64, 64), 20000),
        "linear fwd+bwd": (fwd_bwd, 3000),
    }
    out = {name: per_call(fn, n) for name, (fn, n) in ops.items()}
    print(json.dumps({"import_s": import_s, "ops_us": out,
                      "device": hasattr(torch, "jax"), "jax_imported": "jax" in sys.modules}))
""")


def child(autoload: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    if not autoload:
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for _ in range(args.rounds):
        for autoload in (False, True):  # alternate, so drift hits both alike
            runs[autoload].append(child(autoload))
    assert all(r["device"] for r in runs[True]) and not any(r["device"] for r in runs[False])
    assert not any(r["jax_imported"] for r in runs[True]), "a CPU-only program imported jax"

    def med(autoload: bool, get) -> float:
        return statistics.median(get(r) for r in runs[autoload])

    print(f"{'':22}{'without':>12}{'with':>12}{'ratio':>8}")
    base, loaded = med(False, lambda r: r["import_s"]), med(True, lambda r: r["import_s"])
    print(f"{'import torch (s)':22}{base:12.3f}{loaded:12.3f}{loaded / base:8.2f}")
    for name in runs[True][0]["ops_us"]:
        base = med(False, lambda r: r["ops_us"][name])
        loaded = med(True, lambda r: r["ops_us"][name])
        print(f"{name + ' (us)':22}{base:12.2f}{loaded:12.2f}{loaded / base:8.2f}")


if __name__ == "__main__":
    main()
