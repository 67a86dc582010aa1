"""``idegym eval``: the oracle solves every bundled task, failures are recorded not fatal, runs resume,
and the OpenAI-compatible agent completes an episode against a local stand-in server."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from idegym_env.embedded import EmbeddedControlPlane
from idegym_env.eval import (
    AgentSpecError,
    ManifestMismatch,
    evaluate,
    load_agent,
    pass_at_k,
    resolve_tasks,
    summarize,
)
from idegym_env.eval.progress import Progress
from idegym_env.eval.records import ResultsDir
from idegym_env.eval.summary import markdown
from idegym_env.tasks import TaskSet, load_task
from tests.helpers import REPO, embedded_control_plane, wait_until

PY_TASK = "python-roman-numerals"
PY_TASK_2 = "python-lru-cache"
FIXTURES = "tests.eval_fixtures.agents"


@pytest.fixture(scope="module")
def control_plane() -> Iterator[EmbeddedControlPlane]:
    yield from embedded_control_plane(warm_pool=1)


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("IDEGYM_URL", None)
    return env


def idegym(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "idegym_env.cli", *args], cwd=REPO, env=cli_env(),
                          capture_output=True, text=True, timeout=timeout)


def lines(out: Path, *, complete_only: bool = False) -> list[dict[str, Any]]:
    """The records in episodes.jsonl; ``complete_only`` skips a line still being written (or torn)."""
    path = out / "episodes.jsonl"
    if not path.exists():
        return []
    text = path.read_text()
    if complete_only:
        text = text[:text.rfind("\n") + 1]
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# -- the oracle, through the real CLI ----------------------------------------------------------------


def test_oracle_reaches_one_on_every_bundled_task_through_the_cli(tmp_path: Path) -> None:
    out = tmp_path / "oracle"
    started = time.monotonic()
    proc = idegym("eval", "--tasks", "bundled", "--agent", "oracle", "--parallel", "2", "--out", str(out))
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    bundled = TaskSet.bundled()
    records = lines(out)
    assert sorted(r["task"] for r in records) == sorted(bundled.ids)
    for r in records:
        assert r["error"] is None, r
        assert r["reward"] == 1.0 and r["passed"] and r["solved"], r
        assert r["reward_components"]["all_tests_pass"] == 1.0
        assert r["tool_calls"]["submit"] == 1 and r["steps"] == len(bundled[r["task"]].solution) + 1
        assert (out / r["transcript"]).read_text().count("$ submit") == 1
        assert r["seed"] is not None and r["image"].startswith(f"idegym-task/{r['task']}:")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and summary["overall"]["pass_rate"] == 1.0
    assert summary["overall"]["mean_reward"] == 1.0 and summary["overall"]["errors"] == 0
    assert all(t["pass_rate"] == 1.0 for t in summary["tasks"].values())
    # Reproducibility: the task set's content hash, the versions and the images are recorded.
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["task_set_hash"] == bundled.content_hash == summary["task_set_hash"]
    assert manifest["idegym"]["version"] and manifest["seed"] == 0
    assert {t["id"]: t["image"] for t in manifest["tasks"]} == {r["task"]: r["image"] for r in records}
    assert manifest["tasks"][0]["content_hash"] == bundled[manifest["tasks"][0]["id"]].content_hash()
    # The summary is printed and written as Markdown; progress went to stderr.
    assert "| **overall**" in proc.stdout and "100.0%" in proc.stdout
    assert (out / "summary.md").read_text().strip() in proc.stdout
    assert "[eval] 6/6 done" in proc.stderr
    print(f"oracle over {len(records)} bundled tasks through the CLI: {elapsed:.1f} s\n{proc.stdout}")


# -- the floor, and the Python API ------------------------------------------------------------------


def test_noop_agent_does_not_pass(tmp_path: Path, control_plane: EmbeddedControlPlane) -> None:
    result = evaluate(PY_TASK, "noop", out=tmp_path / "noop", control_plane_url=control_plane.url,
                      progress=False)
    (record,) = result.records
    assert record["error"] is None and record["submitted"] and record["steps"] == 1
    assert 0.0 <= record["reward"] < 1.0 and not record["passed"] and not record["solved"]
    assert result.pass_rate == 0.0 and result.summary["overall"]["mean_reward"] == record["reward"]


def test_a_plain_function_agent_and_pass_at_k(tmp_path: Path, control_plane: EmbeddedControlPlane) -> None:
    # A function is shared by every episode; 3 attempts each give pass@1 and pass@3.
    result = evaluate([PY_TASK], f"{FIXTURES}:submit_now", out=tmp_path / "fn", attempts=3, parallel=2,
                      control_plane_url=control_plane.url, progress=False)
    assert [(r["task"], r["attempt"]) for r in result.records] == [(PY_TASK, a) for a in range(3)]
    assert len({r["seed"] for r in result.records}) == 3
    stats = result.summary["tasks"][PY_TASK]
    assert stats["pass_at_k"] == {"1": 0.0, "3": 0.0} and stats["episodes"] == 3
    assert "pass@3" in result.table()


# -- failures are recorded, and the run goes on -------------------------------------------------------


def test_a_crashing_agent_is_recorded_and_the_run_goes_on(tmp_path: Path,
                                                          control_plane: EmbeddedControlPlane) -> None:
    out = tmp_path / "crash"
    proc = idegym("eval", "--tasks", f"{PY_TASK},{PY_TASK_2}", "--agent", f"{FIXTURES}:CrashOn",
                  "--agent-arg", f"task={PY_TASK_2}", "--out", str(out),
                  "--control-plane-url", control_plane.url)
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_task = {r["task"]: r for r in lines(out)}
    crashed, fine = by_task[PY_TASK_2], by_task[PY_TASK]
    assert crashed["error_kind"] == "agent" and "agent bug: cannot handle" in crashed["error"]
    assert crashed["reward"] is None and not crashed["passed"] and crashed["steps"] == 1
    assert "ERROR (agent)" in (out / crashed["transcript"]).read_text()
    assert fine["error"] is None and fine["reward"] == 1.0 and fine["passed"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["overall"]["errors"] == 1 and summary["overall"]["pass_rate"] == 0.5
    assert "1 failed" in proc.stderr
    # --retry-errors redoes the error (which crashes again) and nothing else.
    again = idegym("eval", "--tasks", f"{PY_TASK},{PY_TASK_2}", "--agent", f"{FIXTURES}:CrashOn",
                   "--agent-arg", f"task={PY_TASK_2}", "--out", str(out), "--retry-errors",
                   "--control-plane-url", control_plane.url)
    assert again.returncode == 0, again.stderr[-3000:]
    records = lines(out)
    assert [r["id"] for r in records] == [f"{PY_TASK_2}#0", f"{PY_TASK}#0", f"{PY_TASK_2}#0"]  # ordered by id
    assert records[2]["error_kind"] == "agent" and records[2]["started_at"] >= records[1]["started_at"]
    assert json.loads((out / "summary.json").read_text())["overall"]["episodes"] == 2


def test_a_hanging_episode_times_out_and_the_run_goes_on(tmp_path: Path,
                                                         control_plane: EmbeddedControlPlane) -> None:
    started = time.monotonic()
    result = evaluate(PY_TASK, f"{FIXTURES}:HangOnFirstAttempt", out=tmp_path / "hang", attempts=2,
                      episode_timeout=8, control_plane_url=control_plane.url, progress=False)
    elapsed = time.monotonic() - started
    hung, fine = result.records
    assert hung["attempt"] == 0 and hung["error_kind"] == "timeout" and "time limit of 8 s" in hung["error"]
    assert 8 <= hung["wall_seconds"] < 14 and hung["reward"] is None and not hung["passed"]
    assert fine["attempt"] == 1 and fine["error"] is None and fine["passed"], fine
    assert elapsed < 60
    assert result.summary["overall"]["errors"] == 1


# -- resume ---------------------------------------------------------------------------------------------


def _start_cli(out: Path, url: str, attempts: int, gate: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "idegym_env.cli", "eval", "--tasks", PY_TASK,
         "--agent", f"{FIXTURES}:GatedOracle", "--attempts", str(attempts), "--out", str(out),
         "--control-plane-url", url],
        cwd=REPO, env={**cli_env(), "IDEGYM_TEST_GATE": str(gate), "PYTHONFAULTHANDLER": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # A suite started with `cmd &` from a script ignores SIGINT, and so would the CLI (Python
        # then installs no KeyboardInterrupt handler): it gets the disposition a terminal gives.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _interrupted(proc: subprocess.Popen[str]) -> str:
    """SIGINT the run; its stderr once it has ended (its threads' stacks if it hangs)."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=60)[1]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
        raise AssertionError(f"no exit 60 s after SIGINT:\n{proc.communicate(timeout=30)[1][-8000:]}") from None


def test_an_interrupted_run_resumes_without_redoing_finished_episodes(
        tmp_path: Path, control_plane: EmbeddedControlPlane) -> None:
    out, attempts, gate = tmp_path / "resume", 6, tmp_path / "gate"
    # 1. Ctrl-C: the run stops cleanly, says so, and writes an incomplete summary. Attempt 0 may
    # finish; the others wait at the gate until the signal.
    gate.write_text("1")
    proc = _start_cli(out, control_plane.url, attempts, gate)
    assert wait_until(lambda: len(lines(out, complete_only=True)) >= 1, timeout=60)
    stderr = _interrupted(proc)
    assert proc.returncode == 130, stderr[-2000:]
    assert "interrupted" in stderr
    first = lines(out)
    assert [r["attempt"] for r in first] == [0]
    assert json.loads((out / "summary.json").read_text())["complete"] is False
    # 2. SIGKILL mid-run (attempt 1 let through): nothing gets to clean up; the finished episodes
    # are on disk (fsync'ed).
    gate.write_text("2")
    proc = _start_cli(out, control_plane.url, attempts, gate)
    assert wait_until(lambda: len(lines(out, complete_only=True)) >= 2, timeout=60)
    proc.kill()
    proc.communicate(timeout=30)
    second = lines(out, complete_only=True)
    assert second[:1] == first and [r["attempt"] for r in second] == [0, 1]
    # A record torn by the kill (simulated) is dropped, not misread.
    with open(out / "episodes.jsonl", "a") as f:
        f.write('{"id": "python-roman-numerals#5", "task": "python-rom')
    # 3. The rerun does only what is missing.
    gate.write_text(str(attempts))
    proc = _start_cli(out, control_plane.url, attempts, gate)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-2000:]
    assert f"resuming: {len(second)} of {attempts} episodes already done" in stderr
    final = lines(out)
    assert final[:len(second)] == second  # finished episodes untouched, none redone
    ids = [r["id"] for r in final]
    assert len(ids) == len(set(ids)) == attempts
    assert sorted(r["attempt"] for r in final) == list(range(attempts))
    assert all(r["passed"] for r in final)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and summary["overall"]["episodes"] == attempts
    assert len(json.loads((out / "manifest.json").read_text())["resumed_at"]) == 2
    # 4. Once complete, a rerun runs nothing (and needs no control plane).
    again = subprocess.run([sys.executable, "-m", "idegym_env.cli", "eval", "--tasks", PY_TASK,
                            "--agent", f"{FIXTURES}:GatedOracle", "--attempts", str(attempts), "--out", str(out),
                            "--control-plane-url", "http://127.0.0.1:9"], cwd=REPO, capture_output=True, text=True,
                           env={**cli_env(), "IDEGYM_TEST_GATE": str(gate)}, timeout=240)
    assert again.returncode == 0, again.stderr[-2000:]
    assert lines(out) == final


