"""Harbor tasks written the way others write them, through Harbor's own CLI (``harbor run``, the
oracle, the IdeGym environment provider) and through ``idegym tasks validate``: one small task of
ours for each thing the compatibility corpus found (benchmarks/task_compat.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.cp_helpers import ControlPlaneProcess
from tests.helpers import REPO
from tests.integration_helpers import control_plane  # noqa: F401 - fixture
from tests.test_integrations_harbor import HARBOR, IMPORT_PATH, harbor_env, harbor_run, trial_results

pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module", autouse=True)
def _bases(image_cache: Path) -> None:
    """The suite's cache of bases, for the control planes of this module."""


DIGEST = "sha256:" + "7" * 64


def _task(root: Path, name: str, toml: str, dockerfile: str | None, solve: str, test: str,
          files: dict[str, str] | None = None) -> Path:
    task = root / name
    for sub in ("environment", "tests", "solution"):
        (task / sub).mkdir(parents=True)
    (task / "task.toml").write_text(toml)
    (task / "instruction.md").write_text(f"{name}: make the verifier pass.\n")
    if dockerfile is not None:
        (task / "environment" / "Dockerfile").write_text(dockerfile)
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\nset -e\n" + solve)
    (task / "tests" / "test.sh").write_text(
        f"#!/bin/bash\nmkdir -p /logs/verifier\nif {test}; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n")
    for rel, text in (files or {}).items():
        (task / rel).write_text(text)
        (task / rel).chmod(0o755)
    return task


def _validate(task: Path, url: str, tmp_path: Path) -> dict:
    out = tmp_path / f"{task.name}.json"
    subprocess.run([str(REPO / ".venv" / "bin" / "idegym"), "tasks", "validate", f"harbor:{task}",
                    "--control-plane-url", url, "--json", str(out)], capture_output=True, text=True, timeout=1700)
    (row,) = json.loads(out.read_text())
    return row


@pytest.mark.heavy
def test_tasks_as_others_write_them_score_with_harbor_and_with_validate(
        tmp_path: Path, control_plane: ControlPlaneProcess) -> None:  # noqa: F811
    """Can fail: before, a digest-pinned ECR name was not available, an ENTRYPOINT that starts a
    service never ran, a task with only a docker_image was refused, [environment] env and
    [solution] env did not reach the sandbox, a RUN here-document was read as instructions."""
    tasks = tmp_path / "tasks"
    _task(tasks, "pinned-ecr-name", 'version = "1.0"\n',
          f"FROM public.ecr.aws/docker/library/debian:bookworm@{DIGEST}\nWORKDIR /app\n",
          "echo done > /app/out.txt\n", "[ \"$(cat /app/out.txt)\" = done ]")
    _task(tasks, "entrypoint-service", 'schema_version = "1.1"\n[environment]\nallow_internet = false\n',
          "FROM debian:bookworm\nCOPY start.sh /start.sh\nWORKDIR /app\nENTRYPOINT [\"/start.sh\"]\n"
          "CMD [\"echo\", \"never run\"]\n",
          "test -f /run/service-started && echo ok > /app/out.txt\n",
          "[ \"$(cat /app/out.txt)\" = ok ] && cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -q 'sleep infinity' "
          "&& ! grep -q 'never' /tmp/*.log",
          files={"environment/start.sh": "#!/bin/sh\ntouch /run/service-started\nexec \"$@\"\n"})
    _task(tasks, "prebuilt-image-only",
          '[environment]\ndocker_image = "debian:bookworm"\nnetwork_mode = "no-network"\n', None,
          "echo built > /tmp/out.txt\n", "[ \"$(cat /tmp/out.txt)\" = built ]")
    _task(tasks, "schema-1-4-env", 'schema_version = "1.4"\n[environment]\nnetwork_mode = "no-network"\n'
          'env = { APP_MODE = "strict" }\n[solution]\nenv = { ANSWER = "42" }\n[verifier]\nenv = { WANT = "42" }\n',
          "FROM debian:bookworm\nWORKDIR /app\n", "echo \"$ANSWER $APP_MODE\" > /app/out.txt\n",
          "[ \"$(cat /app/out.txt)\" = \"$WANT strict\" ]")
    _task(tasks, "heredoc-dockerfile", '[environment]\nnetwork_mode = "no-network"\n',
          "FROM debian:bookworm\nRUN sh << 'SH'\nmkdir -p /app\necho made > /app/made\nSH\nWORKDIR /app\n",
          "cat made > out.txt\n", "[ \"$(cat /app/out.txt)\" = made ]")
    jobs = tmp_path / "jobs"
    harbor_run(tasks, jobs, "--agent", "oracle", "--env", IMPORT_PATH, "--ek", f"control_plane_url={control_plane.url}",
               "--n-concurrent", "2")
    trials = {t["task_name"]: t for t in trial_results(jobs)}
    assert len(trials) == 5, trials.keys()
    for name, trial in trials.items():
        assert trial.get("exception_info") is None, (name, trial.get("exception_info"))
        assert trial["verifier_result"]["rewards"] == {"reward": 1.0}, name
    # IdeGym's own loader agrees (the tasks it can express: not the ENTRYPOINT one, whose service
    # only Harbor's start runs)
    for name in ("pinned-ecr-name", "prebuilt-image-only", "schema-1-4-env", "heredoc-dockerfile"):
        row = _validate(tasks / name, control_plane.url, tmp_path)
        assert row["oracle"] == 1.0 and row["untouched"] == 0.0, (name, json.dumps(row))


def test_harbor_is_installed() -> None:
    assert HARBOR.exists() and harbor_env()["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
