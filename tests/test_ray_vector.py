"""RayVectorEnv, the RLlib adapters (token observations, discrete actions) and RLlib sampling.

Real Ray (started once for the module with ``num_cpus=2``), a real control plane on the local
backend, real sandboxes. The vector env shared by most tests has 3 sub-envs of
``python-roman-numerals``; each test starts with ``reset()``.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import signal
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("ray")
from idegym_env.vector.local_ray import init_local, non_loopback_listeners, use_loopback  # noqa: E402

use_loopback()  # before Ray is first used: every Ray of these tests listens on 127.0.0.1 only
import ray  # noqa: E402

import idegym_env  # noqa: E402,F401 - registers IdeGym-v0
from idegym_env.embedded import EmbeddedControlPlane  # noqa: E402
from idegym_env.spaces import ToolCallSpace, UnicodeText  # noqa: E402
from idegym_env.vector import NEXT_STEP, ObjectBatch, RayVectorEnv, rllib_env_creator  # noqa: E402
from idegym_env.wrappers import ByteTokenizer, DiscreteActions, HashedWordTokenizer, TokenizeObservation  # noqa: E402
from tests.helpers import bash_action as bash  # noqa: E402
from tests.helpers import embedded_control_plane, local_ray_session, processes_mentioning, wait_until  # noqa: E402
from tests.helpers import object_actions as actions  # noqa: E402

pytestmark = pytest.mark.ray

TASK = "python-roman-numerals"
N = 3


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    yield from local_ray_session()


@pytest.fixture(scope="module")
def control_plane() -> Iterator[EmbeddedControlPlane]:
    yield from embedded_control_plane(warm_pool=2)


@pytest.fixture(scope="module")
def vec(ray_session: None, control_plane: EmbeddedControlPlane) -> Iterator[RayVectorEnv]:
    env = RayVectorEnv(N, task=TASK, control_plane_url=control_plane.url)
    yield env
    env.close()


@pytest.fixture(scope="module")
def instruction() -> str:
    from idegym_env.tasks import load_task

    return load_task(TASK).instruction


# -- make_vec, spaces, batches ---------------------------------------------------------------------


def test_make_vec_returns_ray_vector_env_on_the_drivers_embedded_control_plane(ray_session: None,
                                                                               instruction: str) -> None:
    envs = gym.make_vec("IdeGym-v0", num_envs=2, vectorization_mode="vector_entry_point", task=TASK)
    try:
        assert isinstance(envs.unwrapped, RayVectorEnv)
        assert envs.num_envs == 2
        assert envs.metadata["autoreset_mode"] == NEXT_STEP
        # No URL given: sandboxes on the node of their actor; on this one-node Ray that is the
        # driver's node, whose control plane is the driver's embedded one.
        assert envs.unwrapped.placement == "node" and envs.unwrapped.control_plane_url is None
        here = ray.get_runtime_context().get_node_id()
        planes = envs.unwrapped.control_planes()
        assert list(planes) == [here] and planes[here]["url"].startswith("http://127.0.0.1:")
        assert isinstance(envs.single_observation_space, UnicodeText)
        assert isinstance(envs.single_action_space, ToolCallSpace)
        assert envs.observation_space == ObjectBatch(envs.single_observation_space, 2)
        sample = envs.action_space.sample()
        assert sample.dtype == object and sample.shape == (2,) and envs.action_space.contains(sample)

        obs, infos = envs.reset(seed=1)
        assert obs.dtype == object and obs.shape == (2,)
        assert list(obs) == [instruction, instruction]
        assert infos["_server_id"].all() and len(set(infos["server_id"])) == 2
        assert list(infos["placement"]) == ["node", "node"] and list(infos["node_id"]) == [here, here]
    finally:
        envs.close()


def test_reset_and_step_batch_text_as_object_arrays(vec: RayVectorEnv, instruction: str) -> None:
    obs, infos = vec.reset(seed=7)
    assert obs.dtype == object and obs.shape == (N,) and all(o == instruction for o in obs)
    assert list(infos["placement"]) == ["shared"] * N  # the control plane given by URL
    assert vec.observation_space.contains(obs)
    obs, rewards, terminated, truncated, infos = vec.step(actions(*(bash(f"echo sub-env {i}") for i in range(N))))
    assert obs.dtype == object and obs.shape == (N,)
    assert [o.splitlines()[0] for o in obs] == [f"sub-env {i}" for i in range(N)]
    assert all(isinstance(o, str) for o in obs)
    assert rewards.shape == terminated.shape == truncated.shape == (N,)
    assert rewards.dtype == np.float64 and terminated.dtype == truncated.dtype == np.bool_
    assert not terminated.any() and not truncated.any()
    assert list(infos["exit_code"]) == [0] * N and infos["_exit_code"].all()
    # A list of actions (or of LLM-style JSON strings) works too; a malformed one is an observation.
    obs, *_ = vec.step([bash("true"), json.dumps(bash("echo json")), "not a tool call"])
    assert obs[1].startswith("json") and "JSON" in obs[2]


def test_steps_run_concurrently(vec: RayVectorEnv) -> None:
    vec.reset()
    started = time.perf_counter()
    obs, *_ = vec.step(actions(*(bash("sleep 1; echo slept") for _ in range(N))))
    elapsed = time.perf_counter() - started
    assert all(o.startswith("slept") for o in obs)
    assert elapsed < N - 0.8, f"{N} sleeps of 1 s took {elapsed:.2f} s: the sub-envs did not run concurrently"
    # The same holds for calls that do not touch a sandbox at all.
    started = time.perf_counter()
    ray.get([vec.actor(i).sleep.remote(1.0) for i in range(N)])
    assert time.perf_counter() - started < N - 0.8


def test_ray_listens_on_loopback_only(vec: RayVectorEnv) -> None:
    """Every socket the Ray of these tests listens on (GCS, raylet, workers of the actors) is on 127.0.0.1."""
    assert all(n["NodeManagerAddress"] == "127.0.0.1" for n in ray.nodes())
    assert non_loopback_listeners() == []


def test_next_step_autoreset(vec: RayVectorEnv, instruction: str) -> None:
    vec.reset()
    vec.step(actions(bash("echo hello > scratch.txt"), bash("true"), bash("true")))
    obs, rewards, terminated, truncated, infos = vec.step(
        actions({"tool": "submit"}, bash("echo still going"), bash("true")))
    assert terminated.tolist() == [True, False, False] and not truncated.any()
    assert rewards[0] == pytest.approx(0.625)  # the pristine project passes 5 of 8 tests
    assert infos["_checks"].tolist() == [True, False, False]
    assert "[checks]" in obs[0]
    # Next step: sub-env 0 ignores its action and resets; the others step as usual.
    obs, rewards, terminated, truncated, infos = vec.step(
        actions(bash("echo IGNORED"), bash("echo second"), bash("echo third")))
    assert obs[0] == instruction
    assert rewards[0] == 0.0 and not terminated[0] and not truncated[0]
    assert infos["sandbox"][0] == "restarted" and infos["_sandbox"].tolist() == [True, False, False]
    assert obs[1].startswith("second") and obs[2].startswith("third")
    # The new episode is fresh: the file written in the old one is gone.
    obs, *_ = vec.step(actions(bash("cat scratch.txt || echo no file"), bash("true"), bash("true")))
    assert "no file" in obs[0]


def test_a_killed_actor_truncates_only_its_slot_and_the_slot_recovers(vec: RayVectorEnv,
                                                                       instruction: str) -> None:
    vec.reset()
    restarts = int(vec.restarts[1])
    # Sub-env 1's actor dies in the middle of a step.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        marker = f"never-{uuid.uuid4().hex}"
        step = pool.submit(vec.step, actions(bash("echo ok 0"), bash(f"sleep 20; echo {marker}"), bash("echo ok 2")))
        assert wait_until(lambda: processes_mentioning(marker.encode()), 30), "sub-env 1's step never started"
        ray.kill(vec.actor(1))
        obs, rewards, terminated, truncated, infos = step.result(timeout=60)
    assert truncated.tolist() == [False, True, False] and not terminated.any()
    assert infos["slot_failure"][1] == "actor_died" and infos["_slot_failure"].tolist() == [False, True, False]
    assert "ActorDiedError" in infos["error"][1]
    assert obs[1] == instruction  # the slot's last observation
    assert obs[0].startswith("ok 0") and obs[2].startswith("ok 2")
    assert vec.restarts[1] == restarts + 1
    # Autoreset brings the slot back on a new actor with a new sandbox; the others go on.
    obs, rewards, terminated, truncated, infos = vec.step(actions(*(bash(f"echo again {i}") for i in range(N))))
    assert obs[1] == instruction and not truncated.any()
    assert obs[0].startswith("again 0") and obs[2].startswith("again 2")
    obs, *_ = vec.step(actions(*(bash(f"echo back {i}") for i in range(N))))
    assert [o.splitlines()[0] for o in obs] == [f"back {i}" for i in range(N)]


def test_a_sandbox_killed_mid_episode_truncates_its_slot_and_the_next_episode_gets_a_new_one(
        vec: RayVectorEnv, control_plane: EmbeddedControlPlane, instruction: str) -> None:
    vec.reset()
    marker = f"marker-{uuid.uuid4().hex}.txt"
    vec.step(actions(bash("true"), bash("true"), bash(f"touch {marker}")))
    pid = _sandbox_server_pid(control_plane.state_dir, marker)
    os.kill(pid, signal.SIGKILL)
    obs, rewards, terminated, truncated, infos = vec.step(actions(*(bash(f"echo ok {i}") for i in range(N))))
    assert truncated.tolist() == [False, False, True] and not terminated.any()
    assert infos["sandbox_lost"][2] and "sandbox is gone" in infos["error"][2]
    assert obs[0].startswith("ok 0") and obs[1].startswith("ok 1")
    obs, _, _, truncated, infos = vec.step(actions(*(bash("true") for _ in range(N))))
    assert obs[2] == instruction and infos["sandbox"][2] == "started" and not truncated.any()
    obs, *_ = vec.step(actions(*(bash(f"ls {marker} || echo fresh") for _ in range(N))))
    assert "fresh" in obs[2]


def _sandbox_server_pid(state_dir: Path, marker: str) -> int:
    """The host pid of the sandbox server whose project holds ``marker``."""
    for root, _dirs, files in os.walk(state_dir / "sandboxes"):
        if marker in files:
            sandbox_dir = state_dir / "sandboxes" / Path(root).relative_to(state_dir / "sandboxes").parts[0]
            return int(json.loads((sandbox_dir / "sandbox.json").read_text())["server"][0])
    raise AssertionError(f"no sandbox holds {marker}")


def test_a_step_over_the_timeout_truncates_its_slot(vec: RayVectorEnv, instruction: str) -> None:
    vec.reset()
    vec.step_timeout = 2.0
    try:
        started = time.perf_counter()
        obs, _, terminated, truncated, infos = vec.step(actions(bash("sleep 30"), bash("echo a"), bash("echo b")))
        assert time.perf_counter() - started < 10
    finally:
        vec.step_timeout = None
    assert truncated.tolist() == [True, False, False] and not terminated.any()
    assert infos["slot_failure"][0] == "timeout" and "step_timeout" in infos["error"][0]
    obs, _, _, truncated, _ = vec.step(actions(*(bash("echo x") for _ in range(N))))
    assert obs[0] == instruction and not truncated.any()


def _channel_sockets() -> dict[int, list[str]]:
    """The abstract Unix sockets of sub-env actors' channels on this host, by actor pid, as
    ``/proc/net/unix`` lists them (``@idegym-vector-<pid>-<random>``)."""
    out: dict[int, list[str]] = {}
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        name = line.split()[-1]
        if name.startswith("@idegym-vector-"):
            out.setdefault(int(name.split("-")[2]), []).append(name)
    return out


def _actor_pids(vec: RayVectorEnv) -> set[int]:
    return {d["actor_pid"] for i in range(vec.num_envs) for d in ray.get(vec.actor(i).describe.remote())}


def test_a_vector_step_takes_the_channel_not_the_actors_ray_queue(vec: RayVectorEnv) -> None:
    """On the driver's node a step reaches each actor over its direct channel, not as a Ray task
    (Ray's per-task cost was most of a step's): it is answered while every actor's Ray queue is busy."""
    vec.reset()
    pids = _actor_pids(vec)
    busy = [vec.actor(i).sleep.remote(5.0) for i in range(N)]
    started = time.perf_counter()
    obs, *_ = vec.step(actions(*(bash(f"echo channel {i}") for i in range(N))))
    elapsed = time.perf_counter() - started
    assert [o.splitlines()[0] for o in obs] == [f"channel {i}" for i in range(N)]
    assert elapsed < 4.0, f"the step took {elapsed:.2f} s: it waited behind the actors' Ray calls"
    assert pids <= set(_channel_sockets()), "an actor on the driver's node has no channel"
    ray.get(busy)


