"""jax's coordination service in a process of its own, so that it outlives
the job's rank 0.

jax.distributed runs the coordination service (XLA's
``DistributedRuntimeService``) inside process 0.  When process 0 dies, the
others' clients can no longer send it heartbeats, and XLA's client ends
them at once (``LOG(QFATAL)`` in its default ``missed_heartbeat_callback``:
"Terminating process because the JAX distributed service detected fatal
errors"); a callback of our own cannot replace it from Python (jaxlib
0.10.2 cannot hand the callback its ``absl::Status``: the process ends with
``std::bad_cast``).  So rank 0 starts the service here, in a child process
(``python -m pjrt_host._coordination_service``), and only joins it as a
client.

The service is made ``recoverable``: a process that stops sending
heartbeats is marked dead, but the error is not sent to the others (XLA's
``coordination_service.cc``: "All tasks are recoverable, skip propagating
error"), so they are not ended either; they learn of the death from their
next collective, which raises (``_torch/_c10d``).

The child lives as long as some process of the job does: every rank keeps a
TCP connection to it open (:func:`keep_alive`) and the child shuts the
service down and exits when all have closed (a process's connections close
when it exits or dies), or when none came within the start-up timeout.
The same connections tell the ranks of a death at once: a rank says who it
is when it connects and ``bye`` when it exits (``atexit``); a connection
that closes without ``bye`` is a dead rank, and the child sends ``dead R``
to every other rank (:mod:`pjrt_host._peers` keeps it, names it in the
collectives' errors, and ends a survivor that has not exited
``PJRT_HOST_DEAD_PEER_GRACE`` seconds later).
It is in rank 0's process group, so a launcher that stops rank 0's group
(torchrun does, with ``killpg``) stops it too.
"""

from __future__ import annotations

import atexit
import math
import os
import select
import selectors
import socket
import subprocess
import sys
import threading
import time
from typing import Any

__all__ = ["LIVENESS_KEY", "keep_alive", "leave", "start"]

#: Key in jax's key-value store under which rank 0 publishes the child's
#: liveness address.
LIVENESS_KEY = "pjrt_host/coordination_service_liveness"

#: Seconds the service keeps running after its start-up deadline, so that
#: the registration barrier's error reaches the clients, and the most its
#: shutdown may take.
_ANSWER_GRACE = 5.0

_kept: list[Any] = []  # this process's liveness connection, and the child's handle


def start(bind_address: str, num_processes: int, heartbeat_timeout: int, timeout: float) -> tuple[Any, int]:
    """Start the service in a child process, listening at ``bind_address``
    (``host:port``); (its Popen, the port of its liveness listener) once it
    listens."""
    host = bind_address.rpartition(":")[0].strip("[]")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pjrt_host._coordination_service", bind_address, str(num_processes),
         str(heartbeat_timeout), str(timeout), host],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, close_fds=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline().split() if ready else []
    if len(line) != 2 or line[0] != "ready":
        if proc.poll() is None:
            proc.kill()
            raise RuntimeError(f"the coordination service's process at {bind_address} was not ready after "
                               f"{timeout:g} s (PJRT_HOST_COORDINATOR_TIMEOUT)")
        code = proc.wait()
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        raise RuntimeError(f"the coordination service's process at {bind_address} {how} before it was ready "
                           "(see its message above; a port in use ends it so: 'Failed to add port to server')")
    _kept.append(proc)
    return proc, int(line[1])


def keep_alive(host: str, port: int, rank: int) -> None:
    """Hold a connection to the service's process for as long as this
    process lives, and hear from it of the ranks that die."""
    sock = socket.create_connection((host, port), timeout=30)
    sock.settimeout(None)
    sock.sendall(f"rank {rank}\n".encode())
    _kept.append(sock)
    listener = threading.Thread(target=_listen, args=(sock, rank), name="pjrt_host dead peers", daemon=True)
    listener.start()
    atexit.register(leave)


