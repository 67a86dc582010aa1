"""What went wrong in a slot, and collecting the answers of many actors when some fail."""

from __future__ import annotations

import time
from typing import Any

import ray
from ray.exceptions import (
    ActorUnavailableError,
    ActorUnschedulableError,
    GetTimeoutError,
    NodeDiedError,
    RayActorError,
    RayError,
    RayTaskError,
    TaskUnschedulableError,
    WorkerCrashedError,
)

from ..errors import IdeGymError


class SlotFailure(IdeGymError):
    """What went wrong in one slot: ``kind`` is ``actor_died``, ``env_error`` or ``timeout``;
    ``node_lost`` when the actor went with its node."""

    def __init__(self, kind: str, message: str, *, node_lost: bool = False) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.node_lost = node_lost


def lost_with_node(exc: BaseException) -> bool:
    """The error says the actor's (or task's) node died or stopped answering.

    A SIGKILLed node shows as ``ActorUnavailableError`` (its socket closed) for about 15 s
    before Ray calls it dead; a node that shut down shows as ``ActorDiedError`` "because its
    node has died"; work sent to a node that Ray has since called dead is unschedulable there.
    """
    if isinstance(exc, (ActorUnavailableError, NodeDiedError, WorkerCrashedError, ActorUnschedulableError,
                        TaskUnschedulableError)):
        return True
    return isinstance(exc, RayError) and "node has died" in str(exc)


def gather(refs: list[Any], timeout: float | None) -> list[Any]:
    """Results of ``refs`` in order; a failed call's entry is a :class:`SlotFailure`."""
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        return ray.get(refs, timeout=timeout)  # the common case: one round of waiting
    except (RayError, GetTimeoutError):
        pass
    remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=remaining)
    done = set(ready)
    out: list[Any] = []
    for ref in refs:
        if ref not in done:
            out.append(SlotFailure("timeout", f"no answer within step_timeout={timeout:g} s"))
            continue
        try:
            out.append(ray.get(ref))
        except RayActorError as exc:
            out.append(SlotFailure("actor_died", reason(exc), node_lost=lost_with_node(exc)))
        except RayTaskError as exc:
            out.append(SlotFailure("env_error", reason(exc)))
        except RayError as exc:
            out.append(SlotFailure("actor_died", reason(exc), node_lost=lost_with_node(exc)))
    return out


def reason(exc: BaseException, limit: int = 2000) -> str:
    """A readable one-paragraph reason: the env's own exception for task errors, else Ray's."""
    cause = getattr(exc, "cause", None)
    if isinstance(exc, RayTaskError) and isinstance(cause, BaseException):
        text = f"{type(cause).__name__}: {cause}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


__all__ = ["SlotFailure", "gather", "lost_with_node", "reason"]