def test_an_env_held_by_an_actor_reaches_its_own_nodes_actors_over_channels(
        ray_session: None, control_plane: EmbeddedControlPlane) -> None:
    """An RLlib EnvRunner actor holds its RayVectorEnv the same way: inside a Ray worker the step
    still takes the channel (answered while the sub-env actor's Ray queue is busy)."""
    @ray.remote(num_cpus=0)
    def step_while_busy(url: str) -> tuple[str, float]:
        env = RayVectorEnv(1, task=TASK, control_plane_url=url)
        try:
            env.reset()
            busy = env.actor(0).sleep.remote(5.0)
            started = time.perf_counter()
            obs, *_ = env.step(actions(bash("echo from a worker")))
            elapsed = time.perf_counter() - started
            ray.get(busy)
            return str(obs[0]), elapsed
        finally:
            env.close()

    first_line, elapsed = ray.get(step_while_busy.remote(control_plane.url), timeout=120)
    assert first_line.startswith("from a worker")
    assert elapsed < 4.0, f"the step took {elapsed:.2f} s: it waited behind the actor's Ray calls"


@pytest.mark.security
def test_the_channel_admits_only_its_driver_and_sandboxes_cannot_see_it(vec: RayVectorEnv) -> None:
    from multiprocessing.connection import Client
    from multiprocessing.context import AuthenticationError

    from idegym_env.vector.channel import ChannelServer, connect, new_key

    vec.reset()
    obs, *_ = vec.step(actions(*(bash("cat /proc/net/unix; echo done") for _ in range(N))))
    assert all("done" in o and "idegym-vector" not in o for o in obs), "a sandbox sees the actors' channels"
    # An actor's channel takes one connection, the driver's: nobody connects after it.
    for pid, names in _channel_sockets().items():
        if pid in _actor_pids(vec):
            for name in names:
                with pytest.raises(ConnectionRefusedError):
                    Client("\0" + name[1:], "AF_UNIX", authkey=new_key())
    # Before the driver is in, a caller without the key fails the handshake, and the driver still gets in.
    key = new_key()
    server = ChannelServer(lambda batch: [x * 2 for x in batch], key)
    with pytest.raises(AuthenticationError):
        Client(server.address, "AF_UNIX", authkey=new_key())
    with connect(server.address, key) as conn:
        from idegym_env.vector.channel import receive, send

        send(conn, [1, 2])
        assert receive(conn, time.monotonic() + 10) == [2, 4]


