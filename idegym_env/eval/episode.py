"""One episode: an agent playing a task in an ``IdeGymEnv``, its record filled in as it runs.

Every executor (threads, Ray tasks) runs episodes through :class:`EvalAttempt`: an exception in the
agent is recorded as an ``agent`` error, one in the environment (image build, sandbox start,
lost sandbox, grading) as an ``env`` error, an episode over its time limit as a ``timeout``.
"""

from __future__ import annotations

import re
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox_server.grading.models import GradedTests
from sandbox_server.models import TestReport

from ..errors import IdeGymError
from ..rewards import CheckResults
from ..tasks import Task
from .agents import AgentFactory, agent_usage, reset_agent
from .manifest import episode_seed, image_of, now
from .records import new_record

if TYPE_CHECKING:
    from .runner import RunConfig


def is_solved(task: Task, components: Mapping[str, float]) -> bool:
    """Every check of the task succeeded: setup, compilation and — if it has tests — all tests.

    The same as reward 1.0 for any reward without shaping; unlike it, not lowered by a step
    penalty (a reward of ``pass fraction - 0.005 per step`` can never reach 1.0).
    """
    ok = components.get("setup_succeeds") == 1.0 and components.get("compiles") == 1.0
    if task.test is not None:
        ok = ok and components.get("all_tests_pass") == 1.0
    return bool(ok)


class _AgentFailed(IdeGymError):
    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.exc = exc


OUTPUT_TAIL = 1000  # characters of a stage's output kept in its record when no verdict could be reached
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


MODEL = "model"  # the error kind of an episode whose agent could not reach its model endpoint


def _model_unreachable(exc: BaseException) -> bool:
    from .openai_agent import ModelUnreachable

    return isinstance(exc, ModelUnreachable)


def describe(exc: BaseException) -> str:
    text = _ANSI.sub("", f"{type(exc).__name__}: {exc}".strip())
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        text += f" (at {Path(last.filename).name}:{last.lineno} in {last.name})"
    return text[:2000]


