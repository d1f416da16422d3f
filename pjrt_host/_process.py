"""Process set-up that must happen before the client exists.

PJRT knows processes, not hosts or "local" ranks, and a client must be told
which devices and which peers it has when it is created, not after.  This
module is the one mechanism that does it, whether a program calls
``pjrt_host.distributed.initialize()`` or just ``pjrt_host.devices()``:

1. :func:`detect_layout` reads the launcher's environment: torchrun's
   (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
   ``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), else a cluster that
   jax's own cluster detection recognises (SLURM, Open MPI, ...), else one
   process alone.
2. :func:`configure` (called by the runtime right before it creates the
   client) calls the plugin's ``configure_multiprocess(local_rank,
   local_world_size)`` or ``configure_single_process()``, then starts or joins
   jax.distributed's coordination service where several processes need it,
   with bounded timeouts.
3. :func:`client_options` gives the client its ``node_id`` and ``num_nodes``.

Every environment variable is read in one small function below.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import socket
import sys
import threading
import time
from typing import Any, Iterator

from . import _coordination_service, _env, _jax_settings
from ._discovery import PluginRecord
from ._errors import ClientCreationError, cause_text

__all__ = [
    "CoordinatorUnreachableError",
    "DistributedSetupError",
    "ProcessLayout",
    "client_options",
    "configure",
    "current_layout",
    "detect_layout",
    "is_coordinated",
    "leave_coordinator",
]

logger = logging.getLogger(__name__)


# -- errors ---------------------------------------------------------------------


class DistributedSetupError(ClientCreationError):
    """The process could not be set up to run with its peers: the plugin's
    ``configure_multiprocess`` raised, the launcher's environment is
    inconsistent, or the coordinator could not be started or joined.
    ``plugin`` names the plugin in use; the original error is the cause."""


class CoordinatorUnreachableError(DistributedSetupError):
    """Nothing answered at the coordinator's address in time.  ``address``
    is the ``host:port`` that was tried and ``timeout`` the seconds waited."""

    def __init__(self, plugin: str, distribution: str | None, message: str, address: str, timeout: float) -> None:
        super().__init__(plugin, distribution, message)
        self.address = address
        self.timeout = timeout


# -- the layout -----------------------------------------------------------------


class ProcessLayout:
    """Where this process sits in the job.  Every field is known before the
    client exists."""

    __slots__ = (
        "rank",
        "world_size",
        "local_rank",
        "local_world_size",
        "host_index",
        "host_count",
        "coordinator_address",
        "launcher",
    )

    def __init__(
        self,
        rank: int = 0,
        world_size: int = 1,
        local_rank: int = 0,
        local_world_size: int = 1,
        host_index: int = 0,
        host_count: int = 1,
        coordinator_address: str | None = None,
        launcher: str = "single process",
    ) -> None:
        self.rank = rank  #: index of this process among all processes (jax's process_index)
        self.world_size = world_size  #: number of processes in the job
        self.local_rank = local_rank  #: index of this process among those on its host
        self.local_world_size = local_world_size  #: number of processes on this host
        self.host_index = host_index  #: index of this host among all hosts
        self.host_count = host_count  #: number of hosts
        self.coordinator_address = coordinator_address  #: ``host:port`` of jax's coordinator, if any
        self.launcher = launcher  #: where the layout came from ("torchrun", "slurm", ...)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items())
        return f"ProcessLayout({fields})"


def detect_layout(plugin: Any | None = None) -> ProcessLayout:
    """The layout from the launcher's environment; ``plugin.host_index()``
    wins over the launcher's node rank when it is not None."""
    layout = _torchrun_layout()
    if layout is None and _env.cluster_detection_enabled():
        layout = _cluster_layout()
    if layout is None:
        layout = ProcessLayout()
    if plugin is not None:
        host = plugin.host_index()
        if host is not None:
            layout.host_index = int(host)
    _check(layout)
    return layout


def _torchrun_layout() -> ProcessLayout | None:
    rank, world = _env.integer("RANK"), _env.integer("WORLD_SIZE")
    if rank is None or world is None:
        return None
    local_rank = _env.integer("LOCAL_RANK")
    local_world = _env.integer("LOCAL_WORLD_SIZE")
    if local_world is None:
        local_world = 1
    if local_rank is None:
        local_rank = rank % local_world
    host = _env.integer("GROUP_RANK")
    if host is None:
        host = _env.integer("NODE_RANK")
    if host is None:
        host = rank // local_world
    hosts = _env.integer("GROUP_WORLD_SIZE")
    if hosts is None:
        hosts = math.ceil(world / local_world)
    return ProcessLayout(rank, world, local_rank, local_world, host, hosts, _torchrun_coordinator(), "torchrun")


