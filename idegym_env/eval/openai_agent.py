"""An agent for any OpenAI-compatible chat-completions endpoint with tool calling.

One agent per episode. ``reset(task)`` starts the conversation (a system prompt and the task's
instruction) and takes the tool list from the task's action space (``tool_schemas("openai")``).
Each ``__call__`` returns one tool call for ``IdeGymEnv.step``; the observation that comes back is
sent to the model as the ``role: tool`` message answering that call. When the model asks for
several tools at once they are executed one step each before the model is asked again. A reply
without a tool call is handed to the env as text (the env parses tool calls written as JSON and
otherwise explains what a valid call looks like); the next observation then goes back as a
``role: user`` message.

Token counts come from each response's ``usage`` field (``self.usage``). 429 and 5xx answers and
connection errors are retried with exponential backoff (``Retry-After`` is honoured); other
errors raise :class:`ChatCompletionError`, which the harness records as the episode's error.

Configuration: arguments, else ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``OPENAI_MODEL``.
Only ``httpx`` is used, no ``openai`` package.
"""

from __future__ import annotations

import json
import random
import time
from collections import deque
from typing import Any

import httpx

from ..errors import IdeGymError
from ..settings import ClientSettings
from ..tasks import Task

DEFAULT_BASE_URL = "https://api.openai.com/v1"
SYSTEM_PROMPT = (
    "You are a software engineer working in a sandboxed project directory. Use the tools to inspect "
    "the project, change the code and run the tests. Make one tool call at a time and read its result. "
    "When the task is done, call the `submit` tool: it runs the task's checks and ends the episode."
)
RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class ChatCompletionError(IdeGymError, RuntimeError):
    """The endpoint answered with an error that retrying does not fix (or retries ran out)."""


class ModelUnreachable(ChatCompletionError):
    """The model endpoint cannot be reached (its name does not resolve, or connections failed
    until the retries ran out): neither the agent's fault nor the task's, so the harness records
    the episode as an infrastructure failure (``error_kind`` ``model``)."""


# What a failed name lookup looks like in httpx's ConnectError (glibc's and musl's wording).
NAME_RESOLUTION = ("Name or service not known", "Temporary failure in name resolution", "nodename nor servname",
                   "No address associated with hostname", "Name does not resolve")


