"""The availability state machine of servers and clients. Every status change goes through here.

Servers::

    (new) ──► ALIVE ◄──────────────┐ restart / RESTART reuse / first call after RESET
                │ finish           │
                ▼                  │
            FINISHED ──claim──► REUSED
                │
    any non-terminal ──► STOPPED | KILLED | CRASHED | DELETION_FAILED | RESTART_FAILED
    ALIVE (while starting) ──► FAILED_TO_START

Terminal statuses never change again; usable ones (ALIVE, REUSED) accept forwarded calls.
"""

from __future__ import annotations

from .models import AvailabilityStatus as A

TERMINAL = frozenset({A.FAILED_TO_START, A.KILLED, A.STOPPED, A.CRASHED, A.DELETION_FAILED, A.RESTART_FAILED})
USABLE = frozenset({A.ALIVE, A.REUSED})
LIVE = frozenset({A.ALIVE, A.REUSED, A.FINISHED})  # a sandbox exists behind these

_ENDINGS = {A.STOPPED, A.KILLED, A.CRASHED, A.DELETION_FAILED}

SERVER_TRANSITIONS: dict[A, frozenset[A]] = {
    A.ALIVE: frozenset({A.ALIVE, A.FINISHED, A.FAILED_TO_START, A.RESTART_FAILED} | _ENDINGS),
    A.REUSED: frozenset({A.ALIVE, A.REUSED, A.FINISHED, A.RESTART_FAILED} | _ENDINGS),
    A.FINISHED: frozenset({A.REUSED} | _ENDINGS),
    **{t: frozenset() for t in TERMINAL},
}

CLIENT_TRANSITIONS: dict[A, frozenset[A]] = {
    A.ALIVE: frozenset({A.ALIVE, A.FINISHED, A.STOPPED, A.KILLED, A.DELETION_FAILED}),
    A.FINISHED: frozenset({A.ALIVE, A.FINISHED, A.STOPPED, A.KILLED, A.DELETION_FAILED}),
    A.REUSED: frozenset(),
    **{t: frozenset() for t in TERMINAL},
}


class IllegalTransition(Exception):
    def __init__(self, kind: str, current: A, target: A) -> None:
        super().__init__(f"{kind} cannot go from {current.value} to {target.value}")
        self.current = current
        self.target = target


def server_sources(target: A) -> frozenset[A]:
    """Statuses a server may move to ``target`` from (used as a compare-and-set guard)."""
    return frozenset(src for src, targets in SERVER_TRANSITIONS.items() if target in targets)


def client_sources(target: A) -> frozenset[A]:
    return frozenset(src for src, targets in CLIENT_TRANSITIONS.items() if target in targets)


def check_server(current: A, target: A) -> None:
    if target not in SERVER_TRANSITIONS[current]:
        raise IllegalTransition("server", current, target)


def is_terminal(status: A) -> bool:
    return status in TERMINAL


def is_usable(status: A) -> bool:
    return status in USABLE
