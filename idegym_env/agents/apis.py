"""The model APIs agents speak, each as the one shape the policy sees and answers.

An agent's call arrives in its own API: OpenAI chat completions (``/v1/chat/completions``),
Anthropic's Messages (``/v1/messages``) or OpenAI's Responses (``/v1/responses``). ``parse_call``
makes each a chat-completions request (``messages``, ``tools``, sampling parameters) — what the
policy observes and what pass-through mode sends to an OpenAI-compatible server; ``reply_body``
turns the policy's answer (a chat-completions assistant message) into the agent's API, as one
JSON body or, when the agent asked for a stream, as server-sent events.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..errors import IdeGymError

CHAT, ANTHROPIC, RESPONSES = "chat", "anthropic", "responses"
SAMPLING = ("temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "seed", "n",
            "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs", "tool_choice", "reasoning_effort")


class ReplyError(IdeGymError, ValueError):
    """The policy's reply is not an assistant message (the message says what is wrong)."""


@dataclass
class ParsedCall:
    api: str  # chat | anthropic | responses
    path: str
    request: dict[str, Any]  # as a chat-completions request
    stream: bool
    model: str
    raw: dict[str, Any] = field(default_factory=dict)


def api_of(path: str) -> str | None:
    path = path.split("?", 1)[0].rstrip("/")
    if path.endswith("/chat/completions"):
        return CHAT
    if path.endswith("/messages"):
        return ANTHROPIC
    if path.endswith("/responses"):
        return RESPONSES
    return None


def parse_call(path: str, body: bytes) -> ParsedCall:
    """``ValueError`` when the call is no model request of a known API."""
    api = api_of(path)
    if api is None:
        raise ValueError(f"{path}: not a model API this gateway serves (/v1/chat/completions, /v1/messages, "
                         "/v1/responses)")
    try:
        raw = json.loads(body or b"{}")
    except ValueError as exc:
        raise ValueError(f"the request body is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError("the request body is not a JSON object")
    request = {CHAT: _chat_from_chat, ANTHROPIC: _chat_from_anthropic, RESPONSES: _chat_from_responses}[api](raw)
    return ParsedCall(api, path, request, bool(raw.get("stream")), str(raw.get("model") or ""), raw)


# -- requests, as chat completions ------------------------------------------------------------------


def _chat_from_chat(raw: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in raw.items() if k in ("messages", "tools", *SAMPLING)}
    out.setdefault("messages", [])
    return out


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict)
                       and b.get("type") in ("text", "input_text", "output_text"))
    return ""