class OpenAIAgent:
    def __init__(
        self,
        model: str | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float | None = 0.0,
        max_tokens: int | None = None,
        system_prompt: str = SYSTEM_PROMPT,
        request_timeout: float = 300.0,
        max_retries: int = 6,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        parallel_tool_calls: bool | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        env = ClientSettings.from_env()
        self.model = model or env.openai_model
        if not self.model:
            raise ValueError("the openai agent needs a model: --agent-arg model=NAME or $OPENAI_MODEL")
        self.base_url = (base_url or env.openai_base_url or DEFAULT_BASE_URL).rstrip("/")
        api_key = api_key if api_key is not None else env.openai_api_key
        self.system_prompt = system_prompt
        # What every request carries besides the conversation (the options given), then extra_body over it.
        self.sampling: dict[str, Any] = {name: value for name, value in (
            ("temperature", temperature), ("max_tokens", max_tokens), ("parallel_tool_calls", parallel_tool_calls))
            if value is not None}
        self.extra_body = dict(extra_body or {})
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=request_timeout)
        self.messages: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] = []
        self.usage: dict[str, int] = {}
        self.requests = 0
        self.seed: int | None = None
        self._pending: deque[dict[str, Any]] = deque()  # tool calls of the last reply not yet executed
        self._answer_to: str | None = None  # id of the tool call whose result the next observation is
        self._started = False

    # -- the Agent protocol -----------------------------------------------------------------------

    def reset(self, task: Task, *, seed: int | None = None) -> None:
        self.tools = task.action_space().tool_schemas("openai")
        self.messages = [{"role": "system", "content": self.system_prompt}]
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        self.requests = 0
        self.seed = seed
        self._pending.clear()
        self._answer_to = None
        self._started = False

    def __call__(self, observation: str, info: dict[str, Any]) -> Any:
        if not self._started:
            self._started = True
            self.messages.append({"role": "user", "content": observation})
        elif self._answer_to is not None:
            self.messages.append({"role": "tool", "tool_call_id": self._answer_to, "content": observation})
        else:
            self.messages.append({"role": "user", "content": observation})
        self._answer_to = None
        if not self._pending:
            self._ask()
        if self._pending:
            call = self._pending.popleft()
            self._answer_to = call.get("id")
            return {"type": "function", "id": call.get("id"),
                    "function": {"name": call["function"]["name"],
                                 "arguments": call["function"].get("arguments") or "{}"}}
        return self.messages[-1].get("content") or ""

    def close(self) -> None:
        self._http.close()

    # -- the endpoint --------------------------------------------------------------------------------

    def _ask(self) -> None:
        body: dict[str, Any] = {"model": self.model, "messages": self.messages, "tools": self.tools, **self.sampling}
        if self.seed is not None:
            body["seed"] = self.seed
        body.update(self.extra_body)
        reply = self._post("/chat/completions", body)
        self.requests += 1
        for key, value in (reply.get("usage") or {}).items():
            if isinstance(value, int) and not isinstance(value, bool):
                self.usage[key] = self.usage.get(key, 0) + value
        choices = reply.get("choices") or []
        if not choices or not isinstance(choices[0].get("message"), dict):
            raise ChatCompletionError(f"the endpoint answered without a message: {json.dumps(reply)[:500]}")
        message = choices[0]["message"]
        tool_calls = [c for c in message.get("tool_calls") or [] if isinstance(c, dict) and c.get("function")]
        kept: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if tool_calls:
            for i, call in enumerate(tool_calls):
                call.setdefault("type", "function")
                if not call.get("id"):
                    call["id"] = f"call_{self.requests}_{i}"
            kept["tool_calls"] = tool_calls
        self.messages.append(kept)
        self._pending.extend(tool_calls)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        attempt = 0
        while True:
            try:
                response = self._http.post(path, json=body)
            except httpx.TransportError as exc:
                host = httpx.URL(self.base_url).host
                if any(text in str(exc) for text in NAME_RESOLUTION):  # retrying does not bring a network back
                    raise ModelUnreachable(f"the model endpoint {self.base_url} is unreachable: {host!r} does not "
                                           "resolve (no network here, or a wrong base_url: --agent-arg "
                                           "base_url=URL or $OPENAI_BASE_URL)") from exc
                if attempt >= self.max_retries:
                    raise ModelUnreachable(f"the model endpoint {self.base_url} is unreachable after {attempt + 1} "
                                           f"tries: {type(exc).__name__}: {exc}") from exc
                self._sleep(attempt, None)
                attempt += 1
                continue
            if response.status_code == 200:
                try:
                    return response.json()
                except ValueError as exc:
                    raise ChatCompletionError(f"POST {self.base_url}{path}: the answer is not JSON: "
                                              f"{response.text[:300]!r}") from exc
            if response.status_code in RETRY_STATUS or response.status_code >= 500:
                if attempt < self.max_retries:
                    self._sleep(attempt, response.headers.get("retry-after"))
                    attempt += 1
                    continue
            raise ChatCompletionError(f"POST {self.base_url}{path} answered {response.status_code} "
                                      f"(after {attempt + 1} tries): {response.text[:500]}")

    def _sleep(self, attempt: int, retry_after: str | None) -> None:
        delay = min(self.backoff * (2 ** attempt), self.max_backoff) * (0.5 + random.random() / 2)
        if retry_after:
            try:
                delay = min(max(float(retry_after), 0.0), self.max_backoff)
            except ValueError:
                pass
        time.sleep(delay)


__all__ = ["OpenAIAgent", "ChatCompletionError", "ModelUnreachable", "SYSTEM_PROMPT", "DEFAULT_BASE_URL"]