def _torchrun_coordinator() -> str | None:
    explicit = _env.coordinator_address()
    if explicit is not None:
        return explicit
    master = _env.text("MASTER_ADDR")
    if master is None:
        return None
    port = _env.coordinator_port()
    if port is None:
        master_port = _env.integer("MASTER_PORT")
        if master_port is None:
            return None
        port = master_port + 1
    return _join_host_port(master, port)


# Per cluster (jax's ClusterEnv.name): the variables that give the number of
# processes on this host and the host's index, which jax does not expose.
_CLUSTER_LOCAL_SIZE = {"slurm": ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"), "ompi": ("OMPI_COMM_WORLD_LOCAL_SIZE",)}
_CLUSTER_HOST_INDEX = {"slurm": ("SLURM_NODEID",)}


def _cluster_layout() -> ProcessLayout | None:
    try:
        from jax._src import clusters
    except Exception as err:  # pragma: no cover - broken jax install
        logger.info("jax cluster detection unavailable (%s)", err)
        return None
    env = next((c for c in clusters.ClusterEnv._cluster_types
                if not c.opt_in_only_method and c.is_env_present()), None)
    if env is None:
        return None
    rank, world = env.get_process_id(), env.get_process_count()
    local_rank = env.get_local_process_id()
    local_world = _first_count(_CLUSTER_LOCAL_SIZE.get(env.name, ()))
    if local_world is None:
        local_world = 1
    if local_rank is None:
        local_rank = rank % local_world
    host = _first_count(_CLUSTER_HOST_INDEX.get(env.name, ()))
    if host is None:
        host = rank // local_world
    address = _env.coordinator_address()
    if address is None and world > 1:
        port = _env.coordinator_port()
        address = env.get_coordinator_address(
            timeout_secs=int(_env.coordinator_timeout()), override_coordinator_port=str(port) if port else None)
    return ProcessLayout(rank, world, local_rank, local_world, host, math.ceil(world / local_world),
                         address, env.name or env.__name__)


def _first_count(names: tuple[str, ...]) -> int | None:
    for name in names:
        value = _env.text(name)
        if value is not None:
            # SLURM_TASKS_PER_NODE looks like "4(x2),3": this host's count is
            # the first group's when the job is uniform, which is what we need.
            match = re.match(r"\d+", value)
            if match:
                return int(match.group())
    return None


def _check(layout: ProcessLayout) -> None:
    problems = []
    if layout.world_size < 1:
        problems.append(f"WORLD_SIZE={layout.world_size} is less than 1")
    if not 0 <= layout.rank < max(layout.world_size, 1):
        problems.append(f"RANK={layout.rank} is not in [0, WORLD_SIZE={layout.world_size})")
    if layout.local_world_size < 1:
        problems.append(f"LOCAL_WORLD_SIZE={layout.local_world_size} is less than 1")
    if not 0 <= layout.local_rank < max(layout.local_world_size, 1):
        problems.append(f"LOCAL_RANK={layout.local_rank} is not in [0, LOCAL_WORLD_SIZE={layout.local_world_size})")
    if problems:
        raise ValueError(
            f"pjrt_host: the {layout.launcher} environment is inconsistent: " + "; ".join(problems)
            + ". Start the processes with `python -m pjrt_host launch` or torchrun, which set these.")


def _join_host_port(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def _split_host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"coordinator address {address!r} is not host:port")
    return host.strip("[]"), int(port)


# -- set-up ---------------------------------------------------------------------


class _Setup:
    __slots__ = ("layout", "coordinated")

    def __init__(self, layout: ProcessLayout, coordinated: bool) -> None:
        self.layout = layout  #: the layout the client was created with
        self.coordinated = coordinated  #: whether jax.distributed is running in this process


_lock = threading.Lock()
_setup: _Setup | None = None


def current_layout() -> ProcessLayout | None:
    """The layout the client was created with, or None before that."""
    return _setup.layout if _setup is not None else None


def is_coordinated() -> bool:
    """Whether this process has joined jax.distributed's coordinator."""
    return _setup is not None and _setup.coordinated


def configure(record: PluginRecord) -> None:
    """Prepare this process for ``record``'s client: the plugin's configure
    hook, then jax's coordinator where needed.  Called once, by the runtime,
    right before it creates the client."""
    global _setup
    plugin = record.plugin
    assert plugin is not None
    with _lock:
        try:
            layout = detect_layout(plugin)
        except Exception as err:
            raise _error(record, "the process layout could not be read from the launcher's environment", err,
                         "Start the processes with `python -m pjrt_host launch` or torchrun.") from err
        _call_configure(record, layout)
        coordinated = _join_coordinator(record, layout)
        _setup = _Setup(layout, coordinated)
        logger.info("%r", layout)


def leave_coordinator() -> None:
    """Leave jax.distributed's coordinator, waiting for every process to
    leave too (jax does it at interpreter exit; a process ended with
    ``os._exit`` must do it first)."""
    if is_coordinated():
        import jax

        _coordination_service.leave()
        jax.distributed.shutdown()


def client_options(record: PluginRecord) -> dict[str, Any]:
    """Create options the host adds for every plugin: this process's
    ``node_id`` and the ``num_nodes`` of the job when it runs under jax's
    coordinator (a PJRT client counts processes as nodes)."""
    if _setup is None or not _setup.coordinated:
        return {}
    return {"node_id": _setup.layout.rank, "num_nodes": _setup.layout.world_size}


def _call_configure(record: PluginRecord, layout: ProcessLayout) -> None:
    plugin = record.plugin
    if layout.world_size > 1:
        call = f"configure_multiprocess(local_rank={layout.local_rank}, local_world_size={layout.local_world_size})"
    else:
        call = "configure_single_process()"
    try:
        if layout.world_size > 1:
            plugin.configure_multiprocess(layout.local_rank, layout.local_world_size)
        else:
            plugin.configure_single_process()
    except Exception as err:
        raise _error(record, f"{call} raised on rank {layout.rank} of {layout.world_size}", err,
                     f"This is a bug or a missing requirement of plugin {record.name!r}; report it to the "
                     f"maintainers of {record.distribution or 'the plugin'}, or choose another plugin with "
                     "PJRT_DEVICE=NAME.") from err


def _join_coordinator(record: PluginRecord, layout: ProcessLayout) -> bool:
    from jax._src import distributed as jax_distributed
    from jax._src import xla_bridge

    state = jax_distributed.global_state
    if state.client is not None:
        # The program called jax.distributed.initialize() itself: adopt it.
        layout.rank, layout.world_size = state.process_id, state.num_processes
        return True
    if layout.world_size <= 1:
        return False
    plugin = record.plugin
    required = bool(plugin.requires_xla_coordinator())
    if _env.coordinator_mode() == "off":
        if required:
            raise _error(record, "the plugin requires jax.distributed's coordinator with several processes, "
                         "but PJRT_HOST_XLA_COORDINATOR=off", None, "Unset PJRT_HOST_XLA_COORDINATOR.")
        return False
    address = layout.coordinator_address
    if address is None:
        raise _error(record, f"rank {layout.rank} of {layout.world_size} does not know where the coordinator is",
                     None, "Set MASTER_ADDR and MASTER_PORT (torchrun and `python -m pjrt_host launch` do), "
                     "or PJRT_HOST_COORDINATOR_ADDRESS=host:port.")
    if xla_bridge.backends_are_initialized():
        raise _error(record, "jax's backends were initialised before the multi-process set-up", None,
                     "Call pjrt_host.distributed.initialize() (or pjrt_host.devices()) before any jax "
                     "computation or jax.devices().")
    timeout = _env.coordinator_timeout()
    deadline = time.monotonic() + timeout
    if layout.rank != 0:
        _wait_reachable(record, layout, address, timeout, deadline)
    remaining = max(1, math.ceil(deadline - time.monotonic()))
    host, port = _split_host_port(address)
    import jax

    if not _env.text("JAX_ENABLE_PREEMPTION_SERVICE"):
        _jax_settings.disable_preemption_service()
    # jax aborts the process, with a message of its own, when the other
    # processes do not all join in time; say first what that means here.
    # (Just before jax's own deadline, so the explanation comes first.)
    watchdog = threading.Timer(max(remaining - 1.0, remaining * 0.75), _report_missing_peers,
                               args=(record, layout, address, timeout))
    watchdog.daemon = True
    watchdog.start()
    heartbeat = max(1, math.ceil(_env.heartbeat_timeout()))
    separate = _env.coordination_service_mode() == "process"
    try:
        liveness = None
        if separate and layout.rank == 0:
            bind = _bind_address(host, port) or _env.text("JAX_COORDINATOR_BIND_ADDRESS") or f"[::]:{port}"
            liveness = _coordination_service.start(bind, layout.world_size, heartbeat, timeout)[1]
        with _without_service_in_process(jax_distributed, separate):
            jax.distributed.initialize(
                coordinator_address=address,
                num_processes=layout.world_size,
                process_id=layout.rank,
                cluster_detection_method="deactivate",  # the layout is already known
                initialization_timeout=remaining,
                heartbeat_timeout_seconds=heartbeat,
                coordinator_bind_address=_bind_address(host, port),
            )
        if separate:
            _keep_service_alive(jax_distributed.global_state.client, host, liveness, deadline, layout.rank)
    except Exception as err:
        where = "start" if layout.rank == 0 else "join"
        raise _error(record, f"rank {layout.rank} could not {where} jax.distributed's coordinator at {address}", err,
                     "Check that the port is free on the first host and reachable from every host.") from err
    finally:
        watchdog.cancel()
    logger.info("rank %d of %d joined the coordinator at %s (required by plugin: %s)",
                layout.rank, layout.world_size, address, required)
    return True


@contextlib.contextmanager
def _without_service_in_process(jax_distributed: Any, separate: bool) -> Iterator[None]:
    """While jax.distributed.initialize() runs with ``separate``: process 0
    does not start the coordination service in itself (it runs in a child
    process, :mod:`pjrt_host._coordination_service`, which outlives it) and
    only joins it, as the others do.  jax's initialize() has no such option,
    so its module's ``_jax`` is wrapped for the call."""
    if not separate:
        yield
        return
    real = jax_distributed._jax
    jax_distributed._jax = _JaxModuleWith(real, get_distributed_runtime_service=lambda *a, **k: None)
    try:
        yield
    finally:
        jax_distributed._jax = real


class _JaxModuleWith:
    """jaxlib's ``_jax`` module with some attributes replaced."""

    def __init__(self, module: Any, **replaced: Any) -> None:
        self._module = module
        self.__dict__.update(replaced)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def _keep_service_alive(client: Any, host: str, port: int | None, deadline: float, rank: int) -> None:
    """Every rank holds a connection to the coordination service's process
    while it lives (the process exits when all have closed); rank 0, which
    started it, publishes where in jax's key-value store."""
    if port is not None:
        client.key_value_set(_coordination_service.LIVENESS_KEY, str(port))
    left_ms = max(1000, int((deadline - time.monotonic()) * 1000))
    port = int(client.blocking_key_value_get(_coordination_service.LIVENESS_KEY, left_ms))
    _coordination_service.keep_alive(host, port, rank)


def _report_missing_peers(record: PluginRecord, layout: ProcessLayout, address: str, timeout: float) -> None:
    print(f"pjrt_host: plugin {record.name!r}: rank {layout.rank} of {layout.world_size} is still waiting at "
          f"the coordinator {address} for the other processes to join; when PJRT_HOST_COORDINATOR_TIMEOUT "
          f"({timeout:g} s) runs out, jax.distributed stops this process. Check that all of them were started, "
          "with the same WORLD_SIZE and coordinator address, and that they can reach it.", file=sys.stderr, flush=True)


def _bind_address(host: str, port: int) -> str | None:
    """Where process 0's coordinator listens: the coordinator's own address
    when it is a loopback one, so a one-host job never listens on other
    interfaces; otherwise jax's default (every interface) or
    ``JAX_COORDINATOR_BIND_ADDRESS``."""
    if _env.text("JAX_COORDINATOR_BIND_ADDRESS"):
        return None
    if host == "localhost" or host.startswith("127.") or host == "::1":
        return _join_host_port(host, port)
    return None


def _wait_reachable(record: PluginRecord, layout: ProcessLayout, address: str, timeout: float, deadline: float) -> None:
    # jax's client aborts the whole process (no exception) when it cannot
    # register in time; probing first turns the common case, nothing
    # listening, into an error that names the address.
    host, port = _split_host_port(address)
    last: BaseException | None = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            with socket.create_connection((host, port), timeout=min(1.0, max(left, 0.05))):
                return
        except OSError as err:
            last = err
        time.sleep(min(0.2, max(deadline - time.monotonic(), 0)))
    cause = f": {type(last).__name__}: {last}" if last else ""
    raise CoordinatorUnreachableError(
        record.name, record.distribution,
        f"pjrt_host: plugin {record.name!r}: rank {layout.rank} of {layout.world_size} ({layout.launcher}) could not reach the "
        f"coordinator at {address} within {timeout:g} s{cause}. Check that rank 0 is running on that host and "
        "that this host can reach it; the address comes from PJRT_HOST_COORDINATOR_ADDRESS, else "
        "MASTER_ADDR and PJRT_HOST_COORDINATOR_PORT (default MASTER_PORT + 1). Raise "
        "PJRT_HOST_COORDINATOR_TIMEOUT if the processes start far apart.",
        address, timeout,
    ) from last


def _error(record: PluginRecord, what: str, err: BaseException | None, fix: str) -> DistributedSetupError:
    message = f"pjrt_host: plugin {record.name!r} (from {record.origin()}): {what}"
    if err is not None:
        message += f": {cause_text(err)}"
    return DistributedSetupError(record.name, record.distribution, f"{message}. {fix}")

