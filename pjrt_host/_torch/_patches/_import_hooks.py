"""Run something right after a library is imported, without importing it.

The integrations with libraries that ``import torch`` must not import
(accelerate, transformers, Lightning) wait for their modules here: one
finder at the front of ``sys.meta_path`` finds nothing itself; for a module
some hook waits for, it asks the other finders and wraps the loader they
return, so that the module's own code runs first and the hook right after.
A hook is a function (called with the module) or a module name as a string
(imported then: what a package above the device, such as
:mod:`pjrt_host.lightning`, registers on import; naming it as a string keeps
the device's modules from importing upward).
"""

from __future__ import annotations

import importlib
import importlib.abc
import logging
import sys
from typing import Any, Callable

from .._devices import DEVICE_NAME

__all__ = ["Hook", "after_import"]

logger = logging.getLogger(__name__)

#: What runs once a module has been imported: a function of the module, or
#: the name of a module to import then.
Hook = Callable[[Any], Any] | str


def _run(hook: Hook, module: Any) -> None:
    """Run ``hook`` for ``module``; one that raises is logged: the library
    must import whatever happens here."""
    try:
        if isinstance(hook, str):
            importlib.import_module(hook)
        else:
            hook(module)
    except Exception as err:
        shown = f"`import {hook}` shows the whole error" if isinstance(hook, str) else \
            "docs/integrations.md: how to name the device yourself"
        logger.warning("pjrt_host: could not adapt %s to the '%s' device (%s: %s); it works as it would "
                       "without pjrt_host (%s)", module.__name__, DEVICE_NAME, type(err).__name__, err, shown)


class _Loader(importlib.abc.Loader):
    """The module's own loader, then its hook."""

    def __init__(self, loader: Any, hook: Hook) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        _run(self._hook, module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, is_package, ...
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a module of :func:`after_import` it asks the
    other finders and hands back their spec with its loader wrapped."""

    _pjrt_host = True

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        hook = _hooks.get(fullname)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or getattr(finder, "_pjrt_host", False) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, hook)
                return spec
        return None


#: module -> what runs once it has been imported (every :func:`after_import`).
_hooks: dict[str, Hook] = {}


def after_import(hooks: dict[str, Hook]) -> None:
    """Run ``hooks[name]`` on each module already imported, and on the others
    right after they are imported (the module's own loader runs first; a
    hook that raises is logged and the module stays as it was).  Hooks are
    idempotent; this imports nothing."""
    for name, hook in hooks.items():
        _hooks[name] = hook
        if name in sys.modules:
            _run(hook, sys.modules[name])
    if not any(getattr(f, "_pjrt_host", False) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
