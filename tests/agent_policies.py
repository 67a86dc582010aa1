"""Scripted policies for ``IdeGym-Agent-v0`` tests and benchmarks: each answers in its harness's
own format (a mini-swe-agent bash tool call, a tmux agent's JSON keystrokes, a Codex function call)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

TASK = "python-roman-numerals"
# The fix of python-roman-numerals: the subtractive pairs among the numerals.
FIX = ("python3 -c \"p='roman.py'; s=open(p).read(); "
       "s=s.replace('(500, \\\"D\\\"),', '(900, \\\"CM\\\"), (500, \\\"D\\\"), (400, \\\"CD\\\"),')"
       ".replace('(50, \\\"L\\\"),', '(90, \\\"XC\\\"), (50, \\\"L\\\"), (40, \\\"XL\\\"),')"
       ".replace('(5, \\\"V\\\"),', '(9, \\\"IX\\\"), (5, \\\"V\\\"), (4, \\\"IV\\\"),'); open(p, 'w').write(s)\"")
CHECK = "python3 -c 'import roman; print(roman.to_roman(1994))'"
SUBMIT_MINI = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def bash_call(command: str, name: str = "bash", key: str = "command") -> dict[str, Any]:
    return {"content": f"Running: {command[:40]}", "tool_calls": [{"function": {"name": name,
                                                                              "arguments": {key: command}}}]}


def mini_swe_agent(solve: bool = True) -> Iterator[dict[str, Any]]:
    if solve:
        yield bash_call(FIX)
        yield bash_call(CHECK)
    yield bash_call(SUBMIT_MINI)


def tmux(solve: bool = True) -> Iterator[str]:
    commands = [{"keystrokes": FIX + "\n", "duration": 1.0}, {"keystrokes": CHECK + "\n", "duration": 1.0}]
    if solve:
        yield json.dumps({"analysis": "fix the numerals", "commands": commands, "task_complete": False})
    yield json.dumps({"analysis": "done", "commands": [], "task_complete": True})


def shell_tool(request: dict[str, Any]) -> tuple[str, Any]:
    """The shell tool of a Codex request and how its command is written (a string or an argv)."""
    for tool in request.get("tools", []):
        fn = tool["function"]
        if "shell" in fn["name"] or fn["name"] == "exec_command":
            props = fn.get("parameters", {}).get("properties", {})
            key = "command" if "command" in props else "cmd"
            return fn["name"], key, props.get(key, {}).get("type")
    raise AssertionError(f"no shell tool among {[t['function']['name'] for t in request.get('tools', [])]}")


def codex_reply(request: dict[str, Any], command: str) -> dict[str, Any]:
    name, key, kind = shell_tool(request)
    value: Any = ["bash", "-lc", command] if kind == "array" else command
    return {"content": None, "tool_calls": [{"function": {"name": name, "arguments": {key: value}}}]}
