"""send / recv of 'jax' tensors between two ranks of a 'pjrt' group.

An XLA transfer is a collective of its two devices, so both ends must run
it together.  isend/irecv are queued and run when one of their Works is
waited on (or before the group's next collective), in an order every rank
derives alike: by pair of ranks, then direction (lower rank to higher
first), then call order.  Ring exchanges and batch_isend_irecv, in which
every rank sends before it receives, then cannot deadlock (each rank runs
its pairs in the same global order).
"""

from __future__ import annotations

import datetime
import threading
from typing import Any

import torch
import torch.distributed as dist

from ..._jax_settings import x64_if_loaded as _x64_if_loaded
from . import _tensors
from ._mesh import GroupMesh

__all__ = ["PointToPoint"]


class PointToPoint:
    """One group's queue of sends and receives, and the two-device meshes
    they run on."""

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta) -> None:
        self._store = store
        self._rank = rank
        self._size = size
        self._timeout = timeout
        self._queued: list[tuple] = []
        self._pairs: dict[tuple, GroupMesh] = {}  # (peer rank, local device index) -> their two-device mesh
        self._lock = threading.Lock()

    @property
    def pending(self) -> bool:
        return bool(self._queued)

    def queue(self, tensors: list, src: int, dst: int) -> "P2PWork":
        peer = dst if src == self._rank else src
        if not 0 <= peer < self._size or peer == self._rank:
            raise ValueError(f"pjrt_host: send/recv between group rank {self._rank} and rank {peer} of a group of "
                             f"{self._size}: the peer must be another rank of the group")
        for t in tensors:
            low, high = sorted((src, dst))
            self._queued.append(((low, high, 0 if src == low else 1, len(self._queued)), t, src, dst))
        return P2PWork(self, tensors)

    @_x64_if_loaded
    def flush(self) -> None:
        """Run the queued sends and receives (see the module's docstring)."""
        queued, self._queued = sorted(self._queued, key=lambda q: q[0]), []
        for _, t, src, dst in queued:
            peer = dst if src == self._rank else src
            sender = 0 if src < dst else 1
            value = self._pair(t, peer).transfer(_tensors.read(t), sender)
            if dst == self._rank:
                _tensors.write(t, value)

    def _pair(self, t: torch.Tensor, peer: int) -> GroupMesh:
        """The two-device mesh of this rank and ``peer`` (group ranks), met
        once per pair and local device: send/recv run on it as an XLA
        transfer between the two devices (a collective of those two only)."""
        index = t.device.index or 0
        low, high = sorted((self._rank, peer))
        key = (peer, index)
        found = self._pairs.get(key)
        if found is None:
            with self._lock:
                found = self._pairs.get(key)
                if found is None:
                    store = dist.PrefixStore(f"pjrt_p2p/{low}/{high}/{index}", self._store)
                    found = self._pairs[key] = GroupMesh.meet(store, 0 if self._rank == low else 1, 2, index,
                                                               self._timeout, 0)
        return found


class P2PWork(dist.Work):
    """The Work of a queued send or receive: waiting runs the queue."""

    def __init__(self, queue: PointToPoint, tensors: list) -> None:
        super().__init__()
        self._queue = queue
        self._tensors = tensors

    def wait(self, timeout: Any = None) -> bool:
        if self._queue.pending:
            self._queue.flush()
        return True

    def is_completed(self) -> bool:
        return not self._queue.pending

    def get_future(self) -> Any:
        self.wait()
        future = torch.futures.Future()
        future.set_result(self._tensors)
        return future
