"""A terminal agent (Terminus-style): the model sees a tmux pane and answers with keystrokes.

Runs inside the sandbox with its python3 (standard library only) and tmux: ``python3 -I
tmux_agent.py`` with the task in ``$IDEGYM_INSTRUCTION``. Each turn it sends the model (OpenAI
chat completions at ``$OPENAI_BASE_URL``) the conversation so far with the pane's screen, and
expects a JSON object::

    {"analysis": "...", "commands": [{"keystrokes": "ls -la\\n", "duration": 0.5}], "task_complete": false}

Keystrokes are typed literally (``\\n`` is Enter; ``C-c`` alone is Ctrl-C); after each it waits
``duration`` seconds (at most 60). ``task_complete: true`` ends the run. An answer that is not such
an object is told so, and the model answers again. Prints one ``IDEGYM_RESULT`` JSON line.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

VERSION = "1"
SESSION = "agent"
MAX_TURNS = int(os.environ.get("IDEGYM_STEP_LIMIT", "0") or 0) or 1000
MAX_DURATION = 60.0
SCREEN_LINES = 40
SYSTEM = """You are an AI assistant solving a task in a Linux terminal (a tmux session running bash).
Each turn you see the terminal's screen. Answer with ONE JSON object and nothing else:
{"analysis": "what you see and plan", "commands": [{"keystrokes": "text to type, \\n for Enter", "duration": 1.0}],
 "task_complete": false}
Keystrokes are typed literally; end a command with \\n. "C-c" alone sends Ctrl-C. duration is how many seconds
to wait after typing (0.1 to 60). Set "task_complete": true once the task is done (your commands then still run)."""

SOCKET = os.path.join(tempfile.mkdtemp(prefix="idegym-tmux-"), "tmux.sock")


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-S", SOCKET, *args], capture_output=True, text=True, check=True).stdout


def screen() -> str:
    return tmux("capture-pane", "-p", "-t", SESSION, "-S", f"-{SCREEN_LINES}").rstrip("\n")


def ask(messages: list) -> str:
    body = json.dumps({"model": os.environ.get("IDEGYM_MODEL_NAME", "idegym-policy"), "messages": messages}).encode()
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions", data=body,
                                 method="POST", headers={"Content-Type": "application/json",
                                                         "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    with urllib.request.urlopen(req, timeout=float(os.environ.get("IDEGYM_CALL_TIMEOUT", "900"))) as resp:
        answer = json.loads(resp.read())
    return answer["choices"][0]["message"].get("content") or ""


def parse(text: str) -> dict:
    """The answer's JSON object (the first ``{`` to the last ``}``), checked."""
    match = re.search(r"\{.*\}", text, re.S)
    if match is None:
        raise ValueError("no JSON object in the answer")
    data = json.loads(match.group(0))
    if not isinstance(data, dict):
        raise ValueError("the answer is not a JSON object")
    commands = data.get("commands", [])
    if not isinstance(commands, list) or not all(isinstance(c, dict) and isinstance(c.get("keystrokes"), str)
                                                 for c in commands):
        raise ValueError('"commands" must be a list of {"keystrokes": str, "duration": number}')
    return data


def type_keys(keys: str) -> None:
    if keys.strip() in ("C-c", "C-d", "C-z", "Escape", "Enter"):
        tmux("send-keys", "-t", SESSION, keys.strip())
        return
    parts = keys.split("\n")
    for n, part in enumerate(parts):
        if part:
            tmux("send-keys", "-t", SESSION, "-l", part)
        if n < len(parts) - 1:
            tmux("send-keys", "-t", SESSION, "Enter")


def main() -> int:
    tmux("new-session", "-d", "-s", SESSION, "-x", "160", "-y", "48", "-c", os.getcwd(), "bash --norc --noprofile")
    tmux("set-option", "-t", SESSION, "history-limit", "5000")
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Task:\n{os.environ['IDEGYM_INSTRUCTION']}\n\nScreen:\n{screen()}"}]
    status = "TurnLimit"
    try:
        for _ in range(MAX_TURNS):
            text = ask(messages)
            messages.append({"role": "assistant", "content": text})
            try:
                data = parse(text)
            except ValueError as exc:
                messages.append({"role": "user", "content": f"Your answer could not be used: {exc}. Answer with one "
                                                            "JSON object as described."})
                continue
            for command in data.get("commands", []):
                type_keys(command["keystrokes"])
                try:
                    duration = float(command.get("duration", 1.0))
                except (TypeError, ValueError):
                    duration = 1.0
                time.sleep(min(max(duration, 0.05), MAX_DURATION))
            if data.get("task_complete") is True:
                status = "Submitted"
                break
            messages.append({"role": "user", "content": f"Screen:\n{screen()}"})
    finally:
        subprocess.run(["tmux", "-S", SOCKET, "kill-server"], capture_output=True)
    print("IDEGYM_RESULT " + json.dumps({"harness": "tmux", "version": VERSION, "exit_status": status}), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except urllib.error.HTTPError as exc:
        sys.exit(f"idegym: the model endpoint answered {exc.code}: {exc.read()[:500]!r}")
