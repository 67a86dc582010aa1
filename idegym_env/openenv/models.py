"""The OpenEnv wire models of an IdeGym episode: ``IdeAction``, ``IdeObservation``, ``IdeState``.

OpenEnv sends an observation as its fields minus ``reward``, ``done`` and ``metadata``
(``serialize_observation``); ``metadata`` never reaches the client. So everything a client needs
— what ``IdeGymEnv`` keeps in ``info`` — is a real field of :class:`IdeObservation`.

An action is one tool call, the same as a :class:`~idegym_env.spaces.ToolCallSpace` action::

    {"tool": "bash", "arguments": {"command": "$IDEGYM_JUDGE tests/"}}
    {"tool": "submit"}

``tool`` is any string and ``arguments`` any object (or the JSON text of one) at this level: the
environment validates the call itself, so an unknown tool or a bad argument comes back as an
observation with ``invalid_action`` set and ``error`` explaining the problem — the episode goes
on. Only a message that is not a tool call at all (no ``tool``, unknown keys) is refused by
OpenEnv's own validation (``VALIDATION_ERROR``), which leaves the session open too.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ._compat import import_openenv

import_openenv()

from openenv.core.env_server.types import Action, Observation, State  # noqa: E402

from ..tools import TOOL_NAMES  # noqa: E402


class IdeAction(Action):
    """One tool call: ``tool`` (one of the task's tools, see ``IdeObservation.tools``) and its
    ``arguments``."""

    tool: str = Field(description=f"The tool to call: one of {', '.join(TOOL_NAMES)} (those the task enables). "
                                  "'submit' ends the episode: the task's checks run and give the reward.")
    arguments: dict[str, Any] | str | None = Field(
        default=None,
        description="The tool's arguments as an object (or the JSON text of one); may be left out for "
                    "'submit'. See the schemas in the reset observation's 'tools'.")


class IdeObservation(Observation):
    """What the agent sees after ``reset`` or ``step``; ``reward`` and ``done`` travel next to it.

    ``done`` is Gymnasium's ``terminated or truncated``; ``truncated`` tells the two apart
    (``submitted`` is the other half). The checks and the reward components are present on the
    grading step only (``submit``, or running out of ``max_steps``).
    """

    text: str = Field("", description="The observation text: the task's instruction after reset, the tool's "
                                      "output (or what was wrong with the action) after a step, with the "
                                      "grading summary appended on the last step.")
    task_id: str = Field("", description="The task of this episode.")
    episode_id: str | None = Field(None, description="The episode's id (given to reset, or generated).")
    step: int = Field(0, ge=0, description="Steps taken in this episode (0 after reset).")
    max_steps: int = Field(0, ge=0, description="Step budget: the episode is truncated (and graded) when "
                                                "'step' reaches it.")
    tool: str | None = Field(None, description="The tool this step called (None for an invalid action).")
    exit_code: int | None = Field(None, description="bash: the command's exit code.")
    timed_out: bool = Field(False, description="bash: the command was killed at its timeout.")
    error: str | None = Field(None, description="What went wrong: an invalid action, a tool error (e.g. a "
                                                "missing file), or a lost sandbox.")
    invalid_action: bool = Field(False, description="The action was not a valid tool call; nothing ran.")
    submitted: bool = Field(False, description="The episode ended with 'submit' (terminated).")
    truncated: bool = Field(False, description="The episode ended without 'submit': out of steps, or the "
                                               "sandbox was lost.")
    checks: dict[str, Any] = Field(default_factory=dict, description="Grading step: the sandbox's answers "
                                   "by stage (setup, compilation, tests), as the sandbox server gave them.")
    reward_components: dict[str, float] = Field(default_factory=dict, description="Grading step: every "
                                                "leaf reward and the raw test counts.")
    grading_errors: list[str] = Field(default_factory=list, description="Grading step: infrastructure "
                                      "problems while grading (they void the reward).")
    seconds: float | None = Field(None, description="Wall time of the step (or of getting the sandbox, "
                                                    "after reset), in seconds.")
    server_id: int | None = Field(None, description="The control plane's server id of the episode's "
                                                    "sandbox (None when the server runs inside it).")
    sandbox: str | None = Field(None, description="After reset: how the sandbox was obtained (started, "
                                                  "reused, restarted, reset).")
    tools: list[dict[str, Any]] = Field(default_factory=list, description="After reset: the task's tools as "
                                        "OpenAI function definitions (name, description, JSON Schema of the "
                                        "arguments).")


class IdeState(State):
    """``episode_id`` and ``step_count`` (OpenEnv's), plus where the episode stands."""

    task_id: str | None = Field(None, description="The task of the current (or next) episode.")
    server_id: int | None = Field(None, description="The control plane's server id of the sandbox, if any.")
    max_steps: int | None = Field(None, description="The task's step budget.")
    done: bool = Field(False, description="The current episode has ended.")
    reward: float | None = Field(None, description="The reward of the last step.")
    mode: str = Field("control-plane", description="'control-plane' (one sandbox per session, from a control "
                                                   "plane) or 'in-sandbox' (the server works on its own sandbox).")


__all__ = ["IdeAction", "IdeObservation", "IdeState"]
