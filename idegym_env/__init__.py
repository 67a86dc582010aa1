"""IdeGym: disposable coding sandboxes as reinforcement-learning environments.

    import gymnasium as gym
    import idegym_env  # registers IdeGym-v0

    env = gym.make("IdeGym-v0")                      # a bundled task, embedded control plane
    env = gym.make("IdeGym-v0", task="js-query-string", control_plane_url="http://cp:8000")
"""

import gymnasium as _gym

from .errors import IdeGymError

__version__ = "0.1.0"

ENV_ID = "IdeGym-v0"
AGENT_ENV_ID = "IdeGym-Agent-v0"  # an agent that brings its own loop (idegym_env.agents)

if ENV_ID not in _gym.registry:
    _gym.register(id=ENV_ID, entry_point="idegym_env.env:IdeGymEnv",
                  vector_entry_point="idegym_env.vector:RayVectorEnv")
if AGENT_ENV_ID not in _gym.registry:
    _gym.register(id=AGENT_ENV_ID, entry_point="idegym_env.agents.env:IdeGymAgentEnv", nondeterministic=True,
                  vector_entry_point="idegym_env.agents.vector:make_agent_vector_env")


def __getattr__(name: str):
    # Heavy modules load on first use, so `import idegym_env` stays cheap.
    if name == "IdeGymEnv":
        from .env import IdeGymEnv

        return IdeGymEnv
    if name == "evaluate":
        from .eval import evaluate

        return evaluate
    if name == "RayVectorEnv":
        from .vector import RayVectorEnv

        return RayVectorEnv
    raise AttributeError(name)


__all__ = ["AGENT_ENV_ID", "ENV_ID", "IdeGymEnv", "IdeGymError", "RayVectorEnv", "evaluate", "__version__"]
