"""The Gymnasium environment: contract, episodes on every bundled task, reuse, robustness, cleanup."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import idegym_env
from idegym_env.client._async import AsyncSessions
from idegym_env.embedded import EmbeddedControlPlane
from idegym_env.env import IdeGymEnv
from idegym_env.tasks import bundled_tasks
from tests.helpers import REPO, embedded_control_plane, wait_until

PY_TASK = "python-roman-numerals"


@pytest.fixture(scope="module")
def control_plane() -> Iterator[EmbeddedControlPlane]:
    yield from embedded_control_plane(warm_pool=1)


@pytest.fixture
def env(control_plane: EmbeddedControlPlane) -> Iterator[IdeGymEnv]:
    e = IdeGymEnv(PY_TASK, control_plane_url=control_plane.url, render_mode="ansi")
    yield e
    e.close()


def test_check_env_passes_on_the_unwrapped_env(control_plane: EmbeddedControlPlane) -> None:
    # check_env demands identical step infos for identical seeds and actions: wall times cannot be.
    env = IdeGymEnv(PY_TASK, control_plane_url=control_plane.url, render_mode="ansi")
    try:
        check_env(env, skip_render_check=False)
    finally:
        env.close()


def test_check_env_passes_on_gym_make_with_default_arguments() -> None:
    env = gym.make("IdeGym-v0")  # the default task on its own embedded control plane
    try:
        check_env(env.unwrapped)
        _, info = env.unwrapped.reset(seed=0)
        assert info["reset_seconds"] > 0  # reset infos keep their time: check_env does not compare them
        _, _, _, _, info = env.unwrapped.step({"tool": "bash", "arguments": {"command": "true"}})
        assert "seconds" not in info and env.unwrapped.last_step_seconds > 0
    finally:
        env.close()


def test_step_wall_times_in_info_on_request(control_plane: EmbeddedControlPlane) -> None:
    env = IdeGymEnv(PY_TASK, control_plane_url=control_plane.url, info_timing=True)
    try:
        env.reset(seed=0)
        _, _, _, _, info = env.step({"tool": "bash", "arguments": {"command": "true"}})
        assert info["seconds"] == env.last_step_seconds > 0
    finally:
        env.close()


def test_make_and_make_vec_sync(control_plane: EmbeddedControlPlane) -> None:
    env = gym.make("IdeGym-v0", task=PY_TASK, control_plane_url=control_plane.url)
    try:
        obs, info = env.reset(seed=0)
        assert "Roman" in obs and info["task_id"] == PY_TASK
        obs, reward, terminated, truncated, info = env.step({"tool": "bash", "arguments": {"command": "echo hi"}})
        assert obs.startswith("hi") and info["exit_code"] == 0 and not terminated
    finally:
        env.close()
    vec = gym.make_vec("IdeGym-v0", num_envs=2, vectorization_mode="sync", task=PY_TASK,
                       control_plane_url=control_plane.url)
    try:
        obs, infos = vec.reset(seed=1)
        assert len(obs) == 2 and all("Roman" in o for o in obs)
        actions = tuple({"tool": "bash", "arguments": {"command": f"echo env{i}"}} for i in range(2))
        obs, rewards, terminated, truncated, infos = vec.step(actions)
        assert [o.split("\n")[0] for o in obs] == ["env0", "env1"]
    finally:
        vec.close()


GYM_SCRIPT = r"""
import json, sys, gymnasium as gym
from gymnasium.utils.env_checker import check_env
import idegym_env
from idegym_env.env import IdeGymEnv
url = sys.argv[1]
env = IdeGymEnv("python-roman-numerals", control_plane_url=url)
check_env(env)
env.close()
vec = gym.make_vec("IdeGym-v0", num_envs=2, vectorization_mode="sync", task="python-roman-numerals",
                   control_plane_url=url)
