"""The arguments of ``idegym mcp serve`` and ``idegym mcp token``, importable without the ``mcp`` SDK
(``idegym --help``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..settings import add_control_plane_argument

DEFAULT_IDLE_TIMEOUT = 1800.0
DEFAULT_MAX_EPISODES_PER_SESSION = 4
DEFAULT_MAX_EPISODES = 16


def _token_dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--token-dir", type=Path, default=None, metavar="DIR",
                        help="where the token is kept: DIR/token (default: $XDG_STATE_HOME/idegym-mcp, else "
                             "~/.local/state/idegym-mcp)")


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", help="the default task: a bundled task id or a task directory")
    parser.add_argument("--allow-task", action="append", dest="allowed_tasks", metavar="ID",
                        help="a bundled task id reset may name (repeatable; default: every bundled task)")
    parser.add_argument("--transport", choices=("stdio", "streamable-http"), default="stdio")
    parser.add_argument("--host", default="127.0.0.1", help="streamable-http: address to listen on")
    parser.add_argument("--port", type=int, default=8765, help="streamable-http: port (0 picks a free one)")
    parser.add_argument("--path", default="/mcp", help="streamable-http: the endpoint's path")
    parser.add_argument("--auth", choices=("token", "none"), default="token",
                        help="streamable-http: 'token' (default) requires the token of --token-dir (made on first "
                             "start; `idegym mcp token` prints it) as a Bearer token or as HTTP Basic password of "
                             "user 'idegym'; 'none' lets anyone who can connect run commands in sandboxes")
    _token_dir_argument(parser)
    add_control_plane_argument(parser)
    parser.add_argument("--max-steps", type=int, default=None, help="tool calls per episode (default: the task's)")
    parser.add_argument("--bash-timeout", type=float, default=120.0,
                        help="the most a bash call may run, and its timeout when it names none")
    parser.add_argument("--max-episodes-per-session", type=int, default=DEFAULT_MAX_EPISODES_PER_SESSION,
                        metavar="N", help="episodes one connection (an HTTP session; stdio's client) may have at "
                                          "once, its own and reset(new=true)'s (default "
                                          f"{DEFAULT_MAX_EPISODES_PER_SESSION})")
    parser.add_argument("--max-episodes", type=int, default=DEFAULT_MAX_EPISODES, metavar="N",
                        help=f"episodes of all connections at once (default {DEFAULT_MAX_EPISODES})")
    parser.add_argument("--session-idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT,
                        help="end an episode (and an HTTP session) after this many seconds without a call")


def add_token_arguments(parser: argparse.ArgumentParser) -> None:
    _token_dir_argument(parser)


def run_token(args: argparse.Namespace) -> int:
    """Print the token ``idegym mcp serve`` requires over HTTP (made if there is none)."""
    from control_plane.auth import TokenFileError

    from .mcp_token import ensure_mcp_token

    try:
        _, token = ensure_mcp_token(args.token_dir)
    except (OSError, TokenFileError) as exc:
        print(f"idegym mcp token: {exc}", file=sys.stderr)
        return 2
    print(token)
    return 0


__all__ = ["add_serve_arguments", "add_token_arguments", "run_token", "DEFAULT_IDLE_TIMEOUT",
           "DEFAULT_MAX_EPISODES", "DEFAULT_MAX_EPISODES_PER_SESSION"]
