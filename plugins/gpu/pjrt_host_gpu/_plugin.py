"""The ``cuda`` device plugin: :class:`CudaPlugin`."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import os
from collections.abc import Mapping
from typing import Any

from pjrt_host import ClientOption, DevicePlugin

from . import _env, _hardware

__all__ = ["CudaPlugin", "library_candidates"]

logger = logging.getLogger(__name__)

#: jax's PJRT wheels, newest CUDA first: (jax_plugins module, distribution).
#: Each ships its library as ``jax_plugins/<module>/xla_cuda_plugin.so``.
_JAX_PJRT_WHEELS = (
    ("xla_cuda13", "jax-cuda13-pjrt"),
    ("xla_cuda12", "jax-cuda12-pjrt"),
)
#: The companion package of each wheel: jax's CUDA custom calls (linear
#: algebra, FFI, Pallas/Triton), registered against the loaded library.
_EXTENSION_PACKAGES = {"jax-cuda13-pjrt": "jax_cuda13_plugin", "jax-cuda12-pjrt": "jax_cuda12_plugin"}
_LIBRARY_NAME = "xla_cuda_plugin.so"

_INSTALL_HINT = (
    "Install it with `pip install 'pjrt-host-gpu[cuda13]'` (jax-cuda13-pjrt, NVIDIA driver 580 or newer) "
    "or `pip install 'pjrt-host-gpu[cuda12]'` (jax-cuda12-pjrt), or point PJRT_HOST_CUDA_LIBRARY_PATH "
    "at a CUDA PJRT C API library."
)


def library_candidates() -> list[tuple[str, str]]:
    """(distribution, library path) for each of jax's CUDA PJRT wheels that
    is installed, preferred first.  Found through the import system without
    running the wheels' code (which imports jax)."""
    found = []
    for module, distribution in _JAX_PJRT_WHEELS:
        try:
            spec = importlib.util.find_spec(f"jax_plugins.{module}")
        except (ImportError, ValueError):
            spec = None
        for folder in (spec.submodule_search_locations or []) if spec is not None else []:
            path = os.path.join(folder, _LIBRARY_NAME)
            if os.path.isfile(path):
                found.append((distribution, os.path.abspath(path)))
                break
    return found


