"""``IdeGym-Agent-v0``: harnesses that bring their own loop, driven by scripted policies that answer
in each harness's own format; pass-through mode against a model server of the test's own."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from idegym_env.agents.env import IdeGymAgentEnv
from idegym_env.embedded import EmbeddedControlPlane
from tests import agent_policies as policies
from tests.helpers import embedded_control_plane


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
