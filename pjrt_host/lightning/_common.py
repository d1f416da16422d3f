"""What Trainer's and Fabric's classes for the 'jax' device share: which
devices there are, what ``devices=`` means, and how a process of a
multi-device run becomes one rank of a pjrt_host job.

Nothing here creates the plugin's client before a process is set up: the
accelerator's questions (``is_available``, ``auto_device_count``,
``parse_devices``) are answered by the selected plugin without a client,
because Lightning asks them in the launching process, before it starts the
other ranks, and a process has one client, made once.
"""

from __future__ import annotations

import os
from typing import Any, Union

import torch

from .. import distributed as _distributed
from .._torch import DEVICE_NAME

__all__ = [
    "BACKEND_NAME",
    "DEVICE_NAME",
    "RankDevice",
    "auto_device_count",
    "become_rank",
    "grad_scaler",
    "get_parallel_devices",
    "is_available",
    "parse_devices",
    "rank_device",
    "single_device",
]

#: The torch.distributed backend of the multi-device strategies (pjrt_host._torch._c10d).
BACKEND_NAME = "pjrt"

_DevicesInput = Union[int, str, list, tuple]


def is_available() -> bool:
    """Whether a plugin is installed and reports a device here (creates no client)."""
    return bool(torch.jax.is_available())


def auto_device_count() -> int:
    """The selected plugin's devices on this host, as the plugin counts them
    before any process has its share (``physical_chip_count``); 0 when none
    can be selected.  Creates no client."""
    from .. import _registry, _runtime

    if not is_available():
        return 0
    try:
        record = _runtime.runtime().record if _runtime.is_initialized() else _registry.selected_record()
        return int(record.plugin.physical_chip_count())
    except Exception:
        return 0


def parse_devices(devices: _DevicesInput) -> Union[int, list[int]]:
    """``devices=`` as Lightning's accelerators take it: a count (``2``,
    ``"2"``; ``-1`` or ``"-1"``: all) or indices (``[0, 1]``, ``"0,1"``).
    Returns a count or a list of indices; raises ValueError naming what
    there is."""
    count = auto_device_count()
    parsed: Union[int, list[int]]
    if isinstance(devices, str):
        text = devices.strip()
        if "," in text:
            try:
                parsed = [int(part) for part in text.split(",") if part.strip()]
            except ValueError:
                raise ValueError(f"devices={devices!r} is neither a number of '{DEVICE_NAME}' devices nor a "
                                 f"comma-separated list of indices") from None
        else:
            try:
                parsed = int(text)
            except ValueError:
                raise ValueError(f"devices={devices!r} is neither a number of '{DEVICE_NAME}' devices nor a "
                                 f"comma-separated list of indices") from None
    elif isinstance(devices, bool) or not isinstance(devices, (int, list, tuple)):
        raise ValueError(f"devices={devices!r}: give a number of '{DEVICE_NAME}' devices or a list of indices")
    else:
        parsed = list(devices) if isinstance(devices, (list, tuple)) else devices
    if parsed == -1:
        parsed = count
    if isinstance(parsed, int):
        if not 1 <= parsed <= count:
            raise ValueError(f"devices={devices!r}: this machine has {count} '{DEVICE_NAME}' device(s) "
                             f"({_what_counts()}); ask for 1 to {count}, or -1 for all")
        return parsed
    bad = [i for i in parsed if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < count]
    if not parsed or bad or len(set(parsed)) != len(parsed):
        raise ValueError(f"devices={devices!r}: indices must be distinct, from 0 to {count - 1} (this machine has "
                         f"{count} '{DEVICE_NAME}' device(s): {_what_counts()})")
    return parsed


def _what_counts() -> str:
    return ("as many as the selected plugin reports; `python -m pjrt_host info` lists them and the plugin's "
            "settings that change them" if is_available()
            else "no pjrt_host plugin reports a device: `python -m pjrt_host list` says why")


def get_parallel_devices(devices: _DevicesInput) -> list[torch.device]:
    """One torch device per rank: 'jax:0' ... for a count, the indices given
    for a list."""
    parsed = parse_devices(devices)
    indices = range(parsed) if isinstance(parsed, int) else parsed
    return [torch.device(DEVICE_NAME, i) for i in indices]


