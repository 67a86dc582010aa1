from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.helpers import SandboxProcess

if TYPE_CHECKING:
    from tests.cp_helpers import ControlPlaneProcess


@pytest.fixture(params=["tcp", "unix"])
def transport(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "README.md").write_text("hello\n")
    return root


@pytest.fixture
def server(project: Path, tmp_path: Path) -> Iterator[SandboxProcess]:
    """A sandbox server over TCP (see ``any_server`` for both transports)."""
    proc = SandboxProcess(project, "tcp", tmp_path)
    yield proc
    proc.stop()


@pytest.fixture
def any_server(project: Path, tmp_path: Path, transport: str) -> Iterator[SandboxProcess]:
    proc = SandboxProcess(project, transport, tmp_path)
    yield proc
    proc.stop()


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``pytest -n N --dist loadgroup`` (``make test``) a module's tests run on one worker
    (its module fixtures start once); every test that starts Ray runs on one worker, one at a
    time (two Ray instances on one host would share its ports and ``/tmp/ray``); and every test
    on the Kubernetes simulator on one worker, in file order, as without xdist: the session's
    simulator audits the calls of them all (``test_the_documented_role_grants_every_call…``)."""
    for item in items:
        if item.get_closest_marker("ray"):
            group = "ray"
        elif item.get_closest_marker("kubernetes") or "k8s_sim" in item.fixturenames:
            group = "kubernetes"
        else:
            group = item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))


pytest_plugins = ["tests.k8s_sim.fixtures", "tests.oci_fixtures"]


def _control_plane(tmp_path: Path, backend: str, request: pytest.FixtureRequest):
    from tests.cp_helpers import ControlPlaneProcess

    if backend == "local":
        return ControlPlaneProcess(tmp_path / "state", ["--warm-pool", "0", "--ephemeral"], backend="local")
    sim = request.getfixturevalue("k8s_sim")
    config = sim.backend_config()
    env = dict(os.environ, IDEGYM_CONTROL_PLANE_BACKEND="kubernetes")
    for key, value in (("KUBECONFIG", config.kubeconfig), ("IN_CLUSTER", "false"),
                       ("ADDRESSING", config.addressing), ("NAMESPACE", config.namespace),
                       ("INSTANCE", config.instance), ("READINESS_PERIOD_SECONDS", "1")):
        env[f"IDEGYM_K8S_{key}"] = str(value)
    return ControlPlaneProcess(tmp_path / "state", ["--backend", "kubernetes", "--ephemeral"], env=env,
                               backend="kubernetes")


@pytest.fixture(params=["local", pytest.param("kubernetes", marks=pytest.mark.kubernetes)])
def cp(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ControlPlaneProcess]:
    """A control plane with a fast watcher, on each backend (Kubernetes: the API simulator)."""
    proc = _control_plane(tmp_path, request.param, request)
    yield proc
    proc.stop()


@pytest.fixture
def cp_local(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ControlPlaneProcess]:
    """A control plane on the local backend, for what only real isolation can show."""
    proc = _control_plane(tmp_path, "local", request)
    yield proc
    proc.stop()
