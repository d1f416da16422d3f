"""The :class:`~pjrt_host._lowerings.LoweringContext` every caller of a
lowering runs it with: eager ops, factories and the compile backend alike.

It holds what a lowering needs from outside its arguments: the
configuration's matmul precision and the selected plugin's lowering options
(``dense_gather_factor``, ...), read once and refused with the plugin's name
when one is malformed.
"""

from __future__ import annotations

from typing import Any

from .. import _plugin, _runtime
from .._errors import PluginLoadError
from .._lowerings import LoweringContext
from . import _config

__all__ = ["lowering_context"]

_contexts: dict[Any, LoweringContext] = {}
_plugin_options: dict | None = None


def _lowering_options() -> dict:
    """The selected plugin's lowering options, refused with the plugin's name
    and the fix when one is not an int >= 0."""
    record = _runtime.runtime().record
    problems = _plugin.lowering_option_problems(record.plugin)
    if problems:
        raise PluginLoadError(record.name, record.distribution,
                              f"pjrt_host: plugin {record.name!r} ({type(record.plugin).__qualname__}) cannot lower "
                              f"ops: {'; '.join(problems)}. Fix the class attribute in the plugin.")
    return {name: getattr(record.plugin, name, False if name in _plugin.BOOL_LOWERING_OPTIONS else 0)
            for name in _plugin.LOWERING_OPTIONS}


def lowering_context(cfg: _config.Config, one_device: bool = False) -> LoweringContext:
    """The context lowerings run with under device configuration ``cfg``
    (no random key: a caller that runs random ops adds its own);
    ``one_device``: the program runs on one device, not over a mesh
    (``LoweringContext.one_device``)."""
    ctx = _contexts.get((cfg, one_device))
    if ctx is None:
        global _plugin_options
        if _plugin_options is None:
            _plugin_options = _lowering_options()
        ctx = _contexts[cfg, one_device] = LoweringContext(matmul_precision=cfg.matmul_precision,
                                                           one_device=one_device, **_plugin_options)
    return ctx