def test_an_answer_that_does_not_pickle_fails_its_batch_and_the_channel_goes_on() -> None:
    import threading

    from idegym_env.vector.channel import BatchFailed, ChannelServer, connect, new_key, receive, send

    key = new_key()
    server = ChannelServer(lambda batch: threading.Lock() if batch == "lock" else batch, key)
    with connect(server.address, key) as conn:
        send(conn, "lock")
        with pytest.raises(BatchFailed, match="could not send its answer"):
            receive(conn, time.monotonic() + 10)
        send(conn, ["next"])
        assert receive(conn, time.monotonic() + 10) == ["next"]


def test_render_call_and_attributes(vec: RayVectorEnv) -> None:
    vec.reset()
    assert vec.get_attr("max_steps") == (20,) * N
    assert vec.call("render") == (None,) * N  # no render_mode
    assert vec.render() is None
    vec.set_attr("invalid_action_penalty", 0.5)
    try:
        _, rewards, *_ = vec.step(["garbage", bash("true"), bash("true")])
        assert rewards.tolist() == [-0.5, 0.0, 0.0]
    finally:
        vec.set_attr("invalid_action_penalty", 0.0)


# -- the adapters for RLlib's default models ---------------------------------------------------------


def test_token_observation_is_a_deterministic_fixed_length_box() -> None:
    env = gym.make("CartPole-v1")  # any env: only tokenize() is exercised here
    tok = TokenizeObservation(env, length=8)
    assert tok.observation_space == gym.spaces.Box(0, 256, (8,), np.float32)
    ids = tok.tokenize("héllo")  # bytes: h, é (2 bytes), l, l, o → id = byte + 1, then padding
    assert ids.tolist() == [105, 196, 170, 109, 109, 112, 0, 0] and ids.dtype == np.float32
    assert ByteTokenizer().decode(ids) == "héllo"
    # Too long: the head and the tail stay (default), or only one of them.
    assert ByteTokenizer().decode(tok.tokenize("abcdefghijXYZ")) == "abcdjXYZ"
    assert ByteTokenizer().decode(TokenizeObservation(env, length=4, keep="head").tokenize("0123456789")) == "0123"
    assert ByteTokenizer().decode(TokenizeObservation(env, length=4, keep="tail").tokenize("0123456789")) == "6789"
    words = TokenizeObservation(env, length=6, tokenizer="words", vocab_size=50, dtype=np.int64)
    a = words.tokenize("assert add(2, 3) == 5")
    assert a.dtype == np.int64 and words.observation_space.contains(a)
    assert (a > 0).all() and a.max() < 50
    assert words.tokenize("assert add(2, 3) == 5").tolist() == a.tolist()
    # crc32, not hash(): the same ids in every process, whatever PYTHONHASHSEED is.
    def h(word: bytes) -> int:
        return 1 + zlib.crc32(word) % 4095

    assert HashedWordTokenizer(4096).encode("pytest ==") == [h(b"pytest"), h(b"="), h(b"=")]
    with pytest.raises(ValueError):
        TokenizeObservation(env, length=0)
    env.close()


