"""mini-swe-agent: :class:`IdeGymEnvironment`, an ``environment_class`` (``pip install 'idegym[mini-swe-agent]'``).

::

    # YAML (mini -c this.yaml, or get_environment(config["environment"]))
    environment:
      environment_class: idegym_env.integrations.mini_swe_agent.IdeGymEnvironment
      task: python-roman-numerals          # any IdeGym task spec: id, directory, humaneval/..., swe/..., harbor:...
      control_plane_url: http://127.0.0.1:8000   # optional: default $IDEGYM_URL, else an embedded control plane

    # Python
    env = IdeGymEnvironment(task="python-roman-numerals")
    agent = DefaultAgent(model, env, **agent_config)
    agent.run(env.instruction)       # {"exit_status": "Submitted", "submission": ..., "reward": 1.0}
    env.reward, env.grading          # the task's reward and its checks

mini-swe-agent (``minisweagent/environments/__init__.py``) resolves ``environment_class`` as a
dotted path and calls it with the rest of the ``environment`` section as keyword arguments; the
agent then calls ``execute(action, cwd)`` per command and ``get_template_vars()`` per template.
Here:

* The constructor starts an IdeGym episode of ``task`` (its image built when the control plane
  lacks it, the task's files written): the episode and the grading are
  :class:`~._episode.ToolCallEpisode`'s, i.e. ``IdeGymEnv``'s.
* ``execute`` runs the command with bash in the task's sandbox, stdout and stderr interleaved as
  mini-swe-agent's own environments give them; ``cwd`` (else the config's, else the task's
  project) and ``env`` as in its Docker environment; ``timeout`` seconds (else the config's)
  after which the command's whole process group is killed and the result is mini-swe-agent's
  timeout shape (``returncode`` -1, ``exception_info``, the output so far).
* A command whose output starts with ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` (exit 0) is the
  submission: the episode is graded by the task's checks (the agent's processes end, protected
  files are restored) and ``Submitted`` is raised with ``reward`` beside ``submission``. The
  reward is then :attr:`IdeGymEnvironment.reward` and the checks :attr:`IdeGymEnvironment.grading`.
  The submitted text itself is not graded: the sandbox's files are. An agent that stops without
  submitting (a step or cost limit) is graded by :meth:`IdeGymEnvironment.grade`.
* An infrastructure failure (the sandbox died, the control plane is unreachable, grading could
  not run) raises :class:`~._episode.InfrastructureError` from ``execute``: mini-swe-agent records
  it as the run's ``exit_status`` (its batch runners: per instance) and re-raises; ``reward``
  stays ``None`` — never a fake 0.
* The sandbox is handed back when the episode is graded, on :meth:`cleanup`, when the object is
  collected and at interpreter exit.
"""

from __future__ import annotations

import shlex
from typing import Any

from minisweagent.exceptions import Submitted
from minisweagent.utils.serialize import recursive_merge
from pydantic import BaseModel, ConfigDict, Field

from ..client import BadRequest, Conflict, NotFound, Sandbox, ServiceError
from ..tasks import Task
from ._episode import InfrastructureError, ToolCallEpisode, ToolCallError

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
_UNAME_FIELDS = ("system", "node", "release", "version", "machine")


class IdeGymEnvironmentConfig(BaseModel):
    """The ``environment`` section of a mini-swe-agent config (besides ``environment_class``)."""

    model_config = ConfigDict(extra="forbid")

    task: str = Field(description="An IdeGym task: bundled id, task directory, humaneval/..., swe/..., harbor:...")
    control_plane_url: str | None = Field(None, description="IdeGym control plane; default: $IDEGYM_URL, else the "
                                                            "embedded one")
    cwd: str = Field("", description="Working directory of commands; default: the task's project")
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables of every command")
    timeout: int = Field(30, ge=1, description="Seconds a command may run (mini-swe-agent's default)")
    max_output_bytes: int = Field(1 << 20, ge=1, description="Output kept per command; the rest is cut, marked")