class EvalAttempt:
    """One (task, attempt): its record, filled in as it runs, and the env it runs in."""

    def __init__(self, task: Task, attempt: int, config: RunConfig) -> None:
        self.task = task
        self.attempt = attempt
        self.seed = episode_seed(config.seed, task.id, attempt)
        self.config = config
        self.record = new_record(task.id, attempt, agent=config.agent_name, seed=self.seed,
                                 image=image_of(task), started_at=now())
        self.env: Any = None
        self.agent: Any = None
        self.done = threading.Event()
        self.abandoned = False
        self.lock = threading.Lock()
        self.started = time.perf_counter()
        self.tools: Counter[str] = Counter()

    # Runs in the episode's own thread (or in a Ray task). Once the episode is abandoned (timeout,
    # Ctrl-C) the thread writes nothing more: the record belongs to the watcher then.
    def play(self, get_env: Callable[[], Any], agent_factory: AgentFactory) -> None:
        try:
            self._play(get_env, agent_factory)
        except _AgentFailed as failed:
            self._fail_if_live(MODEL if _model_unreachable(failed.exc) else "agent", describe(failed.exc))
        except BaseException as exc:  # noqa: BLE001 - anything else is the environment's failure
            self._fail_if_live("env", describe(exc))
        finally:
            with self.lock:
                if not self.abandoned:
                    self._stamp()
            self.done.set()

    def _stamp(self) -> None:
        self.record["wall_seconds"] = round(time.perf_counter() - self.started, 3)
        self.record["tokens"] = agent_usage(self.agent) if self.agent is not None else None
        self.record["tool_calls"] = dict(self.tools)

    def _fail_if_live(self, kind: str, message: str) -> None:
        with self.lock:
            if not self.abandoned:
                self.fail(kind, message)

    def _play(self, get_env: Callable[[], Any], agent_factory: AgentFactory) -> None:
        env = get_env()
        with self.lock:
            self.env = env
            if self.abandoned:
                kill_env(env)
                return
        try:
            self.agent = agent_factory()
            reset_agent(self.agent, self.task, self.seed)
        except BaseException as exc:  # noqa: BLE001 - even SystemExit: the agent's failure, not ours
            raise _AgentFailed(exc) from exc
        observation, info = env.reset(seed=self.seed)
        with self.lock:
            self.record["sandbox"] = info.get("sandbox")
            self.record["setup_seconds"] = round(time.perf_counter() - self.started, 3)
        info = {**info, "task": self.task.id, "attempt": self.attempt, "seed": self.seed}
        while not self.abandoned:
            try:
                action = self.agent(observation, info)
            except BaseException as exc:  # noqa: BLE001
                raise _AgentFailed(exc) from exc
            if self.abandoned:
                return
            observation, reward, terminated, truncated, info = env.step(action)
            with self.lock:
                if self.abandoned:
                    return
                self.record["steps"] += 1
                if info.get("invalid_action"):
                    self.record["invalid_actions"] += 1
                    self.tools["<invalid>"] += 1
                else:
                    self.tools[str(info.get("tool"))] += 1
                if terminated or truncated:
                    self._graded(float(reward), info, bool(terminated), bool(truncated))
                    return

    def _graded(self, reward: float, info: Mapping[str, Any], terminated: bool, truncated: bool) -> None:
        components = dict(info.get("reward_components") or {})
        solved = is_solved(self.task, components) if components else False
        threshold = self.config.pass_threshold
        self.record.update(
            reward=reward, reward_components=components or None, truncated=truncated, solved=solved,
            submitted=bool(info.get("submitted", terminated)),
            passed=solved if threshold is None else reward >= threshold - 1e-9,
            checks=_checks(info.get("checks") or {}))
        if info.get("sandbox_lost"):
            self.record.update(error=str(info.get("error")), error_kind="env", passed=False, reward=None)
        elif info.get("infrastructure_error"):  # the checks could not run: no result, nor the agent's failure
            error = str(info["infrastructure_error"])
            kind = MODEL if error.startswith("model: ") else "env"  # a harness's model server failed
            self.record.update(error=error[:2000], error_kind=kind, passed=False, reward=None)
        elif info.get("grading_errors"):
            self.record.update(error="; ".join(map(str, info["grading_errors"]))[:2000], error_kind="grading",
                               passed=False)
        elif info.get("tests_verdict") == "no_tests":  # nothing was tested: no verdict on the agent's code
            tail = self.record["checks"].get("tests", {}).get("output_tail") or "(no output)"
            self.record.update(error=f"no test ran: the test script reported no test; its output ends: {tail}",
                               error_kind="grading", passed=False)

    def fail(self, kind: str, message: str) -> None:
        self.record.update(error=message, error_kind=kind, reward=None, passed=False, solved=False)

    def abandon(self) -> None:
        """Give up on the episode (from the watching thread): its env is stopped, not reused, and
        the episode's thread writes nothing more to the record."""
        with self.lock:
            self.abandoned = True
            env = self.env
        if env is not None:
            kill_env(env)

    def transcript(self) -> str:
        r = self.record
        head = (f"# episode {r['id']}  agent {r['agent']}  seed {r['seed']}  image {r['image']}\n"
                f"# started {r['started_at']}\n")
        body = ""
        if self.env is not None:
            try:
                body = self.env.render() or ""
            except Exception:  # noqa: BLE001 - a transcript is best effort
                body = ""
        said = _assistant_text(self.agent)
        if said:
            body += "\n\n# what the agent said (its messages that carried text)\n" + said
        if r.get("error"):
            tail = f"\n# ERROR ({r['error_kind']}): {r['error']}\n"
        else:
            tail = f"\n# reward {r['reward']}  passed {r['passed']}  steps {r['steps']}\n"
        return head + "\n" + body + tail


