"""The ``tpu`` device plugin: :class:`TpuPlugin`."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from pjrt_host import ClientOption, DevicePlugin

from . import _env, _hardware, _topology

__all__ = ["TpuPlugin"]

logger = logging.getLogger(__name__)

_INSTALL_HINT = (
    "Install it with `pip install 'pjrt-host-tpu[libtpu]'` (or `pip install libtpu`), "
    "or point TPU_LIBRARY_PATH at a libtpu.so."
)


def _libtpu_library() -> str:
    """``libtpu.get_library_path()``, keeping the environment as it was:
    importing ``libtpu`` sets ``TPU_LIBRARY_PATH`` when it is unset, and
    listing plugins must not change the process's environment."""
    had_override = "TPU_LIBRARY_PATH" in os.environ
    try:
        import libtpu
    except ImportError as err:
        raise FileNotFoundError(f"libtpu is not installed. {_INSTALL_HINT}") from err
    finally:
        if not had_override:
            os.environ.pop("TPU_LIBRARY_PATH", None)
    return os.path.abspath(libtpu.get_library_path())


def _framework_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("pjrt-host")
    except metadata.PackageNotFoundError:  # running from a source tree
        import pjrt_host

        return str(getattr(pjrt_host, "__version__", "0"))


class TpuPlugin(DevicePlugin):
    """Google Cloud TPUs through libtpu.

    ``pci_devices`` is where PCI devices are listed (see
    :mod:`pjrt_host_tpu._hardware`) and ``topology`` returns the slice's
    :class:`~pjrt_host_tpu._topology.TpuTopology` (default: from the
    metadata server or the environment).  The host constructs the plugin
    with no arguments; tests pass a fake tree and a fake topology.
    """

    display_name = "Google Cloud TPU"
    priority = 200  # a real accelerator: chosen over CPU and jax's own plugins
    # TPUs have no 64-bit floating point: float64 tensors become float32.
    unsupported_dtypes = {"float64": "float32"}
    # TPU gathers are faster as one-hot matmuls for all but very sparse ones.
    dense_gather_factor = _env.dense_gather_factor()

    def __init__(
        self,
        pci_devices: str = _hardware.SYSFS_PCI_DEVICES,
        topology: Callable[[], _topology.TpuTopology] | None = None,
    ) -> None:
        self._pci_devices = pci_devices
        self._topology_source = topology or _topology.discover_topology

    # -- the library --------------------------------------------------------

    def library_path(self) -> str:
        override = _env.library_path_override()
        if override is not None:
            if not os.path.isfile(override):
                raise FileNotFoundError(
                    f"TPU_LIBRARY_PATH={override!r} is not a file; set it to a libtpu.so, or unset it "
                    "to use the libtpu package's")
            return os.path.abspath(override)
        return _libtpu_library()

    # -- the hardware -------------------------------------------------------

    def physical_chip_count(self) -> int:
        override = _env.chip_count_override()
        chips = override if override is not None else len(_hardware.pci_tpu_chips(self._pci_devices))
        return _hardware.visible_chip_count(chips, _env.visible_chips())

    def host_index(self) -> int | None:
        """``TPU_WORKER_ID``, else the worker id in the metadata of a Cloud
        TPU VM; None where neither is known (no TPU here, or GKE without the
        variable), and the host falls back to the launcher's node rank."""
        worker = _env.worker_id()
        if worker is not None:
            return worker
        if _env.skip_metadata_query() or self.physical_chip_count() == 0:
            return None
        try:
            return self._topology_source().worker_id
        except (RuntimeError, OSError, ValueError) as err:
            logger.info("no TPU worker id (%s); the host derives the host index", err)
            return None

    # -- processes ----------------------------------------------------------

    def configure_single_process(self) -> None:
        """One process owns every chip of the host: that is libtpu's own
        default (on a multi-host slice it reads the layout from the
        metadata server), so no topology is set.  torch_xla's
        single-process mode pins the process to chip 0 instead; set
        ``TPU_VISIBLE_CHIPS=0 TPU_CHIPS_PER_PROCESS_BOUNDS=1,1,1
        TPU_PROCESS_BOUNDS=1,1,1`` for that.

        On a host without TPU chips, ``ALLOW_MULTIPLE_LIBTPU_LOAD=1`` is set
        (unless the user set it): libtpu's host-wide lock file
        (``/tmp/libtpu_lockfile``) guards chips, and without chips it only
        turns "no TPU found" into a lock error whenever any other process
        (e.g. jax starting its own TPU backend) has loaded libtpu."""
        if self.physical_chip_count() == 0:
            os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

    def configure_multiprocess(self, local_rank: int, local_world_size: int) -> None:
        """One process per chip: set the libtpu variables of
        :data:`~pjrt_host_tpu._topology.TOPOLOGY_VARIABLES` that the user
        has not set.  The slice's topology is read only when one of them is
        missing."""
        if self.physical_chip_count() == 0:
            # No chips to lay out; see configure_single_process.
            os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
            return
        missing = [name for name in _topology.TOPOLOGY_VARIABLES if not os.environ.get(name, "").strip()]
        if not missing:
            return
        values = _topology.multiprocess_environment(
            self._topology_source(), local_rank, local_world_size, _env.base_port())
        for name in missing:
            os.environ[name] = values[name]

    def client_create_options(self) -> Mapping[str, ClientOption]:
        return {
            "max_inflight_computations": _env.max_inflight_computations(),
            "ml_framework_name": "PyTorch/pjrt_host",
            "ml_framework_version": _framework_version(),
        }

    def mesh_device_order(self, mesh_shape: tuple[int, ...], devices: list[Any]) -> list[int] | None:
        """TPU chips sit on a torus (ICI): jax's ``create_device_mesh`` lays
        a logical mesh over it so that each mesh axis follows physical links
        (neighbours adjacent, rings closed), which is what makes collectives
        along an axis fast.  Devices without coordinates (e.g. a test
        double) keep id order."""
        if not all(hasattr(d, "coords") for d in devices):
            return None
        from jax.experimental import mesh_utils

        arranged = mesh_utils.create_device_mesh(tuple(mesh_shape), devices)
        position = {d.id: i for i, d in enumerate(devices)}
        return [position[d.id] for d in arranged.flat]
