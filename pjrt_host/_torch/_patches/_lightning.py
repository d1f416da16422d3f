"""``Trainer(accelerator='jax')`` with nothing else imported: an import hook
imports :mod:`pjrt_host.lightning` (which registers the accelerator with
Lightning) when ``lightning.pytorch`` has been imported.

``lightning.pytorch``, not ``lightning``: ``import lightning`` may come
before ``import torch`` (it imports torch itself), and then the package's
own import is already under way when this hook is installed; its
``lightning.pytorch`` is imported later, after torch, with every class the
registration needs (``lightning.fabric`` included).  Lightning is never
imported here, so ``import torch`` costs nothing more, and nothing happens
where Lightning is not installed.  The registration is named as a string
(:mod:`._import_hooks` imports it): the device does not import the package
above it.  ``PJRT_HOST_SKIP_PATCHES=lightning`` turns it off (then
``import pjrt_host.lightning`` registers by hand).
"""

from __future__ import annotations

from . import _import_hooks

__all__ = ["HOOKS", "install"]

#: module -> the module imported once it has been imported (it registers on import).
HOOKS: dict[str, _import_hooks.Hook] = {"lightning.pytorch": "pjrt_host.lightning"}


def install() -> None:
    """Register when ``lightning.pytorch`` is (or has been) imported.
    Idempotent; imports nothing."""
    _import_hooks.after_import(HOOKS)