def _assistant_text(agent: Any) -> str:
    """The text of a chat agent's assistant messages (an agent with a ``messages`` list), if any."""
    messages = getattr(agent, "messages", None)
    if not isinstance(messages, list):
        return ""
    said = [m["content"] for m in messages
            if isinstance(m, Mapping) and m.get("role") == "assistant" and isinstance(m.get("content"), str)
            and m["content"].strip()]
    return "\n".join(f"> {text.strip()}" for text in said)


def _checks(checks: Mapping[str, Any]) -> dict[str, Any]:
    """The record's summary of each stage from ``info["checks"]``, read back into the sandbox's models."""
    out: dict[str, Any] = {}
    for stage, answer in CheckResults.from_responses(**checks).stages().items():
        entry: dict[str, Any] = {"status": answer.status.value}
        if isinstance(answer, GradedTests):
            entry["verdict"] = answer.verdict
        if isinstance(answer, TestReport):
            scores = answer.scores
            entry.update(total=scores.total, passed=scores.passed, failed=scores.failed, skipped=scores.skipped)
        if isinstance(answer, GradedTests) and answer.verdict in ("no_tests", "error") and answer.output:
            entry["output_tail"] = answer.output.strip()[-OUTPUT_TAIL:]  # why, without the transcript
        out[stage] = entry
    return out


def make_env(task: Task, config: RunConfig, url: str) -> Any:
    from ..env import IdeGymEnv
    from .agents import harness_name

    harness = harness_name(config.agent_name)
    if harness is not None:  # the harness plays; its model calls go to the agent's model_url
        from ..agents.env import IdeGymAgentEnv

        args = config.agent_args
        return IdeGymAgentEnv(task, harness=harness, control_plane_url=url, model_url=args["model_url"],
                              model_name=args.get("model_name"), model_api_key=args.get("api_key"),
                              max_calls=config.max_steps, render_mode="ansi")
    return IdeGymEnv(task, control_plane_url=url, max_steps=config.max_steps, render_mode="ansi",
                     bash_timeout=config.bash_timeout)


def kill_env(env: Any) -> None:
    """Stop the env's sandbox (ending whatever runs in it) and close the env."""
    sandbox = getattr(env, "sandbox", None)
    if sandbox is not None:
        try:
            sandbox.stop()
        except Exception:  # noqa: BLE001 - already gone
            pass
    close_env(env)


def close_env(env: Any) -> None:
    try:
        env.close()
    except Exception:  # noqa: BLE001 - closing is best effort
        pass


def close_agent(agent: Any) -> None:
    close = getattr(agent, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # noqa: BLE001
            pass


def run_standalone(task: Task, attempt: int, config: RunConfig, url: str,
                   agent_factory: AgentFactory) -> tuple[dict[str, Any], str]:
    """One episode with its own env, under the time limit; used by Ray tasks."""
    episode = EvalAttempt(task, attempt, config)
    thread = threading.Thread(target=episode.play, args=(lambda: make_env(task, config, url), agent_factory),
                              name=f"episode-{task.id}-{attempt}", daemon=True)
    thread.start()
    if not episode.done.wait(config.episode_timeout):
        episode.abandon()
        timed_out(episode)
    elif episode.env is not None:
        close_env(episode.env)
    close_agent(episode.agent)
    return episode.record, episode.transcript()


def timed_out(episode: EvalAttempt) -> None:
    """Record an abandoned episode as a timeout (call after ``abandon()``)."""
    with episode.lock:
        limit = episode.config.episode_timeout
        episode.fail("timeout", f"the episode exceeded the time limit of {limit:g} s "
                                f"(after {episode.record['steps']} steps); its sandbox was stopped")
        episode._stamp()


__all__ = ["EvalAttempt", "is_solved", "run_standalone", "timed_out", "make_env", "kill_env", "close_env",
           "close_agent", "describe"]
