"""Worker of tests/test_crash_sweep.py: makes each call named on the command
line (``KIND:NAME:ARGS``), printing ``CALL <name>`` before it, so a call
that ends the process is known by the last line printed.  A Python exception
is a fine answer; only a signal is a defect."""

import sys

import torch


def jax_tensor():
    return torch.arange(6, dtype=torch.float32, device="jax").reshape(2, 3)


ARGS = {
    "none": lambda: (),
    "tensor": lambda: (jax_tensor(),),
    "cpu": lambda: (torch.ones(2, 3),),
    "int": lambda: (0,),
    "float": lambda: (1.5,),
    "storage": lambda: (jax_tensor().untyped_storage(),),
    "cpu_storage": lambda: (torch.ones(6).untyped_storage(),),
}


def target(kind):
    if kind == "tensor":
        return jax_tensor()
    if kind == "storage":
        return jax_tensor().untyped_storage()
    return torch.jax


def main(calls):
    for call in calls:
        kind, name, args = call.split(":")
        print("CALL", call, flush=True)
        try:
            getattr(target(kind), name)(*ARGS[args]())
        except BaseException:  # noqa: BLE001 - any Python-level answer is fine
            pass
    print("DONE", flush=True)


if __name__ == "__main__":
    main(sys.stdin.read().split())
