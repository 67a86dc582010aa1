"""The simulator's etcd: objects, one global resourceVersion, watch history and listeners.

Everything runs on one asyncio loop, so a read-modify-write inside one callback is atomic.
Objects are stored as JSON-ready dicts; every event carries a deep copy taken when it happened.
"""

from __future__ import annotations

import asyncio
import copy
import re
import secrets
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    """Becomes a ``Status`` object with the given code and reason."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def status(self) -> dict[str, Any]:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "details": self.details, "code": self.code}


def not_found(resource: str, name: str) -> ApiError:
    kind = resource.split(".")[0]
    return ApiError(404, "NotFound", f'{kind} "{name}" not found', {"name": name, "kind": kind})


@dataclass(frozen=True)
class Resource:
    """One REST resource: ``key`` is ``plural`` or ``plural.group`` (like kubectl spells it)."""

    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def key(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


@dataclass
class Event:
    rv: int
    resource: str
    type: str  # ADDED | MODIFIED | DELETED
    obj: dict[str, Any]


# -- selectors ----------------------------------------------------------------------------------

_SET_TERM = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_terms(selector: str) -> list[str]:
    """Split on commas that are not inside ``(...)``."""
    terms, depth, cur = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        terms.append(cur)
    return [t.strip() for t in terms if t.strip()]


def label_matcher(selector: str | None) -> Callable[[dict[str, str]], bool]:
    """Kubernetes label selector syntax: ``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``, ``a in (x,y)``,
    ``a notin (x)``. Raises ``ApiError`` 400 for syntax it cannot parse."""
    if not selector:
        return lambda labels: True
    checks: list[Callable[[dict[str, str]], bool]] = []
    for term in _split_terms(selector):
        if m := _SET_TERM.match(term):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",") if v.strip()}
            if op == "in":
                checks.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                checks.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif "=" in term:
            key, value = (s.strip() for s in re.split(r"==?", term, maxsplit=1))
            checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif term.startswith("!"):
            absent = term[1:].strip()
            checks.append(lambda labels, k=absent: k not in labels)
        elif re.fullmatch(r"[A-Za-z0-9./_-]+", term):
            checks.append(lambda labels, k=term: k in labels)
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {term!r}")
    return lambda labels: all(check(labels) for check in checks)


def match_label_selector_obj(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A ``LabelSelector`` object (matchLabels + matchExpressions). An empty selector matches all."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _path_value(obj: dict[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def field_matcher(selector: str | None) -> Callable[[dict[str, Any]], bool]:
    """Field selectors: dotted paths with ``=``, ``==`` or ``!=`` (e.g. ``metadata.name=x``)."""
    if not selector:
        return lambda obj: True
    checks = []
    for term in _split_terms(selector):
        if "!=" in term:
            path, value = (s.strip() for s in term.split("!=", 1))
            checks.append(lambda o, p=path, v=value: _path_value(o, p) != v)
        elif "=" in term:
            path, value = (s.strip() for s in re.split(r"==?", term, maxsplit=1))
            checks.append(lambda o, p=path, v=value: _path_value(o, p) == v)
        else:
            raise ApiError(400, "BadRequest", f"invalid field selector: {term!r}")
    return lambda obj: all(check(obj) for check in checks)


# -- patches ------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (``null`` deletes a key, lists are replaced)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 subset: add, replace, remove, test."""
    doc = copy.deepcopy(target)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        parent: Any = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.setdefault(part, {})
        last = parts[-1]
        kind = op["op"]
        if kind in ("add", "replace"):
            if isinstance(parent, list):
                idx = len(parent) if last == "-" else int(last)
                if kind == "add":
                    parent.insert(idx, op["value"])
                else:
                    parent[idx] = op["value"]
            else:
                if kind == "replace" and last not in parent:
                    raise ApiError(422, "Invalid", f"replace of missing path {op['path']}")
                parent[last] = op["value"]
        elif kind == "remove":
            try:
                del parent[int(last) if isinstance(parent, list) else last]
            except (KeyError, IndexError) as exc:
                raise ApiError(422, "Invalid", f"remove of missing path {op['path']}") from exc
        elif kind == "test":
            current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if current != op.get("value"):
                raise ApiError(422, "Invalid", f"test failed at {op['path']}")
        else:
            raise ApiError(415, "UnsupportedMediaType", f"json patch op {kind!r} is not supported")
    return doc


# -- the store ----------------------------------------------------------------------------------

Listener = Callable[[Event], None]


@dataclass
class _Watch:
    resource: str
    namespace: str | None
    queue: asyncio.Queue[Event | None] = field(default_factory=asyncio.Queue)


