"""Leaf reward functions: ``CheckResults -> float``, each in ``[0, 1]``, pure and deterministic."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from sandbox_server.models import Status

from .results import CheckResults


@runtime_checkable
class RewardFunction(Protocol):
    """Anything that maps the results of an episode's checks to a float.

    Must be deterministic (same results, same reward) and must not raise for missing checks.
    """

    def __call__(self, results: CheckResults, /) -> float: ...


def setup_succeeds(results: CheckResults) -> float:
    """1.0 if the setup check passed or the task has none; 0.0 if it failed or checks errored."""
    return 1.0 if results.setup_ok else 0.0


def compiles(results: CheckResults) -> float:
    """1.0 if setup and compilation passed (a missing check counts as passed), else 0.0."""
    return 1.0 if results.compiled else 0.0


def test_pass_fraction(results: CheckResults) -> float:
    """Passed tests / max(reported tests, expected tests), in ``[0, 1]``.

    Skipped tests count as not passed. 0.0 when no test report exists (no tests ran, or the task
    has no test check), when an earlier stage failed, or when the checks errored.
    """
    if not results.compiled or results.tests is None:
        return 0.0
    denominator = results.test_denominator
    if denominator == 0:
        return 0.0
    return min(max(results.tests.scores.passed / denominator, 0.0), 1.0)


# A module that imports these names must not have pytest collect them as tests.
test_pass_fraction.__test__ = False  # type: ignore[attr-defined]


def all_tests_pass(results: CheckResults) -> float:
    """1.0 iff every test passed (none failed, skipped or missing), at least one ran and the
    test script exited successfully; else 0.0."""
    if test_pass_fraction(results) < 1.0:
        return 0.0
    assert results.tests is not None
    return 1.0 if results.tests.status == Status.SUCCESS and results.tests.scores.failed == 0 else 0.0


def verifier_reward(results: CheckResults) -> float:
    """The number a verifier wrote (Harbor's reward.txt / reward.json), clamped to ``[0, 1]``;
    0.0 without one, when an earlier stage failed, or when the checks errored."""
    reward = getattr(results.tests, "reward", None)
    if not results.compiled or reward is None:
        return 0.0
    return min(max(float(reward), 0.0), 1.0)


def submitted(results: CheckResults) -> float:
    """1.0 if the agent ended the episode with ``submit`` (rather than being truncated), else 0.0."""
    return 1.0 if results.submitted else 0.0


def reward_components(results: CheckResults) -> dict[str, float]:
    """Every leaf reward plus the raw counts, for ``info``; keys are stable."""
    scores = results.tests.scores if results.tests is not None else None
    return {
        "setup_succeeds": setup_succeeds(results),
        "compiles": compiles(results),
        "test_pass_fraction": test_pass_fraction(results),
        "all_tests_pass": all_tests_pass(results),
        "submitted": submitted(results),
        "tests_passed": float(scores.passed) if scores else 0.0,
        "tests_failed": float(scores.failed) if scores else 0.0,
        "tests_skipped": float(scores.skipped) if scores else 0.0,
        "tests_total": float(results.test_denominator),
        "steps": float(results.steps),
    }
