"""Agents for ``idegym eval``: anything that maps an observation (and info) to an action.

The protocol is deliberately small::

    class Agent(Protocol):
        def __call__(self, observation: str, info: dict) -> Any: ...   # an action
        # optional:
        def reset(self, task: Task, *, seed: int | None = None) -> None: ...   # before each episode
        usage: dict[str, int]        # token counts of the current episode (prompt_tokens, ...)

An action is anything ``IdeGymEnv.step`` accepts: ``{"tool": "bash", "arguments": {...}}``, an
OpenAI ``tool_calls`` entry, or the JSON text an LLM wrote. ``info`` is the env's ``info`` of the
previous ``reset``/``step`` plus ``task``, ``attempt`` and ``seed``.

Episodes run in parallel, so the harness needs one agent per episode. An *agent spec* says how
to get it (:func:`load_agent`):

* ``oracle`` — replays the task's known ``solution`` and submits (validates a task set);
* ``noop`` — submits at once (the floor: a task it passes is not a task);
* ``openai`` — a model behind any OpenAI-compatible chat-completions endpoint (``openai_agent``);
* ``MODULE:NAME`` or ``path/to/file.py:NAME`` — a class is instantiated once per episode (with the
  ``--agent-arg`` keyword arguments); any other callable is shared by every episode and must
  therefore keep no per-episode state (use a class for that).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..errors import IdeGymError
from ..settings import ClientSettings
from ..tasks import Task

SUBMIT: dict[str, Any] = {"tool": "submit", "arguments": {}}
FILE_MODULE_PREFIX = "_idegym_agent_"  # modules loaded from a file path (Ray must pickle them by value)


@runtime_checkable
class Agent(Protocol):
    def __call__(self, observation: str, info: dict[str, Any], /) -> Any: ...


AgentFactory = Callable[[], Agent]
"""Makes the agent of one episode."""


class OracleAgent:
    """Applies the task's known solution, one tool call per step, then submits.

    Every task must reach reward 1.0 with it; a task where it does not is broken (or its image is).
    """

    def __init__(self) -> None:
        self._plan: Iterator[dict[str, Any]] = iter(())

    def reset(self, task: Task, *, seed: int | None = None) -> None:
        if not task.solution:
            raise ValueError(f"task {task.id!r} has no solution: the oracle agent cannot run it")
        self._plan = iter([call.to_action() for call in task.solution])

    def __call__(self, observation: str, info: dict[str, Any]) -> dict[str, Any]:
        return next(self._plan, SUBMIT)


class NoopAgent:
    """Submits at once: the score of doing nothing."""

    def reset(self, task: Task, *, seed: int | None = None) -> None:
        pass

    def __call__(self, observation: str, info: dict[str, Any]) -> dict[str, Any]:
        return SUBMIT


def _openai_agent(**kwargs: Any) -> Agent:
    from .openai_agent import OpenAIAgent

    return OpenAIAgent(**kwargs)


BUILTIN: dict[str, Callable[..., Agent]] = {"oracle": OracleAgent, "noop": NoopAgent, "openai": _openai_agent}
HARNESS_PREFIX = "harness:"  # an agent that brings its own loop, its model calls passed through (agents/)


class HarnessAgent:
    """``harness:<name>``: the harness plays the episode in ``IdeGym-Agent-v0``'s pass-through
    mode (``make_env`` builds that env from these arguments); its one step runs it to its end."""

    def __init__(self, *, model_url: str, model_name: str | None = None, api_key: str | None = None) -> None:
        self.model_url, self.model_name, self.api_key = model_url, model_name, api_key

    def reset(self, task: Task, *, seed: int | None = None) -> None:
        pass

    def __call__(self, observation: str, info: dict[str, Any]) -> None:
        return None


def harness_name(spec: str) -> str | None:
    """The harness an agent spec names (``harness:<name>``), or None."""
    return spec[len(HARNESS_PREFIX):] if isinstance(spec, str) and spec.startswith(HARNESS_PREFIX) else None


class AgentSpecError(IdeGymError, ValueError):
    """An agent spec that does not name a loadable agent; the message says why."""


def _import(module_name: str) -> Any:
    path = Path(module_name)
    if module_name.endswith(".py"):
        if not path.is_file():
            raise AgentSpecError(f"agent file {module_name!r} does not exist")
        digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
        name = f"{FILE_MODULE_PREFIX}{path.stem}_{digest}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise AgentSpecError(f"loading agent file {module_name!r} failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
        return module
    if str(Path.cwd()) not in sys.path and "" not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # `idegym eval --agent mymodule:Agent` from the project dir
    try:
        return importlib.import_module(module_name)
    except Exception as exc:
        raise AgentSpecError(f"cannot import agent module {module_name!r}: "
                             f"{type(exc).__name__}: {exc}") from exc


class _Shared:
    """Factory for a stateless callable shared by all episodes."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def __call__(self) -> Agent:
        return self.agent


class _PerEpisode:
    """Factory that builds a fresh agent per episode; picklable when ``cls`` is (for Ray)."""

    def __init__(self, cls: type[Any], kwargs: Mapping[str, Any]) -> None:  # a class whose instances are agents
        self.cls = cls
        self.kwargs = dict(kwargs)

    def __call__(self) -> Agent:
        return self.cls(**self.kwargs)


