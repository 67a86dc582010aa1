"""``IdeGym-Agent-v0``: an agent that brings its own loop, whose model calls are the env's steps.

``gym.make("IdeGym-Agent-v0", task=..., harness="mini-swe-agent")``: ``reset()`` starts the
harness in the task's sandbox on the task's instruction and returns its first model request
(as the JSON text of a chat-completions request; parsed in ``info["request"]``); ``step(reply)``
gives the policy's reply (a string, or an assistant message with ``tool_calls``) to the agent as
its model's answer and returns the agent's next request. The agent's exit terminates the episode
and its work is graded as ``IdeGym-v0`` grades a submission (``idegym_env.grading``: the same
checks, integrity guarantees and ``info``); ``max_calls`` model calls or ``max_seconds`` of wall
time truncate it (graded too). A harness that crashes, or a sandbox lost, ends the episode with
``info["infrastructure_error"]`` and no grade. A reply that is not an assistant message is an
observation that says why, with the same request to answer again. ``info["trajectory"]`` (at the
end; ``env.trajectory`` any time) holds every call: ``trajectory.py`` writes it as ATIF or JSONL.

Pass-through mode (``model_url=``, an OpenAI-compatible server such as vLLM): ``reset()`` starts
the harness, ``step(None)`` runs it to its end, each call forwarded to the server (as chat
completions, whatever API the agent speaks) and recorded with the token ids and logprobs the
server returns.

The harness runs in the sandbox from a read-only layer (``layers.py``); its model endpoint is a
loopback port of the sandbox's own network namespace that answers only this episode's key
(``sandbox_server/agent_gateway.py``); the env collects each call through the control plane.
"""

from __future__ import annotations

import base64
import http.client
import json
import secrets
import time
from pathlib import Path
from typing import Any, SupportsFloat

from sandbox_server import routes
from sandbox_server.models import (
    AgentExchangeRequest,
    AgentExchangeResponse,
    AgentStartRequest,
    AgentState,
    AgentStopRequest,
    ModelReply,
)

from ..client import Conflict, ServiceError
from ..env import EpisodeEnded, IdeGymEnv
from ..spaces import UnicodeText
from ..tasks import Task
from . import apis
from .channel import DirectChannel
from .harnesses import Harness, get_harness
from .layers import Layer, ensure
from .upstream import Upstream, UpstreamError

DEFAULT_MAX_SECONDS = 1800.0
POLL = 30.0  # one exchange waits at most this long (the control plane's wait), then asks again
STOP_GRACE = 2.0


