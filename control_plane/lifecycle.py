"""The availability state machine of servers and clients. Every status change goes through here.

Servers::

    (new) ──► ALIVE ◄──────────────┐ restart / RESTART reuse / first call after RESET
                │ finish           │
                ▼                  │
            FINISHED ──claim──► REUSED
                │
    any non-terminal ──► STOPPED | KILLED | CRASHED | DELETION_FAILED | RESTART_FAILED
    ALIVE (while starting) ──► FAILED_TO_START
    DELETION_FAILED ──stopped again──► STOPPED (or DELETION_FAILED, with the new reason)

Terminal statuses never change again, but for a retried delete's (servers and clients alike: a
sandbox that was not deleted may still be); usable ones (ALIVE, REUSED) accept forwarded calls.
The store applies every change as a compare-and-set guarded by ``server_guard``/``client_guard``
(so two replicas cannot both claim one FINISHED server); the changes the store makes on its own
(a claim, activity on a REUSED server) are named here as ``CLAIM`` and ``ON_ACTIVITY``.
"""

from __future__ import annotations

from collections.abc import Iterable

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
    A.DELETION_FAILED: frozenset({A.STOPPED, A.DELETION_FAILED}),  # its sandbox deleted on a retry, or not
}

CLIENT_TRANSITIONS: dict[A, frozenset[A]] = {
    A.ALIVE: frozenset({A.ALIVE, A.FINISHED, A.STOPPED, A.KILLED, A.DELETION_FAILED}),
    A.FINISHED: frozenset({A.ALIVE, A.FINISHED, A.STOPPED, A.KILLED, A.DELETION_FAILED}),
    A.REUSED: frozenset(),
    **{t: frozenset() for t in TERMINAL},
    A.DELETION_FAILED: frozenset({A.STOPPED, A.DELETION_FAILED}),
}


class IllegalTransition(Exception):
    def __init__(self, kind: str, current: A, target: A) -> None:
        super().__init__(f"{kind} cannot go from {current.value} to {target.value}")
        self.current = current
        self.target = target


def check_server(current: A, target: A) -> None:
    if target not in SERVER_TRANSITIONS[current]:
        raise IllegalTransition("server", current, target)


CLAIM = (A.FINISHED, A.REUSED)  # a start request takes over a finished server
ON_ACTIVITY = {A.REUSED: A.ALIVE}  # a reused server that is used again is alive
for _current, _target in (CLAIM, *ON_ACTIVITY.items()):
    check_server(_current, _target)


def server_guard(target: A, only_from: Iterable[A] | None = None) -> frozenset[A]:
    """The statuses a server may move to ``target`` from, narrowed to ``only_from``; asking for a
    change the state machine never allows raises ``IllegalTransition`` (a bug, not a race)."""
    return _guard("server", SERVER_TRANSITIONS, target, only_from)


def client_guard(target: A, only_from: Iterable[A] | None = None) -> frozenset[A]:
    return _guard("client", CLIENT_TRANSITIONS, target, only_from)


def _guard(kind: str, table: dict[A, frozenset[A]], target: A, only_from: Iterable[A] | None) -> frozenset[A]:
    sources = frozenset(src for src, targets in table.items() if target in targets)
    if only_from is None:
        return sources
    wanted = frozenset(only_from)
    for current in wanted - sources:
        raise IllegalTransition(kind, current, target)
    return wanted


def is_terminal(status: A) -> bool:
    return status in TERMINAL


def is_usable(status: A) -> bool:
    return status in USABLE
