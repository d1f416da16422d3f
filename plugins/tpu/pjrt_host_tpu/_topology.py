"""The TPU slice's topology, and the libtpu environment of each process.

libtpu reads its process layout from environment variables that must be set
before it is loaded.  With one process per host it works them out itself;
with one process per chip (several processes on a host) they are computed
here, as torch_xla does:

* the slice's *host* layout comes from the GCE metadata server (Cloud TPU
  VMs) or from environment variables (GKE, ``TPU_SKIP_MDS_QUERY``), as a
  :class:`TpuTopology`;
* :func:`multiprocess_environment` turns it into the variables of one
  process: one chip each (``TPU_VISIBLE_CHIPS``, bounds ``1,1,1``), the
  process mesh (host mesh times chips per host), a task id and every
  process's address.
"""

from __future__ import annotations

import dataclasses
import os
import urllib.request
from collections.abc import Callable, Mapping

from . import _env

__all__ = [
    "TOPOLOGY_VARIABLES",
    "TpuTopology",
    "discover_topology",
    "fetch_metadata",
    "multiprocess_environment",
    "parse_bounds",
    "parse_tpu_env",
    "parse_worker_endpoints",
    "topology_from_env",
    "topology_from_metadata",
]

#: The variables :func:`multiprocess_environment` computes.  A value the
#: user already set is never replaced.
TOPOLOGY_VARIABLES = (
    "TPU_CHIPS_PER_PROCESS_BOUNDS",
    "TPU_PROCESS_BOUNDS",
    "CLOUD_TPU_TASK_ID",
    "TPU_PROCESS_ADDRESSES",
    "TPU_VISIBLE_CHIPS",
    "TPU_PROCESS_PORT",
    "ALLOW_MULTIPLE_LIBTPU_LOAD",
)

# TPU v2 and v3 metadata has no bounds: their host meshes are fixed by the
# slice size, with 2x2x1 chips per host.
_V2_V3_HOST_BOUNDS = {
    "v2-8": "1,1,1", "v2-32": "2,2,1", "v2-128": "4,4,1", "v2-256": "4,8,1", "v2-512": "8,8,1",
    "v3-8": "1,1,1", "v3-32": "2,2,1", "v3-64": "2,4,1", "v3-128": "4,4,1", "v3-256": "4,8,1",
    "v3-512": "8,8,1", "v3-1024": "8,16,1", "v3-2048": "16,16,1",
}
_V2_V3_CHIPS_PER_HOST = "2,2,1"

Bounds = tuple[int, int, int]


@dataclasses.dataclass(frozen=True, slots=True)
class TpuTopology:
    """What the slice looks like from one host."""

    #: e.g. ``v4-16``; used for v2/v3, whose metadata carries no bounds.
    accelerator_type: str | None
    #: The slice's hosts as an x,y,z mesh (None: unknown).
    host_bounds: Bounds | None
    #: One host's chips as an x,y,z mesh (None: unknown).
    chips_per_host_bounds: Bounds | None
    #: This host's index among the slice's hosts.
    worker_id: int
    #: Every host's address, in worker order (one entry for one host).
    worker_addresses: tuple[str, ...]


def parse_bounds(text: str, what: str) -> Bounds:
    """``"2,2,1"`` -> ``(2, 2, 1)``; ValueError naming ``what`` otherwise."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"{what}={text!r} is not a TPU mesh shape; expected three positive integers like 2,2,1")
    return int(parts[0]), int(parts[1]), int(parts[2])


def topology_from_env(environ: Mapping[str, str] = os.environ) -> TpuTopology:
    """The topology GKE (or a user, with ``TPU_SKIP_MDS_QUERY``) puts in the
    environment: see the ``_env`` functions it reads."""
    hosts = _env.host_bounds(environ)
    chips = _env.chips_per_host_bounds(environ)
    return TpuTopology(
        accelerator_type=_env.accelerator_type(environ),
        host_bounds=parse_bounds(hosts, "TPU_HOST_BOUNDS") if hosts else None,
        chips_per_host_bounds=parse_bounds(chips, "TPU_CHIPS_PER_HOST_BOUNDS") if chips else None,
        worker_id=_env.worker_id(environ) or 0,
        worker_addresses=tuple(_env.worker_hostnames(environ) or ("localhost",)),
    )


MetadataFetcher = Callable[[str], str]


def fetch_metadata(key: str, environ: Mapping[str, str] = os.environ) -> str:
    """The instance attribute ``key`` from the GCE metadata server (never
    through a proxy: the server is link-local)."""
    url = f"http://{_env.metadata_host(environ)}/computeMetadata/v1/instance/attributes/{key}"
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=_env.metadata_timeout(environ)) as response:
        return response.read().decode("utf-8")


def parse_tpu_env(text: str) -> dict[str, str]:
    """The ``tpu-env`` attribute: one ``KEY: 'value'`` per line."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            values[key.strip()] = value.strip().strip("'\"")
    return values


def parse_worker_endpoints(text: str) -> tuple[str, ...]:
    """The ``worker-network-endpoints`` attribute: ``name:uid:ip`` triples
    (older VMs) or plain hostnames, comma-separated."""
    addresses = []
    for worker in (w.strip() for w in text.split(",")):
        if not worker:
            continue
        parts = worker.split(":")
        if len(parts) == 3:
            addresses.append(parts[2])
        elif len(parts) == 1:
            addresses.append(parts[0])
        else:
            raise ValueError(f"unexpected worker-network-endpoints entry {worker!r}")
    return tuple(addresses)


