"""The device's implementation, loaded by the first kernel that needs it.

The kernels torch calls first for 'jax' work (``_kernels``, ``_autocast``)
are registered inside ``import torch`` and must not import jax; the first of
them to run loads the device here: the dispatcher installed on the tensor
class, the patches of the 'device' phase (``_patches``), the collectives
taught 'jax' tensors.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["device", "factories"]

_lock = threading.Lock()
#: The dispatcher once the device is loaded (tests wrap it to count eager ops).
_dispatch_fn = None


def device() -> Any:
    """The dispatcher, after loading the device once."""
    global _dispatch_fn
    if _dispatch_fn is None:
        with _lock:
            if _dispatch_fn is None:
                from .. import _collectives
                from . import _dispatch, _patches, _tensor

                _tensor.install_dispatcher(_dispatch.dispatch)
                _patches.install("device")
                _collectives.register_array_type(
                    _tensor.JaxTensor, to_jax=_tensor.read,
                    from_jax=lambda array, like: _tensor.wrap_array(array, like._storage.device_index, None,
                                                                   like._storage.place))
                _dispatch_fn = _dispatch.dispatch
    return _dispatch_fn


def factories() -> Any:
    """``_factories``, after loading the device."""
    device()
    from . import _factories

    return _factories