class Store:
    """Objects by (resource key, namespace, name). Namespace is ``""`` for cluster-scoped ones."""

    HISTORY = 10_000

    def __init__(self) -> None:
        self.rv = 0
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.history: deque[Event] = deque(maxlen=self.HISTORY)
        self.watches: list[_Watch] = []
        self.listeners: list[Listener] = []

    # -- reads --

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        obj = self.objects.get((resource, namespace, name))
        if obj is None:
            raise not_found(resource, name)
        return obj

    def find(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((resource, namespace, name))

    def list(self, resource: str, namespace: str | None = None, labels: str | None = None,
             fields: str | None = None) -> list[dict[str, Any]]:
        lm, fm = label_matcher(labels), field_matcher(fields)
        return [o for (r, ns, _), o in sorted(self.objects.items())
                if r == resource and (namespace is None or ns == namespace)
                and lm(o["metadata"].get("labels") or {}) and fm(o)]

    def oldest_rv(self) -> int:
        return self.history[0].rv if self.history else self.rv

    # -- writes --

    def _bump(self, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def _emit(self, resource: str, kind: str, obj: dict[str, Any]) -> None:
        event = Event(int(obj["metadata"]["resourceVersion"]), resource, kind, copy.deepcopy(obj))
        self.history.append(event)
        for watch in self.watches:
            if watch.resource == resource and (watch.namespace is None
                                               or watch.namespace == obj["metadata"].get("namespace", "")):
                watch.queue.put_nowait(event)
        for listener in list(self.listeners):
            listener(event)

    def create(self, resource: str, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        name = meta.get("name")
        if not name:
            raise ApiError(422, "Invalid", "metadata.name: Required value: name or generateName is required")
        if namespace:
            meta["namespace"] = namespace
        if (resource, namespace, name) in self.objects:
            raise ApiError(409, "AlreadyExists", f'{resource} "{name}" already exists',
                           {"name": name, "kind": resource})
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta["generation"] = 1
        meta.pop("resourceVersion", None)
        self._bump(obj)
        self.objects[(resource, namespace, name)] = obj
        self._emit(resource, "ADDED", obj)
        return obj

    def update(self, resource: str, namespace: str, name: str, obj: dict[str, Any],
               check_rv: bool = True) -> dict[str, Any]:
        """Replace (PUT). A stale ``metadata.resourceVersion`` is a 409 Conflict, as on a real server."""
        current = self.get(resource, namespace, name)
        sent_rv = (obj.get("metadata") or {}).get("resourceVersion")
        if check_rv and sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict",
                           f'Operation cannot be fulfilled on {resource} "{name}": the object has been '
                           "modified; please apply your changes to the latest version and try again",
                           {"name": name, "kind": resource})
        new = copy.deepcopy(obj)
        meta = new.setdefault("metadata", {})
        for key in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp",
                    "deletionGracePeriodSeconds"):
            if key in current["metadata"]:
                meta[key] = current["metadata"][key]
        generation = current["metadata"].get("generation", 1)
        if new.get("spec") != current.get("spec"):
            generation += 1
        meta["generation"] = generation
        if "status" not in new and "status" in current:
            new["status"] = current["status"]
        if new == current:
            return current  # a no-op write does not bump the version (as the API server)
        self._bump(new)
        self.objects[(resource, namespace, name)] = new
        self._emit(resource, "MODIFIED", new)
        return new

    def set_status(self, resource: str, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
        """Controllers' status writes; skipped when nothing changed, so no event storms."""
        current = self.find(resource, namespace, name)
        if current is None or current.get("status") == status:
            return current
        current = copy.deepcopy(current)
        current["status"] = copy.deepcopy(status)
        self._bump(current)
        self.objects[(resource, namespace, name)] = current
        self._emit(resource, "MODIFIED", current)
        return current

    def patch(self, resource: str, namespace: str, name: str, body: Any, content_type: str,
              admit: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> dict[str, Any]:
        current = self.get(resource, namespace, name)
        if "json-patch" in content_type:
            if not isinstance(body, list):
                raise ApiError(400, "BadRequest", "a JSON patch must be a list of operations")
            patched = json_patch(current, body)
        elif "merge-patch" in content_type:  # merge-patch+json and strategic-merge-patch+json
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "a merge patch must be an object")
            patched = merge_patch(current, body)
        else:
            raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format "
                           f"- accepted media types include: application/json-patch+json, "
                           f"application/merge-patch+json, application/strategic-merge-patch+json "
                           f"(got {content_type!r})")
        if admit is not None:
            patched = admit(patched)
        patched["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        return self.update(resource, namespace, name, patched)

    def mark_deleting(self, resource: str, namespace: str, name: str, grace: int) -> dict[str, Any]:
        """Graceful deletion: the object stays, with a deletionTimestamp, until its owner finalizes it."""
        current = copy.deepcopy(self.get(resource, namespace, name))
        if current["metadata"].get("deletionTimestamp"):
            return current
        current["metadata"]["deletionTimestamp"] = now_rfc3339()
        current["metadata"]["deletionGracePeriodSeconds"] = grace
        self._bump(current)
        self.objects[(resource, namespace, name)] = current
        self._emit(resource, "MODIFIED", current)
        return current

    def remove(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        obj = self.objects.pop((resource, namespace, name), None)
        if obj is None:
            raise not_found(resource, name)
        obj = copy.deepcopy(obj)
        self._bump(obj)  # a DELETED event carries a new resourceVersion
        self._emit(resource, "DELETED", obj)
        return obj

    # -- watches --

    def open_watch(self, resource: str, namespace: str | None) -> _Watch:
        watch = _Watch(resource, namespace)
        self.watches.append(watch)
        return watch

    def close_watch(self, watch: _Watch) -> None:
        if watch in self.watches:
            self.watches.remove(watch)

    def history_since(self, resource: str, namespace: str | None, rv: int) -> list[Event]:
        return [e for e in self.history if e.rv > rv and e.resource == resource
                and (namespace is None or e.obj["metadata"].get("namespace", "") == namespace)]

    def owned_by(self, uid: str) -> list[tuple[str, str, str]]:
        return [key for key, obj in self.objects.items()
                if any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])]
