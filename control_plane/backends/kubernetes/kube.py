"""Small helpers over the official (synchronous) ``kubernetes`` client.

Every call runs in a worker thread and returns the API's JSON as a dict (``_preload_content=False``),
so pods, Deployments and custom resources are all read the same way, and field names are the
API's camelCase, as in the manifests.

The calls have threads of their own (``API_THREADS``), not the loop's default executor: that has
min(32, CPUs + 4) threads, 6 on a small control-plane host, shared with every other blocking
call of the process. Deleting 1,000 servers is ~4,000 calls that only wait on the API server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

T = TypeVar("T")

API_THREADS = 32  # the API client's connection pool holds 64: these calls and the watch streams
_threads = concurrent.futures.ThreadPoolExecutor(API_THREADS, thread_name_prefix="idegym-kube-api")


async def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run one API call in a thread; the response body parsed as JSON (``{}`` when empty)."""

    def run() -> dict[str, Any]:
        resp = fn(*args, _preload_content=False, **kwargs)
        data = resp.data
        return json.loads(data) if data else {}

    return await asyncio.get_running_loop().run_in_executor(_threads, run)


async def call_or_none(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any] | None:
    """Like ``call``, but a 404 is ``None``."""
    try:
        return await call(fn, *args, **kwargs)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


async def delete_quietly(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    """Delete; ``False`` when it was already gone."""
    try:
        await call(fn, *args, **kwargs)
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


def error_text(exc: ApiException) -> str:
    """The ``message`` of the API's Status body, else the HTTP reason."""
    with contextlib.suppress(Exception):
        body = json.loads(exc.body or "{}")
        if body.get("message"):
            return str(body["message"])
    return f"{exc.status} {exc.reason}"


def watch_until(list_fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                check: Callable[[str, dict[str, Any]], T | None], timeout: float) -> T | None:
    """Blocking: stream watch events until ``check(type, obj)`` returns non-None or ``timeout``
    passes (then ``None``). Starts from ``kwargs['resource_version']`` when given. Re-watches
    when the server closes the stream early. Run it with ``asyncio.to_thread``."""
    deadline = time.monotonic() + timeout
    rv = kwargs.pop("resource_version", None)
    while (remaining := deadline - time.monotonic()) > 0:
        extra = {"resource_version": rv} if rv else {}
        resp = list_fn(*args, watch=True, timeout_seconds=max(1, int(remaining)), _preload_content=False,
                       _request_timeout=(10, remaining + 10), **kwargs, **extra)
        try:
            for line in iter_resp_lines(resp):
                event = json.loads(line)
                kind, obj = event.get("type", ""), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        rv = None  # too old: restart from "now" (a fresh watch sends ADDED for all)
                        break
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                rv = obj.get("metadata", {}).get("resourceVersion") or rv
                if kind == "BOOKMARK":
                    continue
                result = check(kind, obj)
                if result is not None:
                    return result
                if time.monotonic() >= deadline:
                    return None
        finally:
            with contextlib.suppress(Exception):
                resp.close()
                resp.release_conn()
    return None
