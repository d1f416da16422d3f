"""Build cpu_ref's C++ kernels on first use, with the machine's compiler.

Why not at ``pip install``: the handlers compile against the XLA FFI
headers of the jaxlib that runs them (``jax.ffi.include_dir()``), for the
CPU that runs them (``-march=native``); a
setuptools build would need jax and jaxlib in ``build-system.requires``,
and pip's isolated build environment installs them again for every
(editable) install: 20 s measured from the local package index (a fresh
environment with setuptools, jax and jaxlib), before the compile itself,
against the 30 s the whole CI install may grow by -- and a remote index
downloads jaxlib (~80 MB) each time.  Compiled here instead, once per
source, jaxlib version, compiler and CPU, into a per-user cache
directory (about 2-3 s, once); later processes load the library in
milliseconds.

A missing compiler, or a failed compile, raises :class:`KernelBuildError`
naming the fix; the host then runs its reference lowering instead of the
kernel, with one warning (``PJRT_HOST_PLUGIN_KERNELS=strict`` makes it an
error).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from pjrt_host import env

__all__ = ["KernelBuildError", "cache_directory", "compiler", "library"]

_HERE = Path(__file__).parent


class KernelBuildError(RuntimeError):
    """cpu_ref's C++ kernels could not be built on this machine."""


def compiler() -> str | None:
    """``CXX`` (a command or path), else ``c++`` or ``g++`` on ``PATH``;
    None when there is none."""
    chosen = env.text("CXX")
    if chosen:
        return shutil.which(chosen)
    return shutil.which("c++") or shutil.which("g++")


def cache_directory() -> Path:
    """``PJRT_HOST_CPU_REF_KERNEL_CACHE``: where built kernels are kept.
    Default: ``$XDG_CACHE_HOME/pjrt_host/cpu_ref_kernels`` (``~/.cache/...``)."""
    chosen = env.text("PJRT_HOST_CPU_REF_KERNEL_CACHE")
    if chosen:
        return Path(chosen)
    base = env.text("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pjrt_host" / "cpu_ref_kernels"


_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-w")
#: For this machine's CPU (AVX-512 where it has it: 6-7x faster than plain
#: x86-64 code here); the library is keyed by the CPU's features, so a cache
#: directory shared by other machines never hands them code they cannot run.
_NATIVE = ("-march=native",)


def library(source: str) -> Path:
    """The shared library built from ``source`` (a file beside this module),
    compiled now unless this machine's cache has it."""
    import jax
    import jaxlib

    cxx = compiler()
    if cxx is None:
        looked = f"CXX={env.text('CXX')!r}" if env.text("CXX") else "c++ and g++ on PATH"
        raise KernelBuildError(f"no C++ compiler was found to build cpu_ref's kernels (looked for {looked}); "
                               "install one (e.g. apt-get install g++) or set CXX to one")
    text = (_HERE / source).read_bytes()
    key = hashlib.sha256(b"\0".join([text, jaxlib.__version__.encode(), cxx.encode(), _compiler_version(cxx),
                                     platform.machine().encode(), _cpu_features(), " ".join(_FLAGS).encode()])
                         ).hexdigest()[:24]
    target = cache_directory() / f"{Path(source).stem}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=target.stem, suffix=".so.partial", dir=target.parent)
    os.close(fd)
    command = [cxx, *_FLAGS, *_NATIVE, f"-I{jax.ffi.include_dir()}", str(_HERE / source), "-o", partial]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:  # a compiler without -march=native for this CPU: plain code
            command.remove(_NATIVE[0])
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise KernelBuildError(f"building cpu_ref's kernel {source} failed ({' '.join(command)}):\n"
                                   f"{done.stderr.strip()[-2000:]}")
        os.replace(partial, target)  # atomic: another process finds a whole library or none
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def _cpu_features() -> bytes:
    """What -march=native compiles for: the CPU's model and feature flags."""
    try:
        with open("/proc/cpuinfo", "rb") as info:
            lines = [line for line in info if line.startswith((b"flags", b"Features", b"model name"))]
        return b"".join(sorted(set(lines)))
    except OSError:
        return (platform.processor() or platform.machine()).encode()


def _compiler_version(cxx: str) -> bytes:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, timeout=30).stdout
    except Exception:
        return b""