def _chat_from_anthropic(raw: dict[str, Any]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if raw.get("system"):
        messages.append({"role": "system", "content": _text_of(raw["system"])})
    for msg in raw.get("messages") or []:
        role, content = msg.get("role"), msg.get("content")
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
            continue
        blocks = content if isinstance(content, list) else []
        text = _text_of(blocks)
        if role == "assistant":
            calls = [{"id": b.get("id"), "type": "function",
                      "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input") or {})}}
                     for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
            messages.append({"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})})
            continue
        for b in blocks:
            if isinstance(b, dict) and b.get("type") == "tool_result":
                messages.append({"role": "tool", "tool_call_id": b.get("tool_use_id"),
                                 "content": _text_of(b.get("content")) if not isinstance(b.get("content"), str)
                                 else b["content"]})
        if text:
            messages.append({"role": role, "content": text})
    out: dict[str, Any] = {"messages": messages}
    tools = [{"type": "function", "function": {"name": t.get("name"), "description": t.get("description", ""),
                                                "parameters": t.get("input_schema") or {"type": "object"}}}
             for t in raw.get("tools") or [] if isinstance(t, dict) and t.get("name")]
    if tools:
        out["tools"] = tools
    for key in ("temperature", "top_p", "max_tokens"):
        if key in raw:
            out[key] = raw[key]
    if raw.get("stop_sequences"):
        out["stop"] = raw["stop_sequences"]
    return out


def _chat_from_responses(raw: dict[str, Any]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if raw.get("instructions"):
        messages.append({"role": "system", "content": str(raw["instructions"])})
    items = raw.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    for item in items or []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            role = "system" if item.get("role") == "developer" else item.get("role", "user")
            messages.append({"role": role, "content": _text_of(item.get("content"))})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}}
            if messages and messages[-1]["role"] == "assistant" and not messages[-1].get("content"):
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": output if isinstance(output, str) else json.dumps(output)})
    out: dict[str, Any] = {"messages": messages}
    tools = [{"type": "function", "function": {"name": t.get("name"), "description": t.get("description", ""),
                                                "parameters": t.get("parameters") or {"type": "object"}}}
             for t in raw.get("tools") or [] if isinstance(t, dict) and t.get("type") == "function"]
    if tools:
        out["tools"] = tools
    for key in ("temperature", "top_p"):
        if key in raw:
            out[key] = raw[key]
    if "max_output_tokens" in raw:
        out["max_tokens"] = raw["max_output_tokens"]
    return out


# -- the policy's reply ---------------------------------------------------------------------------


def assistant_message(reply: Any) -> dict[str, Any]:
    """The policy's reply as a chat-completions assistant message: a string (its text), or a
    message ``{"content": ..., "tool_calls": [...]}`` whose calls' arguments are JSON text or objects."""
    if isinstance(reply, str):
        return {"role": "assistant", "content": reply}
    if not isinstance(reply, dict):
        raise ReplyError(f"a reply is a string or an assistant message (a dict), not {type(reply).__name__}")
    if reply.get("role", "assistant") != "assistant":
        raise ReplyError(f"a reply's role is 'assistant', not {reply.get('role')!r}")
    content = reply.get("content")
    if content is not None and not isinstance(content, str):
        content = _text_of(content) if isinstance(content, list) else None
        if content is None:
            raise ReplyError("a reply's content is a string (or a list of text parts)")
    calls = []
    raw_calls = reply.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise ReplyError("a reply's tool_calls is a list")
    for n, call in enumerate(raw_calls):
        fn = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ReplyError(f"tool_calls[{n}] has no function name: "
                             "{'function': {'name': ..., 'arguments': ...}}")
        args = fn.get("arguments", {})
        if not isinstance(args, str):
            args = json.dumps(args)
        calls.append({"id": (call.get("id") if isinstance(call.get("id"), str) else None)
                      or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": fn["name"], "arguments": args}})
    if content is None and not calls:
        raise ReplyError("a reply needs content or tool_calls")
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return message


def completion(message: dict[str, Any], model: str, usage: dict[str, int] | None = None) -> dict[str, Any]:
    """A chat completion holding ``message``."""
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
            "model": model or "idegym-policy",
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
            "usage": usage or {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}


def reply_body(call: ParsedCall, chat_completion: dict[str, Any], raw: bytes | None = None) -> tuple[bytes, str]:
    """The answer to ``call`` in its API (body, content type) from a chat completion; ``raw``, the
    completion's JSON as a model server sent it, is the answer itself to an unstreamed chat call."""
    message = chat_completion["choices"][0]["message"]
    usage = chat_completion.get("usage") or {}
    if call.api == CHAT:
        if call.stream:
            return _sse_chat(chat_completion)
        return raw if raw is not None else json.dumps(chat_completion).encode(), "application/json"
    if call.api == ANTHROPIC:
        body = _anthropic_message(message, call.model, usage)
        return _sse_anthropic(body) if call.stream else (json.dumps(body).encode(), "application/json")
    body = _responses_response(message, call.model, usage)
    return _sse_responses(body) if call.stream else (json.dumps(body).encode(), "application/json")


def _events(events: list[tuple[str | None, dict[str, Any] | str]]) -> tuple[bytes, str]:
    out = []
    for name, data in events:
        text = data if isinstance(data, str) else json.dumps(data)
        out.append((f"event: {name}\n" if name else "") + f"data: {text}\n\n")
    return "".join(out).encode(), "text/event-stream"


def _sse_chat(done: dict[str, Any]) -> tuple[bytes, str]:
    message = done["choices"][0]["message"]
    base = {k: done[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
    first = base | {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    last = base | {"choices": [{"index": 0, "delta": {}, "finish_reason": done["choices"][0]["finish_reason"]}],
                   "usage": done.get("usage")}
    return _events([(None, first), (None, last), (None, "[DONE]")])


def _anthropic_message(message: dict[str, Any], model: str, usage: dict[str, Any]) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        try:
            arguments = json.loads(call["function"]["arguments"] or "{}")
        except ValueError:
            arguments = {"_raw": call["function"]["arguments"]}
        content.append({"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"),
                        "name": call["function"]["name"], "input": arguments})
    return {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
            "model": model or "idegym-policy", "content": content,
            "stop_reason": "tool_use" if message.get("tool_calls") else "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": usage.get("prompt_tokens", 0),
                      "output_tokens": usage.get("completion_tokens", 0)}}


def _sse_anthropic(body: dict[str, Any]) -> tuple[bytes, str]:
    start = dict(body, content=[], stop_reason=None)
    events: list[tuple[str | None, dict[str, Any] | str]] = [("message_start", {"type": "message_start",
                                                                              "message": start})]
    for i, block in enumerate(body["content"]):
        if block["type"] == "text":
            events += [("content_block_start", {"type": "content_block_start", "index": i,
                                                "content_block": {"type": "text", "text": ""}}),
                       ("content_block_delta", {"type": "content_block_delta", "index": i,
                                                "delta": {"type": "text_delta", "text": block["text"]}})]
        else:
            events += [("content_block_start", {"type": "content_block_start", "index": i,
                                                "content_block": dict(block, input={})}),
                       ("content_block_delta", {"type": "content_block_delta", "index": i,
                                                "delta": {"type": "input_json_delta",
                                                          "partial_json": json.dumps(block["input"])}})]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    events += [("message_delta", {"type": "message_delta",
                                  "delta": {"stop_reason": body["stop_reason"], "stop_sequence": None},
                                  "usage": {"output_tokens": body["usage"]["output_tokens"]}}),
               ("message_stop", {"type": "message_stop"})]
    return _events(events)


def _responses_response(message: dict[str, Any], model: str, usage: dict[str, Any]) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if message.get("content"):
        output.append({"type": "message", "id": f"msg_{uuid.uuid4().hex[:24]}", "status": "completed",
                       "role": "assistant",
                       "content": [{"type": "output_text", "text": message["content"], "annotations": []}]})
    for call in message.get("tool_calls") or []:
        output.append({"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:24]}", "call_id": call["id"],
                       "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                       "status": "completed"})
    tokens_in, tokens_out = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    return {"id": f"resp_{uuid.uuid4().hex[:24]}", "object": "response", "created_at": int(time.time()),
            "status": "completed", "model": model or "idegym-policy", "output": output,
            "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out, "total_tokens": tokens_in + tokens_out,
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}}


def _sse_responses(body: dict[str, Any]) -> tuple[bytes, str]:
    start = dict(body, status="in_progress", output=[])
    events: list[tuple[str | None, dict[str, Any] | str]] = [
        ("response.created", {"type": "response.created", "response": start, "sequence_number": 0}),
        ("response.in_progress", {"type": "response.in_progress", "response": start, "sequence_number": 1})]
    for i, item in enumerate(body["output"]):
        events += [("response.output_item.added", {"type": "response.output_item.added", "output_index": i,
                                                   "item": item, "sequence_number": len(events)}),
                   ("response.output_item.done", {"type": "response.output_item.done", "output_index": i,
                                                  "item": item, "sequence_number": len(events) + 1})]
    events.append(("response.completed", {"type": "response.completed", "response": body,
                                          "sequence_number": len(events)}))
    return _events(events)
