"""verl: ``IdeGymAgentLoop`` through verl's own rollout path (``RLHFDataset``, the
``agent_loop_config_path`` YAML, ``AgentLoopWorker.generate_sequences``) in .venv-verl, with an
OpenAI-compatible HTTP stand-in for the GPU inference engine; driven by ``tests/verl_checks.py``
against a real control plane."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.helpers import REPO
from tests.integration_helpers import alive, control_plane  # noqa: F401 - fixture
from tests.side_venvs import VERL_VENV, side_venv

PYTHON = VERL_VENV / "bin" / "python"

pytestmark = [pytest.mark.timeout(600), pytest.mark.heavy]


@pytest.fixture(scope="module", autouse=True)
def _verl_installed() -> None:
    side_venv(VERL_VENV)  # fails (not skips) without it: `make test` installs it


def test_agent_loop_through_verls_worker(control_plane) -> None:  # noqa: F811
    proc = subprocess.run([str(PYTHON), str(REPO / "tests" / "verl_checks.py"), control_plane.url],
                          capture_output=True, text=True, timeout=500,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "RAY_USAGE_STATS_ENABLED": "0"})
    checks = {json.loads(line)["check"]: json.loads(line) for line in proc.stdout.splitlines()
              if line.startswith("{")}
    for expected in ("rollout", "tools", "sandbox-gone", "no-task"):
        assert expected in checks, f"{expected} missing; stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, proc.stderr[-3000:]
    scores = checks["rollout"]["scores"]
    assert scores[0] == 1.0 and scores[1] < 1.0 and scores[2] < 1.0  # solved; submitted at once; never submitted
    assert "not usable" in checks["sandbox-gone"]["error"]  # an infrastructure error, not a score
    assert alive(control_plane) == 0  # every sandbox was handed back