def test_discrete_actions_over_the_tasks_list(control_plane: EmbeddedControlPlane) -> None:
    env = DiscreteActions(gym.make("IdeGym-v0", task=TASK, control_plane_url=control_plane.url))
    try:
        assert env.action_space == gym.spaces.Discrete(6)  # 5 task actions + submit
        assert env.labels[0] == "bash: $IDEGYM_JUDGE tests/" and env.labels[-1] == "submit"
        env.reset()
        obs, reward, terminated, truncated, info = env.step(9)
        assert info["invalid_action"] and "choose an index from 0 to 5" in obs and "4: edit_file roman.py:5-11" in obs
        assert not terminated and not truncated and info["step"] == 1  # it counts as a step
        obs, *_ = env.step(np.int64(4))  # the fix
        assert obs.startswith("ok: edit_file")
        obs, reward, terminated, truncated, info = env.step(np.array(5))  # submit
        assert terminated and reward == 1.0 and "8/8 passed" in obs
    finally:
        env.close()
    custom = DiscreteActions(gym.make("IdeGym-v0", task=TASK, control_plane_url=control_plane.url),
                             actions=["echo one", bash("echo two")], submit=False)
    try:
        assert custom.action_space.n == 2 and custom.labels == ["bash: echo one", "bash: echo two"]
        custom.reset()
        assert custom.step(1)[0].startswith("two")
    finally:
        custom.close()


