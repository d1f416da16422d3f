"""Every environment variable the TPU plugin reads, one small function each.

The names are those of libtpu, Cloud TPU VMs, GKE and torch_xla, so that an
environment written for any of them keeps working.  The topology variables
the plugin *sets* (``TPU_PROCESS_BOUNDS``, ``TPU_VISIBLE_CHIPS``...) are
listed in :mod:`pjrt_host_tpu._topology`.  A value that cannot be parsed
raises ValueError naming the variable and what it accepts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = [
    "accelerator_type",
    "base_port",
    "chip_count_override",
    "chips_per_host_bounds",
    "dense_gather_factor",
    "host_bounds",
    "library_path_override",
    "max_inflight_computations",
    "metadata_host",
    "metadata_timeout",
    "skip_metadata_query",
    "visible_chips",
    "worker_hostnames",
    "worker_id",
]


def library_path_override(environ: Mapping[str, str] = os.environ) -> str | None:
    """``TPU_LIBRARY_PATH``: the libtpu to load instead of the ``libtpu``
    package's.  Default: unset.  (Importing ``libtpu`` sets it to its own
    library when unset; the plugin undoes that side effect.)"""
    return _get(environ, "TPU_LIBRARY_PATH")


def chip_count_override(environ: Mapping[str, str] = os.environ) -> int | None:
    """``TPU_NUM_DEVICES``: the number of TPU chips to report instead of
    scanning PCI (e.g. where /sys is not mounted).  Default: unset."""
    value = _get(environ, "TPU_NUM_DEVICES")
    if value is None:
        return None
    count = _int(value, "TPU_NUM_DEVICES", "a whole number of TPU chips")
    if count < 0:
        raise ValueError(f"TPU_NUM_DEVICES={value!r} is negative; expected a whole number of TPU chips")
    return count


def visible_chips(environ: Mapping[str, str] = os.environ) -> list[int] | None:
    """``TPU_VISIBLE_CHIPS``: comma-separated chip indices this process may
    use, as libtpu reads it.  Default: unset (or empty), every chip."""
    value = _get(environ, "TPU_VISIBLE_CHIPS")
    if value is None:
        return None
    return [_int(part.strip(), "TPU_VISIBLE_CHIPS", "a comma-separated list of chip indices, e.g. 0,1")
            for part in value.split(",") if part.strip()]


def max_inflight_computations(environ: Mapping[str, str] = os.environ) -> int:
    """``XLA_TPU_MAX_INFLIGHT_COMPUTATIONS``: computations the client may
    have queued per device.  Default 32 (torch_xla's and jax's)."""
    value = _get(environ, "XLA_TPU_MAX_INFLIGHT_COMPUTATIONS")
    if value is None:
        return 32
    count = _int(value, "XLA_TPU_MAX_INFLIGHT_COMPUTATIONS", "a whole number of computations")
    if count < 1:
        raise ValueError(f"XLA_TPU_MAX_INFLIGHT_COMPUTATIONS={value!r} must be at least 1")
    return count


def dense_gather_factor(environ: Mapping[str, str] = os.environ) -> int:
    """``XLA_DENSE_GATHER_FACTOR``: see ``DevicePlugin.dense_gather_factor``.
    Read once, when the plugin is loaded.  Default 8192 (torch_xla's for TPU)."""
    value = _get(environ, "XLA_DENSE_GATHER_FACTOR")
    if value is None:
        return 8192
    factor = _int(value, "XLA_DENSE_GATHER_FACTOR", "a whole number")
    if factor < 0:
        raise ValueError(f"XLA_DENSE_GATHER_FACTOR={value!r} is negative; 0 turns dense gathers off")
    return factor


def base_port(environ: Mapping[str, str] = os.environ) -> int:
    """``PJRT_HOST_TPU_BASE_PORT``: the first of the ports that the processes
    of a host listen on (process ``local_rank`` uses ``base + local_rank``).
    Default 8476 (torch_xla's)."""
    value = _get(environ, "PJRT_HOST_TPU_BASE_PORT")
    if value is None:
        return 8476
    port = _int(value, "PJRT_HOST_TPU_BASE_PORT", "a TCP port number")
    if not 0 < port < 65536:
        raise ValueError(f"PJRT_HOST_TPU_BASE_PORT={value!r} is not a TCP port number (1-65535)")
    return port


# -- the topology, where the cluster sets it in the environment (GKE) ---------


def skip_metadata_query(environ: Mapping[str, str] = os.environ) -> bool:
    """``TPU_SKIP_MDS_QUERY``: when set to anything, the topology comes from
    the environment variables below instead of the GCE metadata server (GKE
    sets it; jax sets it on machines without TPU chips).  Default: unset."""
    return _get(environ, "TPU_SKIP_MDS_QUERY") is not None


def accelerator_type(environ: Mapping[str, str] = os.environ) -> str | None:
    """``TPU_ACCELERATOR_TYPE``: e.g. ``v4-16``, ``v5litepod-8``.  Default: unset."""
    return _get(environ, "TPU_ACCELERATOR_TYPE")


def host_bounds(environ: Mapping[str, str] = os.environ) -> str | None:
    """``TPU_HOST_BOUNDS``: the slice's hosts as an ``x,y,z`` mesh.  Default: unset."""
    return _get(environ, "TPU_HOST_BOUNDS")


def chips_per_host_bounds(environ: Mapping[str, str] = os.environ) -> str | None:
    """``TPU_CHIPS_PER_HOST_BOUNDS``: one host's chips as an ``x,y,z`` mesh.
    Default: unset."""
    return _get(environ, "TPU_CHIPS_PER_HOST_BOUNDS")


def worker_id(environ: Mapping[str, str] = os.environ) -> int | None:
    """``TPU_WORKER_ID``: this host's index in the slice.  Default: unset."""
    value = _get(environ, "TPU_WORKER_ID")
    return None if value is None else _int(value, "TPU_WORKER_ID", "a whole number")


def worker_hostnames(environ: Mapping[str, str] = os.environ) -> list[str] | None:
    """``TPU_WORKER_HOSTNAMES``: the slice's hosts in worker order,
    comma-separated.  Default: unset."""
    value = _get(environ, "TPU_WORKER_HOSTNAMES")
    return None if value is None else [h.strip() for h in value.split(",") if h.strip()]


# -- the GCE metadata server ---------------------------------------------------


def metadata_host(environ: Mapping[str, str] = os.environ) -> str:
    """``GCE_METADATA_IP``: host (and port) of the GCE metadata server.
    Default ``metadata.google.internal``."""
    return _get(environ, "GCE_METADATA_IP") or "metadata.google.internal"


def metadata_timeout(environ: Mapping[str, str] = os.environ) -> float:
    """``PJRT_HOST_TPU_METADATA_TIMEOUT``: seconds to wait for the metadata
    server.  Default 10."""
    value = _get(environ, "PJRT_HOST_TPU_METADATA_TIMEOUT")
    if value is None:
        return 10.0
    try:
        timeout = float(value)
    except ValueError:
        timeout = -1.0
    if timeout <= 0:
        raise ValueError(f"PJRT_HOST_TPU_METADATA_TIMEOUT={value!r} is not a positive number of seconds")
    return timeout


def _get(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


def _int(value: str, name: str, expected: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not {expected}") from None