obs, _ = vec.reset(seed=0)
vec.step(tuple({"tool": "submit", "arguments": {}} for _ in range(2)))
vec.close()
print(json.dumps({"gymnasium": gym.__version__, "ok": True}))
"""


@pytest.mark.parametrize("version", ["1.0.0", "1.4.0"])
def test_other_gymnasium_versions(control_plane: EmbeddedControlPlane, version: str) -> None:
    """Both ends of the range: 1.0.0 (oldest Ray allows) and 1.4 (newest); the venv has 1.2.2."""
    target = REPO / ".gym-versions" / version
    assert (target / "gymnasium").is_dir(), f"{target} missing: `make test` installs it (make gym-versions)"
    env = dict(os.environ, PYTHONPATH=str(target))
    proc = subprocess.run([sys.executable, "-c", GYM_SCRIPT, control_plane.url], capture_output=True, text=True,
                          env=env, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"gymnasium": version, "ok": True}


@pytest.mark.parametrize("task", [t.id for t in bundled_tasks()])
def test_every_bundled_task_is_solvable_and_untouched_is_not(control_plane: EmbeddedControlPlane,
                                                             task: str) -> None:
    env = IdeGymEnv(task, control_plane_url=control_plane.url)
    try:
        env.reset(seed=0)
        _, untouched, terminated, _, info = env.step({"tool": "submit", "arguments": {}})
        assert terminated and untouched < 1.0, info
        env.reset()
        for call in env.task.solution:
            obs, _, terminated, truncated, info = env.step(call.to_action())
            assert "error" not in info, (call, obs)
            assert not terminated and not truncated
        _, solved, terminated, _, info = env.step({"tool": "submit", "arguments": {}})
        assert terminated and solved == 1.0, info
    finally:
        env.close()


def _trace_commands() -> str:
    return ("echo leftover > /tmp/trace; echo leftover > ~/trace; echo leftover > trace.txt; "
            "echo 'echo hacked' >> ~/.bashrc; mkdir -p .git/hooks; nohup sleep 600 >/dev/null 2>&1 &")


def test_restart_reuse_leaves_no_trace_of_the_previous_episode(env: IdeGymEnv) -> None:
    env.reset(seed=0)
    server = env.sandbox.server_id
    env.step({"tool": "bash", "arguments": {"command": _trace_commands()}})
    _, info = env.reset()
    assert info["sandbox"] == "restarted" and env.sandbox.server_id == server
    obs, *_ = env.step({"tool": "bash", "arguments": {"command": "ls /tmp/trace ~/trace trace.txt 2>&1; "
                                                                 "grep -c hacked ~/.bashrc; pgrep -c sleep"}})
    assert obs.count("No such file") == 3 and "\n0\n0\n" in obs + "\n", obs


def test_reset_reuse_restores_the_project_and_ends_processes(control_plane: EmbeddedControlPlane) -> None:
    env = IdeGymEnv(PY_TASK, control_plane_url=control_plane.url, reuse="RESET")
    try:
        env.reset(seed=0)
        env.step({"tool": "bash", "arguments": {"command": _trace_commands()}})
        _, info = env.reset()
        assert info["sandbox"] == "reset"
        obs, *_ = env.step({"tool": "bash", "arguments": {"command": "ls trace.txt 2>&1; pgrep -c sleep"}})
        assert "No such file" in obs and obs.splitlines()[1] == "0", obs
    finally:
        env.close()


_LEFT_BEHIND = ("echo a-secret > /tmp/a-note; site=$(python3 -m site --user-site); mkdir -p \"$site\"; "
                "echo 'print(\"planted by a\")' > \"$site/usercustomize.py\"")
_LOOK_AROUND = "cat /tmp/a-note 2>&1; python3 -c pass 2>&1"


def _leave_a_sandbox_behind(env: IdeGymEnv) -> int:
    """Episode of a first trainer: it leaves a note in /tmp and a ``usercustomize.py`` that runs
    in every later ``python3`` of its user, then hands its sandbox back (``close`` finishes it)."""
    try:
        env.reset(seed=0)
        env.step({"tool": "bash", "arguments": {"command": _LEFT_BEHIND}})
        obs, *_ = env.step({"tool": "bash", "arguments": {"command": _LOOK_AROUND}})
        assert "a-secret" in obs and "planted by a" in obs, obs  # the probe sees what is there
        return env.sandbox.server_id
    finally:
        env.close()


@pytest.mark.security
def test_reset_reuse_never_hands_a_sandbox_to_another_trainer(control_plane: EmbeddedControlPlane) -> None:
    """Two trainers (two envs, each its own client) with ``reuse="RESET"`` on one control plane:
    the second never gets the first's sandbox with its ``/tmp`` and its ``usercustomize.py``.

    Can fail: it did. Every env registers under one client name and a start claimed the newest
    FINISHED server of that name: B's ``python3`` printed "planted by a" and ``cat`` showed A's note.
    """
    first = _leave_a_sandbox_behind(IdeGymEnv(PY_TASK, control_plane_url=control_plane.url, reuse="RESET"))
    second = IdeGymEnv(PY_TASK, control_plane_url=control_plane.url, reuse="RESET")
    try:
        second.reset(seed=0)
        obs, *_ = second.step({"tool": "bash", "arguments": {"command": _LOOK_AROUND}})
        assert "a-secret" not in obs and "planted by a" not in obs, obs
        assert second.sandbox.server_id != first
    finally:
        second.close()


@pytest.mark.security
def test_reset_reuse_stays_within_one_envs_episodes(control_plane: EmbeddedControlPlane) -> None:
    """Two envs sharing one client: RESET keeps files outside the project between an env's own
    episodes only; a sandbox another env handed back comes fresh (restarted), never reset.

    Can fail: it did (as above, through the shared client's own FINISHED server).
    """
    from idegym_env.client import IdeGymClient

    with IdeGymClient(control_plane.url, name="shared-trainer") as client:
        client.register()
        first = _leave_a_sandbox_behind(IdeGymEnv(PY_TASK, client=client, reuse="RESET"))
        second = IdeGymEnv(PY_TASK, client=client, reuse="RESET")
        try:
            _, info = second.reset(seed=0)
            obs, *_ = second.step({"tool": "bash", "arguments": {"command": _LOOK_AROUND}})
            assert "a-secret" not in obs and "planted by a" not in obs, (info, obs)
            assert info["sandbox"] == "reused" and second.sandbox.server_id == first  # reused, but restarted
        finally:
            second.close()


@pytest.mark.parametrize("action", [
    "not json at all", '{"tool": "bash"}', {"tool": "rm_rf"}, {"tool": "bash", "arguments": {"command": 3}},
    {"tool": "edit_file", "arguments": {"path": "roman.py", "start_line": 0, "end_line": 1, "new_content": ""}},
    None, 42, ["bash"], "x" * 100_000,
])
def test_malformed_actions_explain_instead_of_crashing(control_plane: EmbeddedControlPlane, action) -> None:
    env = IdeGymEnv(PY_TASK, control_plane_url=control_plane.url, invalid_action_penalty=0.1)
    try:
        env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["invalid_action"] is True and reward == -0.1 and not terminated and not truncated
        assert "valid" in obs.lower() and env.observation_space.contains(obs)
        obs, *_ = env.step({"tool": "bash", "arguments": {"command": "echo still-here"}})
        assert obs.startswith("still-here")
    finally:
        env.close()


def test_sandbox_errors_become_observations(env: IdeGymEnv) -> None:
    env.reset(seed=0)
    obs, _, terminated, _, info = env.step({"tool": "read_file", "arguments": {"path": "missing.txt"}})
    assert "error" in info and "missing.txt" in obs and not terminated
    obs, _, _, _, info = env.step({"tool": "patch_file", "arguments": {"path": "roman.py",
                                                                      "patch": "@@ -1,3 +1,3 @@\n-zzz\n+yyy\n"}})
    assert "did not apply" in obs


def test_step_budget_truncates_and_grades(control_plane: EmbeddedControlPlane) -> None:
    env = IdeGymEnv(PY_TASK, control_plane_url=control_plane.url, max_steps=2)
    try:
        env.reset(seed=0)
        _, _, terminated, truncated, _ = env.step({"tool": "bash", "arguments": {"command": "true"}})
        assert not terminated and not truncated
        obs, reward, terminated, truncated, info = env.step({"tool": "bash", "arguments": {"command": "true"}})
        assert truncated and not terminated and "reward:" in obs
        assert info["checks"]["tests"]["scores"]["total"] == 8 and 0 < reward < 1
    finally:
        env.close()


def test_step_async_steps_as_step_does(control_plane: EmbeddedControlPlane) -> None:
    """``step_async`` (the MCP and OpenEnv servers' step, on their event loop) is ``step``: the same
    observations, rewards, ends and infos for a result, a tool's error, an invalid action, the
    step that runs out of the budget (graded on a worker thread) and a submit."""
    actions = [{"tool": "bash", "arguments": {"command": "echo hello; exit 3"}},
               {"tool": "read_file", "arguments": {"path": "missing.txt"}},
               {"tool": "no-such-tool"},
               {"tool": "bash", "arguments": {"command": "true"}},  # the 4th of 4: truncated and graded
               "reset",
               {"tool": "submit"}]
    varies = {"seconds", "server_id", "sandbox"}

    def plain(result: tuple) -> tuple:
        obs, reward, terminated, truncated, info = result
        return obs, reward, terminated, truncated, {k: v for k, v in info.items() if k not in varies}

    sync_env = IdeGymEnv(PY_TASK, control_plane_url=control_plane.url, max_steps=4)
    async_env = IdeGymEnv(PY_TASK, control_plane_url=control_plane.url, max_steps=4)

    async def on_a_loop() -> list[tuple]:
        sessions = AsyncSessions(asyncio.get_running_loop())
        try:
            async_env.reset(seed=0)
            got = []
            for action in actions:
                if action == "reset":
                    async_env.reset(seed=0)
                else:
                    got.append(plain(await async_env.step_async(action, sessions)))
            return got
        finally:
            sessions.close()

    try:
        sync_env.reset(seed=0)
        expected = []
        for action in actions:
            if action == "reset":
                sync_env.reset(seed=0)
            else:
                expected.append(plain(sync_env.step(action)))
        got = asyncio.run(on_a_loop())
    finally:
        sync_env.close()
        async_env.close()
    assert got == expected
    assert expected[0][4]["exit_code"] == 3 and "error" in expected[1][4] and expected[2][4]["invalid_action"]
    assert expected[3][3] and "checks" in expected[3][4]  # truncated, graded
    assert expected[4][2] and expected[4][4]["submitted"]  # submitted: terminated


@pytest.mark.security
def test_an_action_cannot_ask_for_more_time_than_the_environment_allows(control_plane: EmbeddedControlPlane
                                                                         ) -> None:
    """Can fail: without the cap in ``BashCall.to_request`` the call asks the sandbox for 3600 s and
    the sleep runs its full 30 s (seen on the code before the cap)."""
    env = IdeGymEnv(PY_TASK, control_plane_url=control_plane.url, bash_timeout=2)
    try:
        env.reset(seed=0)
        action = {"tool": "bash", "arguments": {"command": "sleep 30; echo overslept", "timeout": 3600}}
        obs, _, _, _, info = env.step(action)
        assert info["timed_out"] and "overslept" not in obs, obs
        assert env.last_step_seconds < 10, f"the call ran {env.last_step_seconds:.1f} s past a 2 s limit"
        assert info["timeout_capped"] == 2 and "capped at 2 s" in obs, obs
        # a call may ask for less than the limit, and is not told anything about a cap then
        obs, _, _, _, info = env.step({"tool": "bash", "arguments": {"command": "sleep 5", "timeout": 0.5}})
        assert info["timed_out"] and "timeout_capped" not in info and "capped" not in obs
    finally:
        env.close()


def test_planted_reports_and_edited_tests_do_not_change_the_reward(env: IdeGymEnv) -> None:
    env.reset(seed=0)
    env.step({"tool": "bash", "arguments": {"command":
             "printf 'import sys\\nsys.exit(0)\\n' > tests/run_tests.py; "
             "echo '<testsuite tests=\"8\"><testcase name=\"x\"/></testsuite>' > test-results.xml; "
             "(while true; do echo '<testsuite tests=\"8\"/>' > test-results.xml; sleep 0.01; done) &"}})
    _, reward, terminated, _, info = env.step({"tool": "submit", "arguments": {}})
    assert terminated and reward == pytest.approx(0.625), info


def test_render_ansi_shows_the_transcript(env: IdeGymEnv) -> None:
    env.reset(seed=0)
    env.step({"tool": "bash", "arguments": {"command": "echo transcript-line"}})
    text = env.render()
    assert "task python-roman-numerals" in text and "$ echo transcript-line" in text


def test_default_make_and_close_leave_no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from idegym_env import embedded
    from sandbox_server.procfs import descendants
    from tests.helpers import process_alive

    monkeypatch.setenv("IDEGYM_EMBEDDED_GRACE", "1")  # it outlives its last env by this long
    env = gym.make("IdeGym-v0")
    env.reset(seed=0)
    env.step({"tool": "bash", "arguments": {"command": "nohup sleep 300 >/dev/null 2>&1 &"}})
    assert embedded._shared is not None, "gym.make without a URL starts the embedded control plane"
    control_plane = embedded._shared.process.pid
    ours = {control_plane, *descendants(control_plane)}  # the control plane, its sandboxes, their tools
    assert len(ours) > 3
    env.close()
    assert wait_until(lambda: not [p for p in ours if process_alive(p)], 30), [p for p in ours if process_alive(p)]
    assert idegym_env.ENV_ID == "IdeGym-v0"


def test_embedded_control_plane_does_not_outlive_a_killed_owner(tmp_path: Path) -> None:
    """SIGKILL the process that started the embedded control plane: it still cleans up."""
    script = ("from idegym_env.embedded import EmbeddedControlPlane\n"
              "import sys, time\ncp = EmbeddedControlPlane(warm_pool=1)\n"
              "print(cp.process.pid, cp.state_dir, flush=True)\ntime.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        pid, state_dir = owner.stdout.readline().split()
    finally:
        owner.kill()
        owner.wait()
    from tests.helpers import process_alive

    assert wait_until(lambda: not process_alive(int(pid)), 30), "the embedded control plane outlived its owner"
    assert wait_until(lambda: not Path(state_dir).exists(), 10)