def test_wrapped_sub_envs_batch_as_numeric_spaces(ray_session: None, control_plane: EmbeddedControlPlane) -> None:
    env = RayVectorEnv(2, task=TASK, control_plane_url=control_plane.url, max_steps=3,
                       env_wrappers=[DiscreteActions, functools.partial(TokenizeObservation, length=16)])
    try:
        assert env.single_action_space == gym.spaces.Discrete(6)
        assert env.action_space == gym.spaces.MultiDiscrete([6, 6])
        assert env.observation_space == gym.spaces.Box(0, 256, (2, 16), np.float32)
        obs, _ = env.reset()
        assert obs.shape == (2, 16) and obs.dtype == np.float32 and env.observation_space.contains(obs)
        obs, rewards, terminated, truncated, _ = env.step(np.array([4, 5]))  # fix | submit
        assert terminated.tolist() == [False, True] and rewards[1] == pytest.approx(0.625)
        obs, rewards, terminated, truncated, _ = env.step(np.array([5, 0]))  # submit | (reset)
        assert terminated.tolist() == [True, False] and rewards.tolist() == [1.0, 0.0]
    finally:
        env.close()


# -- RLlib --------------------------------------------------------------------------------------------


def test_rllib_single_agent_env_runner_samples_complete_episodes(ray_session: None,
                                                                  control_plane: EmbeddedControlPlane) -> None:
    pytest.importorskip("torch")
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
    from ray.tune.registry import register_env

    register_env("idegym-test", rllib_env_creator)
    config = (
        PPOConfig()
        .environment("idegym-test", env_config={
            "task": TASK, "max_steps": 3, "control_plane_url": control_plane.url,
            "env_wrappers": [DiscreteActions, functools.partial(TokenizeObservation, length=32)]})
        .env_runners(num_env_runners=0, num_envs_per_env_runner=2,
                     gym_env_vectorize_mode=gym.VectorizeMode.VECTOR_ENTRY_POINT)
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[16]))
    )
    runner = SingleAgentEnvRunner(config=config)
    try:
        assert isinstance(runner.env.unwrapped, RayVectorEnv)
        episodes = runner.sample(num_episodes=4, random_actions=False)
        assert len(episodes) >= 4
        for episode in episodes:
            assert episode.is_done and 1 <= len(episode) <= 3
            assert episode.is_terminated != episode.is_truncated
            assert episode.get_observations().shape == (len(episode) + 1, 32)
            assert set(np.asarray(episode.get_actions()).tolist()) <= set(range(6))
            assert 0.0 <= episode.get_return() <= 1.0
            assert episode.get_return() > 0  # graded at submit or when the step budget runs out
    finally:
        runner.stop()


