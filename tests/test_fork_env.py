"""``IdeGymEnv.fork(n)`` end to end: forks continue the running episode and then go their own way."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from idegym_env.embedded import EmbeddedControlPlane
from idegym_env.env import IdeGymEnv
from tests.helpers import embedded_control_plane

PY_TASK = "python-roman-numerals"


@pytest.fixture(scope="module")
def control_plane() -> Iterator[EmbeddedControlPlane]:
    yield from embedded_control_plane(warm_pool=2)


def _bash(command: str) -> dict:
    return {"tool": "bash", "arguments": {"command": command}}


def test_forks_continue_the_episode_and_go_their_own_way(control_plane: EmbeddedControlPlane) -> None:
    env = IdeGymEnv(PY_TASK, control_plane_url=control_plane.url, render_mode="ansi", max_steps=12)
    client_id = env.client.client_id
    env.reset(seed=3)
    solution = list(env.task.solution)
    assert len(solution) >= 1
    env.step(_bash("echo explored > notes.txt"))
    forks = env.fork(2)
    assert len(forks) == 2 and len({f.sandbox.server_id for f in forks} | {env.sandbox.server_id}) == 3
    for fork in forks:
        assert fork.task is env.task and fork._steps == env._steps == 1
        assert fork.render() == env.render()
        assert fork.np_random.bit_generator.state == env.np_random.bit_generator.state
        assert fork.np_random is not env.np_random and fork.sandbox is not env.sandbox
    solver, idler = forks
    # the solver finishes the task in its own sandbox; the idler submits as it is; the parent goes on
    for call in solution:
        _, _, terminated, truncated, info = solver.step(call.to_action())
        assert "error" not in info and not terminated and not truncated
    _, solved, terminated, _, info = solver.step({"tool": "submit", "arguments": {}})
    assert terminated and solved == 1.0 and info["step"] == 1 + len(solution) + 1, info
    _, untouched, terminated, _, info = idler.step({"tool": "submit", "arguments": {}})
    assert terminated and untouched < 1.0 and info["step"] == 2, info
    obs, _, _, _, info = env.step(_bash("cat notes.txt; ls"))
    assert obs.startswith("explored") and info["step"] == 2
    # the parent's session outlives the parent: the forks keep working when it closes first
    env.close()
    _, info = idler.reset()  # the next episode (a RESTART of the fork's own server)
    assert info["sandbox"] == "restarted"
    obs, _, _, _, info = idler.step(_bash("ls notes.txt 2>&1"))
    assert "No such file" in obs and info["step"] == 1
    solver.close()
    assert _usable(control_plane, client_id)  # the idler's server still runs
    idler.close()
    assert not _usable(control_plane, client_id)  # the last one out ended the session


def test_fork_needs_a_running_episode(control_plane: EmbeddedControlPlane) -> None:
    env = IdeGymEnv(PY_TASK, control_plane_url=control_plane.url)
    try:
        with pytest.raises(RuntimeError, match="reset"):
            env.fork(1)
    finally:
        env.close()


def _usable(cp: EmbeddedControlPlane, client_id: str) -> bool:
    import httpx

    servers = httpx.get(f"{cp.url}/api/idegym-servers", params={"client_id": client_id, "include_terminal": "true"},
                        timeout=30)
    if servers.status_code == 404:
        return False
    return any(s["usable"] for s in servers.json()["servers"])

