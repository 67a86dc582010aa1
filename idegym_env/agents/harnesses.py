"""The agent harnesses ``IdeGym-Agent-v0`` runs: what each installs (its layer), how it starts,
which model API it speaks. Add one with ``register_harness`` (see docs/agents.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .apis import ANTHROPIC, CHAT, RESPONSES
from .layers import LayerSpec

MINI_SWE_AGENT_VERSION = "2.4.6"
CODEX_VERSION = "0.169.0"
CLAUDE_CODE_VERSION = "2.1.328"


@dataclass(frozen=True)
class Harness:
    name: str
    layer: LayerSpec
    command: Callable[[str], list[str]]  # the layer's path inside the sandbox -> argv
    api: str  # the model API it speaks: chat | anthropic | responses
    version: str
    env: dict[str, str] = field(default_factory=dict)
    submit_hint: str = ""  # how the harness's own format ends the task (docs, scripted policies)


HARNESSES: dict[str, Harness] = {}


def register_harness(harness: Harness) -> Harness:
    HARNESSES[harness.name] = harness
    return harness


def get_harness(name: str | Harness) -> Harness:
    if isinstance(name, Harness):
        return name
    try:
        return HARNESSES[name]
    except KeyError:
        raise ValueError(f"unknown harness {name!r}: one of {', '.join(sorted(HARNESSES))} "
                         "(or register_harness your own)") from None


register_harness(Harness(
    name="mini-swe-agent",
    layer=LayerSpec("mini-swe-agent", pip=(f"mini-swe-agent=={MINI_SWE_AGENT_VERSION}",),
                    drivers=("mini_swe_agent.py",)),
    command=lambda inside: ["python3", "-I", f"{inside}/mini_swe_agent.py"],
    api=CHAT, version=MINI_SWE_AGENT_VERSION,
    submit_hint="a bash tool call whose command is `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`",
))

register_harness(Harness(
    name="tmux",
    layer=LayerSpec("tmux-agent", drivers=("tmux_agent.py",)),
    command=lambda inside: ["python3", "-I", f"{inside}/tmux_agent.py"],
    api=CHAT, version="1",
    submit_hint='{"analysis": ..., "commands": [...], "task_complete": true}',
))

register_harness(Harness(
    name="codex",
    layer=LayerSpec("codex", npm=(f"@openai/codex@{CODEX_VERSION}",), drivers=("codex_agent.sh",)),
    command=lambda inside: ["bash", f"{inside}/codex_agent.sh"],
    api=RESPONSES, version=CODEX_VERSION,
    submit_hint="a reply without tool calls (codex exec ends its turn)",
))

register_harness(Harness(
    name="claude-code",
    layer=LayerSpec("claude-code", npm=(f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}",),
                    drivers=("claude_code_agent.sh",)),
    command=lambda inside: ["bash", f"{inside}/claude_code_agent.sh"],
    api=ANTHROPIC, version=CLAUDE_CODE_VERSION,
    submit_hint="a reply without tool calls (claude -p ends its turn)",
))

__all__ = ["Harness", "HARNESSES", "register_harness", "get_harness", "ANTHROPIC", "CHAT", "RESPONSES"]
