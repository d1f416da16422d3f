"""The program tests/test_dead_peers.py runs in every rank (not a test
module): a small DDP training on 'jax' tensors in which one rank kills
itself (SIGKILL) at a chosen step, and the survivors report, save and exit.

    python tests/dead_peers_worker.py OUTDIR [--steps N] [--kill-rank R]
        [--kill-step S] [--async] [--every K]

Each step's data comes from the step number alone, so a run that resumes
from a checkpoint computes the same losses as one that never stopped.
Rank 0 saves a checkpoint (model, optimizer, next step) every ``--every``
steps.  ``--kill-rank R --kill-step S``: rank R SIGKILLs itself when it
reaches step S (only in the first attempt under torchrun's restarts), and a
survivor writes OUTDIR/error<rank>.json with the exception it got (its type,
its text, the seconds its collective took), saves a torch.save and a DCP
checkpoint of its state under OUTDIR/survivor<rank>/, and exits 3.
``--async``: gradients are averaged with ``all_reduce(async_op=True)`` and
``work.wait()`` instead of DDP.  Every rank appends its losses to
OUTDIR/losses<rank>.jsonl (one line per step and attempt).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import time

#: The process group's timeout: far above a step, far below the test's guard.
TIMEOUT = datetime.timedelta(seconds=30)


def _net(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _batch(torch, step: int, rank: int, world: int):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(4 * world, 8, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    return x[4 * rank:4 * (rank + 1)].to("jax"), y[4 * rank:4 * (rank + 1)].to("jax")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("outdir")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--kill-rank", type=int, default=None)
    parser.add_argument("--kill-step", type=int, default=None)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--async", dest="use_async", action="store_true")
    parser.add_argument("--linger", type=float, default=0.0,
                        help="seconds a survivor waits before it saves (a slow save)")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group(timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    net = _net(torch).to("jax")
    model = net if args.use_async else DDP(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    ckpt = os.path.join(args.outdir, "checkpoint.pt")
    start = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt, map_location="cpu")
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
    losses = open(os.path.join(args.outdir, f"losses{rank}.jsonl"), "a")
    step = start
    good = {"model": _to_cpu(torch, net.state_dict()), "step": start}
    try:
        for step in range(start, args.steps):
            if rank == args.kill_rank and step == args.kill_step and attempt == 0:
                os.kill(os.getpid(), signal.SIGKILL)
            x, y = _batch(torch, step, rank, world)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            began = time.monotonic()
            if args.use_async:
                works = [dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, async_op=True) for p in net.parameters()]
                for w in works:
                    w.wait()
            opt.step()
            value = loss.detach()
            dist.all_reduce(value, op=dist.ReduceOp.AVG)
            losses.write(json.dumps({"attempt": attempt, "step": step, "loss": value.item()}) + "\n")
            losses.flush()
            # This step's collectives completed (the loss's all_reduce ran
            # after them): the state a survivor can save.  (After a failed
            # collective the parameters computed from it hold jax's error.)
            good = {"model": _to_cpu(torch, net.state_dict()), "step": step + 1}
            if rank == 0 and (step + 1) % args.every == 0:
                state = {"model": net.state_dict(), "optimizer": opt.state_dict(), "step": step + 1}
                torch.save(_to_cpu(torch, state), ckpt + ".tmp")
                os.replace(ckpt + ".tmp", ckpt)
    except Exception as err:  # a peer died: report, save what this rank has, stop
        took = time.monotonic() - began if "began" in locals() else None
        report = {"type": type(err).__name__, "error": str(err), "step": step, "seconds": took,
                  "time": time.time()}
        with open(os.path.join(args.outdir, f"error{rank}.json"), "w") as f:
            json.dump(report, f)
        print(f"rank {rank}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        time.sleep(args.linger)
        # The job is known broken: this waits for the device's queue (the
        # pending optimizer step, computed from the failed collective) and
        # does not raise the failure again.  DCP's writer calls it too.
        torch.jax.synchronize()
        _save_survivor(torch, good, os.path.join(args.outdir, f"survivor{rank}"))
        with open(os.path.join(args.outdir, f"error{rank}.json"), "w") as f:
            json.dump({**report, "saved": time.time()}, f)
        sys.exit(3)
    losses.close()
    dist.destroy_process_group()


def _to_cpu(torch, state):
    if isinstance(state, dict):
        return {k: _to_cpu(torch, v) for k, v in state.items()}
    if isinstance(state, list):
        return [_to_cpu(torch, v) for v in state]
    return state.cpu() if isinstance(state, torch.Tensor) else state


def _save_survivor(torch, state, where: str) -> None:
    """What a survivor saves alone: torch.save of its last good state, and a
    DCP checkpoint written without the (broken) process group."""
    import torch.distributed.checkpoint as dcp

    os.makedirs(where, exist_ok=True)
    torch.save(state, os.path.join(where, "state.pt"))
    dcp.save({"model": state["model"]}, checkpoint_id=os.path.join(where, "dcp"), no_dist=True)


if __name__ == "__main__":
    main()
