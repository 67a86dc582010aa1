"""Agents that bring their own loop: ``gym.make("IdeGym-Agent-v0", task=..., harness=...)``.

A harness (mini-swe-agent, a tmux terminal agent, OpenAI's Codex CLI) runs inside the task's
sandbox; its model calls are the env's observations and the policy's replies its actions, or,
in pass-through mode, are forwarded to a model server and recorded. See docs/agents.md.
"""

from .harnesses import HARNESSES, Harness, get_harness, register_harness
from .layers import Layer, LayerSpec, ensure

AGENT_ENV_ID = "IdeGym-Agent-v0"

__all__ = ["AGENT_ENV_ID", "HARNESSES", "Harness", "Layer", "LayerSpec", "ensure", "get_harness",
           "register_harness"]
