"""RayVectorEnv and ``idegym eval --ray`` on a multi-node Ray: three raylets on this host.

One simulated cluster for the module (``SimulatedCluster``: a head and two worker nodes, one
CPU each, everything on 127.0.0.1), real control planes on the local backend, real sandboxes.
The tests run in order and share what they find out: placement first, then a worker node is
taken away in the middle of an episode, then the eval run loses the other worker node, and the
last test checks that nothing of any of it is left.
"""

from __future__ import annotations

import glob
import json
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray")

from idegym_env.vector.local_ray import SimulatedCluster, non_loopback_listeners  # noqa: E402
from tests.helpers import REPO, processes_mentioning, wait_until  # noqa: E402
from tests.helpers import bash_action as bash  # noqa: E402

pytestmark = pytest.mark.ray

TASK = "python-roman-numerals"
# In the environment of this module's cluster (its raylets, workers and keepers), so that the last
# test counts only the keepers it started, not another test run's on the same host.
CLUSTER_MARK = ("IDEGYM_TEST_CLUSTER", uuid.uuid4().hex)
FIXTURES = "tests.eval_fixtures.agents"


def actions(*commands: str) -> np.ndarray:
    out = np.empty(len(commands), dtype=object)
    for i, command in enumerate(commands):
        out[i] = bash(command)
    return out


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def sandbox_pids(state_dir: str) -> list[int]:
    """The host pids of the sandbox servers of one control plane (its state directory)."""
    out = []
    for path in glob.glob(os.path.join(state_dir, "sandboxes", "*", "sandbox.json")):
        try:
            out.append(int(json.loads(Path(path).read_text())["server"][0]))
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            pass
    return out


class Seen:
    """Every process and directory the tests saw, for the last test to check they are gone."""

    def __init__(self) -> None:
        self.pids: dict[int, str] = {}
        self.dirs: dict[str, str] = {}

    def planes(self, planes: dict[str, dict[str, Any]]) -> None:
        for node, plane in planes.items():
            self.dirs[plane["state_dir"]] = f"state directory of {node[:8]}'s control plane"
            self.pids[plane["pid"]] = f"control plane of {node[:8]}"
            for key in ("keeper_pid", "actor_pid"):
                if plane.get(key):
                    self.pids[plane[key]] = f"{key} of {node[:8]}"
            if plane.get("keeper_pid"):  # the last test finds this cluster's keepers by the mark
                assert "=".join(CLUSTER_MARK).encode() in _environ(Path(f"/proc/{plane['keeper_pid']}")), plane
            for pid in sandbox_pids(plane["state_dir"]):
                self.pids[pid] = f"sandbox of {node[:8]}"

    def left(self) -> list[str]:
        return [f"{what} (pid {pid})" for pid, what in self.pids.items() if alive(pid)] + \
               [f"{what} {d} holding {_listing(d)}" for d, what in self.dirs.items() if os.path.exists(d)]


def _listing(path: str) -> str:
    """What a state directory still holds (a few levels down) and its log's last lines: why it stayed."""
    found = []
    for top, dirs, files in os.walk(path):
        depth = len(Path(top).relative_to(path).parts)
        found += [os.path.join(top, n)[len(path) + 1:] for n in dirs + files]
        if depth >= 2:
            dirs.clear()
    found.sort()
    try:
        log = Path(path, "control-plane.log").read_text(errors="replace").splitlines()[-15:]
    except OSError:
        log = []
    return f"{found[:30]}; the end of its log:\n" + "\n".join(log)


@pytest.fixture(scope="module")
def cluster() -> Iterator[SimulatedCluster]:
    # The raylets pass their environment to the workers: the eval agents of tests/ must import there.
    before = {k: os.environ.get(k) for k in ("PYTHONPATH", "IDEGYM_EMBEDDED_GRACE", CLUSTER_MARK[0])}
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), before["PYTHONPATH"]]))
    os.environ[CLUSTER_MARK[0]] = CLUSTER_MARK[1]
    # The head node's plane is this process's shared embedded control plane: the last test waits
    # for it to end, so it must not outlive its last env by the default minute.
    os.environ["IDEGYM_EMBEDDED_GRACE"] = "1"
    # A killed node is called dead after ~5 s, not Ray's ~15 s: the two node-loss tests wait on it.
    sim = SimulatedCluster(3, cpus_per_node=1, node_death_s=5.0)
    try:
        yield sim
    finally:
        sim.close()
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def seen() -> Seen:
    return Seen()