class CudaPlugin(DevicePlugin):
    """NVIDIA GPUs through the CUDA PJRT C API library of jax's wheels.

    ``proc_gpus`` and ``dev_root`` are where the driver's files are read
    (see :mod:`pjrt_host_gpu._hardware`); the host constructs the plugin
    with no arguments, tests pass a fake tree.
    """

    display_name = "NVIDIA GPU (CUDA)"
    priority = 200  # a real accelerator: chosen over CPU and jax's own plugins
    # torch's CUDA tensors and this client's buffers are both CUDA device
    # memory on the same GPUs, so DLPack hands them over without a copy.
    zero_copy_torch_devices = ("cuda",)

    def __init__(self, proc_gpus: str = _hardware.PROC_NVIDIA_GPUS, dev_root: str = _hardware.DEV_ROOT) -> None:
        self._proc_gpus = proc_gpus
        self._dev_root = dev_root
        self._local_rank = 0
        self._local_world_size = 1

    # -- the library --------------------------------------------------------

    def library_path(self) -> str:
        override = _env.library_path_override()
        if override is not None:
            if not os.path.isfile(override):
                raise FileNotFoundError(
                    f"PJRT_HOST_CUDA_LIBRARY_PATH={override!r} is not a file; set it to the CUDA "
                    "PJRT C API library (a .so exporting GetPjrtApi), or unset it to use jax's wheel")
            return os.path.abspath(override)
        candidates = library_candidates()
        if not candidates:
            raise FileNotFoundError(f"no CUDA PJRT library is installed. {_INSTALL_HINT}")
        return candidates[0][1]

    def library_loaded(self, c_api: Any) -> None:
        """Register jax's CUDA custom calls and FFI types against the loaded
        library, as jax's own CUDA plugin does, when the companion package
        (``jax-cuda13-plugin`` / ``jax-cuda12-plugin``) is installed.
        Without it, programs that need those calls (jnp.linalg, Pallas)
        fail to compile; everything else runs."""
        extension = _cuda_extension(self._extension_packages())
        if extension is None:
            logger.info(
                "no jax CUDA extension (jax-cuda13-plugin or jax-cuda12-plugin) is installed: "
                "jax's CUDA custom calls (linear algebra, FFI, Pallas) are unavailable; "
                "pip install 'pjrt-host-gpu[cuda13-with-cuda]' to have them")
            return
        from jax._src.lib import triton, xla_client

        xla_client.register_custom_type_handler("CUDA", functools.partial(extension.register_custom_type, c_api))
        xla_client.register_custom_call_handler(
            "CUDA", functools.partial(extension.register_custom_call_target, c_api))
        for name, value in extension.ffi_types().items():
            xla_client.register_custom_type(name, value, platform="CUDA")
        for name, value in extension.ffi_handlers().items():
            xla_client.register_custom_call_target(name, value, platform="CUDA", api_version=1)
        # A private jax hook that jax releases move (jax 0.11 has none here):
        # without it only Pallas/Triton kernels are missing, so say so and go on.
        register_triton = getattr(triton, "register_compilation_handler", None)
        compile_triton = getattr(extension, "compile_triton_to_asm", None)
        if register_triton is None or compile_triton is None:
            logger.warning("this jax (%s) offers no Triton compilation hook to pjrt-host-gpu: Pallas/Triton "
                           "kernels are unavailable on the 'cuda' plugin; everything else runs",
                           getattr(__import__("jax"), "__version__", "?"))
            return
        register_triton("CUDA", functools.partial(compile_triton, c_api))

    def _extension_packages(self) -> list[str]:
        """The companion package of the library in use first, then the others."""
        library = self.library_path()
        ordered = [package for distribution, package in _EXTENSION_PACKAGES.items()
                   if (distribution, library) in library_candidates()]
        return ordered + [p for p in _EXTENSION_PACKAGES.values() if p not in ordered]

    # -- the hardware -------------------------------------------------------

    def physical_chip_count(self) -> int:
        override = _env.device_count_override()
        if override is not None:
            return override
        installed, uuids = _hardware.installed_gpus(self._proc_gpus, self._dev_root)
        return _hardware.visible_gpu_count(installed, uuids, _env.cuda_visible_devices())

    # -- processes ----------------------------------------------------------

    def configure_single_process(self) -> None:
        self._local_rank, self._local_world_size = 0, 1

    def configure_multiprocess(self, local_rank: int, local_world_size: int) -> None:
        if local_world_size < 1 or not 0 <= local_rank < local_world_size:
            raise ValueError(
                f"local_rank={local_rank} is not a rank among local_world_size={local_world_size} processes")
        self._local_rank, self._local_world_size = local_rank, local_world_size

    def requires_xla_coordinator(self) -> bool:
        # Several GPU processes exchange their topology through the
        # coordination service's key-value store when their clients start.
        return _env.world_size() > 1 or self._local_world_size > 1

    def client_create_options(self) -> Mapping[str, ClientOption]:
        """The options of ``PJRT_Client_Create`` for the CUDA plugin.

        ``platform_name`` is always ``cuda`` (what jax's lowering rules
        expect).  ``visible_devices`` is set only when several processes
        share this host: each takes its share of the visible GPUs.
        ``node_id`` / ``num_nodes`` are set from ``RANK`` / ``WORLD_SIZE``
        when the job has several processes.  The allocator settings are set
        only when their environment variables are (see :mod:`._env`).
        """
        options: dict[str, ClientOption] = {"platform_name": "cuda"}
        allocator = _env.allocator()
        if allocator is not None:
            options["allocator"] = allocator
        fraction = _env.memory_fraction()
        if fraction is not None:
            options["memory_fraction"] = fraction
        preallocate = _env.preallocate()
        if preallocate is not None:
            options["preallocate"] = preallocate
        visible = self._visible_devices()
        if visible is not None:
            options["visible_devices"] = visible
        world_size = _env.world_size()
        if world_size > 1:
            rank = _env.rank()
            if not 0 <= rank < world_size:
                raise ValueError(f"RANK={rank} is not a rank among WORLD_SIZE={world_size} processes")
            options["node_id"] = rank
            options["num_nodes"] = world_size
        return options

    def _visible_devices(self) -> list[int] | None:
        """This process's share of the visible GPUs, as indices among them;
        None when this process may use all of them."""
        size, rank = self._local_world_size, self._local_rank
        if size == 1:
            return None
        count = self.physical_chip_count()
        if count == 0:
            # No GPU to share: ask for this rank's, and let the client say
            # that none was found.
            return [rank]
        if count < size:
            if _env.cuda_visible_devices() is not None:
                # The launcher already gave each process its GPUs.
                return None
            raise ValueError(
                f"{size} processes share this host but it has {count} visible GPU(s): run at most "
                f"{count} processes per host, or give each process its GPUs with CUDA_VISIBLE_DEVICES")
        # Contiguous shares; the first (count % size) ranks take one more.
        base, extra = divmod(count, size)
        start = rank * base + min(rank, extra)
        return list(range(start, start + base + (1 if rank < extra else 0)))


def _cuda_extension(packages: list[str]) -> Any | None:
    for package in packages:
        try:
            return importlib.import_module(f"{package}.cuda_plugin_extension")
        except ImportError:
            continue
    return None
