"""``ObjectBatch``: the batched space of a non-numeric space (text, tool calls, …).

A vector env with ``n`` sub-envs batches each sub-env's observation (or action) into one value.
Gymnasium batches numeric spaces into arrays with a leading axis; for everything else
(``batch_space`` turns ``Text`` into a ``Tuple`` of strings, which RLlib's ``unbatch`` splits into
characters) this space is a 1-D ``dtype=object`` array with one element per sub-env. Object
arrays are leaves for RLlib's batching and never go through shared memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces as gym_spaces
from gymnasium.vector.utils import batch_space


class ObjectBatch(gym.Space):
    """``n`` members of ``single`` as a 1-D ``dtype=object`` array (text, tool calls, …)."""

    def __init__(self, single: gym.Space, n: int, seed: int | np.random.Generator | None = None) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.single = single
        self.n = n
        super().__init__(shape=(n,), dtype=object, seed=seed)

    def seed(self, seed: int | None = None) -> Any:
        result = super().seed(seed)
        # The elements draw from the single space: seed it from ours so that sample() is reproducible.
        self.single.seed(int(self.np_random.integers(2**31)) if seed is not None else None)
        return result

    def contains(self, x: Any) -> bool:
        if isinstance(x, np.ndarray):
            if x.shape != (self.n,):
                return False
        elif not isinstance(x, (list, tuple)) or len(x) != self.n:
            return False
        return all(self.single.contains(item) for item in x)

    def sample(self, mask: Any | None = None, probability: Any | None = None) -> np.ndarray:
        out = np.empty(self.n, dtype=object)
        for i in range(self.n):
            m = None if mask is None else mask[i]
            p = None if probability is None else probability[i]
            out[i] = self.single.sample(mask=m, probability=p) if (m is not None or p is not None) \
                else self.single.sample()
        return out

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def to_jsonable(self, sample_n: Sequence[np.ndarray]) -> list[list[Any]]:
        return [self.single.to_jsonable(list(x)) for x in sample_n]

    def from_jsonable(self, sample_n: Sequence[Sequence[Any]]) -> list[np.ndarray]:
        return [object_array(self.single.from_jsonable(list(x))) for x in sample_n]

    def __repr__(self) -> str:
        return f"ObjectBatch({self.single!r}, {self.n})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectBatch) and self.n == other.n and self.single == other.single

    def __hash__(self) -> int:
        return hash((ObjectBatch, self.n))


def object_array(items: Iterable[Any]) -> np.ndarray:
    """A 1-D object array of ``items`` (element by element, so that lists or dicts stay whole)."""
    items = list(items)
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out


def is_numeric_space(space: gym.Space) -> bool:
    """True when gymnasium's own batching (``batch_space``/``concatenate``) fits the space."""
    if isinstance(space, (gym_spaces.Box, gym_spaces.Discrete, gym_spaces.MultiDiscrete,
                          gym_spaces.MultiBinary)):
        return True
    if isinstance(space, gym_spaces.Dict):
        return all(is_numeric_space(s) for s in space.spaces.values())
    if isinstance(space, gym_spaces.Tuple):
        return all(is_numeric_space(s) for s in space.spaces)
    return False


def batched_space(space: gym.Space, n: int) -> gym.Space:
    """The space of ``n`` members of ``space``: gymnasium's own for numeric spaces, else an ObjectBatch."""
    return batch_space(space, n) if is_numeric_space(space) else ObjectBatch(space, n)


__all__ = ["ObjectBatch", "object_array", "is_numeric_space", "batched_space"]
