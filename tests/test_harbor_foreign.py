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
from tests.integration_helpers import alive, control_plane  # noqa: F401 - fixture
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
    done = subprocess.run([str(REPO / ".venv" / "bin" / "idegym"), "tasks", "validate", f"harbor:{task}",
                           "--control-plane-url", url, "--json", str(out)], capture_output=True, text=True,
                           timeout=1700)
    assert out.is_file(), (done.stdout + done.stderr)[-2000:]  # no table at all: the task was refused
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
          "for i in $(seq 300); do test -f /run/service-started && break; sleep 0.1; done\n"
          "test -f /run/service-started && echo ok > /app/out.txt\n",
          "[ \"$(cat /app/out.txt)\" = ok ] && cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -q 'sleep infinit[y]' "
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
    # IdeGym's own loader agrees (not on the ENTRYPOINT one: its verifier wants the entrypoint's
    # process alive, which grading here ends with the agent's; its start is proven by
    # test_validate_starts_an_image_entrypoint_as_harbor_run_does)
    for name in ("pinned-ecr-name", "prebuilt-image-only", "schema-1-4-env", "heredoc-dockerfile"):
        row = _validate(tasks / name, control_plane.url, tmp_path)
        assert row["oracle"] == 1.0 and row["untouched"] == 0.0, (name, json.dumps(row))


SERVER = """\
import http.server, os
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"ok" if self.path == "/health" else os.environ["GREETING"].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), Handler).serve_forever()
"""
COMPOSE = """\
services:
  main:
    depends_on:
      api:
        condition: service_healthy
    environment:
      API_URL: http://api:8080/
  api:
    build:
      context: ./api
    environment:
      GREETING: hello-from-the-sidecar
    ports: ["8080:8080"]
    healthcheck:
      test: ["CMD", "python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health')"]
      interval: 1s
      retries: 30
"""


@pytest.mark.heavy
def test_a_compose_environment_runs_each_service_as_a_sandbox_on_one_network(
        tmp_path: Path, control_plane: ControlPlaneProcess) -> None:  # noqa: F811
    """Can fail: before, the provider had no compose capability (Harbor refused the task); and an
    oracle that prints nothing (this one) failed the download of its ``oracle.txt``: an empty file,
    which ``stat`` calls a "regular empty file", was taken for something other than a file."""
    tasks = tmp_path / "tasks"
    _compose_task(tasks)
    jobs = tmp_path / "jobs"
    harbor_run(tasks, jobs, "--agent", "oracle", "--env", IMPORT_PATH, "--ek", f"control_plane_url={control_plane.url}")
    (trial,) = trial_results(jobs)
    assert trial.get("exception_info") is None, trial.get("exception_info")
    assert trial["verifier_result"]["rewards"] == {"reward": 1.0}
    (trial_dir,) = [p.parent for p in (jobs / "job").glob("*/result.json")]
    log = (trial_dir / "trial.log").read_text()
    assert "Failed to download" not in log, log[-2000:]
    assert alive(control_plane) == 0  # the services were stopped together