def test_a_different_run_is_not_mixed_into_existing_results(tmp_path: Path,
                                                            control_plane: EmbeddedControlPlane) -> None:
    out = tmp_path / "mixed"
    evaluate(PY_TASK, "noop", out=out, control_plane_url=control_plane.url, progress=False)
    with pytest.raises(ManifestMismatch, match="agent: \"noop\" there, \"oracle\" now"):
        evaluate(PY_TASK, "oracle", out=out, control_plane_url=control_plane.url, progress=False)
    proc = idegym("eval", "--tasks", PY_TASK, "--agent", "noop", "--attempts", "2", "--out", str(out))
    assert proc.returncode == 2 and "attempts: 1 there, 2 now" in proc.stderr and "--overwrite" in proc.stderr
    assert len(lines(out)) == 1
    result = evaluate(PY_TASK, "oracle", out=out, control_plane_url=control_plane.url, progress=False,
                      overwrite=True)
    assert result.pass_rate == 1.0 and len(lines(out)) == 1


def test_resuming_with_a_changed_agent_file_warns(tmp_path: Path, control_plane: EmbeddedControlPlane,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    agent_file = tmp_path / "agent.py"
    agent_file.write_text("def act(observation, info):\n    return {'tool': 'submit'}\n")
    out = tmp_path / "changed"
    evaluate(PY_TASK, f"{agent_file}:act", out=out, control_plane_url=control_plane.url, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["agent_source"]["file"] == str(agent_file)
    capsys.readouterr()
    agent_file.write_text("def act(observation, info):\n    return {'tool': 'submit', 'arguments': {}}\n")
    evaluate(PY_TASK, f"{agent_file}:act", out=out, control_plane_url="http://127.0.0.1:9", progress=False)
    assert "changed since this run started" in capsys.readouterr().err


# -- the OpenAI-compatible agent against a stand-in server ----------------------------------------------


class StandIn:
    """A local server that speaks POST /v1/chat/completions: it checks each request and answers with
    scripted tool calls (read the file, apply the fix and run the tests, submit). Before the first
    real answer it fails once with 429 and once with 503, which the agent must retry."""

    def __init__(self, fix: dict[str, Any]) -> None:
        self.fix = fix
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.errors: list[str] = []
        self.failures = [429, 503]
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                if stand_in.failures:
                    status = stand_in.failures.pop(0)
                    return self._send(status, {"error": {"message": "try again"}}, {"Retry-After": "0"})
                stand_in.requests.append(body)
                stand_in.headers.append(dict(self.headers))
                try:
                    reply = stand_in.answer(body)
                except AssertionError as exc:
                    stand_in.errors.append(str(exc))
                    return self._send(400, {"error": {"message": str(exc)}})
                self._send(200, reply)

            def _send(self, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        function = {"name": name, "arguments": json.dumps(arguments)}
        return {"id": call_id, "type": "function", "function": function}

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        assert body["model"] == "stand-in-model", body["model"]
        names = sorted(t["function"]["name"] for t in body["tools"])
        assert names == ["bash", "edit_file", "list_files", "patch_file", "read_file", "submit", "write_file"], names
        assert all(t["type"] == "function" and t["function"]["parameters"]["type"] == "object"
                   for t in body["tools"])
        messages = body["messages"]
        assert messages[0]["role"] == "system" and messages[1]["role"] == "user"
        assert "Roman" in messages[1]["content"]
        turn = sum(1 for m in messages if m["role"] == "assistant")
        if turn == 0:
            calls = [self._call("call_read", "read_file", {"path": "roman.py"})]
        elif turn == 1:
            last = messages[-1]
            assert last["role"] == "tool" and last["tool_call_id"] == "call_read", last
            assert "def to_roman" in last["content"], last["content"][:200]
            assert messages[-2]["tool_calls"][0]["id"] == "call_read"
            calls = [self._call("call_fix", "edit_file", self.fix),
                     self._call("call_test", "bash", {"command": "$IDEGYM_JUDGE tests/"})]
        elif turn == 2:
            fix_result, test_result = messages[-2], messages[-1]
            assert fix_result["role"] == "tool" and fix_result["tool_call_id"] == "call_fix", fix_result
            assert fix_result["content"].startswith("ok: edit_file"), fix_result
            assert test_result["role"] == "tool" and test_result["tool_call_id"] == "call_test", test_result
            assert "[exit code 0]" in test_result["content"], test_result["content"][-500:]
            calls = [self._call("call_submit", "submit", {})]
        else:
            raise AssertionError(f"unexpected turn {turn}: the episode should have ended")
        message = {"role": "assistant", "content": None if turn < 2 else "The tests pass; submitting.",
                   "tool_calls": calls}
        return {"id": f"chatcmpl-{turn}", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 100 * (turn + 1), "completion_tokens": 10,
                          "total_tokens": 100 * (turn + 1) + 10}}


def test_the_openai_compatible_agent_completes_an_episode_against_a_stand_in_server(
        tmp_path: Path, control_plane: EmbeddedControlPlane) -> None:
    task = load_task(PY_TASK)
    stand_in = StandIn(task.solution[0].to_action()["arguments"])
    try:
        result = evaluate(PY_TASK, "openai", out=tmp_path / "openai", control_plane_url=control_plane.url,
                          progress=False, agent_args={"model": "stand-in-model", "base_url": stand_in.url,
                                                      "api_key": "sk-test-secret", "backoff": 0.01})
    finally:
        stand_in.close()
    assert stand_in.errors == []
    (record,) = result.records
    assert record["error"] is None, record["error"]
    assert record["reward"] == 1.0 and record["passed"] and record["submitted"]
    assert record["tool_calls"] == {"read_file": 1, "edit_file": 1, "bash": 1, "submit": 1}
    assert record["tokens"] == {"prompt_tokens": 600, "completion_tokens": 30, "total_tokens": 630}
    assert len(stand_in.requests) == 3  # the 429 and the 503 were retried, not counted
    assert stand_in.requests[0]["seed"] == record["seed"] and stand_in.requests[0]["temperature"] == 0.0
    assert all(h["Authorization"] == "Bearer sk-test-secret" for h in stand_in.headers)
    # The secret never reaches the results.
    out = tmp_path / "openai"
    for name in ("manifest.json", "episodes.jsonl", "summary.json"):
        assert "sk-test-secret" not in (out / name).read_text()
    assert json.loads((out / "manifest.json").read_text())["agent_args"]["api_key"] == "<redacted>"
    transcript = (out / record["transcript"]).read_text()
    assert "$IDEGYM_JUDGE tests/" in transcript and "$ submit" in transcript
    assert "> The tests pass; submitting." in transcript


def test_the_openai_agent_reports_a_non_retryable_error_as_the_episode_error(
        tmp_path: Path, control_plane: EmbeddedControlPlane) -> None:
    stand_in = StandIn({})
    stand_in.failures = [401]
    try:
        result = evaluate(PY_TASK, "openai", out=tmp_path / "openai-401", control_plane_url=control_plane.url,
                          progress=False, agent_args={"model": "stand-in-model", "base_url": stand_in.url,
                                                      "backoff": 0.01})
    finally:
        stand_in.close()
    (record,) = result.records
    assert record["error_kind"] == "agent" and "answered 401" in record["error"]


# -- Ray ---------------------------------------------------------------------------------------------------


@pytest.mark.ray
def test_episodes_as_ray_tasks(tmp_path: Path) -> None:
    """The hung attempt times out and the other passes, both in Ray workers. The time limit is
    each episode's whole wall time (its sandbox, its grading, a Ray worker's start): 8 s was too
    short for the attempt that passes (0.85 s on a quiet host) at load 50-86; 12 s leaves 14x."""
    pytest.importorskip("ray")
    out = tmp_path / "ray"
    proc = idegym("eval", "--tasks", PY_TASK, "--agent", f"{FIXTURES}:HangOnFirstAttempt", "--attempts", "2",
                  "--parallel", "2", "--episode-timeout", "12", "--ray", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_attempt = {r["attempt"]: r for r in lines(out)}
    assert by_attempt[0]["error_kind"] == "timeout" and by_attempt[0]["worker"] == "ray"
    assert by_attempt[1]["passed"] and by_attempt[1]["worker"] == "ray", by_attempt[1]


# -- pieces -------------------------------------------------------------------------------------------------


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    assert pass_at_k(5, 0, 1) == 0.0 and pass_at_k(5, 5, 3) == 1.0
    assert pass_at_k(5, 1, 1) == pytest.approx(0.2)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(4, 3, 2) == 1.0  # fewer than k failures: some draw of k must pass
    assert pass_at_k(2, 1, 3) is None  # k > n: not defined


def test_summary_counts_errors_as_failures_and_reports_percentiles() -> None:
    manifest = {"attempts": 2, "agent": "x", "tasks": [{"id": "a"}, {"id": "b"}],
                "pass_criterion": "reward >= 1"}
    records = [
        {"task": "a", "attempt": 0, "reward": 1.0, "passed": True, "wall_seconds": 1.0, "steps": 2},
        {"task": "a", "attempt": 1, "reward": 0.5, "passed": False, "wall_seconds": 3.0, "steps": 2},
        {"task": "b", "attempt": 0, "reward": None, "passed": False, "error": "boom", "wall_seconds": 5.0},
    ]
    s = summarize(records, manifest)
    assert s["tasks"]["a"]["pass_at_k"] == {"1": 0.5, "2": 1.0}
    assert s["tasks"]["b"]["pass_at_k"] == {"1": 0.0, "2": None} and s["tasks"]["b"]["errors"] == 1
    assert s["overall"]["pass_rate"] == pytest.approx(1 / 3) and s["overall"]["mean_reward"] == 0.5
    assert s["overall"]["pass_at_k"] == {"1": 0.25, "2": 1.0}  # mean over the tasks that have k attempts
    assert s["overall"]["p50_seconds"] == 3.0 and s["overall"]["p95_seconds"] == pytest.approx(4.8)
    assert not s["complete"] and "INCOMPLETE: 3 of 4 episodes" in markdown(s)


def test_task_selection_and_agent_specs(tmp_path: Path) -> None:
    assert [t.id for t in resolve_tasks(f"{PY_TASK_2},{PY_TASK}")] == [PY_TASK_2, PY_TASK]
    assert len(resolve_tasks("bundled")) == len(TaskSet.bundled())
    assert [t.id for t in resolve_tasks(TaskSet.bundled().root / PY_TASK)] == [PY_TASK]
    with pytest.raises(AgentSpecError, match="neither a built-in"):
        load_agent("no-such-agent")
    with pytest.raises(AgentSpecError, match="has no attribute"):
        load_agent(f"{FIXTURES}:Nope")
    with pytest.raises(AgentSpecError, match="needs a model"):
        load_agent("openai", {})
    with pytest.raises(AgentSpecError, match="bad arguments"):
        load_agent(f"{FIXTURES}:CrashOn", {"wrong": 1})
    agent_file = tmp_path / "my_agent.py"
    agent_file.write_text("class Agent:\n"
                          "    def __call__(self, obs, info):\n"
                          "        return {'tool': 'submit'}\n")
    factory = load_agent(f"{agent_file}:Agent")
    assert factory() is not factory() and factory()("", {}) == {"tool": "submit"}
    results = ResultsDir(tmp_path / "r")
    results.append({"task": "t", "attempt": 0})
    with open(results.episodes, "a") as f:
        f.write('{"task": "t", "att')
    assert results.load() == [{"task": "t", "attempt": 0}]
    assert results.episodes.read_text().endswith("}\n")


def test_loopback_urls_are_the_ones_only_this_machine_reaches() -> None:
    from idegym_env.urls import is_loopback_url

    for url in ("http://127.0.0.1:8000", "http://127.3.4.5", "http://localhost:1", "http://[::1]:80",
                "http://0.0.0.0:8000", "http://[::]:8000"):
        assert is_loopback_url(url), url
    for url in ("http://10.0.0.7:8000", "http://cp.example:8000", "http://[2001:db8::1]", "unix:///tmp/s"):
        assert not is_loopback_url(url), url


def test_a_long_error_on_the_progress_line_is_marked_as_cut() -> None:
    stream = io.StringIO()  # not a terminal: one plain line per finished episode
    progress = Progress(2, stream=stream)
    progress.finished({"id": "t#0", "error": "image build failed: " + "x" * 300 + " the end",
                       "error_kind": "env", "wall_seconds": 0.4})
    progress.finished({"id": "t#1", "error": "sandbox gone", "error_kind": "env", "wall_seconds": 0.2})
    cut, whole = stream.getvalue().splitlines()[-2:]
    assert "x…" in cut and "the end" not in cut and cut.endswith("in 0.4 s"), cut
    assert "error (env): sandbox gone in 0.2 s" in whole and "…" not in whole, whole
