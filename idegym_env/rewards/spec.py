"""Rewards as data: a task names its reward as ``name`` + ``params``; ``build_reward`` makes it.

Grammar (YAML shown; a bare string is shorthand for ``{name: <string>}``)::

    reward: test_pass_fraction                     # a leaf: setup_succeeds, compiles,
                                                   #   test_pass_fraction, all_tests_pass, submitted, verifier_reward
    reward:
      name: weighted_sum
      params:
        terms: {compiles: 0.2, test_pass_fraction: 0.8}      # leaf name -> weight, or a list of
        # terms: [{reward: <spec>, weight: 0.9}, {reward: {name: step_penalty,
        #          params: {per_step: 0.01}}, weight: 1.0}]
        normalize: false
    reward: {name: clip, params: {reward: <spec>, low: 0.0, high: 1.0}}
    reward: {name: step_penalty, params: {per_step: 0.01}}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .combinators import clip, step_penalty, weighted_sum
from .functions import (
    RewardFunction,
    all_tests_pass,
    compiles,
    setup_succeeds,
    submitted,
    test_pass_fraction,
    verifier_reward,
)

LEAVES: dict[str, RewardFunction] = {
    fn.__name__: fn for fn in (setup_succeeds, compiles, test_pass_fraction, all_tests_pass, submitted,
                               verifier_reward)
}


class RewardSpec(BaseModel):
    """A reward by name and parameters. A plain string validates as ``{"name": string}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _buildable(self) -> RewardSpec:
        build_reward(self)  # fail at load time, with the reason, not at the end of an episode
        return self


def _spec(value: Any) -> RewardSpec:
    return value if isinstance(value, RewardSpec) else RewardSpec.model_validate(value)


def _params(
    name: str, params: Mapping[str, Any], allowed: set[str], required: frozenset[str] = frozenset()
) -> None:
    extra = set(params) - allowed
    if extra:
        allowed_text = sorted(allowed) or "none"
        raise ValueError(f"reward {name!r}: unknown params {sorted(extra)}; allowed: {allowed_text}")
    missing = required - set(params)
    if missing:
        raise ValueError(f"reward {name!r}: missing params {sorted(missing)}")


def _weighted_sum(params: Mapping[str, Any]) -> RewardFunction:
    _params("weighted_sum", params, {"terms", "normalize"}, frozenset({"terms"}))
    terms = params["terms"]
    if isinstance(terms, Mapping):
        pairs = [(build_reward(name), weight) for name, weight in terms.items()]
    elif isinstance(terms, list):
        pairs = []
        for term in terms:
            if not isinstance(term, Mapping) or set(term) != {"reward", "weight"}:
                raise ValueError(
                    f"weighted_sum: each term is {{reward: <spec>, weight: <number>}}, got {term!r}")
            pairs.append((build_reward(term["reward"]), term["weight"]))
    else:
        raise ValueError("weighted_sum: terms is a mapping {name: weight} or a list of {reward, weight}")
    normalize = params.get("normalize", False)
    if not isinstance(normalize, bool):
        raise ValueError(f"weighted_sum: normalize must be true or false, got {normalize!r}")
    return weighted_sum(pairs, normalize=normalize)


def _step_penalty(params: Mapping[str, Any]) -> RewardFunction:
    _params("step_penalty", params, {"per_step"}, frozenset({"per_step"}))
    return step_penalty(params["per_step"])


def _clip(params: Mapping[str, Any]) -> RewardFunction:
    _params("clip", params, {"reward", "low", "high"}, frozenset({"reward"}))
    return clip(build_reward(params["reward"]), params.get("low", 0.0), params.get("high", 1.0))


FACTORIES: dict[str, Callable[[Mapping[str, Any]], RewardFunction]] = {
    "weighted_sum": _weighted_sum,
    "step_penalty": _step_penalty,
    "clip": _clip,
}


def register_reward(name: str, factory: Callable[[Mapping[str, Any]], RewardFunction]) -> None:
    """Make ``name`` usable in reward specs; ``factory(params)`` returns the reward function."""
    if name in LEAVES or name in FACTORIES:
        raise ValueError(f"a reward named {name!r} exists already")
    FACTORIES[name] = factory


def build_reward(spec: RewardSpec | str | Mapping[str, Any]) -> RewardFunction:
    """The reward function a spec describes; raises ``ValueError`` naming what is wrong."""
    if isinstance(spec, str):
        name, params = spec, {}
    elif isinstance(spec, RewardSpec):
        name, params = spec.name, spec.params
    elif isinstance(spec, Mapping):
        if "name" not in spec or set(spec) - {"name", "params"}:
            raise ValueError(f"a reward spec is a name or {{name, params}}, got {dict(spec)!r}")
        name, params = spec["name"], spec.get("params") or {}
    else:
        raise ValueError(f"a reward spec is a name or {{name, params}}, got {spec!r}")
    if name in LEAVES:
        _params(name, params, set())
        return LEAVES[name]
    if name in FACTORIES:
        if not isinstance(params, Mapping):
            raise ValueError(f"reward {name!r}: params must be a mapping, got {params!r}")
        return FACTORIES[name](params)
    known = sorted([*LEAVES, *FACTORIES])
    raise ValueError(f"unknown reward {name!r}; known rewards: {', '.join(known)}")


__all__ = ["RewardSpec", "build_reward", "register_reward", "LEAVES"]
