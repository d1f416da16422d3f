"""How a section records its checks.

A section is a function of a :class:`Recorder`.  Each check runs inside
``rec.check(name)``: an exception fails that check with its first line and
the section goes on.  The recorder rewrites the result file after every
check, so if the process dies (a plugin that segfaults), the parent still
has every earlier check and the name of the one that was running.
"""

from __future__ import annotations

import contextlib
import json
import os
import traceback
from pathlib import Path
from typing import Any, Iterator

__all__ = ["Expected", "Recorder", "Skip", "error_text", "first_line"]


class Skip(Exception):
    """Raised inside a check: the check does not apply here (the reason)."""


class Expected(Exception):
    """Raised inside a check: a declared or host-wide limitation (the reason)."""


class Recorder:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.result: dict[str, Any] = {"checks": [], "figures": [], "running": None}
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.result, default=str))
        os.replace(tmp, self.path)

    @staticmethod
    def progress(message: str) -> None:
        print(f"progress: {message}", flush=True)

    def add(self, name: str, status: str, detail: str = "", **extra: Any) -> None:
        self.result["checks"].append({"name": name, "status": status, "detail": detail, **extra})
        self._write()

    @contextlib.contextmanager
    def check(self, name: str) -> Iterator[dict[str, Any]]:
        """Run a check; the body may put ``detail`` (and other keys) in the
        yielded dict, or raise Skip / Expected."""
        self.result["running"] = name
        self._write()
        info: dict[str, Any] = {}
        try:
            yield info
        except Skip as why:
            self.add(name, "skip", str(why))
        except Expected as why:
            self.add(name, "expected", str(why))
        except Exception as err:  # the check fails; the section goes on
            detail = error_text(err)
            self.add(name, "fail", detail, **{k: v for k, v in info.items() if k != "detail"})
        else:
            self.add(name, info.pop("status", "pass"), info.pop("detail", ""), **info)
        finally:
            self.result["running"] = None
            self._write()

    def figure(self, name: str, value: float | None, unit: str, reference: float | None = None,
               reference_name: str | None = None, note: str | None = None, peak: float | None = None) -> None:
        fig = {"name": name, "value": value, "unit": unit}
        if reference is not None:
            fig.update(reference=reference, reference_name=reference_name,
                       ratio=(value / reference) if value is not None and reference else None)
        if peak is not None:
            fig["peak"] = peak
        if note:
            fig["note"] = note
        self.result["figures"].append(fig)
        self._write()

    def finish(self, **extra: Any) -> None:
        checks = self.result["checks"]
        self.result.update(extra)
        if "status" not in self.result:
            self.result["status"] = "fail" if any(c["status"] == "fail" for c in checks) else "pass"
        self.result["running"] = None
        self._write()


def error_text(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    where = traceback.extract_tb(err.__traceback__)
    if where and isinstance(err, AssertionError) and not str(err):
        frame = where[-1]
        text += f" at {Path(frame.filename).name}:{frame.lineno}: {frame.line}"
    return text


def first_line(text: str) -> str:
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return lines[0] if lines else ""
