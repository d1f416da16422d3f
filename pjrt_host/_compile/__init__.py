"""``torch.compile(model, backend='jax')``: whole graphs as one ``jax.jit``.

torch finds the backend through the entry point group
``torch_dynamo_backends`` (name ``jax``) the first time the name is used;
importing this package is cheap (no jax, no dynamo): the backend's machinery
loads on the first compile.  What makes dynamo see 'jax' tensors as plain
tensors belongs to the device (:mod:`pjrt_host._torch._hiding`), installed at
``import torch``, before any compile.
"""

from __future__ import annotations

from typing import Any

__all__ = ["backend"]


def backend(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
    """The ``jax`` torch.compile backend (see :mod:`._dynamo_backend`)."""
    from . import _dynamo_backend

    return _dynamo_backend.backend(gm, example_inputs, **kwargs)
