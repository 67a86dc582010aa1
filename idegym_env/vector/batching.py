"""Between the batch a ``RayVectorEnv`` caller sees and its ``num_envs`` slots: seeds and reset
masks spread over the slots, actions split, observations batched, a failed slot's step info."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import concatenate, create_empty_array, iterate

from ..spaces.object_batch import object_array
from . import groups
from .failures import SlotFailure


def check_count(name: str, value: Any) -> None:
    """``value`` is an int >= 1 (numpy's too, never a bool), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def seeds_for(seed: int | Sequence[int | None] | None, num_envs: int) -> list[Any]:
    """One seed a slot: none, ``seed + i`` from one int, or the given sequence (one a slot)."""
    if seed is None:
        return [None] * num_envs
    if isinstance(seed, (int, np.integer)):
        return [int(seed) + i for i in range(num_envs)]
    seeds = list(seed)
    if len(seeds) != num_envs:
        raise ValueError(f"{len(seeds)} seeds for {num_envs} sub-envs")
    return seeds


def reset_slots(options: dict[str, Any] | None, num_envs: int,
                group_size: int) -> tuple[dict[str, Any] | None, list[int]]:
    """``options`` without ``reset_mask``, and the slots to reset: the masked ones (widened to
    whole groups with ``group_size > 1``), else every slot."""
    options = dict(options) if options else None
    mask = options.pop("reset_mask", None) if options else None
    if mask is None:
        return options, list(range(num_envs))
    mask = np.asarray(mask, dtype=np.bool_)
    if mask.shape != (num_envs,):
        raise ValueError(f"options['reset_mask'] must have shape ({num_envs},), got {mask.shape}")
    slots = [i for i in range(num_envs) if mask[i]]
    if group_size > 1:
        slots = groups.whole_groups(slots, group_size)
    return options, slots


def split_actions(actions: Any, action_space: gym.Space, num_envs: int, numeric: bool) -> list[Any]:
    """One action a slot, from a batch of ``action_space`` (numeric) or a sequence of objects."""
    if numeric:
        return list(iterate(action_space, actions))
    if isinstance(actions, (str, bytes, dict)) or not hasattr(actions, "__len__"):
        raise ValueError(f"expected {num_envs} actions (an object array, list or tuple), got "
                         f"{type(actions).__name__}")
    items = list(actions)
    if len(items) != num_envs:
        raise ValueError(f"expected {num_envs} actions, got {len(items)}")
    return items


def batch_observations(observations: list[Any], single_space: gym.Space, numeric: bool) -> Any:
    """The slots' last observations as one batch (a sample for a slot that has none yet)."""
    if numeric:
        filled = [o if o is not None else single_space.sample() for o in observations]
        return concatenate(single_space, filled, create_empty_array(single_space, len(observations)))
    return object_array(observations)


def failure_info(failure: SlotFailure, restarts: int, placement: str, node_id: str | None) -> dict[str, Any]:
    """The step info of a slot whose call failed. An infrastructure failure, not a result: the
    reward of 0 is no score, and ``infrastructure_error`` says so (as for a failed grading)."""
    info = {"error": failure.message, "slot_failure": failure.kind, "infrastructure_error": failure.message,
            "slot_restarts": restarts, "placement": placement, "node_id": node_id}
    if failure.node_lost:
        info["node_lost"] = True
    return info
