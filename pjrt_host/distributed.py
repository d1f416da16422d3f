"""Several processes, on one host or several: who is who, and collectives.

Start the processes with ``python -m pjrt_host launch --nproc-per-node N
script.py`` (or torchrun, or SLURM / Open MPI, which jax's cluster detection
recognises), or from code with :func:`pjrt_host.spawn`.  Then, in each
process::

    import pjrt_host.distributed as dist

    dist.initialize()        # optional: the first pjrt_host.devices() does the same
    total = dist.all_reduce(x, "sum")

The set-up happens once, before the PJRT client exists: the selected
plugin's ``configure_multiprocess(local_rank, local_world_size)`` (or
``configure_single_process()`` for a process alone), then jax.distributed's
coordinator where several processes need it, then the client with its
``node_id`` and ``num_nodes``.  See docs/distributed.md.

The rank accessors read the launcher's environment and never create the
client; after :func:`initialize` they give the values the client was created
with.
"""

from __future__ import annotations

from typing import Any

from . import _process, _registry, _runtime
from ._collectives import REDUCE_OPS, CollectiveError, all_gather, all_reduce, barrier, broadcast
from ._launch import LaunchError, spawn
from ._process import CoordinatorUnreachableError, DistributedSetupError, ProcessLayout

__all__ = [
    "REDUCE_OPS",
    "CollectiveError",
    "CoordinatorUnreachableError",
    "DistributedSetupError",
    "LaunchError",
    "ProcessLayout",
    "all_gather",
    "all_reduce",
    "barrier",
    "broadcast",
    "host_count",
    "host_index",
    "initialize",
    "is_initialized",
    "layout",
    "local_rank",
    "local_world_size",
    "process_count",
    "process_index",
    "spawn",
    "world_size",
]


def initialize() -> ProcessLayout:
    """Set this process up with its peers and create the client; return its
    layout.  Idempotent: once the client exists (whoever created it), it
    returns the layout that client was made with.  Raises
    :class:`DistributedSetupError` (naming the plugin) when the plugin's
    configure hook fails or the coordinator cannot be reached within
    ``PJRT_HOST_COORDINATOR_TIMEOUT`` seconds."""
    _runtime.runtime()
    current = _process.current_layout()
    assert current is not None
    return current


def is_initialized() -> bool:
    """Whether this process's client exists (and so its layout is final)."""
    return _runtime.is_initialized()


def layout() -> ProcessLayout:
    """The process's layout: the one the client was created with, or, before
    that, what the launcher's environment says."""
    current = _process.current_layout()
    if current is not None:
        return current
    return _process.detect_layout(_selected_plugin())


def local_rank() -> int:
    """Index of this process among the processes on its host."""
    return layout().local_rank


def local_world_size() -> int:
    """Number of processes on this host."""
    return layout().local_world_size


def host_index() -> int:
    """Index of this host among the hosts of the job: the plugin's
    ``host_index()`` when it knows it, else the launcher's node rank."""
    return layout().host_index


def host_count() -> int:
    """Number of hosts in the job."""
    return layout().host_count


def process_index() -> int:
    """Index of this process among all processes (torch's ``RANK``, jax's
    ``process_index()``)."""
    return layout().rank


def process_count() -> int:
    """Number of processes in the job (jax's ``process_count()``)."""
    return layout().world_size


def world_size() -> int:
    """Number of ranks taking part in the collectives: one per process, so
    the same as :func:`process_count` (torch's ``WORLD_SIZE``)."""
    return layout().world_size


def _selected_plugin() -> Any | None:
    try:
        return _registry.selected_record().plugin
    except Exception:  # no usable plugin: the launcher's values alone
        return None
