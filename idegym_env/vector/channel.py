"""A direct line between the driver (the process that holds a ``RayVectorEnv``: a Ray driver, or an
RLlib EnvRunner actor) and a sub-env actor on the same node.

A Ray actor call costs about 1.5 ms of CPU on a small machine, most of it in Ray's per-task
Python (argument and result serialisation, task events, signal and process-title handling), the
same whatever the call carries. A vector step sends one call per actor; on the driver's node it
goes over this channel instead: one Unix socket per actor, pickled batches each way, served by a
thread of the actor that blocks on the socket (Ray's compiled graphs do the same over shared
memory, but their readers spin: on two cores they took more CPU than the calls they replace).

The socket is in the abstract namespace (nothing on disk to leak when an actor is killed; the
sandboxes have their own network namespace and cannot see it) and is accepted once, by whoever
answers the HMAC challenge of a 32-byte key the driver made and passed through Ray. Every other
call (describe, rebuild, call, set_attr, render, close) still goes through Ray.
"""

from __future__ import annotations

import os
import pickle
import secrets
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from ray import cloudpickle

from ..errors import IdeGymError

KEY_BYTES = 32


def dumps(value: Any) -> bytes:
    """``value`` pickled; by value (cloudpickle, as Ray would) for what plain pickle refuses."""
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return cloudpickle.dumps(value)


class ChannelServer:
    """The actor's end: accepts the driver's connection and answers each batch with ``handle``."""

    def __init__(self, handle: Callable[[Any], Any], authkey: bytes) -> None:
        if len(authkey) != KEY_BYTES:
            raise ValueError(f"a channel key has {KEY_BYTES} bytes, got {len(authkey)}")
        self._handle = handle
        self._listener = Listener(f"\0idegym-vector-{os.getpid()}-{secrets.token_hex(8)}", "AF_UNIX",
                                  authkey=authkey)
        self.address: str = self._listener.address
        self._thread = threading.Thread(target=self._serve, name="idegym-vector-channel", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            conn = self._accept()
        finally:
            self._listener.close()  # one connection: nobody else can connect afterwards
        if conn is None:
            return
        with conn:
            while True:
                try:
                    request = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    return  # the driver closed its end, or went away
                try:
                    answer = dumps((True, self._handle(request)))
                except Exception as exc:  # noqa: BLE001 - an unpicklable result: the batch's failure
                    answer = dumps((False, f"{type(exc).__name__}: {exc}"))
                try:
                    conn.send_bytes(answer)
                except OSError:
                    return

    def _accept(self) -> Connection | None:
        while True:
            try:
                return self._listener.accept()
            except OSError:
                return None  # the listener was closed
            except Exception:  # noqa: BLE001 - AuthenticationError, a peer that hung up mid-handshake: not ours
                continue


def connect(address: str, authkey: bytes) -> Connection:
    """The driver's end of the channel at ``address``."""
    return Client(address, "AF_UNIX", authkey=authkey)


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


class ChannelClosed(IdeGymError):
    """The actor's end went away: its process died, or it hung up."""


class BatchFailed(IdeGymError):
    """The actor ran the batch but could not send its answer back (a result that does not pickle)."""


def send(conn: Connection, request: Any) -> None:
    try:
        conn.send_bytes(dumps(request))
    except OSError as exc:
        raise ChannelClosed(f"{type(exc).__name__}: {exc}") from exc


def receive(conn: Connection, deadline: float | None) -> Any:
    """The answer to the last request; TimeoutError past ``deadline`` (``time.monotonic``)."""
    timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
    try:
        ready = conn.poll(timeout)
        if ready:
            ok, value = pickle.loads(conn.recv_bytes())
    except (EOFError, OSError) as exc:
        raise ChannelClosed(f"{type(exc).__name__}: {exc}") from exc
    if not ready:
        raise TimeoutError  # (outside the try: TimeoutError is an OSError)
    if not ok:
        raise BatchFailed(f"the actor could not send its answer: {value}")
    return value


__all__ = ["BatchFailed", "ChannelClosed", "ChannelServer", "connect", "new_key", "receive", "send"]
