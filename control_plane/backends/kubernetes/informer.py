"""A pod informer: one list + watch stream per namespace keeps every IdeGym pod in memory.

The watcher observes every sandbox every few seconds and forwards need pod IPs; asking the API
server each time would cost O(servers) requests per tick. One watch costs one connection, and
waits (readiness, restart, deletion) wake on the event that satisfies them instead of polling.

The official client is synchronous, so the stream runs in a daemon thread and hands events to
the asyncio loop with ``call_soon_threadsafe``. ``stop`` shuts the open response down, so the
thread ends at once rather than at the watch timeout.

Pods are indexed by their ``app`` label (one server's pods), and a wait for one server wakes only
on its own pods' events: a mass delete of N servers makes O(N) checks, not O(N²) (each of N
waiters re-checked on each of N events, each check a scan of every pod).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger(__name__)
T = TypeVar("T")


class PodInformer:
    def __init__(self, core: client.CoreV1Api, namespace: str, selector: str, *,
                 watch_timeout: int = 240) -> None:
        self.core = core
        self.namespace = namespace
        self.selector = selector
        self.watch_timeout = watch_timeout
        self._pods: dict[str, dict[str, Any]] = {}
        self._by_app: dict[str, dict[str, dict[str, Any]]] = {}  # app label -> name -> pod
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self.synced = threading.Event()
        self._resp: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None
        self._app_changed: dict[str, tuple[asyncio.Event, int]] = {}  # app -> (its event, waiters)
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None

    # -- lifecycle --

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self._thread = threading.Thread(target=self._run, name=f"pod-informer-{self.namespace}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.shutdown()  # unblocks the reading thread (urllib3 >= 2.3)
            with contextlib.suppress(Exception):
                resp.close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- reading --

    def pods(self, app: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return list((self._pods if app is None else self._by_app.get(app, {})).values())

    async def wait_for(self, check: Callable[[], T | None], timeout: float, recheck: float = 1.0, *,
                       app: str | None = None) -> T | None:
        """Return ``check()``'s first non-None value, re-evaluated on every event of ``app``'s pods
        (of any pod without ``app``) and every ``recheck`` seconds, for time-based conditions;
        ``None`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            changed = self._changed if app is None else self._app_event(app)
            try:
                result = check()
                if result is not None:
                    return result
                remaining = deadline - time.monotonic()
                if remaining <= 0 or changed is None:
                    return None
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(changed.wait(), min(remaining, recheck))
            finally:
                if app is not None and changed is not None:
                    self._app_event_done(app, changed)

    def _app_event(self, app: str) -> asyncio.Event | None:
        """The event the next change of ``app``'s pods sets, this waiter counted on it."""
        if self._changed is None:
            return None
        event, waiters = self._app_changed.get(app) or (asyncio.Event(), 0)
        self._app_changed[app] = (event, waiters + 1)
        return event

    def _app_event_done(self, app: str, event: asyncio.Event) -> None:
        entry = self._app_changed.get(app)
        if entry is None or entry[0] is not event:  # set and dropped already (a later wait has its own)
            return
        if entry[1] <= 1:
            del self._app_changed[app]
        else:
            self._app_changed[app] = (event, entry[1] - 1)

    async def wait_synced(self, timeout: float) -> bool:
        return await self.wait_for(lambda: True if self.synced.is_set() else None, timeout, 0.05) is not None

    # -- the thread --

    def _notify(self, apps: frozenset[str] | None) -> None:
        """On the loop: wake the waits for ``apps`` (for every app after a relist) and the
        waits for any pod."""
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()
        for app in list(self._app_changed) if apps is None else apps:
            entry = self._app_changed.pop(app, None)
            if entry is not None:
                entry[0].set()

    def _signal(self, apps: frozenset[str] | None = None) -> None:
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._notify, apps)

    def _run(self) -> None:
        rv: str | None = None
        backoff = 0.5
        while not self._stopped.is_set():
            try:
                if rv is None:
                    rv = self._relist()
                rv = self._watch(rv)
                backoff = 0.5
            except Exception as exc:  # noqa: BLE001 - network, API server restart, RBAC: retry with back-off
                if self._stopped.is_set():
                    break
                self.last_error = f"{exc.__class__.__name__}: {exc}"
                log.warning("pod informer for namespace %s: %s; retrying", self.namespace, self.last_error)
                self._stopped.wait(backoff)
                backoff = min(backoff * 2, 10.0)
            finally:
                self._resp = None

    def _relist(self) -> str:
        resp = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector,
                                             _preload_content=False, _request_timeout=30)
        data = json.loads(resp.data)
        with self._lock:
            self._pods = {}
            self._by_app = {}
            for pod in data.get("items") or []:
                self._put(pod)
        self.synced.set()
        self._signal()
        return data["metadata"]["resourceVersion"]

    def _watch(self, rv: str) -> str | None:
        resp = self.core.list_namespaced_pod(
            self.namespace, label_selector=self.selector, watch=True, resource_version=rv,
            allow_watch_bookmarks=True, timeout_seconds=self.watch_timeout, _preload_content=False,
            _request_timeout=(10, self.watch_timeout + 30))
        self._resp = resp
        if self._stopped.is_set():
            return rv
        try:
            for line in iter_resp_lines(resp):
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:  # our version left the server's window: list again
                        return None
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                rv = obj.get("metadata", {}).get("resourceVersion") or rv
                if kind == "BOOKMARK":
                    continue
                with self._lock:
                    before = self._drop(obj["metadata"]["name"])
                    if kind != "DELETED":
                        self._put(obj)
                self._signal(frozenset(a for a in (_app(before), _app(obj)) if a is not None))
        finally:
            with contextlib.suppress(Exception):
                resp.release_conn()
        return rv

    def _put(self, pod: dict[str, Any]) -> None:  # under the lock
        name = pod["metadata"]["name"]
        self._pods[name] = pod
        app = _app(pod)
        if app is not None:
            self._by_app.setdefault(app, {})[name] = pod

    def _drop(self, name: str) -> dict[str, Any] | None:  # under the lock
        pod = self._pods.pop(name, None)
        app = _app(pod)
        if app is not None:
            same = self._by_app.get(app, {})
            same.pop(name, None)
            if not same:
                self._by_app.pop(app, None)
        return pod


def _app(pod: dict[str, Any] | None) -> str | None:
    return None if pod is None else (pod["metadata"].get("labels") or {}).get("app")
