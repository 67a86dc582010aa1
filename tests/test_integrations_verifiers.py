"""verifiers: the route that exists today — verifiers' own OpenEnv taskset (``vf-eval`` with
``env.taskset.id = "openenv"`` and ``base_url``) against ``idegym openenv serve``, in
.venv-verifiers. The policy is a real HTTP server speaking OpenAI's chat-completions API (streamed,
as verifiers' interception proxy asks) with scripted replies: each reply is one IdeGym action,
which verifiers' engine sends to our server as an OpenEnv step."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from idegym_env.tasks import load_task
from tests.cp_helpers import ControlPlaneProcess
from tests.helpers import REPO
from tests.integration_helpers import TASK, alive, control_plane  # noqa: F401 - fixture
from tests.side_venvs import VERIFIERS_VENV, side_venv
from tests.test_openenv import OpenEnvServer, needs_openenv

VF_EVAL = VERIFIERS_VENV / "bin" / "vf-eval"

pytestmark = [needs_openenv, pytest.mark.timeout(600), pytest.mark.heavy]


@pytest.fixture(scope="module", autouse=True)
def _verifiers_installed() -> None:
    side_venv(VERIFIERS_VENV)  # fails (not skips) without it: `make test` installs it


def action(tool: str, **arguments: Any) -> str:
    return json.dumps({"tool": tool, "arguments": arguments} if arguments else {"tool": tool})


class Policy(BaseHTTPRequestHandler):
    """``/v1/models`` and streamed ``/v1/chat/completions``: a rollout's n-th reply is its script's
    n-th entry; a rollout (known by the episode id in its first observation) takes the next
    script in order. A callable entry runs first, with the observation, and gives the reply."""

    scripts: list[list[Any]] = []
    episodes: dict[str, int] = {}
    lock = threading.Lock()

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._send(200, "application/json", json.dumps({"object": "list", "data": [{"id": "policy"}]}).encode())

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        users = [m["content"] for m in body["messages"] if m["role"] == "user"]
        first = json.loads(users[0])["observation"]
        with self.lock:
            script = self.scripts[self.episodes.setdefault(first["episode_id"], len(self.episodes))]
        reply = script[len(users) - 1]
        text = reply(first) if callable(reply) else reply
        chunks = [{"delta": {"role": "assistant", "content": text}, "finish_reason": None},
                  {"delta": {}, "finish_reason": "stop"}]
        events = [{"id": "c", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                   "choices": [{"index": 0, **chunk}]} for chunk in chunks]
        stream = b"".join(f"data: {json.dumps(event)}\n\n".encode() for event in events) + b"data: [DONE]\n\n"
        self._send(200, "text/event-stream", stream)

    def _send(self, status: int, kind: str, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def policy() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Policy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlaneProcess  # noqa: F811
           ) -> Iterator[OpenEnvServer]:
    server = OpenEnvServer(tmp_path_factory.mktemp("openenv"), "--control-plane-url", control_plane.url)
    yield server
    assert server.stop() == 0, server.log_path.read_text()[-3000:]


def vf_eval(tmp: Path, served: OpenEnvServer, policy: str, scripts: list[list[Any]]) -> list[dict]:
    """``vf-eval`` on the OpenEnv taskset at our server, one rollout per script; its traces."""
    Policy.scripts, Policy.episodes = scripts, {}
    config = tmp / "eval.toml"
    config.write_text(f'model = "policy"\npush = false\noutput_dir = "{tmp / "out"}"\nnum_rollouts = {len(scripts)}\n'
                      f'[env.taskset]\nid = "openenv"\nbase_url = "{served.url}"\n'
                      '[env.player.runtime]\ntype = "subprocess"\n[env.player.harness]\nid = "null"\n'
                      f'[client]\nbase_url = "{policy}"\napi_key_var = "POLICY_KEY"\n')
    # verifiers runs its chat program with uv; ours, first on PATH, keeps it from installing one.
    env = {**os.environ, "POLICY_KEY": "unused", "PATH": f"{REPO / '.venv-uv' / 'bin'}:{os.environ['PATH']}"}
    proc = subprocess.run([str(VF_EVAL), "@", str(config), "--no-rich"], capture_output=True, text=True,
                          timeout=400, env=env, cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (traces,) = (tmp / "out").glob("*/traces.jsonl")
    return [trace for line in traces.read_text().splitlines() for trace in json.loads(line)["traces"]]


def test_openenv_taskset_scores_idegym_episodes_and_fails_a_dead_one(tmp_path: Path, served: OpenEnvServer,
                                                                      policy: str,
                                                                      control_plane: ControlPlaneProcess  # noqa: F811
                                                                      ) -> None:
    def kill_sandbox(observation: dict) -> str:
        """The session's sandbox goes away under the episode (a crash, a reaper)."""
        sid = observation["server_id"]
        db = sqlite3.connect(f"file:{control_plane.state_dir / 'control-plane.db'}?mode=ro", uri=True)
        (client_id,) = db.execute("SELECT client_id FROM servers WHERE id = ?", (sid,)).fetchone()
        db.close()
        answer = control_plane.http.request("DELETE", "/api/idegym-servers",
                                            json={"client_id": client_id, "server_id": sid})
        assert answer.status_code < 300, answer.text
        return action("bash", command="ls")

    fix = load_task(TASK).solution[0]
    solve = [action("bash", command="cat -n roman.py"), action(fix.tool, **fix.arguments.model_dump()),
             action("submit")]
    traces = vf_eval(tmp_path, served, policy, [solve, [action("submit")], [action("bash", command="true"),
                                                                             kill_sandbox]])
    assert len(traces) == 3
    failed = [t for t in traces if not t["ok"]]
    scored = [t for t in traces if t["ok"]]
    # The dead sandbox's rollout failed with our message and has no reward (not a 0).
    assert len(failed) == 1 and "openenv_reward" not in (failed[0]["rewards"] or {}), failed
    assert "no reward" in json.dumps(failed[0]["errors"]), failed[0]["errors"]
    scores = sorted(t["rewards"]["openenv_reward"]["score"] for t in scored)
    assert scores[0] < 1.0 and scores[1] == 1.0, scores  # gave up; solved (the rollouts' order varies)
    assert alive(control_plane) == 0  # the sessions ended: their sandboxes were handed back
