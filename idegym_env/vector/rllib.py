"""The env creator RLlib registers: a ``RayVectorEnv`` when RLlib asks for ``num_envs``, else one env."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from .env import RayVectorEnv
from .sub_envs import build_env

# Arguments that only the vector env takes; a single env built by ``rllib_env_creator`` drops them.
_VECTOR_ONLY = ("actor_options", "step_timeout", "max_slot_restarts", "ray_init_kwargs", "envs_per_actor")


def rllib_env_creator(config: Any) -> gym.Env | gym.vector.VectorEnv:
    """An env creator for ``ray.tune.registry.register_env``.

    RLlib's ``SingleAgentEnvRunner`` calls the creator with ``num_envs`` added to ``env_config``
    when ``gym_env_vectorize_mode`` is ``VECTOR_ENTRY_POINT``: that gives a :class:`RayVectorEnv`.
    Without ``num_envs`` (other modes) it gives one ``IdeGymEnv`` with ``env_wrappers`` applied.
    Every other key of ``env_config`` goes to the env (``task``, ``control_plane_url``, …).
    """
    kwargs = dict(config)
    num_envs = kwargs.pop("num_envs", None)
    if num_envs is not None:
        return RayVectorEnv(num_envs=num_envs, **kwargs)
    wrappers = kwargs.pop("env_wrappers", ())
    for key in _VECTOR_ONLY:
        kwargs.pop(key, None)
    if kwargs.get("max_steps") is None and "max_episode_steps" in kwargs:
        kwargs["max_steps"] = kwargs.pop("max_episode_steps")
    kwargs.pop("max_episode_steps", None)
    return build_env(kwargs, wrappers)


__all__ = ["rllib_env_creator"]
