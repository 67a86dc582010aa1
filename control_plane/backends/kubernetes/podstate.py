"""Reading a pod (as the API's JSON dict) the way a person reading ``kubectl describe`` would:
is it ready, how often did the server restart, and if it is stuck, why - in the pod's own words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..base import Observation
from .manifests import CONTAINER

# image-pull failures that no amount of waiting fixes
NOT_FOUND_MARKERS = ("not found", "notfound", "manifest unknown", "name unknown", "repository does not exist")


def conditions(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}


def is_ready(pod: dict[str, Any]) -> bool:
    return conditions(pod).get("Ready", {}).get("status") == "True" and not is_terminating(pod)


def is_terminating(pod: dict[str, Any]) -> bool:
    return bool(pod.get("metadata", {}).get("deletionTimestamp"))


def server_status(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((s for s in statuses if s.get("name") == CONTAINER), statuses[0] if statuses else {})


def restarts(pod: dict[str, Any]) -> int:
    return int(server_status(pod).get("restartCount") or 0)


def newest(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    live = [p for p in pods if not is_terminating(p)] or pods
    return max(live, key=lambda p: p["metadata"].get("creationTimestamp", ""), default=None)


@dataclass
class Verdict:
    """Why a pod is not ready. ``fatal``: waiting longer will not help."""

    reason: str
    message: str
    fatal: bool = False
    image_missing: bool = False

    def text(self) -> str:
        return f"{self.reason}: {self.message}" if self.message else self.reason


def _crash_text(status: dict[str, Any]) -> str:
    term = (status.get("lastState") or {}).get("terminated") or (status.get("state") or {}).get("terminated") or {}
    count = int(status.get("restartCount") or 0)
    text = f"container {status.get('name', CONTAINER)} exited with code {term.get('exitCode', '?')}"
    if term.get("reason"):
        text += f" ({term['reason']})"
    if count:
        text += f", restarted {count} time(s)"
    message = (term.get("message") or "").strip()
    if message:
        text += ": " + message.splitlines()[-1][:500]
    return text


def diagnose(pod: dict[str, Any], max_restarts: int | None = None) -> Verdict | None:
    """``None`` when ready; otherwise the most specific reason the pod gives.

    ``max_restarts`` makes a crash fatal once the restart count exceeds it (the rule of
    ``specs/control-plane-api.yaml``: 0 gives up on the first crash).
    """
    if is_ready(pod):
        return None
    if is_terminating(pod):
        return Verdict("Terminating", "the pod is being deleted")
    conds = conditions(pod)
    scheduled = conds.get("PodScheduled", {})
    if scheduled.get("status") == "False":
        return Verdict(scheduled.get("reason") or "Unschedulable", scheduled.get("message") or "")
    phase = (pod.get("status") or {}).get("phase")
    status = server_status(pod)
    if phase in ("Failed", "Succeeded"):
        return Verdict(f"Pod{phase}", _crash_text(status) if status else (pod.get("status") or {}).get("message", ""),
                       fatal=True)
    waiting = (status.get("state") or {}).get("waiting") or {}
    reason, message = waiting.get("reason") or "", waiting.get("message") or ""
    if reason in ("ErrImagePull", "ImagePullBackOff"):
        missing = any(m in message.lower() for m in NOT_FOUND_MARKERS)
        return Verdict(reason, message, fatal=missing, image_missing=missing)
    if reason in ("InvalidImageName", "ErrImageNeverPull"):
        return Verdict(reason, message, fatal=True)
    crashed = int(status.get("restartCount") or 0)
    if reason == "CrashLoopBackOff" or (crashed and (status.get("lastState") or {}).get("terminated")):
        fatal = max_restarts is not None and crashed > max_restarts
        return Verdict(reason or "Crashed", _crash_text(status), fatal=fatal)
    if reason:
        return Verdict(reason, message)
    if "running" in (status.get("state") or {}):
        ready = conds.get("ContainersReady") or conds.get("Ready") or {}
        return Verdict(ready.get("reason") or "NotReady",
                       ready.get("message") or "the readiness probe has not passed yet")
    return Verdict(phase or "Pending", (pod.get("status") or {}).get("message") or "")


def keeps_running(pod: dict[str, Any]) -> bool:
    """The server runs, or the kubelet is restarting it (a back-off between crashes): Kubernetes
    restarts containers itself, so only ``restarts`` against ``max_restarts`` decides a crash."""
    if is_terminating(pod) or (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
        return False
    status = server_status(pod)
    state = status.get("state") or {}
    return "running" in state or (int(status.get("restartCount") or 0) > 0 and "waiting" in state)


def observe(pods: list[dict[str, Any]], exists: bool) -> Observation:
    pod = newest(pods)
    if pod is None:
        return Observation(exists=exists, running=False, ready=False,
                           reason="no pod exists for this server" if exists else "the server's resources are gone")
    verdict = diagnose(pod)
    return Observation(
        exists=True,
        running=keeps_running(pod),
        ready=verdict is None,
        restarts=restarts(pod),
        phase=(pod.get("status") or {}).get("phase"),
        reason=verdict.text() if verdict else None,
    )
