"""tests/side_venvs.py: a test that needs a venv `make test` installs in the background waits for
its install to end, and fails naming the install's log and make target when it failed or has not
ended in time; outside `make test` it fails when the venv is not installed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.side_venvs import BOUND, INSTALLS, WAITS, side_venv


@pytest.fixture
def installs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The directory `make test` gives the tests, its installs just begun."""
    installs = tmp_path / "installs"
    installs.mkdir()
    (installs / "started").touch()
    monkeypatch.setenv(INSTALLS, str(installs))
    return installs


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    (tmp_path / ".venv-harbor").mkdir()
    return tmp_path / ".venv-harbor"


def test_a_test_waits_for_the_install_and_goes_on_once_it_ended(installs: Path, venv: Path) -> None:
    code = "import sys, pathlib, tests.side_venvs as s; print(s.side_venv(pathlib.Path(sys.argv[1])))"
    proc = subprocess.Popen([sys.executable, "-c", code, str(venv)], cwd=REPO, text=True,
                            env={**os.environ, "PYTEST_CURRENT_TEST": "tests/test_x.py::test_y (call)"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        said = proc.stderr.readline() if proc.stderr else ""
        assert "waiting for harbor-venv" in said and str(installs / "harbor-venv.log") in said, said
        assert proc.poll() is None
        (venv / ".stamp").touch()  # as make's recipe ends, then the wrapper's outcome
        (installs / "harbor-venv.ok").touch()
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0 and out.strip() == str(venv), err
    [line] = (installs / WAITS).read_text().splitlines()
    assert line.split()[0] == "harbor-venv" and line.endswith("tests/test_x.py::test_y (call)")


def test_a_failed_install_fails_the_test_naming_its_log_and_target(installs: Path, venv: Path) -> None:
    (installs / "harbor-venv.log").write_text("creating .venv-harbor\nerror: no solution for harbor==0.0.0\n")
    (installs / "harbor-venv.failed").touch()
    with pytest.raises(pytest.fail.Exception) as failure:
        side_venv(venv)
    assert not (installs / WAITS).exists()  # it did not wait
    message = str(failure.value)
    assert "harbor-venv failed to install" in message and str(installs / "harbor-venv.log") in message
    assert "`make harbor-venv`" in message and message.endswith("error: no solution for harbor==0.0.0")


def test_installs_that_ended_without_the_venv_fail_the_test(installs: Path, venv: Path) -> None:
    (installs / "done").write_text("2\n")
    with pytest.raises(pytest.fail.Exception, match=r"ended without harbor-venv .*make\.log.*`make harbor-venv`"):
        side_venv(venv)


def test_an_install_that_has_not_ended_in_the_bound_fails_the_test(installs: Path, venv: Path) -> None:
    began = time.time() - BOUND - 1
    os.utime(installs / "started", (began, began))
    with pytest.raises(pytest.fail.Exception, match=r"harbor-venv was not installed after 0 s of waiting, "
                                                    r"60\d s after .*harbor-venv\.log.*`make harbor-venv`"):
        side_venv(venv)
    assert (installs / WAITS).read_text().startswith("harbor-venv ")


def test_outside_make_test_a_venv_not_installed_fails_the_test(venv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(INSTALLS, raising=False)
    with pytest.raises(pytest.fail.Exception, match=r"is not installed: run `make harbor-venv`"):
        side_venv(venv)
    (venv / ".stamp").touch()
    assert side_venv(venv) == venv
