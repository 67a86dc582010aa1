"""Setup, compilation and test rewards, including JUnit XML from several producers."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.helpers import SandboxProcess, process_alive, processes_mentioning

SUREFIRE = """<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="com.example.CalcTest" time="0.05" tests="4" errors="1" skipped="1" failures="1">
  <properties><property name="java.version" value="17"/></properties>
  <testcase name="adds" classname="com.example.CalcTest" time="0.01"/>
  <testcase name="subtracts" classname="com.example.CalcTest" time="0.01">
    <failure message="expected 1" type="org.opentest4j.AssertionFailedError">trace</failure>
  </testcase>
  <testcase name="divides" classname="com.example.CalcTest"><error type="java.lang.ArithmeticException"/></testcase>
  <testcase name="later" classname="com.example.CalcTest"><skipped/></testcase>
</testsuite>
"""

# jest-junit and Gradle-aggregated style: nested suites inside <testsuites>
NESTED = """<?xml version="1.0"?>
<testsuites name="jest tests" tests="5" failures="1" errors="0">
  <testsuite name="outer" tests="5">
    <testsuite name="math.test.js" tests="3">
      <testcase classname="math adds" name="adds"/>
      <testcase classname="math mul" name="multiplies"/>
      <testcase classname="math div" name="divides"><failure>Error: expected 2</failure></testcase>
    </testsuite>
    <testsuite name="str.test.js" tests="2">
      <testcase classname="str upper" name="upper"/>
      <testcase classname="str lower" name="lower"><skipped message="todo"/></testcase>
    </testsuite>
  </testsuite>
