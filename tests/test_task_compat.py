"""benchmarks/task_compat.py, the compatibility table's own parts: taking a task out of a
repository (one at the repository's root too) and the class a failed trial is put in."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks import task_compat
from benchmarks.task_compat import Entry, classify
from idegym_env.tasks.services import ComposeError, read_compose


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def _task_at_root(tmp_path: Path, compose: str) -> tuple[Path, str]:
    """A repository whose root is a Harbor task with a compose environment; its path and commit."""
    repo = tmp_path / "mirrors" / "someone+a-task" / "repo"
    (repo / "environment").mkdir(parents=True)
    (repo / "solution").mkdir()
    (repo / "task.toml").write_text('version = "1.0"\n')
    (repo / "instruction.md").write_text("Do it.\n")
    (repo / "environment" / "Dockerfile").write_text("FROM debian:bookworm\n")
    (repo / "environment" / "docker-compose.yaml").write_text(compose)
    (repo / "solution" / "solve.sh").write_text("#!/bin/bash\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "task")
    return repo, _git(repo, "rev-parse", "HEAD")


def test_a_task_at_its_repositorys_root_is_fetched_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Can fail: before, ``path = "."`` made the fetch untar into a directory it had not made
    (tar: Cannot open), and the table named the task by an empty string."""
    _repo, commit = _task_at_root(tmp_path, "services:\n  main: {}\n")
    monkeypatch.setattr(task_compat, "CORPUS", tmp_path / "corpus")
    entry = Entry("someone/a-task", commit, ".", "compose")
    task_compat.fetch([entry], tmp_path / "mirrors")
    assert (tmp_path / "corpus" / "someone__a-task" / "environment" / "docker-compose.yaml").is_file()
    assert entry.name == "someone/a-task"
    assert Entry("other/b", commit, ".", "compose").key != entry.key


def test_a_compose_file_docker_compose_refuses_too_is_the_tasks_defect(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A service's ``dockerfile`` resolved from its ``context`` to a file that is not there, as the
    provider's reader says it. Can fail: before, the trial was put in class ``ours``."""
    _repo, commit = _task_at_root(tmp_path, "services:\n  gateway:\n    build:\n      context: .\n"
                                           "      dockerfile: environment/Dockerfile\n")
    monkeypatch.setattr(task_compat, "CORPUS", tmp_path / "corpus")
    entry = Entry("someone/a-task", commit, ".", "compose")
    task_compat.fetch([entry], tmp_path / "mirrors")
    with pytest.raises(ComposeError) as raised:
        read_compose(entry.directory / "environment" / "docker-compose.yaml")
    result = {"exception_info": {"exception_message": str(raised.value)}, "verifier_result": None}
    cls, why = classify(entry, result, None, "")
    assert cls == "defect", why
    assert why.startswith("its docker-compose.yaml: service 'gateway' builds environment/environment/Dockerfile, "
                          "which does not exist"), why
    # a failure the task is not to blame for stays ours
    result = {"exception_info": {"exception_message": "compose service 'gateway' did not start: boom"}}
    assert classify(entry, result, None, "")[0] == "ours"


def test_the_summary_counts_the_tasks_idegyms_loader_refuses() -> None:
    """A task ``idegym tasks validate`` refuses (compose: one sandbox per task there) cannot agree
    or disagree with ``harbor run``; the summary says how many there are rather than hiding them."""
    compose = Entry("someone/a-task", "0" * 40, "compose", "compose", "internet: a.example")
    plain = Entry("someone/a-task", "0" * 40, "plain", "python", "1.0")
    outcomes = [task_compat.Outcome(compose, 0.0, 1.0, "internet", "needs a.example", None,
                                    "idegym tasks: …: the environment is docker-compose.yaml: run it with `harbor run` "
                                    "and the IdeGym environment provider"),
                task_compat.Outcome(plain, 1.0, 1.0, None, "", 1.0)]
    line = task_compat.summary(outcomes)
    assert "disagree on 0; `idegym tasks validate` refuses 1 " in line, line
