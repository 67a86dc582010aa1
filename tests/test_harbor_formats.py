"""Harbor's task.toml as written today (schema 1.0 to 1.4), read with Harbor's own semantics."""

from __future__ import annotations

from pathlib import Path

import pytest

from idegym_env.tasks.sources import harbor
from idegym_env.tasks.task import TaskError


def _task(root: Path, toml: str, *, dockerfile: str | None = "FROM debian:bookworm\nWORKDIR /app\n",
          files: dict[str, str] | None = None) -> Path:
    for sub in ("environment", "tests", "solution"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "task.toml").write_text(toml)
    (root / "instruction.md").write_text("Do it.\n")
    (root / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (root / "solution" / "solve.sh").write_text("echo solved > /app/out.txt\n")
    if dockerfile is not None:
        (root / "environment" / "Dockerfile").write_text(dockerfile)
    for rel, text in (files or {}).items():
        (root / rel).write_text(text)
    return root


def test_schema_1_4_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDEGYM_TEST_SECRET", "s3")
    root = _task(tmp_path / "t", """
schema_version = "1.4"
[task]
name = "acme/t"
[agent]
timeout_sec = 120
user = "root"
network_mode = "no-network"
[verifier]
timeout_sec = 60
user = "tester"
env = { KEY = "${IDEGYM_TEST_SECRET}" }
[solution]
env = { MODE = "${IDEGYM_UNSET:-oracle}" }
[environment]
network_mode = "no-network"
memory = "2G"
storage_mb = 4096
cpus = 1.5
workdir = "/srv/app"
env = { APP_ENV = "test" }
[environment.healthcheck]
command = "test -f /srv/app/ready"
retries = 5
""", dockerfile="FROM debian:bookworm\nUSER nobody\n")
    task = harbor.load_harbor_task(root)
    assert not task.network and task.run_as_root  # [agent] user root wins over the image's USER
    assert task.resources is not None and (task.resources.memory_mb, task.resources.storage_mb,
                                           task.resources.cpus) == (2048, 4096, 1.5)
    assert task.environment is not None and task.environment.env == {"APP_ENV": "test"}
    assert task.environment.workdir == "/srv/app"
    assert task.test is not None and task.test.user == "appuser" and task.test.env == {"KEY": "s3"}
    command = task.solution[0].arguments.command  # type: ignore[attr-defined]
    assert "export MODE=oracle" in command and "export DEBIAN_FRONTEND=noninteractive" in command
    assert "bash /solution/solve.sh" in command  # where Harbor's oracle puts it
    assert task.metadata["schema_version"] == "1.4" and task.metadata["healthcheck"]["retries"] == 5


def test_the_network_is_public_unless_the_task_says_otherwise(tmp_path: Path) -> None:
    """Can fail: before, a task.toml without allow_internet gave an offline sandbox, where
    Harbor's default policy is public."""
    assert harbor.load_harbor_task(_task(tmp_path / "a", 'version = "1.0"\n')).network
    assert not harbor.load_harbor_task(_task(tmp_path / "b", "[environment]\nallow_internet = false\n")).network
    public = _task(tmp_path / "c", '[environment]\nnetwork_mode = "public"\nallow_internet = false\n')
    assert harbor.load_harbor_task(public).network  # network_mode wins over the older key
    empty = _task(tmp_path / "d", '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = []\n')
    assert not harbor.load_harbor_task(empty).network  # nothing allowed: no network


@pytest.mark.parametrize(("toml", "words"), [
    ('[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n', "cannot limit a sandbox's network"),
    ('[environment]\nnetwork_mode = "public"\n[verifier]\nnetwork_mode = "no-network"\n',
     "cannot change a sandbox's network between phases"),
    ('[[steps]]\nname = "one"\n[[steps]]\nname = "two"\n', "multi-step task (2 [[steps]])"),
    ('[verifier]\nenvironment_mode = "separate"\n', "a separate verifier of several services"),
    ('[environment]\ngpus = 1\n', "GPUs or TPUs"),
    ('[environment]\nos = "windows"\n', "Linux sandboxes only"),
])
def test_what_a_task_cannot_be_here_is_said(tmp_path: Path, toml: str, words: str) -> None:
    with pytest.raises(TaskError) as err:
        harbor.load_harbor_task(_task(tmp_path / "t", toml, files={"tests/docker-compose.yaml": "services: {}\n"}))
    assert words in str(err.value)


def test_compose_environments_and_prebuilt_images(tmp_path: Path) -> None:
    """Can fail: before, every compose environment was refused "(several services)", one that only
    sets main's environment too."""
    only_main = _task(tmp_path / "c", "", files={"environment/docker-compose.yaml":
                                                  "services:\n  main:\n    environment:\n      MODE: compose\n"})
    loaded = harbor.load_harbor_task(only_main)
    assert loaded.environment is not None and loaded.environment.services == ()
    assert loaded.environment.env["MODE"] == "compose"  # main's compose environment reaches its tools
    sidecar = _task(tmp_path / "s", "", files={"environment/docker-compose.yaml":
                                                "services:\n  main:\n    depends_on: [db]\n  db:\n"
                                                "    image: postgres:16\n"})
    environment = harbor.load_harbor_task(sidecar).environment
    assert environment is not None and [s.name for s in environment.services] == ["main", "db"]
    assert environment.services[0].depends_on == {"db": "service_started"}
    broken = _task(tmp_path / "b", "", files={"environment/docker-compose.yaml":
                                               "services:\n  main:\n    depends_on: [cache]\n"})
    with pytest.raises(TaskError, match="service 'main' depends on 'cache', which is not a service"):
        harbor.load_harbor_task(broken)
    # beside a Dockerfile, a docker-compose.yml is the task's content (Harbor reads only .yaml)
    content = _task(tmp_path / "y", "", files={"environment/docker-compose.yml": "services: {}\n"})
    assert harbor.compose_file(content / "environment") is None
    assert harbor.load_harbor_task(content).environment is not None
    prebuilt = _task(tmp_path / "p", '[environment]\ndocker_image = "python:3.13-slim"\n', dockerfile=None)
    assert harbor.load_harbor_task(prebuilt).environment.dockerfile == "FROM python:3.13-slim\n"


def test_an_entrypoint_is_kept_for_the_env_to_start(tmp_path: Path) -> None:
    """Can fail: before, a task whose image has an ENTRYPOINT was refused."""
    task = _task(tmp_path / "e", "", dockerfile="FROM debian:bookworm\nENTRYPOINT [\"/start.sh\"]\n")
    environment = harbor.load_harbor_task(task).environment
    assert environment is not None and environment.entrypoint == ("/start.sh",)


def test_a_compose_service_is_told_only_what_is_not_honoured(tmp_path: Path) -> None:
    """``expose`` (a port the other services reach) holds by construction: every service's ports
    are reachable from the others. Can fail: before, every service that exposed a port (each
    recipe of Harbor's cookbook) was logged as "expose not honoured"."""
    from idegym_env.tasks.services import read_compose

    compose = tmp_path / "docker-compose.yaml"
    compose.write_text("services:\n  api:\n    image: python:3.12-slim\n    expose: ['5000']\n"
                       "    ports: ['5000:5000']\n    privileged: true\n")
    assert read_compose(compose)["api"].ignored == ("ports", "privileged")


def test_a_separate_verifier_gets_its_image_as_harbor_chooses_it(tmp_path: Path) -> None:
    """Can fail: before, ``environment_mode = "separate"`` was refused."""
    toml = 'artifacts = ["/app/out.txt", { source = "/app/logs" }]\n[verifier]\nenvironment_mode = "separate"\n'
    own = harbor.load_harbor_task(_task(tmp_path / "a", toml, files={"tests/Dockerfile": "FROM python:3.12\n"}))
    assert own.verifier_environment is not None and own.verifier_environment.dockerfile == "FROM python:3.12\n"
    assert own.verifier_environment.context == tmp_path / "a" / "tests"
    assert own.artifacts == ("/app/out.txt", "/app/logs")
    image = harbor.load_harbor_task(_task(tmp_path / "b", '[verifier]\nenvironment_mode = "separate"\n'
                                          '[verifier.environment]\ndocker_image = "python:3.13-slim"\n'))
    assert image.verifier_environment is not None
    assert image.verifier_environment.dockerfile == "FROM python:3.13-slim\n"
    same = harbor.load_harbor_task(_task(tmp_path / "c", '[verifier]\nenvironment_mode = "separate"\n'))
    assert same.verifier_environment is not None and same.environment is not None
    assert same.verifier_environment.dockerfile == same.environment.dockerfile  # the task's own image
    assert harbor.load_harbor_task(_task(tmp_path / "d", "")).verifier_environment is None


def test_the_local_runner_refuses_what_it_cannot_start(tmp_path: Path) -> None:
    """Can fail: ``--local`` would prove a compose task without its services (or an ENTRYPOINT
    task without its process), scoring what neither ``harbor run`` nor the sandbox path would."""
    from idegym_env.tasks.sources.harbor_local import run_locally

    compose = _task(tmp_path / "c", "", files={"environment/docker-compose.yaml":
                                                "services:\n  main: {}\n  db:\n    image: postgres:16\n"})
    with pytest.raises(TaskError, match="cannot start the services of its compose environment"):
        run_locally(harbor.load_harbor_task(compose), oracle=True)
    entry = _task(tmp_path / "e", "", dockerfile="FROM debian:bookworm\nENTRYPOINT [\"/start.sh\"]\n")
    with pytest.raises(TaskError, match="ENTRYPOINT"):
        run_locally(harbor.load_harbor_task(entry), oracle=True)
