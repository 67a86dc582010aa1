"""``CheckResults``: everything a reward function may look at when an episode ends."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandbox_server.grading.models import GradedTests
from sandbox_server.models import CheckResult, Status, TestReport, TestScores


def _tests(body: Any) -> TestReport:
    """A graded tests stage (``GradedTests``: verdict, cases) or a seed ``TestReport``."""
    if isinstance(body, TestReport):
        return body
    if isinstance(body, Mapping) and "verdict" in body:
        return GradedTests.model_validate(body)
    return TestReport.model_validate(body)


class CheckResults(BaseModel):
    """The outcome of one episode's checks, as the sandbox server reported them.

    ``setup`` and ``compilation`` are the ``CheckResult`` bodies of ``POST /api/rewards/setup`` and
    ``/api/rewards/compilation``; ``tests`` is the ``TestReport`` of ``/api/rewards/test``. A field
    is ``None`` when the task has no such check, or when it was not run because an earlier stage
    failed (the reward functions treat both alike, see below). ``errors`` lists checks that could
    not be run at all (HTTP error, lost sandbox); any error voids every check-based reward.

    The checks form a pipeline, setup → compilation → tests: a failed stage fails every later one,
    and a missing stage counts as passed. ``expected_tests`` (from the task) is the number of tests
    the suite is known to have; fewer reported tests count the missing ones as failed, so deleting
    tests does not raise the pass fraction.
    """

    model_config = ConfigDict(extra="forbid")

    setup: CheckResult | None = None
    compilation: CheckResult | None = None
    tests: GradedTests | TestReport | None = None
    expected_tests: int | None = Field(None, ge=1)
    steps: int = Field(0, ge=0, description="tool calls the agent made in the episode")
    max_steps: int | None = Field(None, ge=1)
    submitted: bool = Field(False, description="the agent ended the episode with submit (not truncated)")
    errors: list[str] = Field(default_factory=list)
    infrastructure_error: str | None = Field(
        None, description="the checks could not run through no fault of the agent (a sandbox lost, the control "
                          "plane unreachable): the reward is not a judgement of the episode, mask it")

    @classmethod
    def from_responses(
        cls,
        *,
        setup: CheckResult | Mapping[str, Any] | None = None,
        compilation: CheckResult | Mapping[str, Any] | None = None,
        tests: TestReport | Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> CheckResults:
        """Build from the sandbox server's answers per stage, as models or their JSON bodies
        (``None`` = not run); a model is kept as it is."""
        return cls(
            setup=None if setup is None else CheckResult.model_validate(setup),
            compilation=None if compilation is None else CheckResult.model_validate(compilation),
            tests=None if tests is None else _tests(tests),
            **fields,
        )

    def stages(self) -> dict[str, CheckResult | TestReport]:
        """The stages that ran, in order, with the sandbox's answers."""
        ran: dict[str, CheckResult | TestReport | None] = {
            "setup": self.setup, "compilation": self.compilation, "tests": self.tests}
        return {name: body for name, body in ran.items() if body is not None}

    @property
    def tests_verdict(self) -> str | None:
        """``passed``, ``failed``, ``no_tests`` or ``error`` for a graded tests stage (a seed
        ``TestReport`` has only its status); ``None`` when no tests ran."""
        if self.tests is None:
            return None
        return self.tests.verdict if isinstance(self.tests, GradedTests) else self.tests.status.value

    # -- the pipeline ------------------------------------------------------------------------------

    @property
    def setup_ok(self) -> bool:
        """No infrastructure error, and setup passed or the task has none."""
        return not self.errors and (self.setup is None or self.setup.status == Status.SUCCESS)

    @property
    def compiled(self) -> bool:
        """Setup ok, and compilation passed or the task has none."""
        return self.setup_ok and (self.compilation is None or self.compilation.status == Status.SUCCESS)

    @property
    def test_denominator(self) -> int:
        """Number of tests the pass fraction is taken over: reported, or expected if more."""
        reported = self.tests.scores.total if self.tests is not None else 0
        return max(reported, self.expected_tests or 0)


__all__ = ["CheckResults", "CheckResult", "TestReport", "TestScores", "Status"]
