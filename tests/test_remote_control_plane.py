"""A control plane on another machine: every task source crosses the wire, nothing is a host path.

The control plane runs as it would elsewhere (``benchmarks._servers.private_view``): in a mount
namespace of its own with a private ``/tmp`` (where this test's task directory is not), this
checkout's client package (every shipped task and its data) and the task cache hidden, and no
``--build-root``. The test drives it from outside over TCP, as a trainer on another host would:
a bundled task, a task directory of the test's own ``/tmp``, a shipped SWE instance, a shipped
Harbor task (a Dockerfile and its context) and HumanEval, each to its oracle's reward, then all
of them again, which sends no byte (``/metrics``); ``idegym tasks validate`` and the eval
harness on the trainer's own task directory. On main the first three were refused with 403
("... is not under a directory this control plane builds from").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from idegym_env.tasks import load_task
from tests.cp_helpers import ControlPlaneProcess
from tests.helpers import REPO
from tests.remote_helpers import remote_control_plane, stop_remote, uploaded_bytes

pytestmark = pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0,
                                reason="needs root and unshare for a mount namespace of its own")

BUNDLED = "python-roman-numerals"
SWE = "swe/inflection__ordinal-teens"
HARBOR = "harbor/bash-log-summary"
HUMANEVAL = "humaneval/HumanEval/0"
@pytest.fixture(scope="module")
def remote() -> Iterator[ControlPlaneProcess]:
    cp = remote_control_plane("remote", ["--warm-pool", "1"])
    try:
        yield cp
    finally:
        stop_remote(cp)


@pytest.fixture(scope="module")
def own_task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A task directory of the trainer's own, under its /tmp."""
    root = tmp_path_factory.mktemp("own-task")
    assert str(root).startswith(tempfile.gettempdir())
    task = root / "python-lru-cache-copy"
    shutil.copytree(REPO / "idegym_env" / "tasks" / "bundled" / "python-lru-cache", task)
    text = (task / "task.yaml").read_text()
    (task / "task.yaml").write_text(re.sub(r"(?m)^id: .*$", "id: python-lru-cache-copy", text))
    return task


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def sandbox_pids(state_dir: Path) -> list[int]:
    """The host pids of a control plane's sandbox servers (its state directory is visible here)."""
    out = []
    for path in state_dir.glob("sandboxes/*/sandbox.json"):
        try:
            out.append(int(json.loads(path.read_text())["server"][0]))
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            pass
    return out


def oracle_reward(url: str, spec: str | Path) -> float:
    from idegym_env.env import IdeGymEnv

    task = load_task(spec)
    env = IdeGymEnv(task, control_plane_url=url)
    try:
        env.reset()
        reward = 0.0
        for call in task.solution:
            _, reward, terminated, truncated, _ = env.step(call.model_dump(mode="json"))
            if terminated or truncated:
                return float(reward)
        _, reward, _, _, info = env.step({"tool": "submit"})
        assert not info.get("infrastructure_error"), info
        return float(reward)
    finally:
        env.close()


def test_the_control_plane_sees_no_task_data_and_no_trainer_tmp(remote: ControlPlaneProcess,
                                                                 own_task: Path) -> None:
    """The namespace hides what the test says it hides (a control experiment for the rest)."""
    pid = remote.proc.pid
    root = Path(f"/proc/{pid}/root")
    assert (REPO / "idegym_env" / "tasks" / "bundled").is_dir() and own_task.is_dir()
    assert not (root / str(REPO / "idegym_env" / "tasks").lstrip("/")).exists()
    assert not (root / str(own_task).lstrip("/")).exists()
    assert (root / str(REPO / "control_plane").lstrip("/")).is_dir()


@pytest.mark.timeout(2400)  # a fresh state: the SWE and Harbor environment images are built once
def test_every_task_source_reaches_its_oracle_reward_over_the_wire(remote: ControlPlaneProcess,
                                                                   own_task: Path) -> None:
    tasks: list[str | Path] = [BUNDLED, own_task, SWE, HARBOR, HUMANEVAL]
    first = {str(t): oracle_reward(remote.url, t) for t in tasks}
    assert first == {str(t): 1.0 for t in tasks}
    sent = uploaded_bytes(remote)
    assert sent > 0  # the projects and build contexts crossed the wire
    again = {str(t): oracle_reward(remote.url, t) for t in tasks}
    assert again == first
    assert uploaded_bytes(remote) == sent  # the second run sent nothing: the control plane had it all


def test_tasks_validate_drives_a_remote_control_plane(remote: ControlPlaneProcess, own_task: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "idegym_env.cli", "tasks", "validate", "--control-plane-url",
                           remote.url, str(own_task)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


TRAINER = """
import sys, time
from idegym_env.client import IdeGymClient
client = IdeGymClient(sys.argv[1], name="doomed-trainer", heartbeat_interval=0.5)
client.register()
boxes = [client.start(reuse="NONE", server_name=f"doomed-{i}") for i in range(2)]
print(client.client_id, *(b.server_id for b in boxes), flush=True)
time.sleep(3600)
"""


def test_a_dead_trainers_sandboxes_end_after_its_heartbeat_timeout(tmp_path: Path) -> None:
    """A trainer on one host, SIGKILLed: its heartbeats stop, and the control plane on another
    ends its client and its sandboxes once ``--heartbeat-timeout`` has passed. It held on main
    (the model of ``specs/``), tested here across processes; can fail: with a timeout of 600 s the
    sandboxes of the dead trainer were still ALIVE 30 s after its death."""
    import signal
    import time

    from tests.helpers import wait_until

    cp = remote_control_plane("heartbeat", ["--heartbeat-timeout", "4", "--warm-pool", "0", "--warm-pool-max", "0"])
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, cp.url], stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        line = trainer.stdout.readline()  # type: ignore[union-attr]
        assert line, "the trainer did not start its sandboxes"
        client_id, *servers = line.split()
        pids = sandbox_pids(cp.state_dir)
        assert len(pids) == 2 and all(alive(p) for p in pids), pids
        time.sleep(6)  # longer than the timeout: the live trainer's heartbeats keep its sandboxes
        statuses = {s["server_id"]: s["availability"] for s in cp.http.get(
            "/api/idegym-servers", params={"client_id": client_id}).json()["servers"]}
        assert statuses == {int(s): "ALIVE" for s in servers}
        os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait()
        killed_at = time.monotonic()

        def ended() -> bool:
            body = cp.http.get("/api/idegym-servers", params={"client_id": client_id, "include_terminal": "true"})
            return {s["availability"] for s in body.json()["servers"]} == {"KILLED"}

        assert wait_until(ended, 30, interval=0.2), cp.http.get(
            "/api/idegym-servers", params={"client_id": client_id, "include_terminal": "true"}).text
        assert time.monotonic() - killed_at >= 3  # not before its timeout
        assert wait_until(lambda: not any(alive(p) for p in pids), 30, interval=0.2)
        body = cp.http.post("/api/clients/heartbeat", json={"client_id": client_id, "availability": "ALIVE"})
        assert json.loads(body.text)["availability"] == "KILLED"
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
            trainer.wait()
        stop_remote(cp)


def test_the_eval_harness_drives_a_remote_control_plane(remote: ControlPlaneProcess, own_task: Path,
                                                        tmp_path: Path) -> None:
    from idegym_env.eval import evaluate

    result = evaluate(str(own_task), "oracle", out=tmp_path / "out", control_plane_url=remote.url, progress=False)
    assert result.pass_rate == 1.0, result.records
