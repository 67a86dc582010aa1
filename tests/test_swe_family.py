"""SWE-bench family rows as published: ``install: pip install -e .`` on the default profile,
SWE-rebench's ``install_config`` with its log parser, and SWE-smith/SWE-Gym/R2E-Gym rows that
name a prebuilt image (pulled through a registry mirror; a clear error without one)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from idegym_env.tasks.sources import log_junit, repos, swe
from idegym_env.tasks.task import TaskError
from tests.cp_helpers import ControlPlaneProcess, wait_job
from tests.helpers import REPO
from tests.integration_helpers import control_plane  # noqa: F401 - fixture


@pytest.fixture(scope="module", autouse=True)
def _bases(image_cache: Path) -> None:
    """The suite's cache of bases, for the control planes of this module."""

GOLD = """\
diff --git a/calc/core.py b/calc/core.py
--- a/calc/core.py
+++ b/calc/core.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""
TEST_PATCH = "".join(line + "\n" for line in (  # (a diff's context line for an empty line is one space)
    "diff --git a/tests/test_core.py b/tests/test_core.py", "--- a/tests/test_core.py", "+++ b/tests/test_core.py",
    "@@ -3,3 +3,7 @@ from calc.core import add", " ", " def test_zero():", "     assert add(0, 0) == 0", "+", "+",
    "+def test_add():", "+    assert add(2, 3) == 5"))


def _repository(root: Path) -> tuple[Path, str]:
    """A small installable project (``pip install -e .``: it imports only once installed)."""
    work = root / "calc-upstream"
    (work / "src" / "calc").mkdir(parents=True)
    (work / "tests").mkdir()
    (work / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools>=61"]\n'
                                         'build-backend = "setuptools.build_meta"\n\n[project]\nname = "calc"\n'
                                         'version = "0.1"\n\n[tool.setuptools.packages.find]\nwhere = ["src"]\n')
    (work / "src" / "calc" / "__init__.py").write_text("")
    (work / "src" / "calc" / "core.py").write_text("def add(a, b):\n    return a - b\n")
    (work / "tests" / "test_core.py").write_text("from calc.core import add\n\n\ndef test_zero():\n"
                                                 "    assert add(0, 0) == 0\n")
    repos.git("init", "--quiet", str(work))
    repos.git("add", "-A", work_tree=work, git_dir=work / ".git")
    repos.git("commit", "--quiet", "-m", "base", work_tree=work, git_dir=work / ".git")
    return work, repos.git("rev-parse", "HEAD", git_dir=work / ".git")


def _row(work: Path, base: str, **over: object) -> dict:
    row = {"instance_id": "calc__calc-1", "repo": str(work), "base_commit": base,
           "problem_statement": "add subtracts.", "patch": GOLD.replace("calc/core.py", "src/calc/core.py"),
           "test_patch": TEST_PATCH, "FAIL_TO_PASS": json.dumps(["tests/test_core.py::test_add"]),
           "PASS_TO_PASS": json.dumps(["tests/test_core.py::test_zero"])}
    row.update(over)
    return row


# -- without sandboxes ----------------------------------------------------------------------------------


def test_install_config_is_a_profile() -> None:
    row = swe.SweInstance.model_validate({
        "instance_id": "a__b-1", "repo": "a/b", "base_commit": "abcdef1", "problem_statement": "x",
        "FAIL_TO_PASS": ["t.py::t"], "install_config": json.dumps({
            "python": "3.12", "pre_install": ["apt-get update", "apt-get install -y libxml2-dev"],
            "pip_packages": ["pytest", "hypothesis"], "reqs_path": ["requirements/test.txt"],
            "install": "pip install -e .", "test_cmd": "pytest --no-header -rA --tb=no -p no:cacheprovider",
            "log_parser": "parse_log_pytest"})})
    profile = row.profile(swe.Profile())
    assert profile.dockerfile == ("FROM python:3.12\nRUN apt-get update\nRUN apt-get install -y libxml2-dev\n")
    assert profile.install == ("python -m pip install pytest hypothesis",
                               "python -m pip install -r requirements/test.txt", "pip install -e .")
    assert profile.log_parser == "parse_log_pytest"
    script = swe.test_command(profile, ["t.py::t"])
    assert script.startswith("set -o pipefail\npytest --no-header -rA --tb=no -p no:cacheprovider t.py::t 2>&1 | tee")
    assert ".idegym/log_junit.py parse_log_pytest" in script


@pytest.mark.parametrize(("parser", "log", "cases"), [
    ("parse_log_pytest", "tests/t.py::test_a PASSED [ 50%]\n\x1b[31mFAILED\x1b[0m tests/t.py::test_b - assert 1\n"
                         "PASSED tests/t.py::test_a\nSKIPPED tests/t.py::test_c\n",
     {"tests/t.py::test_a": "passed", "tests/t.py::test_b": "failed", "tests/t.py::test_c": "skipped"}),
    ("parse_log_django", "test_x (app.tests.T) ... ok\ntest_y (app.tests.T) ... FAIL\ntest_z (app.tests.T)\n"
                         "Docstring ... ERROR\n", {"test_x (app.tests.T)": "passed", "test_y (app.tests.T)": "failed",
                                                   "test_z (app.tests.T)": "error"}),
    ("parse_log_sympy", "test_one ok\ntest_two F\ntest_three E\n",
     {"test_one": "passed", "test_two": "failed", "test_three": "error"}),
])
def test_log_parsers_read_what_the_datasets_name(parser: str, log: str, cases: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "log").write_text(log)
    assert log_junit.main([parser, str(tmp_path / "log"), str(tmp_path / "r.xml")]) == 0
    from sandbox_server.junit import canonical_test_id, parse_cases

    found = {c.name: c.outcome for c in parse_cases(tmp_path / "r.xml")}
    assert found == {canonical_test_id(k): v for k, v in cases.items()}


def test_an_unknown_log_parser_and_an_image_row_say_what_they_are(tmp_path: Path) -> None:
    (tmp_path / "set.jsonl").write_text(json.dumps(_row(Path("acme/calc"), "a" * 40, install_config={
        "log_parser": "parse_log_cobol"})) + "\n")
    with pytest.raises(TaskError, match="log parser 'parse_log_cobol' is not one IdeGym reads"):
        swe.SweSet(tmp_path / "set.jsonl").task("calc__calc-1")
    (tmp_path / "set.jsonl").write_text(json.dumps(_row(Path("acme/calc"), "a" * 40, image_name="acme/calc:1")) + "\n")
    task = swe.SweSet(tmp_path / "set.jsonl").task("calc__calc-1")  # nothing fetched: the repository is the image's
    assert task.environment is not None and task.environment.dockerfile.startswith("FROM acme/calc:1\n")
    assert task.setup is not None and "git checkout -q " + "a" * 40 in task.setup.script
    assert task.protected_paths == ("tests/test_core.py",)


# -- in sandboxes -----------------------------------------------------------------------------------------


def _validate(spec: str, url: str, tmp_path: Path) -> dict:
    out = tmp_path / "rows.json"
    # (the repository's export is a build context: under /tmp, one of the test control planes' build roots)
    env = {**os.environ, "IDEGYM_TASK_CACHE": str(tmp_path / "task-cache")}
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "idegym"), "tasks", "validate", spec, "--control-plane-url",
                           url, "--json", str(out)], capture_output=True, text=True, timeout=1700, env=env)
    assert out.exists(), proc.stdout + proc.stderr
    (row,) = json.loads(out.read_text())
    return row


@pytest.mark.timeout(1800)
def test_a_row_whose_install_is_pip_install_e_validates_on_the_default_profile(
        tmp_path: Path, control_plane: ControlPlaneProcess) -> None:  # noqa: F811
    """Can fail: before, the default profile's image had no pip (the build failed with an apt line)."""
    work, base = _repository(tmp_path)
    (tmp_path / "set.jsonl").write_text(json.dumps(_row(work, base, install="pip install -e .")) + "\n")
    row = _validate(f"swe:{tmp_path / 'set.jsonl'}", control_plane.url, tmp_path)
    assert row["oracle"] == 1.0 and row["untouched"] == 0.0, row


