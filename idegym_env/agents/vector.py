"""``IdeGym-Agent-v0`` in Ray actors: ``gym.make_vec("IdeGym-Agent-v0", num_envs=n)`` (the
spec's vector entry point) is a ``RayVectorEnv`` whose sub-envs are ``IdeGymAgentEnv``."""

from __future__ import annotations

from typing import Any

AGENT_ENV_CLASS = "idegym_env.agents.env:IdeGymAgentEnv"


def make_agent_vector_env(num_envs: int = 1, **kwargs: Any) -> Any:
    from ..vector import RayVectorEnv

    return RayVectorEnv(num_envs, env_class=AGENT_ENV_CLASS, **kwargs)