def leave() -> None:
    """Say goodbye to the service's process: this rank exits, it did not
    die.  (At exit; ``pjrt_host.spawn``'s processes, which end with
    ``os._exit``, call it first.)"""
    for sock in [k for k in _kept if isinstance(k, socket.socket)]:
        try:
            sock.sendall(b"bye\n")
        except OSError:
            pass


def _listen(sock: socket.socket, me: int) -> None:
    from . import _peers

    buffer = b""
    while True:
        try:
            data = sock.recv(256)
        except OSError:
            return
        if not data:
            return
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            words = line.decode(errors="replace").split()
            if len(words) == 2 and words[0] == "dead" and words[1].isdigit():
                _peers.report_dead(int(words[1]), me)


def _serve(bind_address: str, num_processes: int, heartbeat_timeout: int, timeout: float, host: str) -> int:
    from jaxlib import _jax  # the extension alone: no need for all of jax here

    # The registration barrier gets the job's start-up timeout (XLA's
    # default is an hour): when a process never comes, the service answers
    # the others' RegisterTask with an error at the deadline, while it still
    # runs.  Shutting it down with registrations pending instead can leave
    # a registering client waiting for an answer that never comes.
    service = _jax.get_distributed_runtime_service(
        bind_address, num_processes, heartbeat_timeout=heartbeat_timeout,
        cluster_register_timeout=max(1, math.ceil(timeout)), recoverable=True)
    listener = _listener(host)
    print(f"ready {listener.getsockname()[1]}", flush=True)
    sys.stdout.close()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    seen = 0
    ranks: dict[Any, list] = {}  # connection -> [its rank or None, said bye, unread bytes]
    last_change = time.monotonic()
    while True:
        # Every rank came and all have gone: the job is over.  Or nobody
        # has been here for the start-up timeout, and the registration
        # barrier's error has had time to reach those who came.
        if not ranks and (seen >= num_processes or time.monotonic() - last_change > timeout + _ANSWER_GRACE):
            break
        for key, _ in selector.select(timeout=1.0):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                selector.register(conn, selectors.EVENT_READ)
                ranks[conn] = [None, False, b""]
                seen += 1
            else:
                conn = key.fileobj
                try:
                    data = conn.recv(256)
                except OSError:
                    data = b""
                state = ranks[conn]
                if data:
                    state[2] += data
                    while b"\n" in state[2]:
                        line, state[2] = state[2].split(b"\n", 1)
                        words = line.decode(errors="replace").split()
                        if len(words) == 2 and words[0] == "rank" and words[1].isdigit():
                            state[0] = int(words[1])
                        elif words == ["bye"]:
                            state[1] = True
                    continue
                selector.unregister(conn)
                conn.close()
                del ranks[conn]
                if state[0] is not None and not state[1]:  # closed without a goodbye: it died
                    for other in ranks:
                        try:
                            other.sendall(f"dead {state[0]}\n".encode())
                        except OSError:
                            pass
            last_change = time.monotonic()
    _shutdown(service)
    return 0


def _shutdown(service: Any) -> None:
    """Shut the service down, but never wait for it longer than
    ``_ANSWER_GRACE`` seconds: XLA's server can wait forever on a call it
    will not answer, and a process that exits closes every connection, so
    its clients fail instead of waiting."""
    done = threading.Thread(target=service.shutdown, name="pjrt_host service shutdown", daemon=True)
    done.start()
    done.join(_ANSWER_GRACE)


def _listener(host: str) -> socket.socket:
    """A listening socket on ``host`` (every interface for '::' or '',
    IPv4 too where IPv6 sockets take it, else IPv4 only)."""
    if host in ("", "::", "0.0.0.0"):
        try:
            sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(("::", 0))
        except OSError:  # no IPv6 here
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("0.0.0.0", 0))
    else:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((host, 0))
    sock.listen(64)
    return sock


if __name__ == "__main__":
    bind, n, heartbeat, wait, where = sys.argv[1:6]
    os._exit(_serve(bind, int(n), int(heartbeat), float(wait), where))
