"""Where one eager op's time goes, layer by layer (issue 45, item 3): ``x *
1.0001`` on 128 floats, each layer measured on its own in the same run
(interleaved rounds, the best round of each, a wait for the last result
in every round):

- torch CPU eager (the figure users compare with);
- torch's dispatch to a Python tensor subclass whose ``__torch_dispatch__``
  does nothing (returns one tensor made in advance): what any out-of-tree
  Python device pays before its own code runs;
- the same, making a new wrapper tensor per call (``_make_wrapper_subclass``):
  the least a device whose results are new tensors pays;
- the same, adding what a recording device does at the least (a key from
  the arguments, one dict lookup, one append): the floor of a Python hot path;
- the compiled XLA program of the multiply called directly (``jax.jit(...)
  .lower(x).compile()``, the object the engine calls);
- plain jax eager (``x * 1.0001`` on a jax array);
- the 'jax' device op by op (``pjrt_host.config(eager="op")``), and in
  fused eager (the default), where 2,000 calls in a row are recorded into
  segments of repeated blocks;
- issue 45's chain: ``y = y * 1.0001`` 100 times from one tensor, then a
  wait, per op, in plain jax eager, op by op and fused (and fused with its
  replay lane turned off: each replayed op through the engine's key); and
  fused over the same floats padded along a dynamic dim (4 x 27 in a
  bucket of 32), with the lane and without.

The last lines split the device's op-by-op figure: torch's dispatch and the
result tensor, the program call, and the rest (pjrt_host's own Python:
dispatch tables, the call's key, the cache lookup, bookkeeping).

    python benchmarks/bench_op_layers.py [--rounds 7] [--calls 2000]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import pjrt_host  # noqa: F401  (the device, even with autoload off)


class _Nothing(torch.Tensor):
    """A wrapper subclass whose ops return one tensor made in advance."""

    result: torch.Tensor

    @staticmethod
    def __new__(cls, size):
        return torch.Tensor._make_wrapper_subclass(cls, size, dtype=torch.float32)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return cls.result


class _NewWrapper(torch.Tensor):
    """A wrapper subclass whose ops return a new wrapper tensor each."""

    @staticmethod
    def __new__(cls, size):
        return torch.Tensor._make_wrapper_subclass(cls, size, dtype=torch.float32)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return torch.Tensor._make_wrapper_subclass(cls, args[0].shape, dtype=torch.float32)


class _Recorder(torch.Tensor):
    """The least a Python device that records its ops does: per op a key
    from its arguments' specs, one dict lookup, one append to a list and a
    new wrapper tensor carrying a small object (fused eager's whole job,
    without its rules): a floor for how far Python can take it."""

    ops: list = []
    known: dict = {}

    @staticmethod
    def __new__(cls, size):
        t = torch.Tensor._make_wrapper_subclass(cls, size, dtype=torch.float32)
        t.spec = ("float32", tuple(size))
        return t

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        key = (func, *[a.spec if type(a) is cls else (type(a), a) for a in args])
        entry = cls.known.get(key)
        if entry is None:
            entry = cls.known[key] = args[0].spec
        cls.ops.append((entry, args))
        if len(cls.ops) > 1000:
            cls.ops.clear()
        t = torch.Tensor._make_wrapper_subclass(cls, entry[1], dtype=torch.float32)
        t.spec = entry
        return t


def best_per_call(fns: dict, waits: dict, calls: int, rounds: int) -> dict:
    best = {k: float("inf") for k in fns}
    for k, fn in fns.items():
        for _ in range(50):
            r = fn()
        waits[k](r)
    for _ in range(rounds):
        for k, fn in fns.items():
            t = time.perf_counter()
            for _ in range(calls):
                r = fn()
            waits[k](r)
            best[k] = min(best[k], (time.perf_counter() - t) / calls)
    return {k: v * 1e6 for k, v in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp

    x_cpu = torch.randn(128)
    x_dev = x_cpu.to("jax")
    x_jax = jax.device_put(jnp.asarray(x_cpu.numpy()), pjrt_host.devices()[0])
    program = jax.jit(lambda a: a * 1.0001).lower(x_jax).compile()
    nothing = _Nothing(x_cpu.shape)
    _Nothing.result = _Nothing(x_cpu.shape)
    wrapper = _NewWrapper(x_cpu.shape)
    recorder = _Recorder(x_cpu.shape)

    def op_by_op():
        return x_dev * 1.0001

    def device_wait(t):
        torch.jax.synchronize()

    nothing_wait = wrapper_wait = cpu_wait = (lambda r: None)
    fns = {
        "torch CPU eager": lambda: x_cpu * 1.0001,
        "torch dispatch, Python subclass, no work": lambda: nothing * 1.0001,
        "  + a new wrapper tensor per result": lambda: wrapper * 1.0001,
        "  + a key, a lookup and a record (a floor)": lambda: recorder * 1.0001,
        "the compiled XLA program, called directly": lambda: program(x_jax),
        "plain jax eager": lambda: x_jax * 1.0001,
        "'jax' device, op by op": op_by_op,
    }
    waits = {
        "torch CPU eager": cpu_wait,
        "torch dispatch, Python subclass, no work": nothing_wait,
        "  + a new wrapper tensor per result": wrapper_wait,
        "  + a key, a lookup and a record (a floor)": wrapper_wait,
        "the compiled XLA program, called directly": jax.block_until_ready,
        "plain jax eager": jax.block_until_ready,
        "'jax' device, op by op": device_wait,
    }
    with pjrt_host.config(eager="op"):
        best = best_per_call(fns, waits, args.calls, args.rounds)
    fused = "'jax' device, fused eager"
    with pjrt_host.config(eager="fused"):  # entered once: the calls in a row are one recording
        best.update(best_per_call({fused: op_by_op}, {fused: device_wait}, args.calls, args.rounds))

    def chain(y):
        for _ in range(100):
            y = y * 1.0001
        return y

    per_op = args.calls // 100
    from pjrt_host._torch import _fused

    # the same 128 floats as 4 x 27, padded along the 27 (its bucket, 32):
    # a tensor whose dim became dynamic, as a new sequence length makes one
    padded = torch.randn(4, 27, device="jax")
    torch._dynamo.mark_dynamic(padded, 1)
    padded = padded * 1.0
    assert padded._storage.padded is not None
    lane = _fused.replay
    chains = {"chain of 100, plain jax eager": (lambda: chain(x_jax), jax.block_until_ready, None),
              "chain of 100, 'jax' op by op": (lambda: chain(x_dev), device_wait, "op"),
              "chain of 100, 'jax' fused": (lambda: chain(x_dev), device_wait, "fused"),
              "  the same without the replay lane": (lambda: chain(x_dev), device_wait, "fused"),
              "chain of 100, padded, 'jax' fused": (lambda: chain(padded), device_wait, "fused"),
              "  the same without the replay lane ": (lambda: chain(padded), device_wait, "fused")}
    for _ in range(args.rounds):  # interleaved, as above
        for k, (fn, wait, mode) in chains.items():
            # (the lane off: every replayed op through the engine, as before 2026-11-30)
            _fused.replay = (lambda func, a, kw: None) if "without" in k else lane
            with pjrt_host.config(eager=mode or "op"):
                found = best_per_call({k: fn}, {k: wait}, per_op, 1)[k] / 100
            best[k] = min(best.get(k, float("inf")), found)
    _fused.replay = lane
    print(f"x * 1.0001 on 128 floats, per call (best of {args.rounds} interleaved rounds of {args.calls}; "
          f"{os.cpu_count()} cores):")
    width = max(map(len, best))
    for k, us in best.items():
        print(f"  {k:<{width}}  {us:6.2f} us")
    dispatch = best["  + a new wrapper tensor per result"]
    call = best["the compiled XLA program, called directly"]
    device = best["'jax' device, op by op"]
    jax_op = best["plain jax eager"]
    print(f"op by op = torch's dispatch and result tensor {dispatch:.1f} + program call {call:.1f} "
          f"+ pjrt_host's Python {device - dispatch - call:.1f} us; "
          f"against plain jax eager: op by op {device / jax_op:.2f}x, fused {best[fused] / jax_op:.2f}x")
    jax_chain = best["chain of 100, plain jax eager"]
    op_chain = best["chain of 100, 'jax' op by op"] / jax_chain
    fused_chain = best["chain of 100, 'jax' fused"] / jax_chain
    print(f"the chain, per op against plain jax eager's: op by op {op_chain:.2f}x (issue 45's goal: 1.25x), "
          f"fused {fused_chain:.2f}x (goal: 0.75x)")
    exact = best["chain of 100, 'jax' fused"]
    padded_lane = best["chain of 100, padded, 'jax' fused"]
    padded_engine = best["  the same without the replay lane "]
    print(f"the padded chain, per op against the exact one in fused eager: {padded_lane / exact:.2f}x with the "
          f"replay lane, {padded_engine / exact:.2f}x without it")


if __name__ == "__main__":
    main()
