"""Grading results stay the sandbox's pydantic models from its answer to ``info``: the reward, the
summary the agent reads, the eval record and the oracle's diagnosis all read typed fields, and
``info["checks"]`` holds the stages' JSON bodies (its documented shape). No sandbox: the answer is
parsed from the JSON a sandbox sends."""

from __future__ import annotations

import json
from typing import Any

from idegym_env.env import _format_checks
from idegym_env.eval.episode import _checks
from idegym_env.rewards import CheckResults
from idegym_env.tasks.sources.validate import diagnose
from sandbox_server import routes
from sandbox_server.grading.models import GradedTests
from sandbox_server.models import CheckResult

SETUP = {"status": "success", "output": "installed\n", "exit_code": 0, "timed_out": False}


def _answer(tests: dict[str, Any]) -> CheckResults:
    """The grade answer as the client reads it off the wire, then as the env grades it."""
    body = json.dumps({"setup": SETUP, "tests": tests, "errors": [], "killed_processes": 0})
    answer = routes.GRADE.response.model_validate_json(body)
    results = CheckResults.from_responses(setup=answer.setup, compilation=answer.compilation, tests=answer.tests)
    assert results.setup is answer.setup and results.tests is answer.tests  # kept, not dumped and read back
    return results


def _info_checks(results: CheckResults) -> dict[str, Any]:
    """``info["checks"]`` as the env builds it: plain JSON, as it crosses to Ray workers and files."""
    checks = {name: body.model_dump(mode="json") for name, body in results.stages().items()}
    assert json.loads(json.dumps(checks)) == checks
    return checks


def test_a_failed_tests_stage_is_read_through_its_model_from_the_answer_to_the_eval_record() -> None:
    tests = {"status": "failure", "verdict": "failed", "exit_code": 1, "output": "1 failed, 1 passed",
             "scores": {"total": 2, "passed": 1, "failed": 1, "skipped": 0},
             "cases": [{"name": "t.a", "outcome": "passed"}, {"name": "t.b", "outcome": "failed", "message": "no"}]}
    results = _answer(tests)
    assert isinstance(results.setup, CheckResult) and isinstance(results.tests, GradedTests)
    assert list(results.stages()) == ["setup", "tests"] and results.tests_verdict == "failed"
    checks = _info_checks(results)
    assert checks["setup"] == SETUP and checks["tests"]["cases"][1]["name"] == "t.b"

    summary = _format_checks(results, 0.5)
    assert summary.splitlines()[1:4] == ["setup: success", "tests: failed — 1/2 passed, 1 failed, 0 skipped",
                                         "reward: 0.500"], summary
    assert _checks(checks) == {"setup": {"status": "success"},
                               "tests": {"status": "failure", "verdict": "failed", "total": 2, "passed": 1,
                                         "failed": 1, "skipped": 0}}
    assert diagnose(checks, 0.5) == "the tests check failed: 1 test(s) did not pass (t.b)"
    assert diagnose(checks, 1.0) is None


def test_a_tests_stage_that_ran_no_test_says_why_in_the_summary_and_the_record() -> None:
    tests = {"status": "failure", "verdict": "no_tests", "exit_code": 5, "output": "collected 0 items\n",
             "scores": {"total": 0, "passed": 0, "failed": 0, "skipped": 0}}
    results = _answer(tests)
    assert results.tests_verdict == "no_tests" and isinstance(results.tests_verdict, str)
    summary = _format_checks(results, 0.0)
    assert "no test ran: the test script (exit code 5)" in summary and "collected 0 items" in summary, summary
    record = _checks(_info_checks(results))
    assert record["tests"]["verdict"] == "no_tests" and record["tests"]["output_tail"] == "collected 0 items"
