"""``RayVectorEnv(group_size=k)`` end to end: every group of k sub-envs starts each episode from one
reset state, forked (not reset k times), and starts the next once all its members have ended."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("ray")
from idegym_env.vector.local_ray import use_loopback  # noqa: E402

use_loopback()

from idegym_env.embedded import EmbeddedControlPlane  # noqa: E402
from idegym_env.vector import RayVectorEnv  # noqa: E402
from tests.helpers import bash_action as bash  # noqa: E402
from tests.helpers import embedded_control_plane, local_ray_session  # noqa: E402
from tests.helpers import object_actions as actions  # noqa: E402

pytestmark = pytest.mark.ray

TASK = "python-roman-numerals"
FORKED = "grep -c ' /home/appuser/work .*lowerdir.*fork' /proc/self/mountinfo || true"


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    yield from local_ray_session()


@pytest.fixture(scope="module")
def control_plane() -> Iterator[EmbeddedControlPlane]:
    yield from embedded_control_plane(warm_pool=2)


def test_bad_group_sizes_are_refused(ray_session: None, control_plane: EmbeddedControlPlane) -> None:
    with pytest.raises(ValueError, match="multiple of group_size"):
        RayVectorEnv(3, task=TASK, control_plane_url=control_plane.url, group_size=2)
    with pytest.raises(ValueError, match="a group lives in one actor"):
        RayVectorEnv(4, task=TASK, control_plane_url=control_plane.url, group_size=2, envs_per_actor=3)
    with pytest.raises(ValueError, match="group_size must be"):
        RayVectorEnv(4, task=TASK, control_plane_url=control_plane.url, group_size=0)


def test_groups_start_every_episode_from_one_forked_reset(ray_session: None,
                                                          control_plane: EmbeddedControlPlane) -> None:
    vec = RayVectorEnv(4, task=TASK, control_plane_url=control_plane.url, group_size=2, max_steps=8)
    try:
        assert vec.envs_per_actor == 2
        obs, infos = vec.reset(seed=0)
        servers = list(infos["server_id"])
        assert len(set(servers)) == 4
        assert list(infos["group_leader"]) == [True, False, True, False]
        assert infos["forked_from"][1] == servers[0] and infos["forked_from"][3] == servers[2]
        assert obs[0] == obs[1] and obs[2] == obs[3]
        # members stand on their leader's fork layer; leaders on the image alone
        obs, *_ = vec.step(actions(*[bash(FORKED)] * 4))
        assert [o.splitlines()[0] for o in obs] == ["0", "1", "0", "1"], obs
        # slot 0 submits now, slot 1 two steps later: slot 0 waits for its group meanwhile
        obs, rewards, term, trunc, infos = vec.step(actions({"tool": "submit", "arguments": {}}, bash("true"),
                                                            bash("true"), bash("true")))
        assert term[0] and not term[1]
        obs, rewards, term, trunc, infos = vec.step(actions(bash("echo ignored"), bash("true"), bash("true"),
                                                            bash("true")))
        assert infos["group_waiting"][0] and not term[0] and not trunc[0] and rewards[0] == 0.0
        assert not infos["_group_waiting"][1]
        obs, rewards, term, trunc, infos = vec.step(actions(bash("echo ignored"), {"tool": "submit", "arguments": {}},
                                                            bash("true"), bash("true")))
        assert infos["group_waiting"][0] and term[1]
        # the group's next episode: one reset of the leader, forked again
        obs, rewards, term, trunc, infos = vec.step(actions(*[bash("true")] * 4))
        assert infos["_group_leader"][0] and infos["_group_leader"][1] and not infos["_group_leader"][2]
        assert infos["forked_from"][1] == infos["server_id"][0] and infos["server_id"][1] not in servers
        obs, *_ = vec.step(actions(*[bash(FORKED)] * 4))
        assert obs[0].splitlines()[0] == "0" and obs[1].splitlines()[0] == "1"
    finally:
        vec.close()
