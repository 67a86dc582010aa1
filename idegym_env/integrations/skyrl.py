"""SkyRL: :class:`IdeGymTextEnv`, a ``skyrl_gym`` ``BaseTextEnv`` registered as ``"idegym"``
(``pip install 'idegym[skyrl]'``).

::

    import skyrl_gym
    import idegym_env.integrations.skyrl  # registers "idegym"

    env = skyrl_gym.make("idegym", env_config={"control_plane_url": None},
                         extras={"task": "python-roman-numerals", "max_turns": 20})
    prompt, meta = env.init([{"role": "user", "content": "Fix the bug."}])
    out = env.step('<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>')
    ...
    env.close()

SkyRL's generator (``skyrl_train/generators/skyrl_gym_generator.py``) calls
``skyrl_gym.make(env_class, env_config=..., extras=row_extras)``, then ``init(prompt)``, then
``step(llm_text)`` until ``done``, then ``get_metrics()`` and ``close()``. Here:

* ``extras["task"]`` names the task (a bundled id or a task directory); ``extras["max_turns"]``
  (SkyRL sets it) bounds the turns; the last turn grades.
* ``init`` starts the episode and appends the instruction and a tool guide to the last user
  message (or adds one).
* ``step`` reads one tool call from the model's text: ``<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>`` (Hermes/Qwen style), a JSON object, or a fenced JSON block. The tools are
  those of :data:`~._episode.TOOL_NAMES`; ``submit`` grades and ends the episode with the task's
  reward. A malformed call costs a turn and its observation is our message.
* An infrastructure failure (sandbox died, control plane unreachable) raises
  :class:`~._episode.InfrastructureError` from ``step``/``init`` (after handing the sandbox
  back): there is no reward to report, and a reward of 0 would be a lie.
* ``close`` hands the sandbox back; so does the end of the episode and interpreter exit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from skyrl_gym import register, registry
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType

from ..rewards import CheckResults
from ._episode import TOOL_NAMES, InfrastructureError, ToolCallEpisode, ToolCallError, tool_guide

ENV_ID = "idegym"
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_FENCE = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)
CALL_FORMAT = ('Call one tool per turn as <tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>.')
_CONFIG_KEYS = {"control_plane_url", "allowed_tasks", "max_steps", "bash_timeout", "max_observation_chars",
                "invalid_action_penalty"}


def _config(env_config: Any) -> dict[str, Any]:
    if env_config is None:
        return {}
    if not isinstance(env_config, Mapping):  # omegaconf DictConfig is a Mapping; anything else is a mistake
        raise TypeError(f"env_config must be a mapping (dict or DictConfig), not {type(env_config).__name__}")
    config = {str(k): v for k, v in env_config.items()}
    unknown = set(config) - _CONFIG_KEYS
    if unknown:
        raise ValueError(f"unknown idegym env_config keys {sorted(unknown)}; known: {sorted(_CONFIG_KEYS)}")
    if config.get("allowed_tasks") is not None:
        config["allowed_tasks"] = tuple(config["allowed_tasks"])
    return config


class IdeGymTextEnv(BaseTextEnv):
    """An IdeGym episode as a SkyRL text environment (see the module docstring)."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        extras = dict(extras or {})
        if not extras.get("task"):
            raise ValueError("extras must name the task: extras={'task': <bundled task id or task directory>, ...}")
        self.task_name = str(extras["task"])
        self.max_turns = int(extras.get("max_turns") or 0) or 0
        config = _config(env_config)
        if self.max_turns and "max_steps" not in config:
            config["max_steps"] = self.max_turns  # the env grades on its last step
        self.episode = ToolCallEpisode(**config)
        self.chat_history: ConversationType = []

    def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        instruction = self._guarded(lambda: self.episode.start(self.task_name))
        env = self.episode.env
        assert env is not None
        if self.max_turns == 0:
            self.max_turns = env.max_steps
        text = f"{instruction}\n\n{tool_guide()}\n{CALL_FORMAT}"
        prompt = list(prompt or [])
        if prompt and prompt[-1].get("role") == "user":
            prompt[-1] = {**prompt[-1], "content": f"{prompt[-1]['content']}\n\n{text}"}
        else:
            prompt.append({"role": "user", "content": text})
        self.chat_history = list(prompt)
        return prompt, {"task_id": env.task.id, "max_turns": self.max_turns, "server_id": self.episode.last_info.get(
            "server_id")}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        self.chat_history.append({"role": "assistant", "content": action})
        try:
            name, arguments = parse_tool_call(action)
            outcome = self._guarded(lambda: self.episode.call(name, arguments))
        except ToolCallError as exc:
            if not self.episode.active:
                raise
            text, metadata = f"error: {exc}", {"invalid_action": True, "error": str(exc)}
            if self.turns >= self.max_turns:  # the last turn is spent: grade what there is
                outcome = self._guarded(self.episode.submit)
                return self._output(f"{text}\n\n{outcome.text}", outcome.reward, True,
                                    {**metadata, **_metadata(outcome.info)})
            return self._output(text, 0.0, False, metadata)
        done = outcome.done
        if not done and self.turns >= self.max_turns:
            final = self._guarded(self.episode.submit)
            return self._output(f"{outcome.text}\n\n{final.text}", final.reward, True, _metadata(final.info))
        return self._output(outcome.text, outcome.reward, done, _metadata(outcome.info))

    def get_metrics(self) -> dict[str, Any]:
        info = self.episode.last_info
        tests = CheckResults.from_responses(**(info.get("checks") or {})).tests  # the sandbox's models again
        metrics: dict[str, Any] = {"turns": self.turns}
        if self.episode.reward is not None:
            metrics["reward"] = self.episode.reward
        if tests is not None:
            metrics.update(tests_passed=tests.scores.passed, tests_total=tests.scores.total)
        return metrics

    def close(self) -> None:
        self.episode.end()

    # -- helpers --------------------------------------------------------------------------------------

    def _output(self, text: str, reward: float, done: bool, metadata: dict[str, Any]) -> BaseTextEnvStepOutput:
        observation = {"role": "user", "content": text}
        if not done:
            self.chat_history.append(observation)
        return BaseTextEnvStepOutput(observations=[] if done else [observation], reward=float(reward), done=done,
                                     metadata=metadata)

    def _guarded(self, fn: Any) -> Any:
        try:
            return fn()
        except InfrastructureError:
            self.episode.end()
            raise