def become_rank(global_rank: int, world_size: int, local_rank: int, local_world_size: int, node_rank: int,
                num_nodes: int, main_address: str, main_port: int) -> None:
    """Make this process rank ``global_rank`` of a pjrt_host job before its
    client exists, by the launcher variables pjrt_host reads (torchrun's).
    Lightning's own launcher sets only some of them (no ``RANK``, no
    ``LOCAL_WORLD_SIZE``).  Raises RuntimeError when the client already
    exists as something else (the device was used before the processes were
    started)."""
    if torch.jax.is_initialized():
        have = _distributed.layout()
        if (have.rank, have.world_size) != (global_rank, world_size):
            raise RuntimeError(
                f"this process already uses the '{DEVICE_NAME}' device as rank {have.rank} of {have.world_size} "
                f"({have.launcher}), but Lightning runs it as rank {global_rank} of {world_size}: a process has "
                f"one client, made when it first used the device. Make no '{DEVICE_NAME}' tensor before "
                f"Trainer.fit / Fabric.launch starts the processes, or start them yourself with "
                f"`python -m pjrt_host launch --nproc-per-node {local_world_size} script.py` (or torchrun)")
        return
    values = {
        "RANK": global_rank, "WORLD_SIZE": world_size, "LOCAL_RANK": local_rank,
        "LOCAL_WORLD_SIZE": local_world_size, "GROUP_RANK": node_rank, "GROUP_WORLD_SIZE": num_nodes,
        "MASTER_ADDR": main_address, "MASTER_PORT": main_port,
    }
    for name, value in values.items():
        os.environ[name] = str(value)


def rank_device() -> torch.device:
    """This rank's device, once its process is set up (the client is created
    here): the process's first device.  pjrt_host's plugins give each
    process of a job its own share of the host's devices, numbered from 0
    (a GPU or TPU chip each); cpu_ref gives each process the same
    ``PJRT_HOST_CPU_REF_DEVICES`` devices, one CPU, so any of them serves.
    (The first, also because torch's autograd engine sizes its per-device
    queues before a Python backend's count is known, so a backward on
    'jax:1' fails there.)"""
    if torch.jax.device_count() < 1:
        raise RuntimeError(f"this process has no '{DEVICE_NAME}' device: `python -m pjrt_host list` says why")
    return torch.device(DEVICE_NAME, 0)


def single_device(device: Any, owner: str) -> torch.device:
    """``device`` as a single-device strategy takes it: a 'jax' device, its
    index filled in (0); anything else refused naming ``owner``."""
    device = torch.device(device)
    if device.type != DEVICE_NAME:
        raise ValueError(f"{owner} runs on a '{DEVICE_NAME}' device, not {device}")
    return torch.device(DEVICE_NAME, 0) if device.index is None else device


class RankDevice:
    """The rank's device and its set-up, for Trainer's and Fabric's
    ``JaxDDPStrategy`` (placed before Lightning's DDPStrategy among the
    bases).  Each names its Lightning's world-ranks setter in
    :meth:`_world_ranks` (Trainer: ``set_world_ranks``, Fabric:
    ``_set_world_ranks``)."""

    _rank_device: Any = None

    def _world_ranks(self) -> None:
        raise NotImplementedError

    @property
    def root_device(self) -> torch.device:
        if self._rank_device is None:
            # Before the processes are set up only the index is known; asking
            # the device count would create the client too early.
            if not torch.jax.is_initialized():
                devices = self.parallel_devices  # type: ignore[attr-defined]
                local_rank = self.local_rank  # type: ignore[attr-defined]
                return torch.device(devices[local_rank]) if devices else torch.device(DEVICE_NAME, local_rank)
            self._rank_device = rank_device()
        return self._rank_device

    def setup_environment(self) -> None:
        self._world_ranks()
        env = self.cluster_environment  # type: ignore[attr-defined]
        assert env is not None
        become_rank(self.global_rank, self.world_size, self.local_rank, self.num_processes,  # type: ignore[attr-defined]
                    self.node_rank, self.num_nodes, env.main_address, env.main_port)  # type: ignore[attr-defined]
        self._rank_device = rank_device()
        super().setup_environment()  # type: ignore[misc]

    def _connect(self) -> None:
        """Lightning's process-group set-up without
        ``init_process_group(device_id=...)``: torch then asks the group for
        a 'jax' backend to split, which c10d's device map for a backend
        registered from Python does not hold."""
        from lightning.fabric.utilities.distributed import _init_dist_connection

        self._world_ranks()
        self._process_group_backend = self._get_process_group_backend()  # type: ignore[attr-defined]
        assert self.cluster_environment is not None  # type: ignore[attr-defined]
        _init_dist_connection(self.cluster_environment, self._process_group_backend,  # type: ignore[attr-defined]
                              timeout=self._timeout)  # type: ignore[attr-defined]


def grad_scaler(precision: str, scaler: Any) -> Any:
    """The scaler a mixed-precision plugin takes: the user's, else
    ``GradScaler('jax')`` for ``'16-mixed'`` (bfloat16 needs none)."""
    if precision == "16-mixed" and scaler is None:
        return torch.amp.GradScaler(DEVICE_NAME)
    return scaler
