"""Per-device random state: a seed and a counter.

Each random op draws its key as ``fold_in(key(seed), counter)`` inside its
compiled function (:func:`draw_key`) and advances the counter by one, so a random op costs no
extra device work and ``torch.manual_seed(s)`` makes every later draw
reproducible.  Nothing here imports jax until a key is needed.
"""

from __future__ import annotations

import struct
import threading
from typing import Any

__all__ = ["DEFAULT_SEED", "State", "draw_key", "next_key_args", "seed_all", "seed_one", "state"]

#: torch's default seed for its accelerator generators.
DEFAULT_SEED = 67280421310721

_lock = threading.Lock()


class State:
    """Seed and draw counter of one device."""

    __slots__ = ("seed", "counter", "_key")

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.counter = 0
        self._key: Any = None  # jax key data for ``seed``, made on first draw

    def key_data(self) -> Any:
        if self._key is None:
            import numpy as np

            s = self.seed & 0xFFFFFFFFFFFFFFFF
            # Raw threefry key data (two uint32 words): no jax dispatch here,
            # the compiled op wraps it.
            self._key = np.array([s >> 32, s & 0xFFFFFFFF], dtype=np.uint32)
        return self._key

    def to_bytes(self) -> bytes:
        return struct.pack("<QQ", self.seed & 0xFFFFFFFFFFFFFFFF, self.counter)

    @classmethod
    def from_bytes(cls, data: bytes) -> State:
        seed, counter = struct.unpack("<QQ", data)
        st = cls(seed)
        st.counter = counter
        return st


_states: dict[int, State] = {}
_pending_seed: int | None = None  # a manual_seed_all before the device count is known


def state(index: int) -> State:
    st = _states.get(index)
    if st is None:
        with _lock:
            st = _states.get(index)
            if st is None:
                st = _states[index] = State(DEFAULT_SEED if _pending_seed is None else _pending_seed)
    return st


def seed_all(seed: int) -> None:
    """Seed every device (known or not yet created)."""
    global _pending_seed
    seed = int(seed)
    with _lock:
        _pending_seed = seed
        for index in list(_states):
            _states[index] = State(seed)


def seed_one(index: int, seed: int) -> None:
    with _lock:
        _states[index] = State(int(seed))


def set_state(index: int, new: State) -> None:
    with _lock:
        _states[index] = new


def next_key_args(index: int, generator: Any = None) -> tuple[Any, int]:
    """(key data, counter) for one draw on device ``index``; advances it.

    A torch CPU ``generator`` passed to a random op seeds the draw from that
    generator (advancing it), so ``torch.Generator().manual_seed(s)`` is
    reproducible on the device too."""
    if generator is not None:
        import torch

        seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator))
        return State(seed).key_data(), 0
    st = state(index)
    with _lock:
        counter = st.counter
        st.counter = counter + 1
    return st.key_data(), counter


def draw_key(key_data: Any, counter: Any) -> Any:
    """Traceable: the jax key of one draw, from the (key data, counter) pair
    :func:`next_key_args` gave.  Every program that draws builds its key
    here: eager ops, factories, compiled graphs and ``assume_pure``."""
    import jax
    import jax.numpy as jnp

    return jax.random.fold_in(jax.random.wrap_key_data(jnp.asarray(key_data, jnp.uint32), impl="threefry2x32"),
                              counter)
