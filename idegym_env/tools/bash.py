"""``bash``: a bash script in the project directory (``POST /api/tools/bash``)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field

from sandbox_server.models import DEFAULT_TIMEOUT, BashCommandRequest, BashCommandResponse, Response

from .base import Sampler, ToolArguments, ToolCall, not_blank

MAX_TIMEOUT = 3600.0


class BashArguments(ToolArguments):
    command: Annotated[str, Field(min_length=1, description="The bash script to run in the project directory, "
                                  "e.g. `ls src` or `grep -n foo src/app.py`."), AfterValidator(not_blank)]
    timeout: Annotated[float, Field(gt=0, le=MAX_TIMEOUT, allow_inf_nan=False)] | None = Field(
        None, description="Seconds before the command is killed: at most the environment's limit, "
                          "which is also what it gets when omitted.")


class BashCall(ToolCall):
    tool: Literal["bash"] = "bash"
    arguments: BashArguments
    description: ClassVar[str] = (
        "Run a bash script in the project directory and return its stdout, stderr and exit code. "
        "Each call is a fresh shell: cd and variables do not carry over."
    )
    example: ClassVar[dict[str, Any]] = {"command": "ls -la"}
    request = BashCommandRequest

    @classmethod
    def sample(cls, sampler: Sampler) -> dict[str, Any]:
        # Only commands that print or list: check_env executes whatever sample() returns.
        rng, word, path = sampler.rng, sampler.word(), sampler.path()
        templates = [f"echo {word}", "pwd", "ls", "ls -la", f"printf '%s\\n' {word}", f"cat {path}",
                     f"wc -l {path}", "true"]
        args: dict[str, Any] = {"command": templates[int(rng.integers(len(templates)))]}
        if rng.random() < 0.5:
            args["timeout"] = float(rng.choice([5.0, 10.0, 30.0]))
        return args

    def to_request(self, limit: float = DEFAULT_TIMEOUT) -> BashCommandRequest:
        """``limit`` is the call's limit: its timeout when it names none, and the most it may name
        (the agent does not choose how long it may hold the sandbox). Every path that carries an
        agent's call out (the env, and through it MCP, TRL, SkyRL, OpenEnv) builds it here."""
        return BashCommandRequest(command=self.arguments.command, timeout=self.timeout_within(limit))

    def timeout_within(self, limit: float) -> float:
        """The timeout this call gets under ``limit``."""
        asked = self.arguments.timeout
        return limit if asked is None else min(asked, limit)

    def capped(self, limit: float) -> bool:
        """Whether the call named a longer timeout than ``limit`` allows."""
        return self.arguments.timeout is not None and self.arguments.timeout > limit

    def observe(self, answer: Response, info: dict[str, Any], limit: float) -> str:
        assert isinstance(answer, BashCommandResponse), answer
        info.update(exit_code=answer.exit_code, timed_out=answer.timed_out)
        if answer.oom_killed:
            info["oom_killed"] = True
        capped = self.capped(limit)
        if capped:
            info["timeout_capped"] = limit
        return format_output(answer, capped_at=limit if capped else None)

    def describe(self) -> str:
        return self.arguments.command

    def label(self) -> str:
        return f"bash: {self.arguments.command}"


def format_output(answer: BashCommandResponse, capped_at: float | None = None) -> str:
    """A command's output as the agent sees it: stdout, ``[stderr]``, and its exit status."""
    parts = []
    if answer.stdout:
        parts.append(answer.stdout.rstrip("\n"))
    if answer.stderr:
        parts.append("[stderr]\n" + answer.stderr.rstrip("\n"))
    status = (f"[exit code {answer.exit_code}" + (", timed out" if answer.timed_out else "")
              + (", out of memory: killed by the sandbox's memory limit" if answer.oom_killed else "")
              + (f"; the timeout asked for was capped at {capped_at:g} s, this environment's limit"
                 if capped_at is not None else "") + "]")
    parts.append(status)
    return "\n".join(parts)