@pytest.fixture(scope="module")
def vec(cluster: SimulatedCluster, seen: Seen) -> Iterator[Any]:
    from idegym_env.vector import RayVectorEnv

    env = RayVectorEnv(3, task=TASK)
    yield env
    env.close()


def test_the_cluster_listens_on_loopback_only(cluster: SimulatedCluster, vec: Any) -> None:
    import ray

    assert len(ray.nodes()) == 3
    # The driver is on the head node: the tests take worker nodes away, never the driver's.
    assert ray.get_runtime_context().get_node_id() == cluster.head.node_id
    assert all(n["NodeManagerAddress"] == "127.0.0.1" for n in ray.nodes())
    assert non_loopback_listeners() == []  # GCS, three raylets, their workers, the control planes


def test_each_sub_env_runs_on_its_own_node_with_its_sandbox_there(cluster: SimulatedCluster, vec: Any,
                                                                 seen: Seen) -> None:
    import ray

    obs, infos = vec.reset(seed=0)
    nodes = [vec.node_of(i) for i in range(3)]
    everyone = {n.node_id for n in [cluster.head, *cluster.workers]}
    assert set(nodes) == everyone, "three actors, three nodes: one each"
    assert list(infos["placement"]) == ["node"] * 3 and list(infos["node_id"]) == nodes
    assert nodes[0] == ray.get_runtime_context().get_node_id()  # ties go to the driver's node

    planes = vec.control_planes()
    seen.planes(planes)
    assert set(planes) == everyone and len({p["url"] for p in planes.values()}) == 3
    # Each sub-env's sandbox is one of its own node's control plane.
    markers = [f"marker-{uuid.uuid4().hex}-{i}" for i in range(3)]
    obs, *_ = vec.step(actions(*(f"touch {m} && echo ok" for m in markers)))
    assert all(o.startswith("ok") for o in obs)
    for i, marker in enumerate(markers):
        holders = [node for node, plane in planes.items()
                   if glob.glob(os.path.join(plane["state_dir"], "sandboxes", "*", "**", marker),
                                recursive=True)]
        assert holders == [nodes[i]], f"sub-env {i} on {nodes[i][:8]}: its sandbox is in {holders}"


def test_losing_a_node_mid_episode_ends_only_its_sub_env_which_comes_back_elsewhere(
        cluster: SimulatedCluster, vec: Any, seen: Seen) -> None:
    vec.reset()
    victim = cluster.workers[0]
    slot = [vec.node_of(i) for i in range(3)].index(victim.node_id)
    planes = vec.control_planes()
    seen.planes(planes)
    doomed = planes[victim.node_id]
    # A RESTART hands the old sandbox to a teardown thread: its record goes once that ends.
    assert wait_until(lambda: (pids := sandbox_pids(doomed["state_dir"])) and all(alive(p) for p in pids), 30)
    doomed_sandboxes = sandbox_pids(doomed["state_dir"])

    commands = ["echo a", "echo b", "echo c"]
    marker = f"never-{uuid.uuid4().hex}"
    commands[slot] = f"sleep 8; echo {marker}"
    answer: dict[str, Any] = {}
    step = threading.Thread(target=lambda: answer.update(result=vec.step(actions(*commands))))
    step.start()
    assert wait_until(lambda: processes_mentioning(marker.encode()), 30), "the step never ran in the victim's sandbox"
    cluster.remove(victim)  # SIGKILL: the node crashes
    step.join(60)
    assert not step.is_alive(), "the step did not come back after the node was lost"
    obs, rewards, terminated, truncated, infos = answer["result"]
    expected = [False] * 3
    expected[slot] = True
    assert truncated.tolist() == expected and not terminated.any()
    # Either the actor died with its node, or it outlived the node's control plane for a moment
    # (its shutdown answers calls in flight with 503): the sub-env's own infrastructure error.
    if "node_lost" in infos and infos["_node_lost"][slot]:
        assert infos["node_lost"][slot] and infos["slot_failure"][slot] == "actor_died"
    assert infos["infrastructure_error"][slot]  # an infrastructure error, not a score ...
    assert infos["_infrastructure_error"].tolist() == expected  # ... of that sub-env only
    assert infos["node_id"][slot] == victim.node_id
    assert [o.splitlines()[0] for i, o in enumerate(obs) if i != slot] == \
           [c.split()[-1] for i, c in enumerate(commands) if i != slot]

    # The vector env keeps its shape; the slot resets on a surviving node, the others go on.
    obs, rewards, terminated, truncated, infos = vec.step(actions("echo x", "echo y", "echo z"))
    assert obs.shape == (3,) and not truncated.any() and vec.num_envs == 3
    assert infos["sandbox"][slot] == "started" and infos["node_id"][slot] != victim.node_id
    survivors = {cluster.head.node_id, cluster.workers[0].node_id}
    assert {vec.node_of(i) for i in range(3)} == survivors
    obs, _, _, truncated, _ = vec.step(actions("echo x", "echo y", "echo z"))
    assert [o.splitlines()[0] for o in obs] == ["x", "y", "z"] and not truncated.any()

    # The lost node's control plane ends with it, and deletes its sandboxes.
    gone = [doomed["pid"], doomed["keeper_pid"], *doomed_sandboxes]
    assert wait_until(lambda: not any(alive(p) for p in gone), 60, interval=0.2), \
        f"left behind by the lost node: {[p for p in gone if alive(p)]}"
    assert not os.path.exists(doomed["state_dir"])