# -- sub-envs sharing actors ----------------------------------------------------------------------------


def test_sub_envs_can_share_an_actor(ray_session: None, control_plane: EmbeddedControlPlane,
                                     instruction: str) -> None:
    """``envs_per_actor=2``: four sub-envs in two actors, still stepped side by side and answered in
    slot order; an env that raises ends only its own episode, an actor's death ends both of its
    slots' episodes and no other."""
    vec = RayVectorEnv(4, task=TASK, control_plane_url=control_plane.url, envs_per_actor=2)
    try:
        assert vec.actor(0) is vec.actor(1) and vec.actor(2) is vec.actor(3) and vec.actor(1) is not vec.actor(2)
        vec.reset()
        started = time.perf_counter()
        obs, *_ = vec.step(actions(*(bash(f"sleep 1; echo slot {i}") for i in range(4))))
        assert time.perf_counter() - started < 3.0, "the sub-envs of one actor did not run side by side"
        assert [o.splitlines()[0] for o in obs] == [f"slot {i}" for i in range(4)]

        vec.set_attr("max_steps", [20, "not a number", 20, 20])  # slot 1's next step raises
        obs, _, terminated, truncated, infos = vec.step(actions(*(bash(f"echo a{i}") for i in range(4))))
        assert truncated.tolist() == [False, True, False, False] and not terminated.any()
        assert infos["slot_failure"][1] == "env_error" and "TypeError" in infos["error"][1]
        assert obs[0].startswith("a0") and obs[2].startswith("a2") and obs[3].startswith("a3")
        obs, _, _, truncated, _ = vec.step(actions(*(bash(f"echo b{i}") for i in range(4))))
        assert obs[1] == instruction and not truncated.any()  # rebuilt from the original arguments
        assert obs[0].startswith("b0") and obs[3].startswith("b3")

        restarts = vec.restarts.copy()
        doomed = vec.actor(2)
        pid = ray.get(doomed.describe.remote())[0]["actor_pid"]
        ray.kill(doomed)

        def dead() -> bool:
            try:
                ray.get(doomed.sleep.remote(0), timeout=10)
            except ray.exceptions.RayActorError:
                return True
            return False

        assert wait_until(dead, 30, interval=0.1)
        # Ray calls the actor dead before its process has exited, and the channel is served until then.
        assert wait_until(lambda: pid not in _channel_sockets(), 30, interval=0.05), "the killed actor lives on"
        obs, _, terminated, truncated, infos = vec.step(actions(*(bash(f"echo c{i}") for i in range(4))))
        assert truncated.tolist() == [False, False, True, True] and not terminated.any()
        assert infos["slot_failure"][2] == infos["slot_failure"][3] == "actor_died"
        assert (vec.restarts - restarts).tolist() == [0, 0, 1, 1]
        assert obs[0].startswith("c0") and obs[1].startswith("c1")
        obs, _, _, truncated, _ = vec.step(actions(*(bash(f"echo d{i}") for i in range(4))))
        assert obs[2] == obs[3] == instruction and not truncated.any()
        assert vec.actor(2) is not doomed
    finally:
        vec.close()


