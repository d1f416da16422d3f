"""Checks on a PJRT C API shared library that need neither jax nor dlopen.

``python -m pjrt_host list`` must be fast and must not load vendor code, so a
library is checked by reading its ELF headers: it must exist, be a shared
object, and export ``GetPjrtApi``, the one entry point of the PJRT C API.
"""

from __future__ import annotations

import os
import struct

__all__ = ["PJRT_ENTRY_SYMBOL", "library_problem"]

PJRT_ENTRY_SYMBOL = b"GetPjrtApi"

_SHT_DYNSYM = 11


def library_problem(path: str) -> str | None:
    """Why ``path`` is not a usable PJRT C API library, or None if it is."""
    if not os.path.isabs(path):
        return f"library path {path!r} is not absolute"
    if not os.path.exists(path):
        return f"library file {path} does not exist"
    if not os.path.isfile(path):
        return f"library path {path} is not a file"
    try:
        symbols = _dynamic_string_table(path)
    except OSError as err:
        return f"library file {path} cannot be read: {err}"
    except ValueError as err:
        return f"{path} is not a shared library ({err})"
    if PJRT_ENTRY_SYMBOL + b"\0" not in symbols:
        return (
            f"{path} is a shared library but not a PJRT plugin: it does not "
            f"export {PJRT_ENTRY_SYMBOL.decode()}"
        )
    return None


def _dynamic_string_table(path: str) -> bytes:
    """The bytes of the string table of the ELF dynamic symbol table."""
    with open(path, "rb") as f:
        ident = f.read(16)
        if len(ident) < 16 or ident[:4] != b"\x7fELF":
            raise ValueError("no ELF header")
        is64 = ident[4] == 2
        endian = "<" if ident[5] == 1 else ">"
        if is64:
            f.seek(0x28)
            (shoff,) = struct.unpack(endian + "Q", f.read(8))
            f.seek(0x3A)
            shentsize, shnum, _ = struct.unpack(endian + "HHH", f.read(6))
            entry = endian + "IIQQQQIIQQ"
        else:
            f.seek(0x20)
            (shoff,) = struct.unpack(endian + "I", f.read(4))
            f.seek(0x2E)
            shentsize, shnum, _ = struct.unpack(endian + "HHH", f.read(6))
            entry = endian + "IIIIIIIIII"
        if shoff == 0 or shnum == 0:
            raise ValueError("no section headers")
        f.seek(shoff)
        raw = f.read(shentsize * shnum)
        if len(raw) < shentsize * shnum:
            raise ValueError("truncated section headers")
        size = struct.calcsize(entry)
        sections = [struct.unpack(entry, raw[i * shentsize : i * shentsize + size]) for i in range(shnum)]
        for sec in sections:
            if sec[1] == _SHT_DYNSYM:
                link = sec[6]
                if link >= len(sections):
                    raise ValueError("bad dynamic symbol table link")
                strtab = sections[link]
                offset, length = strtab[4], strtab[5]
                f.seek(offset)
                return b"\0" + f.read(length)
        raise ValueError("no dynamic symbol table")