def test_eval_reruns_the_episodes_of_a_lost_node(cluster: SimulatedCluster, vec: Any, seen: Seen,
                                                 tmp_path: Path) -> None:
    from idegym_env.eval import evaluate
    from idegym_env.vector.placement import alive_nodes

    vec.close()  # its sandboxes go now: the eval run has the two remaining nodes to itself
    # Ray calls a SIGKILLed node alive until its health checks are missed (5 s here, more under load);
    # a run that starts before then may pin an episode to it (noted in docs/rllib.md).
    live = {cluster.head.node_id, *(w.node_id for w in cluster.workers)}
    assert wait_until(lambda: set(alive_nodes()) == live, 120, interval=0.5), (alive_nodes(), live)
    markers = tmp_path / "markers"
    markers.mkdir()
    result: dict[str, Any] = {}

    def run() -> None:
        result["eval"] = evaluate(TASK, f"{FIXTURES}:MarkNodeThenOracle", out=tmp_path / "out", attempts=2,
                                  parallel=2, use_ray=True, episode_timeout=240, progress=False,
                                  agent_args={"marker_dir": str(markers), "delay": 6.0})

    runner = threading.Thread(target=run)
    runner.start()
    workers = {w.node_id: w for w in cluster.workers}
    on_workers = lambda: [m.name for m in markers.iterdir() if m.name.split("-")[1] in workers]  # noqa: E731
    assert wait_until(lambda: bool(on_workers()), 120, interval=0.2), \
        f"no episode started on a worker node {sorted(workers)}: {[m.name for m in markers.iterdir()]}"
    lost_attempt, victim_id = on_workers()[0].split("-")[:2]
    lost_attempt = int(lost_attempt)
    victim = workers[victim_id]
    cluster.remove(victim)
    runner.join(300)
    assert not runner.is_alive(), "the eval run did not finish after the node was lost"
    records = {r["attempt"]: r for r in result["eval"].records}
    assert sorted(records) == [0, 1]
    assert all(r["passed"] and not r["error"] for r in records.values()), records
    lost = records[lost_attempt]
    assert lost["reruns"] == 1 and lost["node"] != victim.node_id  # run again on the head node
    assert records[1 - lost_attempt]["reruns"] == 0
    assert len([m for m in markers.iterdir() if m.name.startswith(f"{lost_attempt}-")]) == 2


def test_nothing_is_left_behind(cluster: SimulatedCluster, vec: Any, seen: Seen) -> None:
    vec.close()
    assert wait_until(lambda: not seen.left(), 60, interval=0.2), f"left behind: {seen.left()}"
    # No control plane or keeper process at all that this cluster's nodes started.
    mark = "=".join(CLUSTER_MARK).encode()
    keepers = [p for p in Path("/proc").iterdir()
               if p.name.isdigit() and _cmdline(p).count("node_keeper") and mark in _environ(p)]
    assert [k for k in keepers if alive(int(k.name))] == [], "a node keeper outlived its node and its env"


def _environ(proc: Path) -> list[bytes]:
    try:
        return (proc / "environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
