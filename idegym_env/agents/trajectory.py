"""An agent episode's model calls out: Harbor's trajectory format (ATIF) and JSONL training samples.

``info["trajectory"]`` (``IdeGymAgentEnv``) lists every call: the request as chat completions,
the answer (``message``), usage, and in pass-through mode the server's ``prompt_token_ids``,
``completion_token_ids`` and ``logprobs``. ``to_atif`` makes a Harbor ``Trajectory`` of it (the
system and task messages, then one agent step per call, each observed by the tool results or
user messages its next request brought); ``training_samples`` one sample per call.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ATIF_VERSION = "ATIF-v1.6"


def _logprob_values(logprobs: Any) -> list[float] | None:
    if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
        return [float(t["logprob"]) for t in logprobs["content"] if isinstance(t, dict) and "logprob" in t]
    return None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _observed(next_request: dict[str, Any] | None, seen: int) -> list[dict[str, Any]]:
    """The messages the next call added after this call's answer: what the agent observed."""
    if next_request is None:
        return []
    return [m for m in next_request.get("messages", [])[seen + 1:] if m.get("role") in ("tool", "user")]


def to_atif(trajectory: list[dict[str, Any]], info: dict[str, Any], *, session_id: str = "",
            reward: float | None = None) -> dict[str, Any]:
    """A Harbor trajectory (ATIF) of an agent episode's calls; ``info`` is the episode's last info."""
    harness = info.get("harness") or {}
    steps: list[dict[str, Any]] = []
    first = trajectory[0]["request"]["messages"] if trajectory else []
    for message in first:
        source = "system" if message.get("role") == "system" else "user"
        steps.append({"step_id": len(steps) + 1, "source": source, "message": _text(message.get("content"))})
    for n, call in enumerate(trajectory):
        message = call.get("message") or {}
        step: dict[str, Any] = {"step_id": len(steps) + 1, "source": "agent", "message": _text(message.get("content")),
                                "llm_call_count": 1}
        calls = message.get("tool_calls") or []
        if calls:
            step["tool_calls"] = []
            for c in calls:
                try:
                    arguments = json.loads(c["function"].get("arguments") or "{}")
                except ValueError:
                    arguments = {"_raw": c["function"].get("arguments")}
                step["tool_calls"].append({"tool_call_id": c["id"], "function_name": c["function"]["name"],
                                           "arguments": arguments if isinstance(arguments, dict) else
                                           {"value": arguments}})
        usage = call.get("usage") or {}
        metrics = {"prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": usage.get("completion_tokens"),
                   "prompt_token_ids": call.get("prompt_token_ids"),
                   "completion_token_ids": call.get("completion_token_ids"),
                   "logprobs": _logprob_values(call.get("logprobs"))}
        step["metrics"] = {k: v for k, v in metrics.items() if v is not None}
        nxt = trajectory[n + 1]["request"] if n + 1 < len(trajectory) else None
        ids = {c["id"] for c in calls}
        results = []
        for m in _observed(nxt, len(call["request"].get("messages", []))):
            result: dict[str, Any] = {"content": _text(m.get("content"))}
            if m.get("role") == "tool" and m.get("tool_call_id") in ids:
                result["source_call_id"] = m["tool_call_id"]
            results.append(result)
        if results:
            step["observation"] = {"results": results}
        steps.append(step)
    extra: dict[str, Any] = {k: info[k] for k in ("task_id", "checks", "infrastructure_error", "truncated_by",
                                                   "submitted") if k in info}
    if reward is not None:
        extra["reward"] = reward
    return {"schema_version": ATIF_VERSION, "session_id": session_id or None,
            "agent": {"name": harness.get("name", "unknown"), "version": str(harness.get("version", "unknown")),
                      "extra": {"layer": harness.get("layer"), "installed": harness.get("installed"),
                                "api": harness.get("api")}},
            "steps": steps,
            "final_metrics": {"total_prompt_tokens": sum((c.get("usage") or {}).get("prompt_tokens") or 0
                                                         for c in trajectory),
                              "total_completion_tokens": sum((c.get("usage") or {}).get("completion_tokens") or 0
                                                             for c in trajectory),
                              "total_steps": len(steps)},
            "extra": extra}


def training_samples(trajectory: list[dict[str, Any]], info: dict[str, Any], reward: float) -> list[dict[str, Any]]:
    """One JSONL sample per call: its messages and tools, the completion, token ids, logprobs, the
    episode's reward and whether an infrastructure failure ended it (mask those)."""
    failed = bool(info.get("infrastructure_error"))
    return [{"task_id": info.get("task_id"), "harness": (info.get("harness") or {}).get("name"),
             "call": call["index"], "messages": call["request"].get("messages", []),
             "tools": call["request"].get("tools"), "completion": call.get("message"),
             "prompt_token_ids": call.get("prompt_token_ids"), "completion_token_ids": call.get("completion_token_ids"),
             "logprobs": _logprob_values(call.get("logprobs")), "reward": reward, "infra_failure": failed,
             "infrastructure_error": info.get("infrastructure_error")} for call in trajectory]


def write_jsonl(path: str | Path, samples: list[dict[str, Any]]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        for sample in samples:
            fh.write(json.dumps(sample, ensure_ascii=False) + "\n")
