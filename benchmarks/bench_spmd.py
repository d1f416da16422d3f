"""SPMD on cpu_ref split into N devices (default 8): what a fully-sharded
model holds per device against a replicated one, and the step time of
data-parallel training over N devices against one device.

    python benchmarks/bench_spmd.py [--devices 8] [--width 512] [--layers 4] [--batch 128] [--steps 10] [--compile]

Memory is counted from the arrays themselves: the bytes of every shard each
device holds (parameters, then parameters + AdamW state after one step).
The devices of cpu_ref share this machine's cores, so the DP step time is
reported, not a speed-up to expect: on real devices each shard runs on its
own chip.  (With 8 cpu_ref devices on 2 cores, --width 1024 --layers 8
--batch 256 aborted in XLA:CPU's all-reduce rendezvous: docs/spmd.md, Limits.)
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--compile", action="store_true", help="also time the DP step under torch.compile")
    args = parser.parse_args()
    os.environ.setdefault("PJRT_HOST_CPU_REF_DEVICES", str(args.devices))

    import torch

    import pjrt_host.spmd as xs

    n = xs.global_device_count()
    if n != args.devices:
        sys.exit(f"the client has {n} devices, not {args.devices}: set PJRT_HOST_CPU_REF_DEVICES={args.devices}")
    mesh = xs.get_1d_mesh("data")
    nn = torch.nn

    def model() -> nn.Module:
        torch.manual_seed(0)
        layers = []
        for _ in range(args.layers):
            layers += [nn.Linear(args.width, args.width), nn.ReLU()]
        return nn.Sequential(*layers[:-1]).to("jax")

    def held(tensors) -> dict[int, int]:
        out: dict[int, int] = {}
        for t in tensors:
            for shard in xs.jax_array(t).addressable_shards:
                out[shard.device.id] = out.get(shard.device.id, 0) + shard.data.nbytes
        return out

    def state_tensors(m, opt):
        ts = [p.detach() for p in m.parameters()]
        for st in opt.state.values():
            ts += [v for v in st.values() if isinstance(v, torch.Tensor) and v.device.type == "jax" and v.dim()]
        return ts

    print(f"{n} cpu_ref devices; MLP {args.layers} x Linear({args.width}, {args.width})")
    print()
    print(f"{'layout':<12}{'params MiB/dev':>16}{'+AdamW MiB/dev':>16}{'of whole':>10}")
    whole = None
    for layout in ("one device", "replicated", "fsdp"):
        m = model()
        if layout == "replicated":
            for p in m.parameters():
                xs.mark_sharding(p, mesh, ())
        elif layout == "fsdp":
            for p in m.parameters():
                xs.mark_sharding(p, mesh, ("data",) + (None,) * (p.dim() - 1))
        params = max(held([p.detach() for p in m.parameters()]).values())
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        x = torch.randn(args.batch, args.width).to("jax")
        if layout != "one device":
            xs.mark_sharding(x, mesh, ("data", None))
        m(x).square().mean().backward()
        opt.step()
        total = max(held(state_tensors(m, opt)).values())
        whole = whole or total
        print(f"{layout:<12}{params / 2**20:>16.2f}{total / 2**20:>16.2f}{total / whole:>10.3f}")
        del m, opt

    print()
    print(f"DP step (forward, backward, SGD) on a batch of {args.batch}, median of {args.steps} steps")
    results = {}
    modes = [("1 device", False, False), (f"{n} devices", True, False)]
    if args.compile:
        modes += [("1 device compiled", False, True), (f"{n} devices compiled", True, True)]
    for name, dp, compiled in modes:
        m = model()
        if dp:
            for p in m.parameters():
                xs.mark_sharding(p, mesh, ())
        run = torch.compile(m, backend="jax") if compiled else m
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        x = torch.randn(args.batch, args.width).to("jax")
        if dp:
            xs.mark_sharding(x, mesh, ("data", None))
        times = []
        for step in range(args.steps + 2):
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = run(x).square().mean()
            loss.backward()
            opt.step()
            torch.jax.synchronize()
            times.append(time.perf_counter() - t0)
        times = sorted(times[2:])
        results[name] = times[len(times) // 2] * 1e3
        print(f"  {name:<22}{results[name]:>10.1f} ms")
    print(f"  ratio {n} devices / 1 device: {results[f'{n} devices'] / results['1 device']:.2f} "
          f"(cpu_ref's devices share {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
