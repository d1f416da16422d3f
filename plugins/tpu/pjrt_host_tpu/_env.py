"""Every environment variable the TPU plugin reads, one small function each.

The names are those of libtpu, Cloud TPU VMs, GKE and torch_xla, so that an
environment written for any of them keeps working.  The topology variables
the plugin *sets* (``TPU_PROCESS_BOUNDS``, ``TPU_VISIBLE_CHIPS``...) are
listed in :mod:`pjrt_host_tpu._topology`.  The values are read by the
host's parsers (:mod:`pjrt_host.env`): one that cannot be read raises
``pjrt_host.EnvironmentSettingError`` (a ValueError) naming the variable and
what it accepts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pjrt_host import env

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
    return env.text("TPU_LIBRARY_PATH", environ=environ)


def chip_count_override(environ: Mapping[str, str] = os.environ) -> int | None:
    """``TPU_NUM_DEVICES``: the number of TPU chips to report instead of
    scanning PCI (e.g. where /sys is not mounted).  Default: unset."""
    return env.integer("TPU_NUM_DEVICES", minimum=0, expected="a whole number of TPU chips", environ=environ)


def visible_chips(environ: Mapping[str, str] = os.environ) -> list[int] | None:
    """``TPU_VISIBLE_CHIPS``: comma-separated chip indices this process may
    use, as libtpu reads it.  Default: unset (or empty), every chip."""
    return env.integers("TPU_VISIBLE_CHIPS", expected="a chip index (the list is comma-separated, e.g. 0,1)",
                        environ=environ)


def max_inflight_computations(environ: Mapping[str, str] = os.environ) -> int:
    """``XLA_TPU_MAX_INFLIGHT_COMPUTATIONS``: computations the client may
    have queued per device.  Default 32 (torch_xla's and jax's)."""
    return env.integer("XLA_TPU_MAX_INFLIGHT_COMPUTATIONS", 32, minimum=1, expected="a whole number of computations",
                       environ=environ)


def dense_gather_factor(environ: Mapping[str, str] = os.environ) -> int:
    """``XLA_DENSE_GATHER_FACTOR``: see ``DevicePlugin.dense_gather_factor``.
    Read once, when the plugin is loaded.  Default 8192 (torch_xla's for TPU)."""
    return env.integer("XLA_DENSE_GATHER_FACTOR", 8192, minimum=0,
                       expected="a whole number; 0 turns dense gathers off", environ=environ)


def base_port(environ: Mapping[str, str] = os.environ) -> int:
    """``PJRT_HOST_TPU_BASE_PORT``: the first of the ports that the processes
    of a host listen on (process ``local_rank`` uses ``base + local_rank``).
    Default 8476 (torch_xla's)."""
    return env.integer("PJRT_HOST_TPU_BASE_PORT", 8476, minimum=1, maximum=65535, expected="a TCP port number",
                       environ=environ)


# -- the topology, where the cluster sets it in the environment (GKE) ---------


def skip_metadata_query(environ: Mapping[str, str] = os.environ) -> bool:
    """``TPU_SKIP_MDS_QUERY``: when set to anything, the topology comes from
    the environment variables below instead of the GCE metadata server (GKE
    sets it; jax sets it on machines without TPU chips).  Default: unset."""
    return env.text("TPU_SKIP_MDS_QUERY", environ=environ) is not None


def accelerator_type(environ: Mapping[str, str] = os.environ) -> str | None:
    """``TPU_ACCELERATOR_TYPE``: e.g. ``v4-16``, ``v5litepod-8``.  Default: unset."""
    return env.text("TPU_ACCELERATOR_TYPE", environ=environ)


def host_bounds(environ: Mapping[str, str] = os.environ) -> str | None:
    """``TPU_HOST_BOUNDS``: the slice's hosts as an ``x,y,z`` mesh.  Default: unset."""
    return env.text("TPU_HOST_BOUNDS", environ=environ)


def chips_per_host_bounds(environ: Mapping[str, str] = os.environ) -> str | None:
    """``TPU_CHIPS_PER_HOST_BOUNDS``: one host's chips as an ``x,y,z`` mesh.
    Default: unset."""
    return env.text("TPU_CHIPS_PER_HOST_BOUNDS", environ=environ)


def worker_id(environ: Mapping[str, str] = os.environ) -> int | None:
    """``TPU_WORKER_ID``: this host's index in the slice.  Default: unset."""
    return env.integer("TPU_WORKER_ID", environ=environ)


def worker_hostnames(environ: Mapping[str, str] = os.environ) -> list[str] | None:
    """``TPU_WORKER_HOSTNAMES``: the slice's hosts in worker order,
    comma-separated.  Default: unset."""
    return env.items("TPU_WORKER_HOSTNAMES", environ=environ)


# -- the GCE metadata server ---------------------------------------------------


def metadata_host(environ: Mapping[str, str] = os.environ) -> str:
    """``GCE_METADATA_IP``: host (and port) of the GCE metadata server.
    Default ``metadata.google.internal``."""
    return env.text("GCE_METADATA_IP", "metadata.google.internal", environ=environ)


def metadata_timeout(environ: Mapping[str, str] = os.environ) -> float:
    """``PJRT_HOST_TPU_METADATA_TIMEOUT``: seconds to wait for the metadata
    server.  Default 10."""
    return env.seconds("PJRT_HOST_TPU_METADATA_TIMEOUT", 10.0, environ=environ)

