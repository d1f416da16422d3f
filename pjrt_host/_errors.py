"""The exception family.  Each error carries the thing it is about and its
message says what was expected, what the choices are and how to fix it."""

from __future__ import annotations

import os
import re
import sys

__all__ = [
    "ClientCreationError",
    "EnvironmentSettingError",
    "PjrtHostError",
    "PluginLoadError",
    "PluginNotFoundError",
    "SelectionError",
    "cause_text",
    "user_stacklevel",
]


def cause_text(err: BaseException | None, limit: int = 400, strip: re.Pattern[str] | None = None) -> str:
    """The cause an error message quotes: ``Type: text`` on one line
    (whitespace collapsed, ``strip`` removed, cut at ``limit`` characters);
    "" for None."""
    if err is None:
        return ""
    text = " ".join(str(err).split())
    if strip is not None:
        text = strip.sub("", text).strip()
    if len(text) > limit:
        text = text[:limit] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


class PjrtHostError(RuntimeError):
    """Base class of every error pjrt_host raises on purpose."""


class EnvironmentSettingError(PjrtHostError, ValueError):
    """An environment variable whose value cannot be read; the message names
    the variable, the value and what is accepted."""


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


_OWN = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes the ``warnings.warn`` of the function
    calling this name the first frame outside pjrt_host: the line of the
    user's code whose torch call led there, as torch's own C++ warnings
    name it (a CPU tensor's warning points at the same line, so filters by
    module and ``-W error`` treat both alike).  torch frames between two
    of pjrt_host's (a decomposition dispatching back to the device) are
    passed over too; torch frames the user's call went through first are
    not."""
    torch = sys.modules.get("torch")
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep if torch is not None else None
    frame = sys._getframe(1)
    level = 1
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_OWN):
            frame, level = frame.f_back, level + 1
            continue
        if torch_dir is not None and name.startswith(torch_dir):
            above, k = frame, level
            while above is not None and above.f_code.co_filename.startswith(torch_dir):
                above, k = above.f_back, k + 1
            if above is not None and above.f_code.co_filename.startswith(_OWN):
                frame, level = above, k
                continue
        break
    return level
