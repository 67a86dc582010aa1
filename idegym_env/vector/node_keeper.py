"""``python -m idegym_env.vector.node_keeper``: one Ray node's embedded control plane, for as long as
its owner lives.

The owner, a :class:`~idegym_env.vector.node_control_plane.NodeControlPlane` actor, starts the
keeper detached and keeps the write end of a pipe (the lifeline) whose read end only the keeper
holds. When the owner's process ends, however it ends (closed, killed, or its Ray node gone),
the pipe reaches end-of-file, and the keeper stops the control plane, which deletes its
sandboxes (``--ephemeral``) before it exits.

Why not simply the control plane's ``--parent-pid`` watch, with the actor as the parent: a Ray
worker SIGKILLs its child processes when it exits (Ray's ``kill_child_processes_on_worker_exit``),
so a control plane started by the actor itself dies without deleting its sandboxes, and they stay
behind — measured when the actor is killed and when its node is SIGKILLed. The keeper is not the
worker's child, so Ray leaves it alone; and a pipe, unlike a pid, ends with its process even
when nobody reaps that process (a worker whose raylet died is a zombie until init reaps it).

It writes one JSON line to ``--ready-fd``: ``{"url", "pid", "state_dir", "keeper_pid"}`` or
``{"error"}``. SIGTERM, SIGINT or SIGHUP also stop it, cleanly.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
from typing import Any

from ..embedded import EmbeddedControlPlane

POLL = 1.0  # seconds between checks that the control plane is still running


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m idegym_env.vector.node_keeper",
        description="Run an embedded control plane until the lifeline pipe closes.")
    parser.add_argument("--lifeline-fd", type=int, required=True)
    parser.add_argument("--ready-fd", type=int, required=True)
    parser.add_argument("--warm-pool", type=int, default=1)
    args = parser.parse_args(argv)

    stop = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        cp = EmbeddedControlPlane(warm_pool=args.warm_pool)
    except Exception as exc:  # noqa: BLE001 - reported to the owner, who raises it
        _answer(args.ready_fd, {"error": f"{type(exc).__name__}: {exc}"})
        return 1
    _answer(args.ready_fd, {"url": cp.url, "pid": cp.process.pid, "state_dir": str(cp.state_dir),
                            "keeper_pid": os.getpid()})
    try:
        while not stop and cp.process.poll() is None:
            ready, _, _ = select.select([args.lifeline_fd], [], [], POLL)
            if ready and not os.read(args.lifeline_fd, 4096):
                break  # end-of-file: the owner is gone
    finally:
        cp.close()
    return 0


def _answer(fd: int, message: dict[str, Any]) -> None:
    try:
        os.write(fd, (json.dumps(message) + "\n").encode())
    finally:
        os.close(fd)


if __name__ == "__main__":
    sys.exit(main())
