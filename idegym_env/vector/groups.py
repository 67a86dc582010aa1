"""Groups of sub-envs that start every episode from one reset state: ``RayVectorEnv(group_size=k)``.

What a GRPO trainer asks for: k rollouts of the same start. Slots ``g*k .. g*k+k-1`` are one
group and live in one actor. A group's episode starts with one ``reset()`` of its first sub-env
(the leader), whose sandbox is then forked into the other k-1 (``IdeGymEnv.fork``): the same
task and the same filesystem, not k resets. The group starts its next episode when all of its
members have ended theirs (next-step autoreset, as for every slot): until then a member whose
episode ended *waits* — its step ignores the action and answers its last observation with reward
0, not terminated, not truncated, and ``info["group_waiting"] = True`` (mask those steps out).

Here: how the vector env turns per-slot calls into group calls and group answers back into
per-slot ones; the actor side is ``SubEnvGroup.reset_group``.
"""

from __future__ import annotations

from typing import Any

from .failures import SlotFailure

Calls = dict[int, tuple[str, tuple, dict[str, Any]]]


def check_group_size(group_size: Any, num_envs: int, envs_per_actor: int, envs_per_actor_given: bool) -> int:
    """The envs per actor for ``group_size`` (a group never spans two actors)."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
    if num_envs % group_size:
        raise ValueError(f"num_envs ({num_envs}) must be a multiple of group_size ({group_size})")
    if group_size == 1:
        return envs_per_actor
    if not envs_per_actor_given:
        return group_size
    if envs_per_actor % group_size:
        raise ValueError(f"envs_per_actor ({envs_per_actor}) must be a multiple of group_size ({group_size}): "
                         "a group lives in one actor")
    return envs_per_actor


def whole_groups(slots: list[int], group_size: int) -> list[int]:
    """``slots`` when they are whole groups (a reset mask must select groups, not parts of them)."""
    chosen = set(slots)
    for slot in slots:
        first = slot - slot % group_size
        if not set(range(first, first + group_size)) <= chosen:
            raise ValueError(f"with group_size={group_size} a reset selects whole groups: slot {slot} is reset "
                             f"without the rest of its group {list(range(first, first + group_size))}")
    return slots


def reset_calls(slots: list[int], seeds: list[Any], options: dict[str, Any] | None, group_size: int) -> Calls:
    """One ``reset_group`` call per group among ``slots`` (whole groups), on its leader."""
    leaders = sorted({s - s % group_size for s in slots})
    return {g: ("reset_group", (group_size,), {"seed": seeds[g], "options": options}) for g in leaders}


def step_calls(calls: Calls, resetting: list[bool], group_size: int) -> tuple[Calls, list[bool], set[int]]:
    """Per-slot calls of a vector step → group calls: a group whose members all ended resets (on
    its leader), a member that ended before the others waits (no call). Returns the calls, which
    slots reset, and which wait."""
    out: Calls = {}
    reset = list(resetting)
    waiting: set[int] = set()
    for first in range(0, len(resetting), group_size):
        members = range(first, first + group_size)
        if all(resetting[i] for i in members):
            out[first] = ("reset_group", (group_size,), {"seed": None, "options": None})
            continue
        for i in members:
            if resetting[i]:
                waiting.add(i)
                reset[i] = False
            else:
                out[i] = calls[i]
    return out, reset, waiting


def spread(values: dict[int, Any], calls: Calls, group_size: int) -> dict[int, Any]:
    """A leader's ``reset_group`` answer (one ``(obs, info)`` per member), or its failure, to every
    member of its group."""
    out = dict(values)
    for leader, (method, _args, _kwargs) in calls.items():
        if method != "reset_group":
            continue
        value = values[leader]
        for m in range(group_size):
            if isinstance(value, SlotFailure):
                out[leader + m] = value
            elif len(value) != group_size:
                out[leader + m] = SlotFailure("env_error", f"group reset answered {len(value)} members, not "
                                                           f"{group_size}")
            else:
                out[leader + m] = value[m]
    return out


def waiting_step(last_obs: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
    return last_obs, 0.0, False, False, {"group_waiting": True}
