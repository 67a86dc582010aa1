"""pytest fixtures: a Kubernetes API simulator process and backend configs pointing at it.

Use from any test module (or a conftest) with::

    from tests.k8s_sim.fixtures import k8s_sim, k8s_config  # noqa: F401  (fixtures)

    def test_x(k8s_config):
        backend = KubernetesBackend(k8s_config)      # real kubernetes client → simulator over HTTP

``k8s_sim`` is session-scoped (one simulator process, its pods are local processes);
``k8s_config`` gives every test its own ``instance`` label, so tests sharing the simulator never
see (or sweep) each other's servers. The lead's shared control-plane suite can parametrize its
backend fixture with ``KubernetesBackend(k8s_sim.backend_config(...))``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .images import REPO


class SimulatorProcess:
    """``python -m tests.k8s_sim`` in its own process group; ``stop`` ends it and all its pods."""

    def __init__(self, tmp: Path, *, snapshots: bool = True, nodes: int = 3, token: str = "sim-token",
                 images: dict[str, Path] | None = None, namespaces: tuple[str, ...] = ("default", "idegym"),
                 latency: float = 0.0) -> None:
        self.tmp = tmp
        self.token = token
        self.kubeconfig = tmp / "kubeconfig"
        argv = [sys.executable, "-m", "tests.k8s_sim", "--state-dir", str(tmp / "state"), "--token", token,
                "--kubeconfig", str(self.kubeconfig), "--nodes", str(nodes)]
        argv += ["--snapshots"] if snapshots else []
        argv += ["--latency", str(latency)] if latency else []
        for ns in namespaces:
            argv += ["--namespace", ns]
        for tag, project in (images or {}).items():
            argv += ["--image", f"{tag}={project}"]
        self.log_path = tmp / "simulator.log"
        self._log = open(self.log_path, "wb")
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
        self.proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=self._log, env=env,
                                     start_new_session=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline() if ready else b""  # type: ignore[union-attr]
        if not line:
            self.stop()
            raise RuntimeError(f"the Kubernetes simulator did not start: {self.log_path.read_text()}")
        self.url: str = json.loads(line)["url"]
        self.http = httpx.Client(base_url=self.url, timeout=30)

    # -- simulator hooks (not Kubernetes API) --

    def state(self) -> dict[str, Any]:
        return self.http.get("/_sim/state").json()

    def set_snapshots(self, enabled: bool) -> None:
        self.http.post("/_sim/snapshots", params={"enabled": "1" if enabled else "0"}).raise_for_status()

    def pod_pids(self) -> list[int]:
        return [p["pid"] for p in self.state()["pods"].values() if p["pid"]]

    # -- configs --

    def backend_config(self, **overrides: Any) -> Any:
        from control_plane.backends.kubernetes import KubernetesBackendConfig

        values: dict[str, Any] = {"kubeconfig": str(self.kubeconfig), "in_cluster": False, "addressing": "api-proxy",
                                  "namespace": "idegym", "instance": f"t{uuid.uuid4().hex[:10]}",
                                  "readiness_period_seconds": 1}
        values.update(overrides)
        return KubernetesBackendConfig(**values)

    def stop(self) -> None:
        if getattr(self, "http", None) is not None:
            self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


@pytest.fixture(scope="session")
def k8s_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimulatorProcess]:
    sim = SimulatorProcess(tmp_path_factory.mktemp("k8s-sim"))
    yield sim
    sim.stop()


@pytest.fixture
def k8s_config(k8s_sim: SimulatorProcess) -> Any:
    """A ``KubernetesBackendConfig`` for the simulator, api-proxy addressing, a test-unique instance."""
    return k8s_sim.backend_config()
