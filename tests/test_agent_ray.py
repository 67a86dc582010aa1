"""``IdeGym-Agent-v0`` in Ray actors: ``make_vec`` with the spec's vector entry point."""

from __future__ import annotations

import json
from collections.abc import Iterator

import gymnasium as gym
import pytest

pytest.importorskip("ray")
from idegym_env.vector.local_ray import use_loopback  # noqa: E402

use_loopback()  # before Ray is first used: it listens on 127.0.0.1 only

import idegym_env  # noqa: E402
from idegym_env.embedded import EmbeddedControlPlane  # noqa: E402
from idegym_env.vector import RayVectorEnv  # noqa: E402
from tests import agent_policies as policies  # noqa: E402
from tests.helpers import embedded_control_plane, local_ray_session  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    yield from local_ray_session()


@pytest.fixture(scope="module")
def control_plane() -> Iterator[EmbeddedControlPlane]:
    yield from embedded_control_plane(warm_pool=0)


def test_make_vec_runs_agent_episodes_in_ray_actors(ray_session: None, control_plane: EmbeddedControlPlane) -> None:
    envs = gym.make_vec(idegym_env.AGENT_ENV_ID, num_envs=2, task=policies.TASK, harness="tmux",
                        control_plane_url=control_plane.url)
    try:
        assert isinstance(envs.unwrapped, RayVectorEnv)
        observations, _ = envs.reset(seed=0)
        assert all("Screen:" in json.loads(o)["messages"][1]["content"] for o in observations)
        fix, submit = policies.tmux()
        _, rewards, terminated, _, _ = envs.step([fix, submit])  # the second submits at once
        assert list(terminated) == [False, True] and rewards[1] < 1.0
        _, rewards, terminated, _, _ = envs.step([submit, submit])  # the second's reset (NEXT_STEP)
        assert bool(terminated[0]) and rewards[0] == 1.0
    finally:
        envs.close()
