"""RayVectorEnv on a simulated 3-node Ray cluster, every node's actor using one control plane that
runs as on another machine (``test_remote_control_plane``): the task's files reach it as uploads
from the actors, never as paths. On main the first reset failed with 403 (``project.path ... is
not under a directory this control plane builds from``)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray")

from idegym_env.tasks import load_task  # noqa: E402
from idegym_env.vector.local_ray import SimulatedCluster  # noqa: E402
from tests.cp_helpers import ControlPlaneProcess  # noqa: E402
from tests.helpers import REPO  # noqa: E402
from tests.remote_helpers import remote_control_plane, stop_remote, uploaded_bytes  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0,
                                                  reason="needs root and unshare for a mount namespace of its own")]


@pytest.fixture(scope="module")
def remote() -> Iterator[ControlPlaneProcess]:
    cp = remote_control_plane("remote-ray", ["--warm-pool", "1"])
    try:
        yield cp
    finally:
        stop_remote(cp)


@pytest.fixture(scope="module")
def cluster() -> Iterator[SimulatedCluster]:
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), before]))
    sim = SimulatedCluster(3, cpus_per_node=1)
    try:
        yield sim
    finally:
        sim.close()
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


@pytest.fixture(scope="module")
def own_task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    task = tmp_path_factory.mktemp("ray-task") / "python-roman-numerals-copy"
    shutil.copytree(REPO / "idegym_env" / "tasks" / "bundled" / "python-roman-numerals", task)
    text = (task / "task.yaml").read_text()
    (task / "task.yaml").write_text(re.sub(r"(?m)^id: .*$", "id: python-roman-numerals-copy", text))
    return task


def episode(vec: Any, calls: list[dict[str, Any]]) -> np.ndarray:
    """Every sub-env plays the oracle's calls, then submits; their rewards."""
    vec.reset(seed=0)
    for call in calls:
        actions = np.empty(vec.num_envs, dtype=object)
        actions[:] = [call] * vec.num_envs
        vec.step(actions)
    submit = np.empty(vec.num_envs, dtype=object)
    submit[:] = [{"tool": "submit"}] * vec.num_envs
    _, rewards, terminated, _, _ = vec.step(submit)
    assert terminated.all()
    return rewards


def test_every_node_reaches_the_remote_control_plane_with_uploads(remote: ControlPlaneProcess,
                                                                 cluster: SimulatedCluster, own_task: Path) -> None:
    from idegym_env.vector import RayVectorEnv

    calls = [c.model_dump(mode="json") for c in load_task(own_task).solution]
    # A loopback URL would pin every actor to the driver's node: one CPU each, one CPU per node, spread.
    vec = RayVectorEnv(3, task=str(own_task), control_plane_url=remote.url,
                       actor_options={"num_cpus": 1, "scheduling_strategy": "SPREAD"})
    try:
        assert episode(vec, calls).tolist() == [1.0, 1.0, 1.0]
        nodes = {vec.node_of(i) for i in range(3)}
        assert len(nodes) == 3, "one actor on each node"
    finally:
        vec.close()
    sent = uploaded_bytes(remote)
    assert sent > 0
    vec = RayVectorEnv(3, task=str(own_task), control_plane_url=remote.url,
                       actor_options={"num_cpus": 1, "scheduling_strategy": "SPREAD"})
    try:
        assert episode(vec, calls).tolist() == [1.0, 1.0, 1.0]
    finally:
        vec.close()
    assert uploaded_bytes(remote) == sent  # the second vector env's nodes sent nothing
