"""Reading environment settings, for the host and for device plugins.

A plugin reads each of its variables in one small function that documents
its default, over these parsers.  Every parser returns ``default`` (None
unless given) when the variable is unset or blank, and raises
:class:`EnvironmentSettingError` (a ``ValueError``) when its value cannot be
read, naming the variable, the value and what is accepted: a typo in a
setting must never silently mean its default.

```python
from pjrt_host import env

def visible_chips(environ=os.environ):
    \"\"\"``ACME_VISIBLE_CHIPS``: chip indices this process may use.
    Default: unset, every chip.\"\"\"
    return env.integers("ACME_VISIBLE_CHIPS", minimum=0, expected="a chip index", environ=environ)
```

``environ`` (default ``os.environ``) lets a test or a launcher read another
mapping.  Importing this module imports neither torch nor jax.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from typing import overload

from ._errors import EnvironmentSettingError

__all__ = [
    "EnvironmentSettingError",
    "choice",
    "flag",
    "integer",
    "integers",
    "items",
    "number",
    "seconds",
    "text",
]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_BOOLEANS = "1/0, true/false, yes/no or on/off"


@overload
def text(name: str, default: str, *, environ: Mapping[str, str] | None = None) -> str: ...
@overload
def text(name: str, default: None = None, *, environ: Mapping[str, str] | None = None) -> str | None: ...


def text(name: str, default: str | None = None, *, environ: Mapping[str, str] | None = None) -> str | None:
    """The variable's value, stripped of surrounding blanks; ``default``
    when it is unset or blank."""
    value = (os.environ if environ is None else environ).get(name, "").strip()
    return value or default


@overload
def flag(name: str, default: bool, *, environ: Mapping[str, str] | None = None) -> bool: ...
@overload
def flag(name: str, default: None, *, environ: Mapping[str, str] | None = None) -> bool | None: ...


def flag(name: str, default: bool | None, *, environ: Mapping[str, str] | None = None) -> bool | None:
    """A boolean: 1/true/yes/on or 0/false/no/off, in any case."""
    value = text(name, environ=environ)
    if value is None:
        return default
    return _boolean(name, value)


@overload
def integer(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None,
            expected: str = ..., environ: Mapping[str, str] | None = None) -> int: ...
@overload
def integer(name: str, default: None = None, *, minimum: int | None = None, maximum: int | None = None,
            expected: str = ..., environ: Mapping[str, str] | None = None) -> int | None: ...


def integer(name: str, default: int | None = None, *, minimum: int | None = None, maximum: int | None = None,
            expected: str = "a whole number", environ: Mapping[str, str] | None = None) -> int | None:
    """A whole number, between ``minimum`` and ``maximum`` (inclusive) when
    they are given.  ``expected`` says what the number is, for the error
    (e.g. "a whole number of GPUs")."""
    value = text(name, environ=environ)
    if value is None:
        return default
    return _whole(name, value, value, minimum, maximum, expected)


def integers(name: str, *, minimum: int | None = None, maximum: int | None = None,
             expected: str = "a whole number", environ: Mapping[str, str] | None = None) -> list[int] | None:
    """A comma-separated list of whole numbers (blank entries skipped), each
    in range as for :func:`integer`; None when unset or blank."""
    parts = items(name, environ=environ)
    if parts is None:
        return None
    whole = text(name, environ=environ) or ""
    return [_whole(name, whole, part, minimum, maximum, expected) for part in parts]


def number(name: str, default: float | None = None, *, minimum: float | None = None, above: float | None = None,
           maximum: float | None = None, expected: str = "a number",
           environ: Mapping[str, str] | None = None) -> float | None:
    """A real number: at least ``minimum``, more than ``above``, at most
    ``maximum``, for those given."""
    value = text(name, environ=environ)
    if value is None:
        return default
    bounds = _bounds(minimum, above, maximum)
    try:
        result = float(value)
    except ValueError:
        result = math.nan
    if math.isnan(result):
        raise EnvironmentSettingError(f"{name}={value!r} is not {expected}{_parenthesised(bounds)}")
    if (minimum is not None and result < minimum) or (above is not None and result <= above) \
            or (maximum is not None and result > maximum):
        raise EnvironmentSettingError(f"{name}={value!r} must be {bounds} ({expected})")
    return result


def seconds(name: str, default: float, *, environ: Mapping[str, str] | None = None) -> float:
    """A duration in seconds, more than 0."""
    result = number(name, default, above=0, expected="a number of seconds", environ=environ)
    assert result is not None
    return result


def choice(name: str, choices: Iterable[str], default: str | None = None, *, expected: str | None = None,
           environ: Mapping[str, str] | None = None) -> str | None:
    """One of ``choices``, compared without case; the choice as it is
    spelled in ``choices`` is returned.  ``expected`` says what a choice is
    (e.g. "a GPU allocator")."""
    value = text(name, environ=environ)
    if value is None:
        return default
    options = tuple(choices)
    for option in options:
        if option.lower() == value.lower():
            return option
    what = f" is not {expected};" if expected else ":"
    raise EnvironmentSettingError(f"{name}={value!r}{what} expected one of {', '.join(options)}")


def items(name: str, *, environ: Mapping[str, str] | None = None) -> list[str] | None:
    """A comma-separated list, each entry stripped and blank entries
    skipped; None when unset or blank."""
    value = text(name, environ=environ)
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


# -- shared by the parsers -------------------------------------------------------


def _boolean(name: str, value: str) -> bool:
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise EnvironmentSettingError(f"{name}={value!r} is not a boolean; expected {_BOOLEANS}")


def _whole(name: str, whole: str, part: str, minimum: int | None, maximum: int | None, expected: str) -> int:
    # ``whole`` is the variable's value, ``part`` the entry being read (the
    # same string for a single number): a list's error quotes both.
    where = f"{name}={whole!r}" if whole == part else f"{name}={whole!r}: {part!r}"
    bounds = _bounds(minimum, None, maximum)
    try:
        result = int(part)
    except ValueError:
        raise EnvironmentSettingError(f"{where} is not {expected}{_parenthesised(bounds)}") from None
    if (minimum is not None and result < minimum) or (maximum is not None and result > maximum):
        raise EnvironmentSettingError(f"{where} must be {bounds} ({expected})")
    return result


def _bounds(minimum: float | None, above: float | None, maximum: float | None) -> str:
    """The accepted range in words: "at least 1", "from 1 to 65535",
    "more than 0 and at most 1"; "" when unbounded."""
    low = f"at least {_show(minimum)}" if minimum is not None else ""
    if above is not None and minimum is None:
        low = f"more than {_show(above)}"
    if maximum is None:
        return low
    if minimum is not None:
        return f"from {_show(minimum)} to {_show(maximum)}"
    return f"{low} and at most {_show(maximum)}" if low else f"at most {_show(maximum)}"


def _show(bound: float | None) -> str:
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


def _parenthesised(bounds: str) -> str:
    return f" ({bounds})" if bounds else ""