class IdeGymEnvironment:
    """A mini-swe-agent environment on an IdeGym task's sandbox (see the module docstring)."""

    def __init__(self, *, config_class: type[IdeGymEnvironmentConfig] = IdeGymEnvironmentConfig,
                 **kwargs: Any) -> None:
        self.config = config_class(**kwargs)
        self.episode = ToolCallEpisode(control_plane_url=self.config.control_plane_url)
        self.reward: float | None = None
        self.grading: dict[str, Any] | None = None
        self._uname: dict[str, str] | None = None
        try:
            self.instruction: str = self.episode.start(self.config.task)
        except ToolCallError as exc:  # no such task: a configuration error
            raise ValueError(str(exc)) from None
        try:
            self._sandbox_uname()  # now: templates are rendered after the episode ends, too
        except BaseException:
            self.episode.end()
            raise

    # -- mini-swe-agent's Environment protocol ------------------------------------------------------

    def execute(self, action: dict[str, Any] | str, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run one command in the sandbox; raises ``Submitted`` after grading a submission."""
        command = action.get("command", "") if isinstance(action, dict) else action
        seconds = timeout or self.config.timeout
        sandbox = self._sandbox()
        try:
            # `exec 2>&1;` on the command's own line: one stream in the order it was written, and
            # the shell's line numbers in messages stay the command's.
            answer = sandbox.bash(f"exec 2>&1; {command}", timeout=seconds, cwd=cwd or self.config.cwd or None,
                                  env=self.config.env, max_output_bytes=self.config.max_output_bytes)
        except (BadRequest, NotFound, Conflict) as exc:  # e.g. a cwd that does not exist: the agent's doing
            return {"output": "", "returncode": -1,
                    "exception_info": f"An error occurred while executing the command: {exc.message}",
                    "extra": {"exception_type": type(exc).__name__, "exception": exc.message}}
        except ServiceError as exc:
            raise self.episode._failed(f"the control plane or the sandbox failed: {exc}") from exc
        output = answer.stdout + answer.stderr
        if answer.timed_out:
            message = f"Command {command!r} timed out after {seconds} seconds"
            return {"output": output, "returncode": -1,
                    "exception_info": f"An error occurred while executing the command: {message}",
                    "extra": {"exception_type": "TimeoutExpired", "exception": message}}
        result: dict[str, Any] = {"output": output, "returncode": answer.exit_code, "exception_info": ""}
        lines = output.lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and answer.exit_code == 0:
            self._submit("".join(lines[1:]))
        return result

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """The config, the sandbox's ``uname`` (``system``, ``release``, ``version``, ``machine``: what
        mini-swe-agent's templates name) and the task (``task_id``, ``instruction``)."""
        task = self.episode.task
        facts = {"task_id": task.id if task is not None else None, "instruction": self.instruction}
        return recursive_merge(self.config.model_dump(), self._sandbox_uname(), facts, kwargs)

    def serialize(self) -> dict[str, Any]:
        return {"info": {
            "config": {"environment": self.config.model_dump(mode="json"),
                       "environment_type": f"{type(self).__module__}.{type(self).__name__}"},
            "idegym": {"reward": self.reward, "grading": self.grading,
                       "infrastructure_error": self.episode.infra_error},
        }}

    # -- IdeGym's side ------------------------------------------------------------------------------

    @property
    def task(self) -> Task | None:
        return self.episode.task

    def grade(self) -> float | None:
        """The episode's reward, grading it now if the agent stopped without submitting; ``None``
        when it could not be graded (``episode.infra_error`` says why)."""
        if self.reward is None and self.episode.infra_error is None:
            self.episode.grade()
            self._record()
        return self.reward

    def cleanup(self) -> None:
        """Hand the sandbox back (also done when the episode is graded, and at exit)."""
        self.episode.end()

    close = cleanup

    def __enter__(self) -> IdeGymEnvironment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    # -- helpers ------------------------------------------------------------------------------------

    def _sandbox(self) -> Sandbox:
        if self.episode.infra_error is not None:
            raise InfrastructureError(f"the episode ended on an infrastructure failure: {self.episode.infra_error}")
        if not self.episode.active or self.episode.env is None or self.episode.env.sandbox is None:
            raise RuntimeError("the IdeGym episode has ended (it was graded or cleaned up): make a new environment")
        return self.episode.env.sandbox

    def _submit(self, submission: str) -> None:
        self.episode.submit()  # InfrastructureError propagates: no Submitted, no reward
        self._record()
        raise Submitted({"role": "exit", "content": submission,
                         "extra": {"exit_status": "Submitted", "submission": submission, "reward": self.reward}})

    def _record(self) -> None:
        self.reward = self.episode.reward
        self.grading = self.episode.last_info.get("checks")

    def _sandbox_uname(self) -> dict[str, str]:
        """``uname`` inside the sandbox, asked once (the kernel is the host's under bubblewrap, a
        node's on Kubernetes)."""
        if self._uname is None:
            flags = " ".join(shlex.quote(f"-{flag}") for flag in "snrvm")
            try:
                answer = self._sandbox().bash(f"for f in {flags}; do uname $f; done", timeout=30)
            except ServiceError as exc:
                raise self.episode._failed(f"the control plane or the sandbox failed: {exc}") from exc
            values = answer.stdout.splitlines()
            if answer.exit_code != 0 or len(values) != len(_UNAME_FIELDS):
                raise RuntimeError(f"uname failed in the sandbox (exit code {answer.exit_code}): {answer.stderr}")
            self._uname = dict(zip(_UNAME_FIELDS, values, strict=True))
        return self._uname

__all__ = ["IdeGymEnvironment", "IdeGymEnvironmentConfig", "SUBMIT_MARKER"]
