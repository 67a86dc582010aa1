"""The sandbox server's side of agents that bring their own loop: ``/api/agent/start``,
``/api/agent/exchange``, ``/api/agent/stop`` (``sandbox_server/agent_gateway.py``), against a real
server process and a real harness process that calls its model endpoint over HTTP."""

from __future__ import annotations

import base64
import json
import sys
import textwrap
import time

import pytest

from tests.helpers import SandboxProcess, wait_until

KEY = "k" * 16 + "episode-one"

# A harness: asks its model twice (OpenAI chat completions, over plain HTTP) and prints the answers.
HARNESS = textwrap.dedent("""
    import json, os, sys, urllib.request, urllib.error
    base = os.environ["OPENAI_BASE_URL"]
    key = sys.argv[1] if len(sys.argv) > 1 else os.environ["OPENAI_API_KEY"]
    for n in range(2):
        req = urllib.request.Request(base + "/chat/completions", method="POST",
                                     data=json.dumps({"messages": [{"role": "user", "content": f"q{n}"}]}).encode(),
                                     headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                print(resp.status, json.loads(resp.read())["choices"][0]["message"]["content"], flush=True)
        except urllib.error.HTTPError as exc:
            print(exc.code, exc.read().decode(), flush=True)
            sys.exit(3)
""")


def _start(server: SandboxProcess, *argv: str, **fields) -> dict:
    (server.project / "harness.py").write_text(HARNESS)
    body = {"command": [sys.executable, "harness.py", *argv], "key": KEY, "timeout": 60, **fields}
    r = server.client.post("/api/agent/start", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _exchange(server: SandboxProcess, reply: dict | None = None, wait: float = 30) -> dict:
    r = server.client.post("/api/agent/exchange", json={"reply": reply, "wait": wait})
    assert r.status_code == 200, r.text
    return r.json()


def _answer(call_id: str, text: str) -> dict:
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}
    return {"call_id": call_id, "body_base64": base64.b64encode(json.dumps(body).encode()).decode()}


def test_model_calls_are_collected_and_answered_until_the_harness_exits(server: SandboxProcess) -> None:
    started = _start(server)
    assert started["base_url"] == f"http://127.0.0.1:{started['port']}"
    first = _exchange(server)
    call = first["call"]
    assert call["path"] == "/v1/chat/completions" and call["method"] == "POST"
    assert json.loads(base64.b64decode(call["body_base64"]))["messages"][0]["content"] == "q0"
    assert "authorization" not in call["headers"]  # the key never leaves the sandbox server
    second = _exchange(server, _answer(call["id"], "a0"))
    assert json.loads(base64.b64decode(second["call"]["body_base64"]))["messages"][0]["content"] == "q1"
    done = _exchange(server, _answer(second["call"]["id"], "a1"))
    assert done["call"] is None
    assert done["agent"]["running"] is False and done["agent"]["exit_code"] == 0
    assert done["agent"]["stdout"].splitlines() == ["200 a0", "200 a1"]
    assert done["agent"]["calls"] == 2


@pytest.mark.security
def test_a_call_with_another_key_is_refused(server: SandboxProcess) -> None:
    _start(server, "not-the-episode-key-at-all")
    done = _exchange(server)
    assert done["call"] is None  # nothing reached the caller
    assert done["agent"]["exit_code"] == 3
    assert done["agent"]["stdout"].startswith("401 ") and "serves one episode" in done["agent"]["stdout"]


def test_an_unanswered_call_is_a_504_to_the_agent_and_the_wait_returns(server: SandboxProcess) -> None:
    _start(server, call_timeout=0.5)
    started = time.monotonic()
    first = _exchange(server, wait=30)  # collected; never answered
    assert first["call"] is not None and time.monotonic() - started < 10
    done = _exchange(server, wait=30)
    assert done["call"] is None and done["agent"]["exit_code"] == 3
    assert done["agent"]["stdout"].startswith("504 ") and "no answer from the policy" in done["agent"]["stdout"]
    late = server.client.post("/api/agent/exchange", json={"reply": _answer(first["call"]["id"], "late")})
    assert late.status_code == 409 and "no model call" in late.json()["message"]


