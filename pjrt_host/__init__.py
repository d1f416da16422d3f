"""pjrt_host: bring any PJRT C API device to PyTorch through pip-installed plugins.

The whole public surface is listed in ``__all__``.  Names are loaded lazily,
so ``import pjrt_host`` imports neither torch nor jax nor any plugin; that
happens only when a client or a tensor is needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "ClientCreationError",
    "ClientOption",
    "DevicePlugin",
    "EnvironmentSettingError",
    "Kernel",
    "PjrtHostError",
    "PluginLoadError",
    "PluginNotFoundError",
    "PluginRecord",
    "SelectionError",
    "Status",
    "assume_pure",
    "backend_name",
    "client",
    "config",
    "devices",
    "distributed",
    "env",
    "hookimpl",
    "hookspec",
    "interop",
    "plugin_kernel_stats",
    "plugin_manager",
    "plugins",
    "profile",
    "register_plugin",
    "select",
    "selected",
    "spawn",
    "spmd",
]

__version__ = "0.1.0"

# public name -> (module, attribute)
_LAZY = {
    "ClientCreationError": ("._errors", "ClientCreationError"),
    "ClientOption": ("._plugin", "ClientOption"),
    "DevicePlugin": ("._plugin", "DevicePlugin"),
    "EnvironmentSettingError": ("._errors", "EnvironmentSettingError"),
    "Kernel": ("._plugin", "Kernel"),
    "PjrtHostError": ("._errors", "PjrtHostError"),
    "PluginLoadError": ("._errors", "PluginLoadError"),
    "PluginNotFoundError": ("._errors", "PluginNotFoundError"),
    "PluginRecord": ("._discovery", "PluginRecord"),
    "SelectionError": ("._errors", "SelectionError"),
    "Status": ("._discovery", "Status"),
    "assume_pure": ("._compile._pure", "assume_pure"),
    "backend_name": ("._runtime", "backend_name"),
    "client": ("._runtime", "client"),
    "config": ("._torch._config", "config"),
    "devices": ("._runtime", "devices"),
    "distributed": (".distributed", None),  # the submodule itself
    "env": (".env", None),  # the submodule itself: the settings parsers plugins use
    "hookimpl": ("._hookspecs", "hookimpl"),
    "hookspec": ("._hookspecs", "hookspec"),
    "interop": (".interop", None),  # the submodule itself
    "plugin_kernel_stats": ("._lowerings._kernels", "stats"),  # imports jax
    "plugin_manager": ("._registry", "plugin_manager"),
    "plugins": ("._registry", "plugins"),
    "profile": ("._torch._profile", "profile"),
    "register_plugin": ("._registry", "register_plugin"),
    "select": ("._registry", "select"),
    "selected": ("._registry", "selected_record"),
    "spawn": ("._launch", "spawn"),
    "spmd": (".spmd", None),  # the submodule itself (imports torch and jax)
}


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'pjrt_host' has no attribute {name!r}") from None
    loaded = importlib.import_module(module, __name__)
    value = loaded if attr is None else getattr(loaded, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _register_torch_device() -> None:
    # `import pjrt_host` makes device='jax' work like torch's autoload does,
    # when torch is already imported; it never imports torch itself (if torch
    # comes later, its `torch.backends` entry point does the same).
    # Imported by the user (torch absent or fully imported), not by torch's
    # own entry-point loading in the middle of `import torch`: an explicit
    # request for the device, which autoload honours on torch builds with an
    # accelerator of their own too.
    import sys

    torch = sys.modules.get("torch")
    importing_torch = torch is not None and getattr(getattr(torch, "__spec__", None), "_initializing", False)
    if importing_torch:
        return
    from . import _torch

    _torch.explicit = True
    if torch is not None and hasattr(torch, "_import_device_backends"):
        _torch.autoload()


_register_torch_device()


if TYPE_CHECKING:  # pragma: no cover
    from ._discovery import PluginRecord, Status
    from . import env
    from ._errors import (ClientCreationError, EnvironmentSettingError, PjrtHostError, PluginLoadError,
                          PluginNotFoundError, SelectionError)
    from ._hookspecs import hookimpl, hookspec
    from ._lowerings._kernels import stats as plugin_kernel_stats
    from ._plugin import ClientOption, DevicePlugin, Kernel
    from ._registry import plugin_manager, plugins, register_plugin, select
    from ._registry import selected_record as selected
    from . import distributed
    from ._launch import spawn
    from . import spmd
    from ._runtime import backend_name, client, devices
    from ._torch._config import config
    from ._torch._profile import profile
