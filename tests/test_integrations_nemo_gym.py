"""NeMo Gym: the ``idegym`` sandbox provider, found through NeMo Gym's own registry (the
``nemo_gym.sandbox_providers`` entry point of this package) in .venv-nemo-gym (Python 3.12),
driven by ``tests/nemo_gym_checks.py`` through NeMo Gym's ``Sandbox`` API and its
``mini_swe_agent_2`` sandbox environment, against a real control plane."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.helpers import REPO, process_alive
from tests.integration_helpers import alive, control_plane  # noqa: F401 - fixture
from tests.side_venvs import NEMO_VENV, side_venv

PYTHON = NEMO_VENV / "bin" / "python"

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module", autouse=True)
def _nemo_gym_installed() -> None:
    side_venv(NEMO_VENV)  # fails (not skips) without it: `make test` installs it


def test_provider_through_nemo_gyms_registry_api_and_agent_episode(control_plane) -> None:  # noqa: F811
    proc = subprocess.run([str(PYTHON), str(REPO / "tests" / "nemo_gym_checks.py"), control_plane.url],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    checks = {json.loads(line)["check"]: json.loads(line) for line in proc.stdout.splitlines()
              if line.startswith("{")}
    for expected in ("registry", "exec", "exec-timeout", "files", "stopped", "refusals", "episode-solved",
                     "episode-unsolved", "sandbox-gone"):
        assert expected in checks, f"{expected} missing; stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert checks["episode-solved"]["reward"] == 1.0 and checks["episode-unsolved"]["reward"] < 1.0
    assert "not usable" in checks["sandbox-gone"]["error"]  # an infrastructure error, not a score
    assert alive(control_plane) == 0  # every sandbox was handed back


def test_package_installs_on_nemo_gyms_python() -> None:
    proc = subprocess.run([str(PYTHON), "-c",
                           "import sys; from importlib.metadata import version, entry_points;"
                           "[ep] = entry_points(group='nemo_gym.sandbox_providers', name='idegym');"
                           "print(sys.version_info[:2], version('nemo-gym'), ep.value)"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-2:] == ["0.4.0", "idegym_env.integrations.nemo_gym:IdeGymSandboxProvider"]
    assert "(3, 12)" in proc.stdout


def test_embedded_control_plane_ends_quietly_at_exit_on_python_312() -> None:
    # The plug-ins' shared client hands the embedded control plane back from an atexit hook, where
    # Python 3.12 refuses to start the grace timer's thread: it must stop the control plane there.
    proc = subprocess.run([str(PYTHON), "-c",
                           "from idegym_env import embedded\n"
                           "from idegym_env.integrations._episode import shared_client\n"
                           "shared_client(None)\n"
                           "print(embedded._shared.process.pid)\n"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert proc.returncode == 0 and "Exception ignored" not in proc.stderr, proc.stderr[-3000:]
    assert not process_alive(int(proc.stdout.split()[-1]))
