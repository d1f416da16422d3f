"""What several sections share: the plugin under test, and comparing a
device result with torch CPU's."""

from __future__ import annotations

from typing import Any

__all__ = ["close_to_cpu", "plugin_record"]


def plugin_record(name: str) -> Any:
    from ... import _registry

    for r in _registry.plugins():
        if r.name == name and r.ok:
            return r
    raise RuntimeError(f"plugin {name!r} is not installed or not usable")


def close_to_cpu(torch: Any, got: Any, want: Any, what: str, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    try:
        torch.testing.assert_close(got.detach().cpu(), want.detach().cpu(), rtol=rtol, atol=atol)
    except AssertionError as err:
        raise AssertionError(f"{what} differs from torch CPU: {' '.join(str(err).split())[:300]}") from None