def load_agent(spec: str | Callable[..., Any], kwargs: Mapping[str, Any] | None = None) -> AgentFactory:
    """The factory of per-episode agents for ``spec`` (a built-in name, ``MODULE:NAME``,
    ``file.py:NAME``, a class, or a callable agent). ``kwargs`` go to a class's constructor."""
    kwargs = dict(kwargs or {})
    harness = harness_name(spec) if isinstance(spec, str) else None
    if harness is not None:
        from ..agents import get_harness

        try:
            get_harness(harness)
        except ValueError as exc:
            raise AgentSpecError(str(exc)) from None
        _check_kwargs(str(spec), HarnessAgent, kwargs)
        if not kwargs.get("model_url"):
            raise AgentSpecError(f"agent {spec}: the harness's model calls go to your server: "
                                 "--agent-arg model_url=http://HOST:PORT/v1 (an OpenAI-compatible server)")
        return _PerEpisode(HarnessAgent, kwargs)
    if isinstance(spec, str):
        if spec in BUILTIN:
            target: Any = BUILTIN[spec]
            if spec == "openai":
                from .openai_agent import OpenAIAgent

                _check_kwargs(spec, OpenAIAgent, kwargs)
                env = ClientSettings.from_env()
                if not (kwargs.get("model") or env.openai_model):
                    raise AgentSpecError("the openai agent needs a model: --agent-arg model=NAME or "
                                         "$OPENAI_MODEL")
                from .openai_agent import DEFAULT_BASE_URL

                base_url = kwargs.get("base_url") or env.openai_base_url or DEFAULT_BASE_URL
                if base_url.rstrip("/") == DEFAULT_BASE_URL and not (kwargs.get("api_key")
                                                                       or env.openai_api_key):
                    raise AgentSpecError(f"the openai agent talks to {DEFAULT_BASE_URL} by default, which needs "
                                         "a key: set $OPENAI_API_KEY, or point it at your own server with "
                                         "--agent-arg base_url=URL")
            else:
                _check_kwargs(spec, target, kwargs)
            return _PerEpisode(target, kwargs)
        module_name, sep, attr = spec.rpartition(":")
        if not sep or not module_name or not attr:
            raise AgentSpecError(f"agent {spec!r} is neither a built-in ({', '.join(BUILTIN)}) nor "
                                 "MODULE:NAME (e.g. my_agents:Agent or ./agent.py:Agent)")
        module = _import(module_name)
        target = module
        for part in attr.split("."):
            try:
                target = getattr(target, part)
            except AttributeError:
                raise AgentSpecError(f"module {module_name!r} has no attribute {attr!r}") from None
    else:
        target = spec
    if inspect.isclass(target):
        _check_kwargs(getattr(target, "__name__", str(target)), target, kwargs)
        return _PerEpisode(target, kwargs)
    if not callable(target):
        raise AgentSpecError(f"agent {spec!r} is a {type(target).__name__}, not a callable or a class")
    if kwargs:
        raise AgentSpecError(f"agent {spec!r} is a callable, not a class: it takes no --agent-arg "
                             f"(got {', '.join(kwargs)})")
    return _Shared(target)


def _check_kwargs(name: str, cls: Any, kwargs: Mapping[str, Any]) -> None:
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as exc:
        raise AgentSpecError(f"agent {name}: bad arguments {dict(kwargs)}: {exc}") from None
    except ValueError:
        pass  # no signature to check


def agent_source(factory: AgentFactory) -> dict[str, str] | None:
    """The file that defines the agent and its sha256, for the manifest (None when unknown)."""
    target = getattr(factory, "cls", None) or getattr(factory, "agent", None)
    if target is None:
        return None
    defined = target if inspect.isclass(target) or inspect.isfunction(target) else type(target)
    module = inspect.getmodule(defined)
    path = getattr(module, "__file__", None)
    if not path or not Path(path).is_file():
        return None
    return {"file": str(Path(path).resolve()), "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()}


def reset_agent(agent: Agent, task: Task, seed: int | None) -> None:
    """Call ``agent.reset(task[, seed=...])`` when the agent has one."""
    reset = getattr(agent, "reset", None)
    if reset is None or not callable(reset):
        return
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(reset).parameters
    except (TypeError, ValueError):
        params = {}
    if "seed" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        reset(task, seed=seed)
    else:
        reset(task)


def agent_usage(agent: Agent) -> dict[str, int] | None:
    """The agent's token counts for the episode (``usage`` attribute or method), if it reports any."""
    usage = getattr(agent, "usage", None)
    if callable(usage):
        usage = usage()
    if not isinstance(usage, Mapping):
        return None
    out = {}
    for key, value in usage.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[str(key)] = int(value)
    return out or None


__all__ = ["Agent", "AgentFactory", "OracleAgent", "NoopAgent", "AgentSpecError", "BUILTIN", "HarnessAgent",
           "harness_name", "load_agent",
           "reset_agent", "agent_usage", "agent_source", "SUBMIT"]
