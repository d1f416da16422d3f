"""The exception family.  Each error carries the thing it is about and its
message says what was expected, what the choices are and how to fix it."""

from __future__ import annotations

__all__ = [
    "ClientCreationError",
    "PjrtHostError",
    "PluginLoadError",
    "PluginNotFoundError",
    "SelectionError",
]


class PjrtHostError(RuntimeError):
    """Base class of every error pjrt_host raises on purpose."""


class PluginLoadError(PjrtHostError):
    """A plugin could not be loaded or used (import, constructor, library).

    ``plugin`` is the plugin's name and ``distribution`` the distribution that
    provides it (None when registered in code); the original exception is the
    ``__cause__``.
    """

    def __init__(self, plugin: str, distribution: str | None, message: str) -> None:
        super().__init__(message)
        self.plugin = plugin
        self.distribution = distribution


class PluginNotFoundError(PjrtHostError, LookupError):
    """A plugin name that no installed or registered plugin has."""

    def __init__(self, plugin: str, message: str) -> None:
        super().__init__(message)
        self.plugin = plugin


class SelectionError(PjrtHostError):
    """A selection that cannot be made (e.g. after the client exists)."""


class ClientCreationError(PluginLoadError):
    """The PJRT client of a plugin could not be created (no device, a
    library that fails to initialise, bad create options...)."""
