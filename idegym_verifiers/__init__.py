"""The verifiers taskset id ``idegym-verifiers``: verifiers imports a taskset id as a top-level
module, which :mod:`idegym_env.integrations.verifiers` is not (see its docstring)."""

from idegym_env.integrations.verifiers import (
    IdeGymTask,
    IdeGymTaskData,
    IdeGymTaskset,
    IdeGymTasksetConfig,
    IdeGymVerifiersEnv,
    IdeGymVerifiersEnvConfig,
)

__all__ = ["IdeGymTasksetConfig", "IdeGymTaskData", "IdeGymTask", "IdeGymTaskset", "IdeGymVerifiersEnvConfig",
           "IdeGymVerifiersEnv"]
