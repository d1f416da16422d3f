"""Hook specifications: the host's lifecycle, as pluggy hooks.

A plugin package (or any code) implements these with :data:`pjrt_host.hookimpl`
and registers the object with :func:`pjrt_host.plugin_manager`; a
:class:`~pjrt_host.DevicePlugin` instance is registered automatically, so a
device plugin can hook in by defining these methods on its class.
"""

from __future__ import annotations

from typing import Any

import pluggy

__all__ = ["hookimpl", "hookspec"]

hookspec = pluggy.HookspecMarker("pjrt_host")
hookimpl = pluggy.HookimplMarker("pjrt_host")


@hookspec
def pjrt_host_plugin_registered(name: str, record: Any) -> None:
    """A plugin was discovered or registered (``record`` is its
    :class:`~pjrt_host.PluginRecord`, status included)."""


@hookspec
def pjrt_host_plugin_selected(name: str, plugin: Any) -> None:
    """``plugin`` (a DevicePlugin) was chosen as the device to run on."""


@hookspec
def pjrt_host_before_client_create(name: str, plugin: Any, options: dict[str, Any]) -> None:
    """The client of ``name`` is about to be created; the process is already
    configured.  ``options`` are the create options and may be changed."""


@hookspec
def pjrt_host_client_created(name: str, plugin: Any, devices: list[Any]) -> None:
    """The client of ``name`` exists; ``devices`` are its addressable jax
    devices."""


# DevicePlugin's own hook implementation (it imports its vendor kernels'
# modules as the client comes up), marked here rather than where it is
# defined: the contract module stays free of pluggy, which listing plugins
# does not import.
from ._plugin import DevicePlugin  # noqa: E402

hookimpl(DevicePlugin.pjrt_host_client_created)