def _metadata(info: dict[str, Any]) -> dict[str, Any]:
    keep = ("tool", "exit_code", "timed_out", "error", "submitted", "checks", "reward_components", "truncated_by")
    return {k: info[k] for k in keep if k in info}


def parse_tool_call(text: str) -> tuple[str, dict[str, Any] | None]:
    """The one tool call in a model's text: ``<tool_call>{json}</tool_call>``, a fenced JSON block
    or a bare JSON object with ``name`` (or ``tool``) and ``arguments``. Raises ``ToolCallError``."""
    if not isinstance(text, str):
        raise ToolCallError(f"the action must be the model's text, not {type(text).__name__}")
    tagged = _TOOL_CALL.findall(text)
    if len(tagged) > 1:
        raise ToolCallError(f"one tool call per turn, found {len(tagged)}. {CALL_FORMAT}")
    if tagged:
        body = tagged[0]
    else:
        fenced = _FENCE.search(text)
        body = fenced.group(1) if fenced else text.strip()
    if not body.startswith("{"):
        raise ToolCallError(f"no tool call found. {CALL_FORMAT}")
    try:
        call = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ToolCallError(f"the tool call is not valid JSON ({exc.msg} at column {exc.colno}). "
                            f"{CALL_FORMAT}") from None
    if not isinstance(call, dict):
        raise ToolCallError(f"a tool call is a JSON object. {CALL_FORMAT}")
    name = call.get("name", call.get("tool"))
    if not isinstance(name, str) or name not in TOOL_NAMES:
        raise ToolCallError(f"unknown tool {name!r}; the tools are {', '.join(TOOL_NAMES)}")
    arguments = call.get("arguments")
    if isinstance(arguments, str):  # some models send the arguments JSON-encoded
        try:
            arguments = json.loads(arguments) if arguments.strip() else None
        except json.JSONDecodeError as exc:
            raise ToolCallError(f"the arguments of {name} are not valid JSON: {exc.msg}") from None
    if arguments is not None and not isinstance(arguments, dict):
        raise ToolCallError(f"the arguments of {name} must be an object")
    return name, arguments


def register_env() -> None:
    """Register ``"idegym"`` with ``skyrl_gym`` (done on import; safe to call again)."""
    if ENV_ID not in registry:
        register(id=ENV_ID, entry_point="idegym_env.integrations.skyrl:IdeGymTextEnv")


register_env()

__all__ = ["IdeGymTextEnv", "ENV_ID", "parse_tool_call", "register_env"]