def topology_from_metadata(fetch: MetadataFetcher = fetch_metadata) -> TpuTopology:
    """The topology of a Cloud TPU VM, from its metadata server."""
    tpu_env = parse_tpu_env(fetch("tpu-env"))
    # The host-level keys say what the hardware is; the TPU_* ones are
    # libtpu's default process layout (one process per host on v4).
    hosts = tpu_env.get("HOST_BOUNDS") or tpu_env.get("TPU_PROCESS_BOUNDS")
    chips = tpu_env.get("CHIPS_PER_HOST_BOUNDS") or tpu_env.get("TPU_CHIPS_PER_PROCESS_BOUNDS")
    worker = tpu_env.get("WORKER_ID", "0")
    return TpuTopology(
        accelerator_type=tpu_env.get("ACCELERATOR_TYPE"),
        host_bounds=parse_bounds(hosts, "tpu-env HOST_BOUNDS") if hosts else None,
        chips_per_host_bounds=parse_bounds(chips, "tpu-env CHIPS_PER_HOST_BOUNDS") if chips else None,
        worker_id=int(worker) if worker.isdigit() else 0,
        worker_addresses=parse_worker_endpoints(fetch("worker-network-endpoints")) or ("localhost",),
    )


def discover_topology(environ: Mapping[str, str] = os.environ) -> TpuTopology:
    """From the environment when ``TPU_SKIP_MDS_QUERY`` is set, else from
    the metadata server; raises RuntimeError saying what to set when the
    server cannot be reached."""
    if _env.skip_metadata_query(environ):
        return topology_from_env(environ)
    try:
        return topology_from_metadata(lambda key: fetch_metadata(key, environ))
    except (OSError, ValueError) as err:
        raise RuntimeError(
            f"the TPU topology could not be read from the GCE metadata server at "
            f"{_env.metadata_host(environ)} ({err}). Outside a Cloud TPU VM, set TPU_SKIP_MDS_QUERY=1 "
            "with TPU_ACCELERATOR_TYPE, TPU_HOST_BOUNDS, TPU_CHIPS_PER_HOST_BOUNDS, TPU_WORKER_ID and "
            "TPU_WORKER_HOSTNAMES, or set the process variables (TPU_PROCESS_BOUNDS, TPU_VISIBLE_CHIPS...) "
            "yourself") from err


def multiprocess_environment(topology: TpuTopology, local_rank: int, local_world_size: int,
                             base_port: int) -> dict[str, str]:
    """The libtpu variables of process ``local_rank`` of ``local_world_size``
    on this host, one chip per process.  Raises ValueError when the
    processes of a host are not one per chip."""
    if local_world_size < 1 or not 0 <= local_rank < local_world_size:
        raise ValueError(f"local_rank={local_rank} is not a rank among local_world_size={local_world_size} processes")
    host_bounds, chips = topology.host_bounds, topology.chips_per_host_bounds
    if (host_bounds is None or chips is None) and topology.accelerator_type in _V2_V3_HOST_BOUNDS:
        host_bounds = parse_bounds(_V2_V3_HOST_BOUNDS[topology.accelerator_type], "host bounds")
        chips = parse_bounds(_V2_V3_CHIPS_PER_HOST, "chips per host")
    if host_bounds is None or chips is None:
        raise ValueError(
            f"the host and chip bounds of TPU {topology.accelerator_type or '(unknown type)'} are unknown: set "
            "TPU_HOST_BOUNDS and TPU_CHIPS_PER_HOST_BOUNDS (with TPU_SKIP_MDS_QUERY=1), or the process "
            "variables TPU_PROCESS_BOUNDS and TPU_CHIPS_PER_PROCESS_BOUNDS yourself")
    chips_per_host = chips[0] * chips[1] * chips[2]
    # Bounds of 1,1,1 chips describe a layout that is already one chip per
    # process (the metadata of some single-host slices): the process mesh
    # is then the host mesh and says nothing about processes per host.
    if chips_per_host > 1 and local_world_size != chips_per_host:
        raise ValueError(
            f"{local_world_size} processes share this host but libtpu runs one process per chip here and the "
            f"host has {chips_per_host} chips ({_text(chips)}): run {chips_per_host} processes per host, "
            "or one process that owns every chip")
    process_bounds = tuple(h * c for h, c in zip(host_bounds, chips))
    ports = [base_port + i for i in range(local_world_size)]
    # One host: its processes talk over loopback, whatever the host is called.
    hosts = topology.worker_addresses if len(topology.worker_addresses) > 1 else ("localhost",)
    return {
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": _text(process_bounds),
        "CLOUD_TPU_TASK_ID": str(topology.worker_id * local_world_size + local_rank),
        "TPU_PROCESS_ADDRESSES": ",".join(f"{host}:{port}" for host in hosts for port in ports),
        "TPU_VISIBLE_CHIPS": str(local_rank),
        "TPU_PROCESS_PORT": str(ports[local_rank]),
        # Each process loads libtpu for its own chip; without this, libtpu's
        # lock file lets only the first process of the host start.
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    }


def _text(bounds: tuple[int, ...]) -> str:
    return ",".join(str(d) for d in bounds)

