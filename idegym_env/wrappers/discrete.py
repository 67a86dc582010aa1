"""``DiscreteActions``: a task's candidate tool calls as a ``Discrete(n)`` action space.

A policy with a categorical head (RLlib's and SB3's defaults) cannot write tool calls, but it can
choose among a few. Every bundled task lists ``actions``: 3–8 candidate calls (run the tests, show
a file, a wrong patch, the fix, …), at least one of which solves the task. This wrapper makes
action ``i`` run ``calls[i]``; by default the list is the task's ``actions`` followed by
``submit`` (which ends the episode with the task's reward).

    env = DiscreteActions(gym.make("IdeGym-v0", task="python-roman-numerals"))
    env.action_space          # Discrete(6)
    env.labels                # ['bash: $IDEGYM_JUDGE tests/', 'bash: cat -n roman.py', …, 'submit']

``actions=`` gives your own list: tool-call dicts (any shape ``IdeGymEnv.step`` accepts),
``ToolCall`` objects, or plain strings, which are bash commands.

An index outside ``0..n-1`` (or not an integer) is an invalid action like any other: the
episode goes on, the step counts, the env's ``invalid_action_penalty`` applies, and the
observation says which indices exist and what they do (``info["invalid_action"]`` is True).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from ..spaces import InvalidAction, ToolCall, ToolCallSpace

LABEL_WIDTH = 80


def _tool_call(item: Any, parser: ToolCallSpace) -> ToolCall:
    if isinstance(item, str):
        item = {"tool": "bash", "arguments": {"command": item}}
    try:
        return parser.parse(item)
    except InvalidAction as exc:
        raise ValueError(f"not a usable action for DiscreteActions: {item!r}: {exc.reason}") from None


def label(call: ToolCall) -> str:
    """A one-line description of a tool call, e.g. ``edit_file roman.py:5-11`` (its tool's label)."""
    text = " ".join(call.label().split())
    return text if len(text) <= LABEL_WIDTH else text[: LABEL_WIDTH - 1] + "…"


class DiscreteActions(gym.ActionWrapper):
    """``Discrete(n)`` over a list of tool calls (default: the task's ``actions`` + ``submit``)."""

    def __init__(self, env: gym.Env, actions: Sequence[Any] | None = None, *, submit: bool = True) -> None:
        super().__init__(env)
        inner = env.unwrapped
        space = getattr(inner, "action_space", None)
        parser = space if isinstance(space, ToolCallSpace) else ToolCallSpace()
        if actions is None:
            task = getattr(inner, "task", None)
            if task is None:
                raise ValueError("the env has no task: pass actions=[...]")
            actions = list(task.actions)
            if not actions:
                raise ValueError(f"task {task.id!r} lists no actions: pass actions=[...]")
        calls = [_tool_call(a, parser) for a in actions]
        if submit and not any(c.ends_episode for c in calls):
            calls.append(_tool_call({"tool": "submit"}, parser))
        if not calls:
            raise ValueError("DiscreteActions needs at least one action")
        self.calls: tuple[ToolCall, ...] = tuple(calls)
        self.labels: list[str] = [label(c) for c in self.calls]
        self.action_space = gym.spaces.Discrete(len(self.calls))

    def index(self, action: Any) -> int | None:
        """The action as a valid index, or None."""
        if isinstance(action, np.ndarray) and action.size == 1:
            action = action.reshape(()).item()
        if isinstance(action, (bool, np.bool_)):
            return None
        if isinstance(action, str) and action.strip().isdigit():
            action = int(action.strip())
        if isinstance(action, numbers.Integral) and 0 <= int(action) < len(self.calls):
            return int(action)
        return None

    def action(self, action: Any) -> ToolCall:
        i = self.index(action)
        if i is None:
            raise InvalidAction(self._invalid_message(action))
        return self.calls[i]

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        i = self.index(action)
        if i is not None:
            return self.env.step(self.calls[i])
        # Let the env account for the step (budget, penalty, transcript) with an action that can
        # never run anything, then say in the observation what the valid choices are.
        message = self._invalid_message(action)
        obs, reward, terminated, truncated, info = self.env.step(f"<invalid action index {action!r}>")
        info["invalid_action"] = True
        info["error"] = message
        if isinstance(obs, str):
            grading = obs.find("\n\n[checks]")
            text = message + (obs[grading:] if grading >= 0 else "")
            fit = getattr(self.env.observation_space, "fit", None)
            obs = fit(text) if callable(fit) else text
        return obs, reward, terminated, truncated, info

    def _invalid_message(self, action: Any) -> str:
        shown = repr(action)
        if len(shown) > 100:
            shown = shown[:99] + "…"
        choices = "\n".join(f"  {i}: {text}" for i, text in enumerate(self.labels))
        return f"invalid action {shown}: choose an index from 0 to {len(self.calls) - 1}:\n{choices}"


__all__ = ["DiscreteActions", "label"]
