"""The import guard of grading's Pythons (``sandbox_server/judge/path_guard.py``), on this machine.

A check stage's environment (``grading/python_env.guarded``) given to a real interpreter with
pytest, in a project where the agent planted modules on the task's ``PYTHONPATH``: the standard
library and the installed packages come from where they are installed; the project's own
modules, at its roots, resolve as before. The same in sandboxes, against SWE tasks:
tests/test_reward_integrity.py (``planted_harness_module``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_server.grading.python_env import guarded

# Imported, it says so in a file and stops the process, as a forging harness would.
PLANTED = "import posix\nfd = posix.open({marker!r}, posix.O_WRONLY | posix.O_CREAT | posix.O_APPEND, 0o644)\n" \
          "posix.write(fd, (__file__ + '\\n').encode())\nposix._exit(0)\n"


def _project(root: Path, *, with_own: bool) -> None:
    (root / "src" / "mypkg").mkdir(parents=True)
    (root / "src" / "mypkg" / "__init__.py").write_text("def f():\n    return 1\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_f.py").write_text(
        "import decimal, httpx, h11\nfrom mypkg import f\n\n"
        "def test_f():\n    assert f() == 2\n\n"
        "def test_own_module():\n    assert httpx.OWN is True\n\n"
        "def test_installed_module():\n    assert h11.__file__.endswith('h11/__init__.py')\n")
    if with_own:  # the project's own module of an installed package's name (six.py beside python3-six)
        (root / "httpx.py").write_text("OWN = True\n")


@pytest.mark.security
def test_planted_modules_on_the_pythonpath_do_not_shadow_the_harness_or_the_standard_library(tmp_path: Path) -> None:
    """``python3 -m pytest`` with ``PYTHONPATH=src:.`` in a project holding a planted
    ``pytest.py``, ``argparse.py``, ``encodings/``, ``tests/decimal.py`` (a test directory pytest
    puts first) and ``h11.py`` (an installed package's name): none is imported; the code under
    test and the project's own ``httpx.py`` are.

    Can fail: with the stage's ``PYTHONPATH`` given to Python as it is (no hook), the planted
    ``encodings/`` ran as the interpreter started, and without it ``pytest.py``."""
    project, pristine = tmp_path / "project", tmp_path / "pristine"
    _project(project, with_own=True)
    _project(pristine, with_own=True)
    marker = tmp_path / "imported"
    for rel in ("pytest.py", "src/argparse.py", "src/encodings/__init__.py", "tests/decimal.py", "h11.py"):
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(PLANTED.format(marker=str(marker)))
    env = guarded({"PATH": "/usr/bin:/bin", "PYTHONSAFEPATH": "1", "PYTHONPATH": "src:."}, project, pristine)
    assert env["PYTHONPATH"].endswith("judge/site") and env["IDEGYM_PYTHONPATH"] == "src:."
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", "tests"],
                         cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert not marker.exists(), marker.read_text()
    assert "FAILED tests/test_f.py::test_f" in run.stdout, run.stdout + run.stderr  # the real code ran
    assert "PASSED tests/test_f.py::test_own_module" in run.stdout, run.stdout
    assert "PASSED tests/test_f.py::test_installed_module" in run.stdout, run.stdout


def test_without_a_pristine_copy_every_installed_name_is_the_images(tmp_path: Path) -> None:
    project = tmp_path / "project"
    _project(project, with_own=True)
    env = guarded({"PATH": "/usr/bin:/bin", "PYTHONSAFEPATH": "1", "PYTHONPATH": "src"}, project, None)
    assert env["IDEGYM_PROJECT_MODULES"] == ""
    run = subprocess.run([sys.executable, "-c", "import httpx, mypkg; print(httpx.__file__, mypkg.f())"],
                         cwd=project, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "site-packages/httpx" in run.stdout and run.stdout.strip().endswith("1"), run
