"""verifiers, both routes, with ``vf-eval`` (verifiers' CLI, in .venv-verifiers): our native taskset
(``env.taskset.id = "idegym-verifiers"``), which steps each action in verifiers' process, and
verifiers' own OpenEnv taskset (``env.taskset.id = "openenv"`` and ``base_url``) against
``idegym openenv serve``. The policy is a real HTTP server speaking OpenAI's chat-completions API
(streamed, as verifiers' interception proxy asks) with scripted replies: each reply is one IdeGym
action."""

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
from tests.integration_helpers import TASK, alive, control_plane, server_counts  # noqa: F401 - fixture
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
    n-th entry; a rollout (known by verifiers' session header, its trace id) takes the next
    script in order. A callable entry runs first, with the user turns so far, and gives the
    reply. ``seen`` keeps each rollout's user turns, in script order."""

    scripts: list[list[Any]] = []
    episodes: dict[str, int] = {}
    seen: list[list[str]] = []
    lock = threading.Lock()

    @classmethod
    def play(cls, scripts: list[list[Any]]) -> None:
        cls.scripts, cls.episodes, cls.seen = scripts, {}, [[] for _ in scripts]

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._send(200, "application/json", json.dumps({"object": "list", "data": [{"id": "policy"}]}).encode())

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        users = [m["content"] for m in body["messages"] if m["role"] == "user"]
        with self.lock:
            index = self.episodes.setdefault(self.headers["X-Session-ID"], len(self.episodes))
        self.seen[index][:] = users
        reply = self.scripts[index][len(users) - 1]
        text = reply(users) if callable(reply) else reply
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


def vf_eval(tmp: Path, taskset: str, policy: str, scripts: list[list[Any]], player: str = "", env_table: str = ""
            ) -> list[dict]:
    """``vf-eval`` on ``taskset`` (its TOML table's body), one rollout per script, one at a time;
    its episodes, in script order (a rollout's ``traces``: one, none for a cancelled one)."""
    Policy.play(scripts)
    config = tmp / "eval.toml"
    config.write_text(f'model = "policy"\npush = false\noutput_dir = "{tmp / "out"}"\nnum_rollouts = {len(scripts)}\n'
                      f'max_concurrent = 1\n{env_table}[env.taskset]\n{taskset}\n{player}'
                      f'[client]\nbase_url = "{policy}"\napi_key_var = "POLICY_KEY"\n')
    # verifiers runs its chat program with uv; ours, first on PATH, keeps it from installing one.
    env = {**os.environ, "POLICY_KEY": "unused", "PATH": f"{REPO / '.venv-uv' / 'bin'}:{os.environ['PATH']}"}
    proc = subprocess.run([str(VF_EVAL), "@", str(config), "--no-rich"], capture_output=True, text=True,
                          timeout=400, env=env, cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (traces,) = (tmp / "out").glob("*/traces.jsonl")
    return [json.loads(line) for line in traces.read_text().splitlines()]


def delete_server(control_plane: ControlPlaneProcess, sid: int) -> None:  # noqa: F811
    """A sandbox goes away under its episode (a crash, a reaper)."""
    db = sqlite3.connect(f"file:{control_plane.state_dir / 'control-plane.db'}?mode=ro", uri=True)
    (client_id,) = db.execute("SELECT client_id FROM servers WHERE id = ?", (sid,)).fetchone()
    db.close()
    answer = control_plane.http.request("DELETE", "/api/idegym-servers",
                                        json={"client_id": client_id, "server_id": sid})
    assert answer.status_code < 300, answer.text


def test_native_taskset_scores_episodes_fails_a_dead_one_and_hands_back_a_cancelled_one(
        tmp_path: Path, policy: str, control_plane: ControlPlaneProcess) -> None:  # noqa: F811
    """``idegym-verifiers``: verifiers' default player for it (no harness or runtime given), the
    task's instruction as the prompt, each reply one action in verifiers' process."""
    db = control_plane.state_dir / "control-plane.db"

    released = threading.Event()

    def hang(users: list[str]) -> str:
        """No reply until the test ends: verifiers' episode deadline cancels the rollout."""
        released.wait()
        return action("submit")

    def kill_sandbox(users: list[str]) -> str:
        """The rollout's sandbox goes away. It is the one sandbox handed out (rollouts run one at a
        time), so every earlier rollout's was handed back, the cancelled one's too."""
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        (sid,), = conn.execute("SELECT id FROM servers WHERE client_name = 'idegym-integrations' "
                               "AND availability IN ('ALIVE', 'REUSED')").fetchall()
        conn.close()
        delete_server(control_plane, sid)
        return action("bash", command="ls")

    fix = load_task(TASK).solution[0]
    fenced = f"```json\n{action(fix.tool, **fix.arguments.model_dump())}\n```"
    solve = [action("bash", command="cat -n roman.py"), fenced, action("submit")]
    bad = ["I will read the file first.", action("bash"), action("bash", command="echo still-here"),
           action("submit")]
    taskset = f'id = "idegym-verifiers"\ntasks = ["{TASK}"]\ncontrol_plane_url = "{control_plane.url}"\n'
    dies = [action("bash", command="true"), kill_sandbox]
    try:
        busy = [action("bash", command="true")] * 5
        episodes = vf_eval(tmp_path, taskset, policy, [solve, [action("submit")], bad, busy, [hang], dies],
                           player="[env.player]\nmax_turns = 4\n", env_table="[env.timeout]\nepisode = 20\n")
    finally:
        released.set()
    (solved,), (untouched,), (fumbled,), (limited,), cancelled, (killed,) = (e["traces"] for e in episodes)
    assert solved["ok"] and solved["rewards"]["idegym_reward"]["score"] == 1.0, solved
    assert untouched["ok"] and untouched["rewards"]["idegym_reward"]["score"] < 1.0, untouched
    # The prompt is the task's instruction (no checks of it); a reply that is no tool call, or a call
    # without its argument, is a step whose observation says so, and the episode goes on.
    first, not_a_call, no_command, echoed, = Policy.seen[2]
    assert first == load_task(TASK).instruction
    assert "tool" in not_a_call.lower() and "command" in no_command.lower(), (not_a_call, no_command)
    assert "still-here" in echoed
    assert fumbled["ok"] and fumbled["rewards"]["idegym_reward"]["score"] < 1.0, fumbled
    # The dead sandbox's rollout failed with our message and has no reward (not a 0).
    assert not killed["ok"] and "idegym_reward" not in (killed["rewards"] or {}), killed
    (error,) = killed["errors"]
    assert error["type"] == "InfrastructureError" and "the sandbox is gone" in error["message"], error
    # One that verifiers ended (its max_turns) before submit is graded as it stands.
    assert len(Policy.seen[3]) == 4 and limited["ok"] and limited["rewards"]["idegym_reward"]["score"] < 1.0, limited
    # The rollout cancelled at verifiers' deadline failed (no trace is kept of it); kill_sandbox saw
    # its sandbox handed back.
    assert cancelled == [] and episodes[4]["is_timeout"] and "deadline" in episodes[4]["errors"][0]["message"]
    assert alive(control_plane) == 0  # every sandbox handed back; vf-eval's exit stopped them
    assert server_counts(control_plane).get("FINISHED", 0) == 0, server_counts(control_plane)


def test_native_taskset_without_a_control_plane_fails_its_rollouts(tmp_path: Path, policy: str) -> None:
    """Named on the command line alone (no config file); no control plane answers at its URL."""
    Policy.play([[action("submit")]])
    env = {**os.environ, "POLICY_KEY": "unused", "PATH": f"{REPO / '.venv-uv' / 'bin'}:{os.environ['PATH']}"}
    proc = subprocess.run([str(VF_EVAL), "idegym-verifiers", "--env.taskset.tasks", json.dumps([TASK]),
                           "--env.taskset.control-plane-url", "http://127.0.0.1:1", "-m", "policy",
                           "--client.base-url", policy, "--client.api-key-var", "POLICY_KEY", "-n", "1", "-r", "1",
                           "--output-dir", str(tmp_path / "out"), "--push", "false", "--no-rich"],
                          capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (traces,) = (tmp_path / "out").glob("*/traces.jsonl")
    ((trace,),) = (json.loads(line)["traces"] for line in traces.read_text().splitlines())
    assert not trace["ok"] and "idegym_reward" not in (trace["rewards"] or {}), trace
    (error,) = trace["errors"]
    assert error["type"] == "InfrastructureError" and "no control plane answers" in error["message"], error


def test_openenv_taskset_scores_idegym_episodes_and_fails_a_dead_one(tmp_path: Path, served: OpenEnvServer,
                                                                      policy: str,
                                                                      control_plane: ControlPlaneProcess  # noqa: F811
                                                                      ) -> None:
    def kill_sandbox(users: list[str]) -> str:
        delete_server(control_plane, json.loads(users[0])["observation"]["server_id"])
        return action("bash", command="ls")

    fix = load_task(TASK).solution[0]
    solve = [action("bash", command="cat -n roman.py"), action(fix.tool, **fix.arguments.model_dump()),
             action("submit")]
    episodes = vf_eval(tmp_path, f'id = "openenv"\nbase_url = "{served.url}"\n', policy,
                       [solve, [action("submit")], [action("bash", command="true"), kill_sandbox]],
                       player='[env.player.runtime]\ntype = "subprocess"\n[env.player.harness]\nid = "null"\n')
    traces = [trace for episode in episodes for trace in episode["traces"]]
    assert len(traces) == 3
    failed = [t for t in traces if not t["ok"]]
    scored = [t for t in traces if t["ok"]]
    # The dead sandbox's rollout failed with our message and has no reward (not a 0).
    assert len(failed) == 1 and "openenv_reward" not in (failed[0]["rewards"] or {}), failed
    assert "no reward" in json.dumps(failed[0]["errors"]), failed[0]["errors"]
    scores = sorted(t["rewards"]["openenv_reward"]["score"] for t in scored)
    assert scores[0] < 1.0 and scores[1] == 1.0, scores  # gave up; solved (the rollouts' order varies)
    assert alive(control_plane) == 0  # the sessions ended: their sandboxes were handed back