@pytest.mark.timeout(1800)
def test_an_swe_rebench_row_validates_with_its_install_config_and_log_parser(
        tmp_path: Path, control_plane: ControlPlaneProcess) -> None:  # noqa: F811
    work, base = _repository(tmp_path)
    config = {"python": "3.13", "install": "pip install -e .", "pip_packages": ["pytest"],
              "test_cmd": "pytest --no-header -rA --tb=no -p no:cacheprovider", "log_parser": "parse_log_pytest"}
    (tmp_path / "set.jsonl").write_text(json.dumps(_row(work, base, install_config=config)) + "\n")
    row = _validate(f"swe:{tmp_path / 'set.jsonl'}", control_plane.url, tmp_path)
    assert row["oracle"] == 1.0 and row["untouched"] == 0.0, row


@pytest.mark.timeout(1800)
def test_an_image_row_is_pulled_through_a_mirror_and_says_so_without_one(
        tmp_path: Path, control_plane: ControlPlaneProcess, registry: str) -> None:  # noqa: F811
    """A SWE-smith-style row: its image (a repository at its base commit in /testbed) is pushed to a
    registry; through that registry as a mirror the row validates; without it the build says the
    image is not available and why."""
    work, base = _repository(tmp_path)
    dockerfile = ("FROM debian:bookworm\nRUN apt-get install -y --no-install-recommends python3-pytest git\n"
                  "COPY repo /testbed\nWORKDIR /testbed\nENV PYTHONPATH=/testbed/src\n")
    context = tmp_path / "image"
    context.mkdir()
    subprocess.run(["cp", "-a", str(work), str(context / "repo")], check=True)
    resp = control_plane.http.post("/api/build-push-images", json={"yaml_content": json.dumps(
        {"images": [{"name": "swesmith-calc", "dockerfile": dockerfile, "context": str(context),
                     "build_network": True}]})})
    (job,) = [wait_job(control_plane, n, 1200, 0.5) for n in resp.json()["job_names"]]
    assert job["status"] == "success", job["details"][-3000:]
    push = subprocess.run([str(REPO / ".venv" / "bin" / "idegym"), "images", "push", job["tag"],
                           f"{registry}/swesmith/calc:1", "--state-dir", str(control_plane.state_dir), "--tls-verify",
                           "false"], capture_output=True, text=True, timeout=600)
    assert push.returncode == 0, push.stderr
    (tmp_path / "set.jsonl").write_text(json.dumps(_row(work, base, image_name="swesmith/calc:1")) + "\n")
    missing = _validate(f"swe:{tmp_path / 'set.jsonl'}", control_plane.url, tmp_path)
    assert missing["oracle"] is None and "'swesmith/calc:1' is not available" in (missing["error"] or ""), missing
    mirrored = ControlPlaneProcess(tmp_path / "mirrored", ["--ephemeral", "--image-registry", f"http://{registry}"])
    try:
        row = _validate(f"swe:{tmp_path / 'set.jsonl'}", mirrored.url, tmp_path)
    finally:
        mirrored.stop()
    assert row["oracle"] == 1.0 and row["untouched"] == 0.0, row
