"""SkyRL: the ``idegym`` text env through ``skyrl_gym.make``, driven the way SkyRL's generator
drives it (init → step(text)... → get_metrics → close) by scripted multi-turn policies."""

from __future__ import annotations

import json

import pytest
import skyrl_gym

import idegym_env.integrations.skyrl  # noqa: F401 - registers "idegym"
from idegym_env.integrations import InfrastructureError
from idegym_env.integrations._episode import close_shared_clients, shared_client
from idegym_env.integrations.skyrl import parse_tool_call
from tests.integration_helpers import TASK, alive, control_plane, fix_call_json  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(300)


def call(name: str, **arguments: object) -> str:
    return f"Let me do this.\n<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def make(cp, **extras):  # type: ignore[no-untyped-def]
    return skyrl_gym.make("idegym", env_config={"control_plane_url": cp.url}, extras={"task": TASK, **extras})


def rollout(env, actions: list[str]) -> list[dict]:  # type: ignore[no-untyped-def]
    """What SkyRL's agent loop does with one trajectory: init, then step until done."""
    prompt, meta = env.init([{"role": "system", "content": "You are a coder."}, {"role": "user", "content": "Go."}])
    assert meta["task_id"] == TASK
    assert "Roman" in prompt[-1]["content"] and "<tool_call>" in prompt[-1]["content"]
    outputs = []
    for action in actions:
        out = env.step(action)
        outputs.append(out)
        if out["done"]:
            break
    return outputs


@pytest.fixture(autouse=True, scope="module")
def _clients():  # type: ignore[no-untyped-def]
    yield
    close_shared_clients()


def test_solving_policy_gets_reward_one_and_hands_the_sandbox_back(control_plane) -> None:  # noqa: F811
    env = make(control_plane, max_turns=10)
    assert isinstance(env, idegym_env.integrations.skyrl.IdeGymTextEnv)
    outputs = rollout(env, [
        call("bash", command="cat -n roman.py"),
        f"<tool_call>{fix_call_json()}</tool_call>",
        call("run_checks"),
        call("submit"),
    ])
    assert [o["done"] for o in outputs] == [False, False, False, True]
    assert "def to_roman" in outputs[0]["observations"][0]["content"]
    assert outputs[0]["observations"][0]["role"] == "user"
    assert "OK" in outputs[2]["observations"][0]["content"]  # the tests pass before grading, too
    assert outputs[-1]["reward"] == 1.0 and outputs[-1]["observations"] == []
    assert outputs[-1]["metadata"]["checks"]["tests"]["scores"]["passed"] == 8
    assert env.get_metrics() == {"turns": 4, "reward": 1.0, "tests_passed": 8, "tests_total": 8}
    assert alive(control_plane) == 0  # graded: the sandbox went back when the episode ended
    env.close()


def test_idle_policy_gets_less_than_one_at_the_turn_limit(control_plane) -> None:  # noqa: F811
    env = make(control_plane, max_turns=3)
    outputs = rollout(env, ["I am not sure what to do.", call("bash", command="ls"), "Still thinking."])
    assert [o["done"] for o in outputs] == [False, False, True]
    assert "no tool call found" in outputs[0]["observations"][0]["content"]  # our message, a turn spent
    assert outputs[0]["metadata"]["invalid_action"] is True
    assert outputs[-1]["reward"] < 1.0
    scores = outputs[-1]["metadata"]["checks"]["tests"]["scores"]
    assert scores["total"] == 8 and scores["passed"] < 8  # graded on the untouched project
    env.close()
    assert alive(control_plane) == 0


def test_malformed_calls_cost_a_turn_with_our_message(control_plane) -> None:  # noqa: F811
    env = make(control_plane, max_turns=10)
    outputs = rollout(env, [
        call("rm_rf"),
        '<tool_call>{"name": "bash", "arguments": {"command": }</tool_call>',
        call("edit_file", path="roman.py", start_line=5, end_line=2, new_content="x"),
        call("read_file", path="no/such/file.py"),
        call("submit"),
    ])
    texts = [o["observations"][0]["content"] if o["observations"] else "" for o in outputs]
    assert "unknown tool 'rm_rf'" in texts[0] and "submit" in texts[0]
    assert "not valid JSON" in texts[1]
    assert "end_line (2) is before start_line (5)" in texts[2]
    assert "no such file" in texts[3].lower()
    assert outputs[-1]["done"] and outputs[-1]["reward"] < 1.0
    env.close()


def test_dead_sandbox_is_an_error_not_a_zero(control_plane) -> None:  # noqa: F811
    env = make(control_plane, max_turns=10)
    rollout(env, [call("bash", command="true")])
    sandbox = env.episode.env.sandbox
    sandbox.stop()  # the sandbox goes away under the episode (what a crash or a reaper looks like)
    with pytest.raises(InfrastructureError, match="gone"):
        env.step(call("bash", command="ls"))
    assert env.episode.reward is None and env.episode.infra_error
    env.close()
    assert alive(control_plane) == 0


def test_configuration_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="extras must name the task"):
        skyrl_gym.make("idegym", env_config={}, extras={})
    with pytest.raises(ValueError, match="unknown idegym env_config keys"):
        skyrl_gym.make("idegym", env_config={"control_plane": "x"}, extras={"task": TASK})
    assert parse_tool_call('```json\n{"name": "submit"}\n```') == ("submit", None)
    assert parse_tool_call('{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}') == ("bash", {"command": "ls"})


def test_shared_client_is_one_per_control_plane(control_plane) -> None:  # noqa: F811
    assert shared_client(control_plane.url) is shared_client(control_plane.url)
