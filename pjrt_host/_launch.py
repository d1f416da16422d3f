"""Starting the processes of a job: ``python -m pjrt_host launch`` and
:func:`spawn`.

Both are thin layers over torch's engines, so a job started either way looks
to its processes exactly like one started by torchrun (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``):

* ``launch`` is torchrun (``torch.distributed.run``: the elastic agent, its
  static rendezvous, its monitoring), with pjrt_host's defaults: no restarts,
  free ports on one host, and jax's coordinator port passed to the workers.
* :func:`spawn` runs a function in fresh processes through
  ``torch.multiprocessing.start_processes``.

When one process fails, the engine stops the others and the launch exits
non-zero (``spawn`` raises); processes on other hosts hear of it from the
coordination service's process (:mod:`pjrt_host._peers`): their next
collective raises, and they are ended ``PJRT_HOST_DEAD_PEER_GRACE`` seconds
later if they have not exited.  torch is imported only when a job is
started.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import _env, _process, _runtime
from ._errors import PjrtHostError, cause_text

__all__ = ["LaunchError", "add_launch_arguments", "launch", "run_launch_command", "spawn"]

_LOOPBACK = "127.0.0.1"


class LaunchError(PjrtHostError):
    """A job could not be started, or one of its processes failed.
    ``failures`` maps each failed rank to its exit code (negative: killed by
    that signal) when known."""

    def __init__(self, message: str, failures: dict[int, int] | None = None, first_rank: int | None = None) -> None:
        super().__init__(message)
        self.failures = dict(failures or {})
        #: the rank that failed first (the others were usually stopped because of it)
        self.first_rank = first_rank if first_rank is not None else min(self.failures, default=None)


# -- python -m pjrt_host launch ------------------------------------------------


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``launch`` subcommand's arguments (the CLI adds the subparser)."""
    parser.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1,
                        help="processes on this host (default 1)")
    parser.add_argument("--nnodes", type=int, default=1, help="number of hosts (default 1)")
    parser.add_argument("--node-rank", "--node_rank", type=int, default=0, help="index of this host (default 0)")
    parser.add_argument("--master-addr", "--master_addr", default=None,
                        help="address of host 0 (default 127.0.0.1 on one host; required on several)")
    parser.add_argument("--master-port", "--master_port", type=int, default=None,
                        help="port of torch's rendezvous store on host 0 (default: a free port on one host; "
                             "required on several)")
    parser.add_argument("--coordinator-port", type=int, default=None,
                        help="port of jax's coordinator on host 0 (default: PJRT_HOST_COORDINATOR_PORT, else a "
                             "free port on one host, else MASTER_PORT + 1)")
    parser.add_argument("--max-restarts", "--max_restarts", type=int, default=0,
                        help="times the job is restarted after a failure (default 0)")
    parser.add_argument("-m", "--module", action="store_true", help="run SCRIPT as a module, like python -m")
    parser.add_argument("script", help="the program every process runs")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")


def run_launch_command(args: argparse.Namespace) -> int:
    """``python -m pjrt_host launch``: the exit status of the job."""
    try:
        launch(args.script, args.script_args, nproc_per_node=args.nproc_per_node, nnodes=args.nnodes,
               node_rank=args.node_rank, master_addr=args.master_addr, master_port=args.master_port,
               coordinator_port=args.coordinator_port, max_restarts=args.max_restarts, module=args.module)
    except LaunchError as err:
        print(str(err), file=sys.stderr, flush=True)
        code = err.failures.get(err.first_rank, 1) if err.first_rank is not None else 1
        return code if code > 0 else 1
    return 0


