from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import SandboxProcess


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


@pytest.fixture
def cp(tmp_path: Path) -> Iterator["ControlPlaneProcess"]:
    """A control plane on the local backend with a fast watcher and a small warm pool."""
    from tests.cp_helpers import ControlPlaneProcess

    proc = ControlPlaneProcess(tmp_path / "state", ["--warm-pool", "1", "--ephemeral"])
    yield proc
    proc.stop()