class IdeGymAgentEnv(IdeGymEnv):
    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(self, task: Task | str | Path | None = None, *, harness: str | Harness = "mini-swe-agent",
                 model_url: str | None = None, model_api_key: str | None = None, model_name: str | None = None,
                 upstream_params: dict[str, Any] | None = None, max_calls: int | None = None,
                 max_seconds: float | None = None, call_timeout: float = 600.0,
                 max_observation_chars: int = 1 << 20, direct_exchange: bool = True, **kwargs: Any) -> None:
        self.harness = get_harness(harness)
        self.layer: Layer = ensure(self.harness.layer)
        super().__init__(task, max_observation_chars=max_observation_chars, **kwargs)
        self.action_space = UnicodeText(max_length=None)  # a string; an assistant message (dict) is taken too
        self.max_calls = max_calls or self.task.max_steps
        self.max_seconds = max_seconds or self.task.agent_timeout or DEFAULT_MAX_SECONDS
        self.call_timeout = call_timeout
        self.direct_exchange = direct_exchange  # model calls straight from the sandbox server (channel.py)
        self._channel: DirectChannel | None = None
        self._exchange_path = ""  # how the model calls reach the env: "direct" or "control plane"
        self.endpoint = ""
        self.model_url = model_url.rstrip("/") if model_url else None
        self.model_name = model_name
        self.upstream_params = {"logprobs": True} if upstream_params is None else dict(upstream_params)
        self._upstream = Upstream(self.model_url, model_api_key, call_timeout) if self.model_url else None
        self.trajectory: list[dict[str, Any]] = []
        self._pending: apis.ParsedCall | None = None
        self._pending_id = ""
        self._key = ""
        self._deadline = 0.0
        self._agent_state: AgentState | None = None
        self._late_replies = 0  # replies that came after their call's agent gave up waiting
        self._first: str | None = None  # how the episode ended before a step could (reset, pass-through)

    # -- episode ----------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        instruction, info = super().reset(seed=seed, options=options)
        self.trajectory = []
        self._late_replies = 0
        info["harness"] = self.harness_info()
        try:
            self._start_agent()
            outcome = self._next_call()
        except ServiceError as exc:
            raise RuntimeError(f"the harness {self.harness.name!r} could not start: {exc}") from exc
        if self.model_url is not None:
            info["mode"] = "pass-through"
            self._first = outcome
            return instruction, info
        if outcome is not None:  # exited (or was cut off) before its first call: step() reports it
            self._first = outcome
            info.update(agent_ended_before_first_call=True, agent=self._agent_state.model_dump()
                        if self._agent_state else None)
            return self._fit(f"the agent ended before its first model call: {outcome}"), info
        self._first = None
        info["request"] = self._pending.request if self._pending else None
        info["api"] = self._pending.api if self._pending else None
        return self._observation(), info

    def step(self, action: Any) -> tuple[str, SupportsFloat, bool, bool, dict]:
        if self._ended:
            raise EpisodeEnded("the episode has ended (terminated or truncated): call reset() to start the next one")
        if self.sandbox is None:
            raise RuntimeError("call reset() before step()")
        started = time.perf_counter()
        info: dict[str, Any] = {"step": self._steps + 1}
        if self.model_url is not None:
            return self._end(self._first if self._first is not None else self._pass_through(), info, started)
        if self._first is not None:
            return self._end(self._first, info, started)
        assert self._pending is not None
        try:
            message = apis.assistant_message(action)
        except apis.ReplyError as exc:
            self._steps += 1
            info.update(invalid_action=True, error=str(exc), request=self._pending.request)
            self._log("<invalid reply>", str(exc))
            text = (f"error: {exc}. Answer the same request again.\n\n" + self._observation())
            if self._steps >= self.max_calls:
                return self._end("max_calls", info, started)
            return self._fit(text), -self.invalid_action_penalty if self.invalid_action_penalty else 0.0, \
                False, False, info
        self._steps += 1
        completion = apis.completion(message, self.model_name or self._pending.model)
        self._record(completion, started)
        outcome = self._answer_and_next(completion)
        if outcome is None and self._steps >= self.max_calls:
            outcome = "max_calls"
        if outcome is not None:
            return self._end(outcome, info, started)
        info.update(request=self._pending.request, api=self._pending.api)
        self._timed(info, started)
        return self._observation(), 0.0, False, False, info

    def run_episode(self, *, seed: int | None = None) -> tuple[float, dict[str, Any]]:
        """Pass-through mode: reset, run the agent to its end; the reward and the final info."""
        if self.model_url is None:
            raise RuntimeError("run_episode() needs model_url= (pass-through mode)")
        self.reset(seed=seed)
        _, reward, _, _, info = self.step(None)
        return float(reward), info

    def harness_info(self) -> dict[str, Any]:
        return {"name": self.harness.name, "version": self.harness.version, "api": self.harness.api,
                "layer": self.layer.host.name, "installed": dict(self.layer.manifest.get("installed", {}))}

    def fork(self, n: int = 1) -> list[IdeGymAgentEnv]:  # type: ignore[override]
        """``n`` envs from this episode's start: each in a sandbox forked from this one's, its own
        harness started there (processes are not forked) and waiting with its first request.
        Only before the first ``step`` (a group of rollouts from one state)."""
        if self._steps:
            raise RuntimeError("fork an agent episode right after reset(): a fork restarts the harness, so a "
                               "fork later would not continue this episode")
        from ..env_fork import fork_env

        children = fork_env(self, n)
        for child in children:
            child.trajectory = []
            child._channel = None  # the parent's stays the parent's
            child._upstream = self._upstream.copy() if self._upstream is not None else None
            child._start_agent()
            child._first = child._next_call()
        return children

    def close(self) -> None:
        self._close_channel()
        if self._upstream is not None:
            self._upstream.close()
        super().close()

    # -- the harness --------------------------------------------------------------------------------

    def _start_agent(self) -> None:
        assert self.sandbox is not None
        self._key = "idegym-" + secrets.token_urlsafe(24)
        self._deadline = time.monotonic() + self.max_seconds
        self._pending, self._agent_state = None, None
        env = {"IDEGYM_INSTRUCTION": self.task.instruction, "IDEGYM_STEP_LIMIT": str(self.max_calls),
               "IDEGYM_MODEL_NAME": self.model_name or "idegym-policy", **self.harness.env}
        self._close_channel()
        channel = self._open_channel()
        started = self.sandbox.call(routes.AGENT_START, AgentStartRequest(
            command=self.harness.command(self.layer.inside), key=self._key, env=env, timeout=self.max_seconds + 60,
            graceful_termination_timeout=STOP_GRACE, call_timeout=self.call_timeout,
            exchange_socket=channel.inside if channel else None, exchange_secret=channel.secret if channel else None))
        self.endpoint = started.base_url  # the harness's model endpoint, inside the sandbox
        if channel is not None and started.exchange_connected and channel.accept():
            self._channel = channel
            self._exchange_path = "direct"
        else:
            self._exchange_path = "control plane"
            if channel is not None:
                channel.close()

    def _open_channel(self) -> DirectChannel | None:
        """A direct line to the sandbox's endpoint, when it may be on this host (``channel.py``)."""
        if not self.direct_exchange:
            return None
        try:
            return DirectChannel(self.layer.host.parent)
        except OSError:
            return None

    def _close_channel(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def _call_exchange(self, request: AgentExchangeRequest) -> AgentExchangeResponse:
        assert self.sandbox is not None
        if self._channel is not None:
            try:
                return self._channel.exchange(request)
            except (OSError, http.client.HTTPException):
                self._close_channel()  # through the control plane from now on (a reply sent twice is a 409)
                self._exchange_path = "control plane (the direct line broke)"
        return self.sandbox.call(routes.AGENT_EXCHANGE, request)

    def _exchange(self, reply: ModelReply | None) -> str | None:
        """Deliver ``reply``; wait for the next model call (``self._pending``). None, or why the
        episode ends: ``exited`` (the agent's loop ended), ``max_seconds``, ``lost: ...``."""
        assert self.sandbox is not None
        while True:
            left = self._deadline - time.monotonic()
            if left <= 0:
                return "max_seconds"
            try:
                answer = self._call_exchange(AgentExchangeRequest(reply=reply, wait=min(left, POLL)))
            except Conflict:
                # the call the reply answers is gone: its agent stopped waiting (call_timeout)
                self._late_replies += 1
                reply = None
                continue
            except ServiceError as exc:
                return f"lost: {getattr(exc, 'message', exc)}"
            reply = None
            self._agent_state = answer.agent
            if answer.call is not None:
                self._pending_id = answer.call.id
                body = base64.b64decode(answer.call.body_base64)
                try:
                    self._pending = apis.parse_call(answer.call.path, body)
                except ValueError as exc:  # not a model request (GET /v1/models, a probe): answered here
                    reply = self._side_answer(answer.call.method, answer.call.path, str(exc))
                    continue
                return None
            if not answer.agent.running:
                return "exited"

    def _side_answer(self, method: str, path: str, why: str) -> ModelReply:
        if method == "GET" and path.split("?")[0].rstrip("/").endswith("/models"):
            name = self.model_name or "idegym-policy"
            body = {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "idegym"}]}
            return ModelReply(call_id=self._pending_id,
                              body_base64=base64.b64encode(json.dumps(body).encode()).decode())
        error = {"error": {"type": "not_found_error", "message": why}}
        return ModelReply(call_id=self._pending_id, status=404,
                          body_base64=base64.b64encode(json.dumps(error).encode()).decode())

    def _next_call(self) -> str | None:
        return self._exchange(None)

    def _answer_and_next(self, completion: dict[str, Any], raw: bytes | None = None) -> str | None:
        assert self._pending is not None
        body, content_type = apis.reply_body(self._pending, completion, raw)
        reply = ModelReply(call_id=self._pending_id, content_type=content_type,
                           body_base64=base64.b64encode(body).decode("ascii"))
        self._pending = None
        return self._exchange(reply)

    def _pass_through(self) -> str:
        """Forward every call to ``model_url`` until the agent's loop ends or a budget runs out."""
        assert self._upstream is not None
        while True:
            assert self._pending is not None
            started = time.perf_counter()
            payload = {**self._pending.request, **self.upstream_params, "stream": False,
                       "model": self.model_name or self._pending.model or "default"}
            try:
                completion, raw = self._upstream.chat(payload)
            except UpstreamError as exc:
                return f"model: the model server at {self.model_url} failed: {exc}"
            self._steps += 1
            self._record(completion, started)
            outcome = self._answer_and_next(completion, raw)
            if outcome is None and self._steps >= self.max_calls:
                outcome = "max_calls"
            if outcome is not None:
                return outcome

    def _record(self, completion: dict[str, Any], started: float) -> None:
        assert self._pending is not None
        choice = completion["choices"][0]
        entry: dict[str, Any] = {
            "index": len(self.trajectory), "api": self._pending.api, "path": self._pending.path,
            "request": self._pending.request, "message": choice.get("message"),
            "finish_reason": choice.get("finish_reason"), "usage": completion.get("usage"),
            "seconds": round(time.perf_counter() - started, 6)}
        if choice.get("logprobs") is not None:
            entry["logprobs"] = choice["logprobs"]
        for key in ("token_ids",):
            if choice.get(key) is not None:
                entry["completion_token_ids"] = choice[key]
        if completion.get("prompt_token_ids") is not None:
            entry["prompt_token_ids"] = completion["prompt_token_ids"]
        self.trajectory.append(entry)
        self._log(f"[call {entry['index']}] {self._pending.api}", json.dumps(choice.get("message"))[:2000])

    # -- the end ------------------------------------------------------------------------------------

    def _end(self, outcome: str, info: dict[str, Any], started: float) -> tuple[str, SupportsFloat, bool, bool, dict]:
        info.update(harness=self.harness_info(), calls=len(self.trajectory), task_id=self.task.id,
                    exchange=self._exchange_path)
        if self._late_replies:
            info["late_replies"] = self._late_replies
        state = self._agent_state
        if outcome == "exited" and state is not None and state.exit_code == 0:
            info["agent"] = state.model_dump()
            return self._graded(info, started, submitted=True)
        if outcome in ("max_calls", "max_seconds"):
            info["truncated_by"] = outcome
            info["agent"] = self._stop_agent()
            return self._graded(info, started, submitted=False)
        # the harness crashed, the sandbox was lost, the model server failed: nobody's answer to grade
        if outcome == "exited" and state is not None:
            tail = (state.stderr or state.stdout).strip()[-1500:]
            why = f"the harness {self.harness.name!r} exited with code {state.exit_code}" + (
                ", timed out" if state.timed_out else "") + (f": {tail}" if tail else "")
            info["agent"] = state.model_dump()
        else:
            why = outcome.removeprefix("lost: ")
            info["agent"] = self._stop_agent()
        self._ended = True
        self._close_channel()
        info.update(infrastructure_error=why, trajectory=list(self.trajectory))
        self._log("<episode ended>", why)
        self._timed(info, started)
        return self._fit(f"infrastructure error: {why}"), 0.0, False, True, info

    def _graded(self, info: dict[str, Any], started: float, *, submitted: bool
                ) -> tuple[str, SupportsFloat, bool, bool, dict]:
        self._close_channel()
        observation, reward, terminated, truncated, info = self._finish(info, started, submitted=submitted)
        info["trajectory"] = list(self.trajectory)
        return observation, reward, terminated, truncated, info

    def _stop_agent(self) -> dict[str, Any] | None:
        if self.sandbox is None:
            return None
        try:
            stopped = self.sandbox.call(routes.AGENT_STOP, AgentStopRequest(graceful_termination_timeout=STOP_GRACE))
        except ServiceError:
            return None
        return stopped.agent.model_dump() if stopped.agent is not None else None

    def _observation(self) -> str:
        assert self._pending is not None
        return self._fit(json.dumps(self._pending.request, ensure_ascii=False))
