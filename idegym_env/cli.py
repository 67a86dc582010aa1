"""The ``idegym`` command: one entry point, one subcommand per job.

Only the chosen command's module is imported, to build its arguments and to run it. With every
one imported before parsing, `idegym --help` took 0.91 s of CPU and `idegym tasks list humaneval`
0.92; importing only the chosen one, 0.27 and 0.67 (medians of 5, load 6).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn


@dataclass(frozen=True)
class _Command:
    help: str
    add: Callable[[Any, str, str], None]  # (the subparsers, the name, help): the command's full parser
    run: Callable[[argparse.Namespace], None]


def _commands(sub: Any, name: str, dest: str, command_help: str, command_description: str) -> Any:
    """The subcommands of ``idegym NAME``."""
    command = sub.add_parser(name, help=command_help, description=command_description)
    return command.add_subparsers(dest=dest, required=True, metavar="COMMAND")


def _serve_parser(sub: Any, name: str, dest: str, command_help: str, command_description: str,
                  **serve: Any) -> argparse.ArgumentParser:
    """The parser of ``idegym NAME serve``, for a command whose subcommand runs a server."""
    return _commands(sub, name, dest, command_help, command_description).add_parser("serve", **serve)


def _add_sandbox(sub: Any, name: str, command_help: str) -> None:
    from sandbox_server.cli import add_serve_arguments

    add_serve_arguments(_serve_parser(
        sub, name, "sandbox_command", command_help, "The in-sandbox server.",
        help="run the sandbox server (tools, rewards, reset, code runner)",
        description="Run the sandbox server: bash and file tools, rewards, project reset and a code runner over "
                    "HTTP."))


def _run_sandbox(args: argparse.Namespace) -> None:
    from sandbox_server.cli import run_serve

    run_serve(args)


def _add_control_plane(sub: Any, name: str, command_help: str) -> None:
    from control_plane.cli import add_serve_arguments, add_tenants_arguments

    cp_commands = _commands(sub, name, "cp_command", command_help, "The IdeGym control plane.")
    add_serve_arguments(cp_commands.add_parser(
        "serve", help="run the control plane (local backend by default)",
        description="Run the control plane. With no options it runs on this machine: sandboxes are local "
                    "processes isolated with bubblewrap."))
    add_tenants_arguments(cp_commands.add_parser(
        "tenants", help="add or remove a tenant of a tenants file (serve --tenants)",
        description="Edit a tenants file: one 'NAME sha256:HEX' line per tenant (see serve --help, --tenants)."))


def _run_control_plane(args: argparse.Namespace) -> None:
    if args.cp_command == "tenants":
        from control_plane.cli import run_tenants

        sys.exit(run_tenants(args))
    from control_plane.cli import run_serve

    run_serve(args)


def _add_openenv(sub: Any, name: str, command_help: str) -> None:
    from .openenv.server import DESCRIPTION, EPILOG, add_serve_arguments

    add_serve_arguments(_serve_parser(
        sub, name, "openenv_command", command_help,
        "IdeGym episodes for OpenEnv's clients (pip install 'idegym[openenv]').",
        help="run an OpenEnv server for a task", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter))


def _run_openenv(args: argparse.Namespace) -> NoReturn:
    from .openenv.server import run_serve

    sys.exit(run_serve(args))


def _add_sandboxes(sub: Any, name: str, command_help: str) -> None:
    from control_plane.sandboxes_cli import add_arguments

    add_arguments(sub.add_parser(name, help=command_help,
                                 description="The local backend's sandboxes on this host: list them, or end them "
                                             "(prune) when their control plane is gone."))


def _run_sandboxes(args: argparse.Namespace) -> NoReturn:
    from control_plane.sandboxes_cli import run

    sys.exit(run(args))


def _add_mcp(sub: Any, name: str, command_help: str) -> None:
    from .integrations.mcp_cli import add_serve_arguments, add_token_arguments

    mcp = _commands(sub, name, "mcp_command", command_help,
                    "IdeGym episodes for MCP clients (pip install 'idegym[mcp]').")
    add_serve_arguments(mcp.add_parser("serve", help="run an MCP server whose tools act on an IdeGym episode",
                                       description="Run an MCP server whose tools (reset, bash, file tools, "
                                                   "run_checks, submit) act on an IdeGym episode."))
    add_token_arguments(mcp.add_parser(
        "token", help="print the token `idegym mcp serve` requires over HTTP (made if there is none)",
        description="Print the token `idegym mcp serve` requires over streamable HTTP; it is made (0600) if "
                    "there is none."))


def _run_mcp(args: argparse.Namespace) -> NoReturn:
    if args.mcp_command == "token":
        from .integrations.mcp_cli import run_token

        sys.exit(run_token(args))
    from .integrations.mcp import run_serve

    sys.exit(run_serve(args))


def _add_demo(sub: Any, name: str, command_help: str) -> None:
    sub.add_parser(name, help=command_help, description="Run a short real session end to end and print what "
                                                        "happened.")


def _run_demo(args: argparse.Namespace) -> NoReturn:
    from .demo import main as demo

    sys.exit(demo())


def _add_eval(sub: Any, name: str, command_help: str) -> None:
    from .eval.cli import DESCRIPTION, EPILOG, add_eval_arguments

    add_eval_arguments(sub.add_parser(name, help=command_help, description=DESCRIPTION, epilog=EPILOG,
                                      formatter_class=argparse.RawDescriptionHelpFormatter))


def _run_eval(args: argparse.Namespace) -> NoReturn:
    from .eval.cli import run_eval

    sys.exit(run_eval(args))


def _add_images(sub: Any, name: str, command_help: str) -> None:
    from control_plane.backends.local.oci.cli import DESCRIPTION, add_arguments

    add_arguments(sub.add_parser(name, help=command_help, description=DESCRIPTION))


def _run_images(args: argparse.Namespace) -> NoReturn:
    from control_plane.backends.local.oci.cli import run

    sys.exit(run(args))


def _add_tasks(sub: Any, name: str, command_help: str) -> None:
    from .tasks.sources.validate import DESCRIPTION, EPILOG, add_tasks_arguments

    add_tasks_arguments(sub.add_parser(name, help=command_help, description=DESCRIPTION, epilog=EPILOG,
                                       formatter_class=argparse.RawDescriptionHelpFormatter))


def _run_tasks(args: argparse.Namespace) -> NoReturn:
    from .tasks.sources.validate import run_tasks_command

    try:
        sys.exit(run_tasks_command(args))
    except BrokenPipeError:  # `idegym tasks list humaneval | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)


COMMANDS = {
    "sandbox": _Command("the in-sandbox server", _add_sandbox, _run_sandbox),
    "control-plane": _Command("the orchestrator (clients, servers, forwarding…)", _add_control_plane,
                              _run_control_plane),
    "openenv": _Command("serve IdeGym episodes with OpenEnv's protocol (/ws, /reset, /step…)", _add_openenv,
                        _run_openenv),
    "sandboxes": _Command("list or end the local sandboxes on this host", _add_sandboxes, _run_sandboxes),
    "mcp": _Command("serve IdeGym episodes as MCP tools (stdio or streamable HTTP)", _add_mcp, _run_mcp),
    "demo": _Command("run a short real session end to end and print what happened", _add_demo, _run_demo),
    "eval": _Command("run an agent on a set of tasks and report the pass rate", _add_eval, _run_eval),
    "images": _Command("the local image store: list, push to a registry", _add_images, _run_images),
    "tasks": _Command("list, show and validate the tasks of a source", _add_tasks, _run_tasks),
}


def main(argv: list[str] | None = None) -> None:
    try:
        _main(sys.argv[1:] if argv is None else argv)
    except Exception as exc:
        from sandbox_server.env_settings import SettingsError

        from .errors import ConfigurationError

        if not isinstance(exc, SettingsError | ConfigurationError):
            raise
        print(f"idegym: {exc}", file=sys.stderr)  # a variable that cannot be used: say which
        sys.exit(2)


def _main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="idegym",
        description="IdeGym: disposable coding sandboxes as reinforcement-learning environments.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # The command is the first word that is not an option: the top level has no option that takes one.
    chosen = next((word for word in argv if not word.startswith("-")), None)
    for name, command in COMMANDS.items():
        if name == chosen:
            command.add(sub, name, command.help)
        else:
            sub.add_parser(name, help=command.help)  # what `idegym --help` lists
    args = parser.parse_args(argv)
    COMMANDS[args.command].run(args)


if __name__ == "__main__":
    main()