def test_envs_per_actor_must_be_a_positive_int(ray_session: None, control_plane: EmbeddedControlPlane) -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="envs_per_actor"):
            RayVectorEnv(2, task=TASK, control_plane_url=control_plane.url, envs_per_actor=bad)


def test_rllib_env_creator_passes_vector_settings_to_the_vector_env_only(
        ray_session: None, control_plane: EmbeddedControlPlane) -> None:
    config = {"task": TASK, "control_plane_url": control_plane.url, "envs_per_actor": 2, "step_timeout": 60.0}
    single = rllib_env_creator(dict(config))  # no num_envs: one env; the vector-only keys are dropped
    try:
        assert not isinstance(single, gym.vector.VectorEnv) and single.unwrapped.task.id == TASK
    finally:
        single.close()
    vec = rllib_env_creator({**config, "num_envs": 2})
    try:
        assert isinstance(vec, RayVectorEnv) and vec.envs_per_actor == 2 and vec.actor(0) is vec.actor(1)
    finally:
        vec.close()


def test_without_direct_channels_every_call_goes_through_ray(ray_session: None,
                                                             control_plane: EmbeddedControlPlane) -> None:
    """``direct_channels=False`` (the benchmark's baseline for the channel): the actor never listens."""
    env = RayVectorEnv(1, task=TASK, control_plane_url=control_plane.url, direct_channels=False)
    try:
        env.reset()
        _, _, terminated, truncated, _ = env.step([bash("true")])
        assert not terminated[0] and not truncated[0]
        pid = ray.get(env.actor(0).describe.remote())[0]["actor_pid"]
        assert pid not in _channel_sockets()
    finally:
        env.close()


# -- closing --------------------------------------------------------------------------------------------


def test_close_is_idempotent_and_safe_before_and_after_ray_shutdown(ray_session: None,
                                                                    control_plane: EmbeddedControlPlane) -> None:
    env = RayVectorEnv(1, task=TASK, control_plane_url=control_plane.url)
    env.reset()
    actor = env.actor(0)
    pid = ray.get(actor.describe.remote())[0]["actor_pid"]
    assert pid in _channel_sockets()
    env.close()
    env.close()
    assert env.closed
    with pytest.raises(RuntimeError, match="closed"):
        env.step([bash("true")])
    # ray.kill is asynchronous: a call sent right after it may still be served, so wait for the end.
    def actor_gone() -> bool:
        try:
            ray.get(actor.describe.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return True
        return False

    assert wait_until(actor_gone, 30, interval=0.1), "the sub-env actor outlived close()"
    assert wait_until(lambda: pid not in _channel_sockets(), 10, interval=0.05), "the actor's channel outlived it"
    # Closing after ray.shutdown() (as a finaliser at exit might) must not raise either. This test
    # runs last in the module; it restarts Ray so that the fixture's teardown finds one.
    late = RayVectorEnv(1, task=TASK, control_plane_url=control_plane.url)
    ray.shutdown()
    try:
        late.close()
        late.close()
        assert late.closed
    finally:
        init_local(num_cpus=2, log_to_driver=False, configure_logging=False)