def test_a_call_its_agent_gave_up_on_is_not_handed_out(server: SandboxProcess) -> None:
    (server.project / "once.py").write_text(textwrap.dedent("""
        import os, urllib.request, urllib.error
        req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", method="POST",
                                     data=b"{}", headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
        try:
            urllib.request.urlopen(req, timeout=30)
        except urllib.error.HTTPError as exc:
            open("gave-up", "w").write(str(exc.code))
    """))
    r = server.client.post("/api/agent/start", json={"command": [sys.executable, "once.py"], "key": KEY,
                                                     "call_timeout": 0.3})
    assert r.status_code == 200
    assert wait_until(lambda: (server.project / "gave-up").exists(), 30)  # nobody collected its call
    done = _exchange(server, wait=30)
    assert done["call"] is None and done["agent"]["exit_code"] == 0
    assert (server.project / "gave-up").read_text() == "504"


def test_a_wait_without_a_call_returns_when_it_runs_out(server: SandboxProcess) -> None:
    (server.project / "idle.py").write_text("import time; time.sleep(60)\n")
    r = server.client.post("/api/agent/start", json={"command": [sys.executable, "idle.py"], "key": KEY})
    assert r.status_code == 200
    started = time.monotonic()
    out = _exchange(server, wait=0.3)
    assert out["call"] is None and out["agent"]["running"] is True
    assert time.monotonic() - started < 5


def test_reset_and_stop_end_the_harness_and_close_its_endpoint(server: SandboxProcess) -> None:
    _start(server)
    assert _exchange(server)["call"] is not None  # the harness now waits for an answer
    stopped = server.client.post("/api/agent/stop", json={})
    assert stopped.status_code == 200 and stopped.json()["agent"]["running"] is False
    assert server.client.post("/api/agent/exchange", json={"wait": 0}).status_code == 409
    _start(server)
    assert _exchange(server)["call"] is not None
    assert server.client.post("/api/project/reset", json={}).json()["status"] == "success"
    gone = server.client.post("/api/agent/exchange", json={"wait": 0})
    assert gone.status_code == 409 and "agent/start" in gone.json()["message"]


def test_bad_requests_say_what_is_wrong(server: SandboxProcess) -> None:
    r = server.client.post("/api/agent/start", json={"command": [], "key": KEY})
    assert r.status_code == 422
    r = server.client.post("/api/agent/start", json={"command": ["true"], "key": "short"})
    assert r.status_code == 422 and "key" in r.text
    r = server.client.post("/api/agent/exchange", json={"wait": 99999})
    assert r.status_code == 422


@pytest.mark.security
def test_calls_flooding_the_endpoint_are_refused_not_held(server: SandboxProcess) -> None:
    # a harness that sends 70 calls of 2 MiB at once: the endpoint holds at most 64 MiB of them
    (server.project / "flood.py").write_text(textwrap.dedent("""
        import os, threading, urllib.request, urllib.error
        codes = []
        def one():
            req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
                                         data=b"x" * (2 << 20), method="POST",
                                         headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
            try:
                urllib.request.urlopen(req, timeout=60)
                codes.append(200)
            except urllib.error.HTTPError as exc:
                codes.append(exc.code)
            except OSError:
                codes.append(0)
        threads = [threading.Thread(target=one) for _ in range(70)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print(sorted(codes).count(429), len(codes))
    """))
    # The held calls end at call_timeout (nobody answers them); all 70 arrive within a second
    r = server.client.post("/api/agent/start", json={"command": [sys.executable, "flood.py"], "key": KEY,
                                                      "call_timeout": 8})
    assert r.status_code == 200
    deadline = time.monotonic() + 90
    state = None
    while time.monotonic() < deadline:
        state = server.client.post("/api/agent/exchange", json={"wait": 5}).json()
        if state["call"] is None and not state["agent"]["running"]:
            break
    refused, total = map(int, state["agent"]["stdout"].split())
    assert total == 70 and refused >= 70 - 32  # 2 MiB each: at most 32 held at once
