"""Reward combinators: build a reward from others. Each result is itself a ``RewardFunction``,
immutable, hashable and with a readable ``repr``."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .functions import RewardFunction
from .results import CheckResults


def reward_name(fn: RewardFunction) -> str:
    """``__name__`` for functions, ``repr`` for combinators."""
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) else repr(fn)


def _finite(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class WeightedSum:
    """``sum(weight * fn(results))``; with ``normalize``, divided by ``sum(|weight|)``."""

    terms: tuple[tuple[RewardFunction, float], ...]
    normalize: bool = False

    def __call__(self, results: CheckResults) -> float:
        # fsum: exact sums, so 0.2 * 1 + 0.8 * 1 is exactly 1.0.
        total = math.fsum(weight * float(fn(results)) for fn, weight in self.terms)
        if self.normalize:
            scale = math.fsum(abs(w) for _, w in self.terms)
            return total / scale if scale else 0.0
        return total

    def __repr__(self) -> str:
        inner = " + ".join(f"{w:g}*{reward_name(fn)}" for fn, w in self.terms)
        return f"weighted_sum({inner}{', normalize' if self.normalize else ''})"


@dataclass(frozen=True)
class StepPenalty:
    """``-per_step * steps``: a cost for every tool call the agent made."""

    per_step: float

    def __call__(self, results: CheckResults) -> float:
        return -self.per_step * results.steps

    def __repr__(self) -> str:
        return f"step_penalty({self.per_step:g})"


@dataclass(frozen=True)
class Clip:
    """``fn(results)`` limited to ``[low, high]``."""

    fn: RewardFunction
    low: float = 0.0
    high: float = 1.0

    def __call__(self, results: CheckResults) -> float:
        return min(max(float(self.fn(results)), self.low), self.high)

    def __repr__(self) -> str:
        return f"clip({reward_name(self.fn)}, {self.low:g}, {self.high:g})"


def weighted_sum(
    terms: Mapping[RewardFunction, float] | Iterable[tuple[RewardFunction, float]], *, normalize: bool = False
) -> WeightedSum:
    """A reward that adds up ``weight * fn(results)`` over ``terms`` (``{fn: weight}`` or pairs).

    Example: ``weighted_sum({compiles: 0.2, test_pass_fraction: 0.8})``.
    """
    pairs = list(terms.items()) if isinstance(terms, Mapping) else list(terms)
    if not pairs:
        raise ValueError("weighted_sum needs at least one term")
    checked = []
    for fn, weight in pairs:
        if not callable(fn):
            raise TypeError(f"weighted_sum term {fn!r} is not a reward function")
        checked.append((fn, _finite(weight, f"the weight of {reward_name(fn)}")))
    return WeightedSum(tuple(checked), normalize)


def step_penalty(per_step: float) -> StepPenalty:
    """A reward of ``-per_step * results.steps`` (``per_step >= 0``); add it with ``weighted_sum``."""
    value = _finite(per_step, "per_step")
    if value < 0:
        raise ValueError(f"per_step is a cost and must be >= 0, got {per_step!r}")
    return StepPenalty(value)


def clip(fn: RewardFunction, low: float = 0.0, high: float = 1.0) -> Clip:
    """``fn`` limited to ``[low, high]`` (default ``[0, 1]``)."""
    lo, hi = _finite(low, "low"), _finite(high, "high")
    if lo > hi:
        raise ValueError(f"clip bounds are reversed: low {lo:g} > high {hi:g}")
    if not callable(fn):
        raise TypeError(f"clip needs a reward function, got {fn!r}")
    return Clip(fn, lo, hi)


__all__ = ["weighted_sum", "step_penalty", "clip", "WeightedSum", "StepPenalty", "Clip", "reward_name"]
