"""``IdeGym-Agent-v0``: harnesses that bring their own loop, driven by scripted policies that answer
in each harness's own format; pass-through mode against a model server of the test's own."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from idegym_env.agents import Harness, LayerSpec
from idegym_env.agents.channel import DirectChannel
from idegym_env.agents.env import IdeGymAgentEnv
from idegym_env.agents.trajectory import to_atif, training_samples, write_jsonl
from idegym_env.embedded import EmbeddedControlPlane
from sandbox_server import routes
from sandbox_server.models import AgentExchangeRequest
from tests import agent_policies as policies
from tests.helpers import embedded_control_plane
from tests.side_venvs import HARBOR_VENV, side_venv


@pytest.fixture(scope="module")
def control_plane() -> Iterator[EmbeddedControlPlane]:
    yield from embedded_control_plane(warm_pool=0)


def _play(env: IdeGymAgentEnv, replies) -> tuple[float, bool, bool, dict, list[dict]]:
    observation, info = env.reset()
    requests = [info["request"]]
    assert json.loads(observation) == info["request"]
    for reply in replies:
        observation, reward, terminated, truncated, info = env.step(reply)
        if terminated or truncated:
            return float(reward), terminated, truncated, info, requests
        requests.append(info["request"])
    raise AssertionError(f"the agent did not end after the scripted replies: {observation[:500]}")


def test_mini_swe_agent_solves_a_task_through_its_own_loop(control_plane: EmbeddedControlPlane) -> None:
    env = IdeGymAgentEnv(policies.TASK, harness="mini-swe-agent", control_plane_url=control_plane.url)
    try:
        reward, terminated, truncated, info, requests = _play(env, policies.mini_swe_agent())
        assert (reward, terminated, truncated) == (1.0, True, False), info
        assert info["tests_verdict"] == "passed" and info["submitted"] is True
        assert requests[0]["tools"][0]["function"]["name"] == "bash"  # mini-swe-agent's own tool
        assert "Roman" in requests[0]["messages"][1]["content"]  # its template around the task
        assert "MCMXCIV" in requests[2]["messages"][-1]["content"]  # the check's output, as its observation
        assert len(info["trajectory"]) == 3 and info["calls"] == 3
        assert info["harness"]["name"] == "mini-swe-agent" and info["harness"]["installed"]["mini-swe-agent"] == "2.4.6"
    finally:
        env.close()


def test_submitting_at_once_scores_less(control_plane: EmbeddedControlPlane) -> None:
    env = IdeGymAgentEnv(policies.TASK, harness="tmux", control_plane_url=control_plane.url)
    try:
        reward, terminated, _, info, _ = _play(env, policies.tmux(solve=False))
        assert terminated and reward < 1.0 and info["tests_verdict"] == "failed"
        assert len(info["trajectory"]) == 1
    finally:
        env.close()


def test_a_malformed_reply_is_an_observation_and_the_agent_goes_on(control_plane: EmbeddedControlPlane) -> None:
    env = IdeGymAgentEnv(policies.TASK, harness="mini-swe-agent", control_plane_url=control_plane.url)
    try:
        first, info = env.reset()
        observation, reward, terminated, truncated, info = env.step(12345)
        assert not terminated and not truncated and info["invalid_action"] is True
        assert "a reply is a string or an assistant message" in observation and first in observation
        # well formed, but not mini-swe-agent's format: its own loop answers with its format error
        observation, _, terminated, _, info = env.step(
            {"content": "x", "tool_calls": [{"function": {"name": "python", "arguments": {"code": "1"}}}]})
        assert not terminated and "Unknown tool 'python'" in info["request"]["messages"][-1]["content"]
        _, reward, terminated, _, info = env.step(policies.bash_call(policies.SUBMIT_MINI))
        assert terminated and "infrastructure_error" not in info and len(info["trajectory"]) == 2
    finally:
        env.close()


def test_a_crashing_harness_is_an_infrastructure_failure_not_a_zero(control_plane: EmbeddedControlPlane) -> None:
    crasher = Harness(name="crasher", layer=LayerSpec("tmux-agent", drivers=("tmux_agent.py",)),
                      command=lambda inside: ["python3", "-c", "raise SystemExit('harness boom')"], api="chat",
                      version="0")
    env = IdeGymAgentEnv(policies.TASK, harness=crasher, control_plane_url=control_plane.url)
    try:
        observation, info = env.reset()
        assert info["agent_ended_before_first_call"] is True
        _, reward, terminated, truncated, info = env.step("anything")
        assert (terminated, truncated) == (False, True) and reward == 0.0
        assert "exited with code 1" in info["infrastructure_error"] and "harness boom" in info["infrastructure_error"]
        assert "checks" not in info  # nothing was graded
    finally:
        env.close()


def test_a_call_whose_answer_comes_too_late_ends_as_an_infrastructure_failure(
        control_plane: EmbeddedControlPlane) -> None:
    env = IdeGymAgentEnv(policies.TASK, harness="tmux", control_plane_url=control_plane.url, call_timeout=1.0)
    try:
        env.reset()
        deadline = time.monotonic() + 60
        while True:  # the harness got its 504 and gave up: it is no longer running
            state = env.sandbox.call(routes.AGENT_EXCHANGE, AgentExchangeRequest(wait=2)).agent
            if not state.running or time.monotonic() > deadline:
                break
        assert not state.running
        _, reward, terminated, truncated, info = env.step(next(policies.tmux()))
        assert truncated and not terminated and reward == 0.0 and info["late_replies"] == 1
        assert "no answer from the policy within 1 s" in info["infrastructure_error"]
    finally:
        env.close()


def test_a_budget_of_seconds_truncates_and_grades(control_plane: EmbeddedControlPlane) -> None:
    sleeper = Harness(name="sleeper", layer=LayerSpec("tmux-agent", drivers=("tmux_agent.py",)),
                      command=lambda inside: ["sleep", "600"], api="chat", version="0")
    env = IdeGymAgentEnv(policies.TASK, harness=sleeper, control_plane_url=control_plane.url, max_seconds=1.0)
    try:
        started = time.monotonic()
        env.reset()
        _, reward, terminated, truncated, info = env.step("x")
        assert time.monotonic() - started < 60
        assert truncated and not terminated and info["truncated_by"] == "max_seconds"
        assert info["tests_verdict"] == "failed" and "infrastructure_error" not in info and reward < 1.0
    finally:
        env.close()


def test_the_tmux_harness_solves_a_task(control_plane: EmbeddedControlPlane) -> None:
    env = IdeGymAgentEnv(policies.TASK, harness="tmux", control_plane_url=control_plane.url)
    try:
        reward, terminated, _, info, requests = _play(env, policies.tmux())
        assert reward == 1.0 and terminated, info
        assert "Screen:" in requests[0]["messages"][1]["content"]
        assert "MCMXCIV" in requests[1]["messages"][-1]["content"]  # the pane showed the check's output
    finally:
        env.close()


def test_the_codex_cli_solves_a_task_through_the_responses_api(control_plane: EmbeddedControlPlane) -> None:
    env = IdeGymAgentEnv(policies.TASK, harness="codex", control_plane_url=control_plane.url)
    try:
        observation, info = env.reset()
        assert info["api"] == "responses"
        request = info["request"]
        _, _, terminated, _, info = env.step(policies.codex_reply(request, policies.FIX))
        assert not terminated, info
        assert info["request"]["messages"][-1]["role"] == "tool"  # the command's output came back
        observation, reward, terminated, truncated, info = env.step("Done: the numerals are fixed.")
        while not (terminated or truncated):  # codex may ask again (a summary, a title): say it is done
            observation, reward, terminated, truncated, info = env.step("Done.")
        assert reward == 1.0 and terminated, info
        assert info["harness"]["installed"]["@openai/codex"] == "0.169.0"
    finally:
        env.close()


class _ScriptedModel(BaseHTTPRequestHandler):
    """An OpenAI-compatible server: scripted completions with token ids and logprobs."""

    replies: list[dict] = []
    seen: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        n = len(type(self).seen) - 1
        message = type(self).replies[min(n, len(type(self).replies) - 1)]
        answer = {"id": f"cmpl-{n}", "object": "chat.completion", "model": body.get("model"),
                  "prompt_token_ids": [1, 2, 3, n],
                  "choices": [{"index": 0, "message": {"role": "assistant", **message},
                               "finish_reason": "tool_calls",
                               "token_ids": [100 + n, 200 + n],
                               "logprobs": {"content": [{"token": "t", "logprob": -0.5 - n, "top_logprobs": []}]}}],
                  "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def _tool_message(command: str) -> dict:
    return {"content": None, "tool_calls": [{"id": f"call_{abs(hash(command))}", "type": "function",
                                              "function": {"name": "bash",
                                                           "arguments": json.dumps({"command": command})}}]}


def _check_exports(tmp_path: Path, calls: list[dict], info: dict, reward: float) -> None:
    """ATIF (validated by Harbor's own models) and JSONL samples hold every call."""
    atif = to_atif(calls, info, session_id="s1", reward=reward)
    agent_steps = [s for s in atif["steps"] if s["source"] == "agent"]
    assert len(agent_steps) == 2 and agent_steps[1]["metrics"]["completion_token_ids"] == [101, 201]
    assert agent_steps[0]["observation"]["results"][0]["source_call_id"] == agent_steps[0]["tool_calls"][0][
        "tool_call_id"]
    assert atif["agent"]["extra"]["installed"]["mini-swe-agent"] == "2.4.6"
    path = tmp_path / "trajectory.json"
    path.write_text(json.dumps(atif))
    harbor_python = side_venv(HARBOR_VENV) / "bin" / "python"
    checked = subprocess.run([str(harbor_python), "-c", "import sys; from harbor.models.trajectories import "
                              "Trajectory; t = Trajectory.model_validate_json(open(sys.argv[1]).read()); "
                              "print(len(t.steps))", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0 and checked.stdout.strip() == str(len(atif["steps"])), checked.stderr
    samples = training_samples(calls, info, reward)
    write_jsonl(tmp_path / "samples.jsonl", samples)
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [r["logprobs"] for r in rows] == [[-0.5], [-1.5]]
    assert all(r["reward"] == 1.0 and r["infra_failure"] is False for r in rows)


def test_pass_through_runs_mini_swe_agent_against_a_model_server(control_plane: EmbeddedControlPlane,
                                                                 tmp_path: Path) -> None:
    _ScriptedModel.replies = [_tool_message(policies.FIX), _tool_message(policies.SUBMIT_MINI)]
    _ScriptedModel.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ScriptedModel)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    env = IdeGymAgentEnv(policies.TASK, harness="mini-swe-agent", control_plane_url=control_plane.url,
                         model_url=f"http://127.0.0.1:{server.server_address[1]}/v1", model_name="scripted")
    try:
        reward, info = env.run_episode()
        assert reward == 1.0 and info["submitted"] is True
        calls = info["trajectory"]
        assert len(calls) == 2 == len(_ScriptedModel.seen)
        assert [c["completion_token_ids"] for c in calls] == [[100, 200], [101, 201]]
        assert [c["prompt_token_ids"][-1] for c in calls] == [0, 1]
        assert calls[1]["logprobs"]["content"][0]["logprob"] == -1.5
        assert _ScriptedModel.seen[0]["logprobs"] is True and _ScriptedModel.seen[0]["model"] == "scripted"
        assert _ScriptedModel.seen[0]["tools"][0]["function"]["name"] == "bash"
        _check_exports(tmp_path, calls, info, reward)
    finally:
        env.close()
        server.shutdown()
        server.server_close()


# A harness that asks once and prints the answer's body as it came, in base64.
ASK_ONCE = r"""
import base64, http.client, os, urllib.parse
url = urllib.parse.urlparse(os.environ["OPENAI_BASE_URL"])
conn = http.client.HTTPConnection(url.hostname, url.port)
conn.request("POST", url.path + "/chat/completions", '{"model": "m", "messages": [{"role": "user", "content": "hi"}]}',
             {"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
print("BODY", base64.b64encode(conn.getresponse().read()).decode())
"""


def test_pass_through_hands_the_agent_the_model_servers_answer_as_it_came(
        control_plane: EmbeddedControlPlane) -> None:
    harness = Harness(name="ask-once", layer=LayerSpec("tmux-agent", drivers=("tmux_agent.py",)),
                      command=lambda inside: ["python3", "-c", ASK_ONCE], api="chat", version="1")
    with policies.fixed_model() as url:
        env = IdeGymAgentEnv(policies.TASK, harness=harness, control_plane_url=control_plane.url, model_url=url)
        try:
            _, info = env.run_episode()
        finally:
            env.close()
    printed = info["agent"]["stdout"].split("BODY ", 1)[1].strip()
    assert base64.b64decode(printed) == policies.FixedModel.answer
    assert info["trajectory"][0]["message"]["content"] == "café ✓"


def test_fork_gives_a_group_of_rollouts_from_one_state(control_plane: EmbeddedControlPlane) -> None:
    env = IdeGymAgentEnv(policies.TASK, harness="tmux", control_plane_url=control_plane.url)
    children: list[IdeGymAgentEnv] = []
    try:
        env.reset()
        env.sandbox.write_file("NOTES.md", "set up before the fork\n")
        children = env.fork(2)
        rewards = []
        for child, solve in zip(children, (True, False), strict=True):
            assert child.sandbox.server_id != env.sandbox.server_id
            look = json.dumps({"analysis": "look", "commands": [{"keystrokes": "cat NOTES.md\n", "duration": 0.5}]})
            _, _, terminated, _, step_info = child.step(look)
            assert "set up before the fork" in step_info["request"]["messages"][-1]["content"]
            for reply in policies.tmux(solve):
                _, reward, terminated, truncated, step_info = child.step(reply)
                if terminated or truncated:
                    break
            rewards.append(reward)
        assert rewards[0] == 1.0 and rewards[1] < 1.0
        with pytest.raises(RuntimeError, match="right after reset"):
            children[0].fork(1)
    finally:
        for child in children:
            child.close()
        env.close()


def test_make_vec_runs_agent_episodes_side_by_side(control_plane: EmbeddedControlPlane) -> None:
    import gymnasium as gym

    import idegym_env  # noqa: F401 - registers the env ids

    envs = gym.make_vec(idegym_env.AGENT_ENV_ID, num_envs=2, vectorization_mode="sync", task=policies.TASK,
                        harness="tmux", control_plane_url=control_plane.url)
    try:
        observations, infos = envs.reset(seed=0)
        assert all("Screen:" in json.loads(o)["messages"][1]["content"] for o in observations)
        submit = next(policies.tmux(solve=False))
        _, rewards, terminated, truncated, infos = envs.step([submit, submit])
        assert list(terminated) == [True, True] and all(r < 1.0 for r in rewards)
    finally:
        envs.close()


@pytest.mark.security
def test_the_direct_exchange_socket_admits_only_its_sandbox_server(control_plane: EmbeddedControlPlane) -> None:
    env = IdeGymAgentEnv(policies.TASK, harness="tmux", control_plane_url=control_plane.url)
    channel = DirectChannel(env.layer.host.parent)
    try:
        env.reset()
        assert env._exchange_path == "direct"  # the env's own episode went the direct way
        # the sandbox's user can neither list the sockets nor connect to one whose name it learnt
        probe = ("import os, socket\n"
                 "try:\n    os.listdir('/opt/idegym/harness/.gw'); print('listed')\n"
                 "except PermissionError: print('no list')\n"
                 f"s = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect({channel.inside!r}); print('connected')\n"
                 "except PermissionError: print('no connect')\n")
        env.sandbox.write_file("probe.py", probe)
        out = env.sandbox.run_tool(policies_bash("python3 probe.py")).stdout.split()
        assert out == ["no", "list", "no", "connect"], out
        # a connection that does not say the secret is dropped
        rogue = socket.socket(socket.AF_UNIX)
        rogue.connect(str(channel.path))
        rogue.sendall(b"not-the-secret-of-this-episode\n")
        assert channel.accept() is False and not channel.path.exists()
        rogue.close()
    finally:
        channel.close()
        env.close()


def policies_bash(command: str):
    from idegym_env.tools import BashCall

    return BashCall.model_validate({"tool": "bash", "arguments": {"command": command}})


def test_eval_runs_a_harness_against_a_model_server(control_plane: EmbeddedControlPlane, tmp_path: Path) -> None:
    from idegym_env.eval import AgentSpecError, evaluate

    with pytest.raises(AgentSpecError, match="model_url"):
        evaluate(policies.TASK, "harness:mini-swe-agent", out=tmp_path / "none", control_plane_url=control_plane.url)
    with pytest.raises(AgentSpecError, match="unknown harness"):
        evaluate(policies.TASK, "harness:nope", agent_args={"model_url": "http://127.0.0.1:9/v1"},
                 out=tmp_path / "none", control_plane_url=control_plane.url)
    _ScriptedModel.replies = [{"content": reply} for reply in policies.tmux()]
    _ScriptedModel.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ScriptedModel)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        result = evaluate(policies.TASK, "harness:tmux", agent_args={"model_url": url}, out=tmp_path / "ok",
                          control_plane_url=control_plane.url)
        (record,) = result.records
        assert record["reward"] == 1.0 and record["passed"] is True and record["error"] is None, record
    finally:
        server.shutdown()
        server.server_close()
    # a model server that is not there: the model's failure, not a score
    result = evaluate(policies.TASK, "harness:tmux", agent_args={"model_url": url},
                      out=tmp_path / "down", control_plane_url=control_plane.url)
    (record,) = result.records
    assert record["error_kind"] == "model" and record["reward"] is None, record


def test_an_agent_speaking_anthropics_messages_api_solves_a_task(control_plane: EmbeddedControlPlane) -> None:
    speaker = Harness(name="anthropic-speaker", layer=LayerSpec("tmux-agent", drivers=("tmux_agent.py",)),
                      command=lambda inside: ["python3", "-c", policies.ANTHROPIC_AGENT], api="anthropic",
                      version="0")
    env = IdeGymAgentEnv(policies.TASK, harness=speaker, control_plane_url=control_plane.url)
    try:
        _, info = env.reset()
        assert info["api"] == "anthropic"
        assert info["request"]["messages"][0] == {"role": "system", "content": "You fix code."}
        assert info["request"]["tools"][0]["function"]["name"] == "bash"
        _, _, terminated, _, info = env.step(policies.bash_call(policies.FIX))
        assert not terminated
        tool = info["request"]["messages"][-1]
        assert tool["role"] == "tool" and tool["tool_call_id"].startswith("toolu_")
        _, reward, terminated, _, info = env.step("The numerals are fixed.")
        assert terminated and reward == 1.0, info
        assert "ended: end_turn" in info["agent"]["stdout"]
    finally:
        env.close()


def test_claude_code_solves_a_task_through_the_messages_api(control_plane: EmbeddedControlPlane) -> None:
    env = IdeGymAgentEnv(policies.TASK, harness="claude-code", control_plane_url=control_plane.url)
    try:
        _, info = env.reset()
        assert info["api"] == "anthropic" and "Bash" in [t["function"]["name"] for t in info["request"]["tools"]]
        reply = {"content": None, "tool_calls": [{"function": {"name": "Bash", "arguments": {
            "command": policies.FIX, "description": "fix the numerals"}}}]}
        observation, reward, terminated, truncated, info = env.step(reply)
        assert not terminated and info["request"]["messages"][-1]["role"] == "tool"
        while not (terminated or truncated):  # it may ask again: say it is done
            observation, reward, terminated, truncated, info = env.step("Done: the numerals are fixed.")
        assert reward == 1.0 and terminated, info
        assert info["harness"]["installed"]["@anthropic-ai/claude-code"] == "2.1.328"
    finally:
        env.close()


@pytest.mark.security
def test_another_episodes_endpoint_is_out_of_reach(control_plane: EmbeddedControlPlane) -> None:
    first = IdeGymAgentEnv(policies.TASK, harness="tmux", control_plane_url=control_plane.url)
    second = IdeGymAgentEnv(policies.TASK, harness="tmux", control_plane_url=control_plane.url)
    try:
        first.reset()
        second.reset()
        # from the first sandbox, the second's endpoint with the second's key: its loopback is not ours
        probe = ("import json, sys, urllib.request\n"
                 f"req = urllib.request.Request({second.endpoint + '/v1/chat/completions'!r}, data=b'{{}}', "
                 f"method='POST', headers={{'Authorization': 'Bearer {second._key}'}})\n"
                 "try:\n    urllib.request.urlopen(req, timeout=5); print('reached')\n"
                 "except urllib.error.HTTPError as exc: print('http', exc.code)\n"
                 "except OSError as exc: print('refused', type(exc).__name__)\n")
        first.sandbox.write_file("probe.py", probe)
        out = first.sandbox.run_tool(policies_bash("python3 probe.py")).stdout.split()
        # refused, or (the same port by chance) the first episode's own endpoint, which wants its own key
        assert out[0] == "refused" or out == ["http", "401"], out
        assert second._call_exchange(AgentExchangeRequest(wait=0)).agent.calls == 1  # only its own agent's call
    finally:
        first.close()
        second.close()
