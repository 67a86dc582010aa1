"""IdeGym inside the trainers people use: thin adapters over the client and :class:`~idegym_env.env.IdeGymEnv`.

==========================  ===============================================  ====================
framework                   what IdeGym provides                             extra
==========================  ===============================================  ====================
Harbor (``harbor run``)     :class:`.harbor.IdeGymEnvironment`, a Harbor     ``idegym[harbor]``
                            environment provider (``--env IMPORT_PATH``)     (Python >= 3.12)
TRL (``GRPOTrainer``)       :class:`.trl.IdeGymTRLEnv` for                   ``idegym[trl]``
                            ``environment_factory``
SkyRL (``skyrl_gym``)       :class:`.skyrl.IdeGymTextEnv`, registered as     ``idegym[skyrl]``
                            ``"idegym"``
MCP (official SDK)          ``idegym mcp serve`` (:mod:`.mcp`), stdio or      ``idegym[mcp]``
                            streamable HTTP
mini-swe-agent              :class:`.mini_swe_agent.IdeGymEnvironment`, an   ``idegym[mini-swe-agent]``
                            ``environment_class``
NeMo Gym                    :class:`.nemo_gym.IdeGymSandboxProvider`, the    ``idegym[nemo-gym]``
                            ``nemo_gym.sandbox_providers`` entry point       (Python >= 3.12)
                            ``idegym``
verl                        :class:`.verl.IdeGymAgentLoop`, an agent loop    ``idegym[verl]``
                            (``agent_loop_config_path``)
verifiers                   :mod:`.verifiers`, a taskset (id                 ``idegym[verifiers]``
                            ``idegym-verifiers``: the alias package
                            ``idegym_verifiers``); or ``idegym openenv
                            serve`` behind verifiers' OpenEnv taskset
==========================  ===============================================  ====================

TRL, SkyRL, MCP, mini-swe-agent, verl, verifiers and NeMo Gym's task sandboxes share
:class:`._episode.ToolCallEpisode` (one episode's tool calls through ``IdeGymEnv.step``, its grading);
Harbor's provider drives sandboxes through the async client. None of them
grades or runs an episode by itself. Each module imports its framework on import, so importing
this package costs nothing. See ``docs/integrations.md``.
"""

from ._episode import InfrastructureError, ToolCallEpisode, ToolCallError

__all__ = ["ToolCallEpisode", "InfrastructureError", "ToolCallError"]