def launch(
    script: str,
    script_args: Sequence[str] = (),
    *,
    nproc_per_node: int = 1,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
    coordinator_port: int | None = None,
    max_restarts: int = 0,
    module: bool = False,
) -> None:
    """Run ``script`` in ``nproc_per_node`` processes on this host, as host
    ``node_rank`` of ``nnodes``, through torchrun's elastic agent; return
    when every process has exited 0, else raise :class:`LaunchError`."""
    if nproc_per_node < 1 or nnodes < 1 or not 0 <= node_rank < nnodes:
        raise LaunchError(f"pjrt_host launch: need --nproc-per-node >= 1, --nnodes >= 1 and 0 <= --node-rank < "
                          f"--nnodes (got {nproc_per_node}, {nnodes}, {node_rank}).")
    if nnodes > 1 and (master_addr is None or master_port is None):
        raise LaunchError("pjrt_host launch: with --nnodes > 1, give every host the same --master-addr (the "
                          "address of host 0, reachable from every host) and --master-port.")
    master_addr = master_addr or _LOOPBACK
    if master_port is None:
        master_port = free_port(master_addr)
    if coordinator_port is None:
        coordinator_port = _env.coordinator_port()
    if coordinator_port is None and nnodes == 1:
        coordinator_port = free_port(master_addr, avoid={master_port})
    if coordinator_port is not None:
        # Inherited by the workers, which read it in _process.
        os.environ["PJRT_HOST_COORDINATOR_PORT"] = str(coordinator_port)

    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    argv = [
        "--nnodes", str(nnodes),
        "--node-rank", str(node_rank),
        "--nproc-per-node", str(nproc_per_node),
        "--rdzv-backend", "static",
        "--master-addr", master_addr,
        "--master-port", str(master_port),
        # Bounds how long host 0 waits for the other hosts' agents.
        "--rdzv-conf", f"timeout={max(1, int(_env.coordinator_timeout()))}",
        "--max-restarts", str(max_restarts),
        *(["--module"] if module else []),
        script, *script_args,
    ]
    try:
        torchrun.run(torchrun.parse_args(argv))
    except ChildFailedError as err:
        failures = {rank: failure.exitcode for rank, failure in err.failures.items()}
        first_rank, first = err.get_first_failure()
        raise LaunchError(
            f"pjrt_host launch: {script}: {_describe_failures(failures)}; the other processes on this host "
            f"were stopped (host {node_rank} of {nnodes}). The first to fail was rank {first_rank} "
            f"(exit code {first.exitcode}): see its log above.",
            failures, first_rank) from err
    except Exception as err:  # the rendezvous: hosts that never came, a port in use
        raise LaunchError(
            f"pjrt_host launch: host {node_rank} of {nnodes} could not start the job through "
            f"{master_addr}:{master_port}: {cause_text(err).rstrip('.')}. Run the same command on every host "
            f"with --node-rank 0 to {nnodes - 1}, with host 0's --master-addr and a --master-port reachable from "
            "every host; PJRT_HOST_COORDINATOR_TIMEOUT bounds the wait.") from err


def _describe_failures(failures: dict[int, int]) -> str:
    parts = []
    for rank in sorted(failures):
        code = failures[rank]
        parts.append(f"rank {rank} was killed by signal {-code}" if code < 0 else f"rank {rank} exited with code {code}")
    return ", ".join(parts)


def free_port(host: str = _LOOPBACK, avoid: set[int] | None = None) -> int:
    """A TCP port nothing listens on at ``host`` now (the OS's choice)."""
    for _ in range(20):
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in (avoid or set()):
            return port
    raise LaunchError(f"pjrt_host: found no free TCP port on {host}")  # pragma: no cover


# -- spawn ----------------------------------------------------------------------


def spawn(fn: Callable[..., Any], nprocs: int, args: Sequence[Any] = (), *, start_method: str = "forkserver") -> None:
    """Run ``fn(local_rank, *args)`` in ``nprocs`` new processes on this host,
    each set up as by ``pjrt_host.distributed.initialize()`` before ``fn``
    starts.  ``fn`` and ``args`` must be picklable (a module-level
    function).  Returns when all have finished; if one fails, the others are
    stopped and :class:`LaunchError` names the rank."""
    if nprocs < 1:
        raise LaunchError(f"pjrt_host.spawn: nprocs={nprocs}: need at least one process.")
    import torch.multiprocessing as mp

    master_port = free_port()
    coordinator_port = _env.coordinator_port() or free_port(avoid={master_port})
    env = {
        "MASTER_ADDR": _LOOPBACK,
        "MASTER_PORT": str(master_port),
        "PJRT_HOST_COORDINATOR_PORT": str(coordinator_port),
        "WORLD_SIZE": str(nprocs),
        "LOCAL_WORLD_SIZE": str(nprocs),
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
    }
    if start_method == "forkserver":
        # One import of torch in the fork server instead of one per process.
        mp.set_forkserver_preload(["torch.multiprocessing.spawn", __name__])
    try:
        mp.start_processes(_spawned, args=(fn, tuple(args), env), nprocs=nprocs, join=True, start_method=start_method)
    except mp.ProcessRaisedException as err:
        raise LaunchError(f"pjrt_host.spawn: rank {err.error_index} raised an exception; the other processes "
                          f"were stopped. Its traceback:\n{err}", {err.error_index: 1}, err.error_index) from err
    except mp.ProcessExitedException as err:
        code = err.exit_code
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        raise LaunchError(f"pjrt_host.spawn: rank {err.error_index} {how}; the other processes were stopped.",
                          {err.error_index: code}, err.error_index) from err


def _spawned(local_rank: int, fn: Callable[..., Any], args: tuple[Any, ...], env: dict[str, str]) -> None:
    os.environ.update(env)
    os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(local_rank)
    _runtime.runtime()  # the multi-process set-up, then the client
    fn(local_rank, *args)
    # multiprocessing ends the process with os._exit, which skips jax's
    # atexit shutdown; without it rank 0 could take the coordinator away
    # while the others still wait on it for their last barrier.
    _process.leave_coordinator()
