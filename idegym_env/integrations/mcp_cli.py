"""The arguments of ``idegym mcp serve``, importable without the ``mcp`` SDK (``idegym --help``)."""

from __future__ import annotations

import argparse

DEFAULT_IDLE_TIMEOUT = 1800.0


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", help="the default task: a bundled task id or a task directory")
    parser.add_argument("--allow-task", action="append", dest="allowed_tasks", metavar="ID",
                        help="a bundled task id reset may name (repeatable; default: every bundled task)")
    parser.add_argument("--transport", choices=("stdio", "streamable-http"), default="stdio")
    parser.add_argument("--host", default="127.0.0.1", help="streamable-http: address to listen on")
    parser.add_argument("--port", type=int, default=8765, help="streamable-http: port (0 picks a free one)")
    parser.add_argument("--path", default="/mcp", help="streamable-http: the endpoint's path")
    parser.add_argument("--control-plane-url", default=None,
                        help="where sandboxes come from (default: $IDEGYM_URL, else the embedded control plane)")
    parser.add_argument("--max-steps", type=int, default=None, help="tool calls per episode (default: the task's)")
    parser.add_argument("--bash-timeout", type=float, default=120.0, help="default timeout of a bash call")
    parser.add_argument("--session-idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT,
                        help="streamable-http: end a session's episode after this many seconds without a request")


__all__ = ["add_serve_arguments", "DEFAULT_IDLE_TIMEOUT"]