</testsuites>
"""

# Suite attributes only, as some Gradle setups summarise
SUMMARY_ONLY = '<testsuite name="s" tests="7" failures="2" errors="1" skipped="1"></testsuite>'


def _write_reports_script(project: Path, files: dict[str, str], exit_code: int = 0) -> str:
    for name, content in files.items():
        (project / "fixtures" / name).parent.mkdir(parents=True, exist_ok=True)
        (project / "fixtures" / name).write_text(content)
    copies = "; ".join(f"mkdir -p $(dirname {name}) && cp fixtures/{name} {name}" for name in files)
    return f"{copies}; exit {exit_code}"


def test_setup_reward(server: SandboxProcess) -> None:
    assert server.post("/api/rewards/setup", {"setup_check_script": "true"}).json()["status"] == "success"
    body = server.post("/api/rewards/setup", {"setup_check_script": "echo out; echo err >&2; exit 1"}).json()
    assert body["status"] == "failure"
    assert body["output"] == "stdout:\nout\n\nstderr:\nerr"


def test_compilation_reward(server: SandboxProcess, project: Path) -> None:
    (project / "ok.c").write_text("int main(void) { return 0; }\n")
    (project / "bad.c").write_text("int main(void) { return missing; }\n")
    ok = server.post("/api/rewards/compilation", {"compilation_script": "gcc -o ok ok.c"}).json()
    assert ok == {"status": "success", "output": "", "exit_code": 0, "timed_out": False}
    bad = server.post("/api/rewards/compilation", {"compilation_script": "gcc -o bad bad.c"}).json()
    assert bad["status"] == "failure" and "missing" in bad["output"]
    kotlin_like = server.post("/api/rewards/compilation",
                              {"compilation_script": "printf 'e: A\\nnoise\\ne: B\\n' >&2; exit 1"}).json()
    assert kotlin_like["output"] == "e: A\ne: B"


def test_test_reward_with_real_pytest(server: SandboxProcess, project: Path) -> None:
    (project / "test_calc.py").write_text(
        "import pytest\n"
        "def test_pass(): assert 1 + 1 == 2\n"
        "def test_fail(): assert 1 + 1 == 3\n"
        "@pytest.fixture\n"
        "def broken(): raise RuntimeError('setup error')\n"
        "def test_error(broken): pass\n"
        "@pytest.mark.skip\n"
        "def test_skip(): pass\n"
    )
    body = server.post("/api/rewards/test", {
        "test_script": f"{sys.executable} -m pytest -q -p no:cacheprovider --junitxml=test-results.xml test_calc.py",
    }).json()
    assert body["status"] == "failure"
    assert body["scores"] == {"total": 4, "passed": 1, "failed": 2, "skipped": 1}, body
    assert body["reports"] == ["test-results.xml"]


def test_test_reward_surefire_and_nested_suites(server: SandboxProcess, project: Path) -> None:
    script = _write_reports_script(project, {
        "target/surefire-reports/TEST-com.example.CalcTest.xml": SUREFIRE,
        "reports/test-jest.xml": NESTED,
        "build/test-results/test/TEST-summary.xml": SUMMARY_ONLY,
    })
    body = server.post("/api/rewards/test", {"test_script": script}).json()
    assert body["status"] == "success"
    # surefire 4 (1 pass, 2 failed, 1 skipped) + jest 5 (3 pass, 1 fail, 1 skip) + summary 7 (3, 3, 1)
    assert body["scores"] == {"total": 16, "passed": 7, "failed": 6, "skipped": 3}


def test_test_reward_ignores_reports_the_run_did_not_write(server: SandboxProcess, project: Path) -> None:
    """A planted 'all green' report must not count: only files the test run wrote are read."""
    planted = '<testsuite tests="100"><testcase name="fake"/></testsuite>'
    (project / "test-results.xml").write_text(planted)
    body = server.post("/api/rewards/test", {"test_script": "exit 1"}).json()
    assert body["status"] == "failure"
    assert body["scores"] == {"total": 0, "passed": 0, "failed": 0, "skipped": 0}
    assert "wrote no report" in body["output"]


def test_test_reward_skips_malformed_reports(server: SandboxProcess, project: Path) -> None:
    body = server.post("/api/rewards/test", {"test_script": "echo '<testsuite' > test-bad.xml"}).json()
    assert body["scores"]["total"] == 0
    assert "ignored report" in body["output"]


def test_reward_timeout_is_a_failure_not_a_500(server: SandboxProcess) -> None:
    resp = server.post("/api/rewards/test", {"test_script": "echo partial; sleep 30", "timeout": 0.5,
                                             "graceful_termination_timeout": 0.2})
    assert resp.status_code == 200
    body = resp.json()
    assert body["status"] == "failure" and body["timed_out"] is True
    assert "timed out after 0.5 seconds" in body["output"] and "partial" in body["output"]
    resp = server.post("/api/rewards/setup", {"setup_check_script": "sleep 30", "timeout": 0.3})
    assert resp.status_code == 200 and "timed out" in resp.json()["output"]


@pytest.mark.skipif(shutil.which("javac") is None, reason="no JDK")
def test_compilation_reward_with_java(server: SandboxProcess, project: Path) -> None:
    (project / "Main.java").write_text("public class Main { public static void main(String[] a) { int x = ; } }")
    body = server.post("/api/rewards/compilation", {"compilation_script": "javac Main.java"}).json()
    assert body["status"] == "failure" and "Main.java" in body["output"]


@pytest.mark.security
def test_a_checks_leftovers_end_with_it_without_tool_cgroups(server: SandboxProcess, project: Path) -> None:
    """A server without delegated tool cgroups (Kubernetes pods, a server run by hand) still
    ends what a check leaves: a daemon that left the check's session, environment and pipes
    (re-parented to the server) is gone when the check answers; the caller's own daemon, started
    by a tool call, is not the check's; ``keep_processes`` keeps a check's service running.

    Can fail: before checks ended their leftovers, the daemon was alive after the check."""
    marker = f"idegym-check-daemon-{os.getpid()}"
    agents = f"idegym-agent-daemon-{os.getpid()}"
    kept = f"idegym-kept-service-{os.getpid()}"

    def daemon(name: str, pidfile: str, prefix: str = "") -> str:
        # Each daemon writes its pid before it execs, and the script waits for that: a process
        # found by its command line could be missed while it execs (the kernel shows an empty one).
        return (f"(setsid {prefix}bash -c 'echo $$ > {pidfile}; exec -a {name} sleep 300' </dev/null >/dev/null 2>&1 &)"
                f"; until [ -s {pidfile} ]; do sleep 0.01; done")

    def pid_in(pidfile: str) -> int:
        return int((project / pidfile).read_text())

    try:
        server.bash(daemon(agents, ".agent.pid"))
        body = server.post("/api/rewards/setup", {
            "setup_check_script": daemon(marker, ".check.pid", "env -i PATH=/usr/bin:/bin ") + "; true"}).json()
        assert body["status"] == "success", body
        assert not process_alive(pid_in(".check.pid")), "the check's daemon outlived it"
        assert process_alive(pid_in(".agent.pid")), "a check ended a process the caller started"
        body = server.post("/api/rewards/compilation", {
            "keep_processes": True, "compilation_script": daemon(kept, ".kept.pid") + "; true"}).json()
        assert body["status"] == "success", body
        assert process_alive(pid_in(".kept.pid")), "keep_processes did not keep the check's service"
    finally:
        pids = {int(text) for f in (".agent.pid", ".check.pid", ".kept.pid")
                if (project / f).exists() and (text := (project / f).read_text().strip())}
        for name in (marker, agents, kept):
            pids.update(processes_mentioning(name.encode()))
        for pid in pids:
            if process_alive(pid):
                os.kill(pid, 9)
