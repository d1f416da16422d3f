"""``Trainer(accelerator='jax')`` with nothing else imported: an import hook
imports :mod:`pjrt_host.lightning` (which registers the accelerator with
Lightning) when ``lightning.pytorch`` has been imported.

``lightning.pytorch``, not ``lightning``: ``import lightning`` may come
before ``import torch`` (it imports torch itself), and then the package's
own import is already under way when this hook is installed; its
``lightning.pytorch`` is imported later, after torch, with every class the
registration needs (``lightning.fabric`` included).  Lightning is never
imported here, so ``import torch`` costs nothing more, and nothing happens
where Lightning is not installed.  ``PJRT_HOST_SKIP_PATCHES=lightning``
turns it off (then ``import pjrt_host.lightning`` registers by hand).
"""

from __future__ import annotations

import logging
from typing import Any

from . import _accelerate

__all__ = ["HOOKS", "install"]

logger = logging.getLogger(__name__)


def _register(module: Any) -> None:
    try:
        import pjrt_host.lightning  # noqa: F401  (registers on import)
    except Exception as err:  # Lightning must import whatever happens here
        logger.warning("pjrt_host: accelerator='jax' could not be registered with this Lightning (%s: %s); "
                       "Lightning works without it. `import pjrt_host.lightning` shows the whole error",
                       type(err).__name__, err)


#: module -> what runs once it has been imported.
HOOKS = {"lightning.pytorch": _register}


def install() -> None:
    """Register when ``lightning.pytorch`` is (or has been) imported.
    Idempotent; imports nothing."""
    _accelerate.after_import(HOOKS)