def test_harbor_is_installed() -> None:
    assert HARBOR.exists() and harbor_env()["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"


def _compose_task(tasks: Path) -> Path:
    task = _task(tasks, "compose-sidecar", '[environment]\nnetwork_mode = "no-network"\n',
                 "FROM python:3.13-slim\nWORKDIR /app\n",
                 "python3 -c \"import os, urllib.request; open('/app/answer.txt', 'w').write("
                 "urllib.request.urlopen(os.environ['API_URL']).read().decode())\"\n",
                 "[ \"$(cat /app/answer.txt)\" = hello-from-the-sidecar ]",
                 files={"environment/docker-compose.yaml": COMPOSE})
    (task / "environment" / "api").mkdir()
    (task / "environment" / "api" / "Dockerfile").write_text(
        "FROM python:3.13-slim\nCOPY server.py /srv/server.py\nCMD [\"python3\", \"/srv/server.py\"]\n")
    (task / "environment" / "api" / "server.py").write_text(SERVER)
    return task


def test_validate_runs_a_compose_environment_as_harbor_run_does(
        tmp_path: Path, control_plane: ControlPlaneProcess) -> None:  # noqa: F811
    """Can fail: before, ``idegym tasks validate`` refused a docker-compose environment ("run it
    with `harbor run`"); now main reaches the service by its name once its healthcheck passes, the
    oracle scores 1.0, the untouched run 0, and every sandbox of the group is stopped."""
    row = _validate(_compose_task(tmp_path / "tasks"), control_plane.url, tmp_path)
    assert row["error"] is None and row["oracle"] == 1.0 and row["untouched"] == 0.0, json.dumps(row)
    assert alive(control_plane) == 0  # the services were stopped with the task's sandbox


def test_an_env_whose_task_runs_services_is_not_forked(
        tmp_path: Path, control_plane: ControlPlaneProcess) -> None:  # noqa: F811
    """Can fail: a fork copies one sandbox, so children of a task with services shared the
    parent's service sandboxes (and stopped them at their own reset); now fork says why it cannot."""
    from idegym_env.env import IdeGymEnv

    env = IdeGymEnv(task=f"harbor:{_compose_task(tmp_path / 'tasks')}", control_plane_url=control_plane.url)
    try:
        env.reset(seed=0)
        with pytest.raises(RuntimeError, match="runs services beside its sandbox"):
            env.fork(2)
    finally:
        env.close()
    assert alive(control_plane) == 0


def test_validate_starts_an_image_entrypoint_as_harbor_run_does(
        tmp_path: Path, control_plane: ControlPlaneProcess) -> None:  # noqa: F811
    """Can fail: before, ``idegym tasks validate`` refused a task whose image has an ENTRYPOINT;
    now it is started with the sandbox as Harbor's docker environment starts it (its CMD replaced
    by ``sh -c "sleep infinity"``), so the oracle finds what it started."""
    task = _task(tmp_path / "tasks", "entrypoint-service", '[environment]\nallow_internet = false\n',
                 "FROM debian:bookworm\nCOPY start.sh /start.sh\nWORKDIR /app\nENTRYPOINT [\"/start.sh\"]\n"
                 "CMD [\"touch\", \"/run/cmd-ran\"]\n",
                 # the entrypoint runs beside the agent, as a container's beside `docker exec`: wait for it
                 # ([y]: grep's own command line must not match)
                 "for i in $(seq 300); do cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' "
                 "| grep -q 'sleep infinit[y]' && test -f /run/service-started && break; sleep 0.1; done\n"
                 "test -f /run/service-started && ! test -e /run/cmd-ran && cat /proc/[0-9]*/cmdline | tr '\\0' ' ' "
                 "| grep -q 'sleep infinit[y]' && echo ok > /app/out.txt\n",
                 "[ \"$(cat /app/out.txt)\" = ok ]",
                 files={"environment/start.sh": "#!/bin/sh\ntouch /run/service-started\nexec \"$@\"\n"})
    row = _validate(task, control_plane.url, tmp_path)
    assert row["error"] is None and row["oracle"] == 1.0 and row["untouched"] == 0.0, json.dumps(row)


def test_validate_grades_a_separate_verifier_in_its_own_sandbox_with_the_artifacts(
        tmp_path: Path, control_plane: ControlPlaneProcess) -> None:  # noqa: F811
    """Can fail: before, ``idegym tasks validate`` refused ``[verifier] environment_mode =
    "separate"``; now the verifier runs in a sandbox of ``tests/Dockerfile``'s image that has the
    declared artifact and nothing else of the agent's sandbox, as under ``harbor run``."""
    task = _task(tmp_path / "tasks", "separate-verifier",
                 'artifacts = ["/app/report.txt"]\n[verifier]\nenvironment_mode = "separate"\n'
                 '[environment]\nnetwork_mode = "no-network"\n',
                 "FROM debian:bookworm\nWORKDIR /app\n",
                 "echo done > /app/report.txt\necho planted > /app/other.txt\n",
                 "[ \"$(cat /app/report.txt)\" = done ] && [ \"$(cat /verifier-image)\" = verifier ] "
                 "&& [ ! -e /app/other.txt ]",
                 files={"tests/Dockerfile": "FROM debian:bookworm\nRUN echo verifier > /verifier-image\n"})
    row = _validate(task, control_plane.url, tmp_path)
    assert row["error"] is None and row["oracle"] == 1.0 and row["untouched"] == 0.0, json.dumps(row)
    assert alive(control_plane) == 0  # the verifier's sandbox was stopped


@pytest.mark.security
def test_an_agent_that_breaks_its_artifacts_fails_the_episode_not_the_infrastructure(
        tmp_path: Path, control_plane: ControlPlaneProcess) -> None:  # noqa: F811
    """Can fail: an agent that is root in its sandbox and replaces ``tar`` made the collection of
    its artifacts fail, which was reported as an infrastructure error (an episode a trainer
    drops) instead of a failed one."""
    from idegym_env.env import IdeGymEnv
    from idegym_env.tasks.sources.harbor import load_harbor_task

    task = _task(tmp_path / "tasks", "separate-verifier-broken",
                 'artifacts = ["/app/report.txt"]\n[verifier]\nenvironment_mode = "separate"\n'
                 '[agent]\nuser = "root"\n[environment]\nnetwork_mode = "no-network"\n',
                 "FROM debian:bookworm\nWORKDIR /app\n", "true\n", "true")
    env = IdeGymEnv(load_harbor_task(task), control_plane_url=control_plane.url)
    try:
        env.reset()
        env.step({"tool": "bash", "arguments": {"command": "echo done > /app/report.txt && "
                                                "printf '#!/bin/sh\\nexit 3\\n' > \"$(command -v tar)\""}})
        _, reward, terminated, _, info = env.step({"tool": "submit"})
    finally:
        env.close()
    assert terminated and reward == 0.0
    assert "infrastructure_error" not in info, info.get("infrastructure_error")
    assert any("not graded: the agent's artifacts" in e for e in info["grading_errors"]), info["grading_errors"]
    assert alive(control_plane) == 0
