"""Scripted policies for ``IdeGym-Agent-v0`` tests and benchmarks: each answers in its harness's
own format (a mini-swe-agent bash tool call, a tmux agent's JSON keystrokes, a Codex function call)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


# A small agent that speaks Anthropic's Messages API (streamed), as Claude Code does: bash tool uses
# until the model ends its turn. Run inside the sandbox with python3 -c.
ANTHROPIC_AGENT = r"""
import json, os, subprocess, urllib.request
base = os.environ["ANTHROPIC_BASE_URL"]
tools = [{"name": "bash", "description": "run bash", "input_schema": {"type": "object",
          "properties": {"command": {"type": "string"}}, "required": ["command"]}}]
messages = [{"role": "user", "content": os.environ["IDEGYM_INSTRUCTION"]}]
while True:
    body = json.dumps({"model": "claude-x", "max_tokens": 1024, "system": "You fix code.", "stream": True,
                       "tools": tools, "messages": messages}).encode()
    req = urllib.request.Request(base + "/v1/messages", data=body, method="POST", headers={
        "x-api-key": os.environ["ANTHROPIC_API_KEY"], "anthropic-version": "2023-06-01",
        "content-type": "application/json"})
    blocks, stop = {}, None
    with urllib.request.urlopen(req, timeout=600) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.read().decode().splitlines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "content_block_start":
                blocks[event["index"]] = dict(event["content_block"], _json="")
            elif event["type"] == "content_block_delta":
                delta = event["delta"]
                if delta["type"] == "text_delta":
                    blocks[event["index"]]["text"] += delta["text"]
                else:
                    blocks[event["index"]]["_json"] += delta["partial_json"]
            elif event["type"] == "message_delta":
                stop = event["delta"]["stop_reason"]
    content = []
    for _, block in sorted(blocks.items()):
        raw = block.pop("_json")
        if block["type"] == "tool_use":
            block["input"] = json.loads(raw or "{}")
        content.append(block)
    messages.append({"role": "assistant", "content": content})
    if stop != "tool_use":
        print("ended:", stop)
        break
    results = []
    for block in content:
        if block["type"] == "tool_use":
            out = subprocess.run(block["input"]["command"], shell=True, capture_output=True, text=True)
            results.append({"type": "tool_result", "tool_use_id": block["id"], "content": out.stdout + out.stderr})
    messages.append({"role": "user", "content": results})
"""


class FixedModel(BaseHTTPRequestHandler):
    """A model server with one answer, JSON as a server may write it: compact, not ASCII."""

    protocol_version = "HTTP/1.1"
    answer = ('{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":'
              '{"role":"assistant","content":"café ✓"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,'
              '"completion_tokens":1,"total_tokens":2}}').encode()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.answer)))
        self.end_headers()
        self.wfile.write(self.answer)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def fixed_model() -> Iterator[str]:
    """A ``FixedModel`` server on a loopback port; its base URL (``.../v1``)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), FixedModel)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
