"""The ``idegym`` command: one entry point, one subcommand per job."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from sandbox_server.env_settings import SettingsError

from .errors import ConfigurationError


def _commands(sub: Any, name: str, dest: str, command_help: str, command_description: str) -> Any:
    """The subcommands of ``idegym NAME``."""
    command = sub.add_parser(name, help=command_help, description=command_description)
    return command.add_subparsers(dest=dest, required=True, metavar="COMMAND")


def _serve_parser(sub: Any, name: str, dest: str, command_help: str, command_description: str,
                  **serve: Any) -> argparse.ArgumentParser:
    """The parser of ``idegym NAME serve``, for a command whose subcommand runs a server."""
    return _commands(sub, name, dest, command_help, command_description).add_parser("serve", **serve)


def main(argv: list[str] | None = None) -> None:
    try:
        _main(argv)
    except (SettingsError, ConfigurationError) as exc:  # a variable that cannot be used: say which
        print(f"idegym: {exc}", file=sys.stderr)
        sys.exit(2)


def _main(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser(
        prog="idegym",
        description="IdeGym: disposable coding sandboxes as reinforcement-learning environments.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = _serve_parser(sub, "sandbox", "sandbox_command", "the in-sandbox server", "The in-sandbox server.",
                          help="run the sandbox server (tools, rewards, reset, code runner)",
                          description="Run the sandbox server: bash and file tools, rewards, project reset and a "
                                      "code runner over HTTP.")
    from sandbox_server.cli import add_serve_arguments

    add_serve_arguments(serve)

    cp_commands = _commands(sub, "control-plane", "cp_command", "the orchestrator (clients, servers, forwarding…)",
                            "The IdeGym control plane.")
    cp_serve = cp_commands.add_parser("serve", help="run the control plane (local backend by default)",
                                      description="Run the control plane. With no options it runs on this machine: "
                                                  "sandboxes are local processes isolated with bubblewrap.")
    from control_plane.cli import add_serve_arguments as add_cp_arguments
    from control_plane.cli import add_tenants_arguments

    add_cp_arguments(cp_serve)
    add_tenants_arguments(cp_commands.add_parser(
        "tenants", help="add or remove a tenant of a tenants file (serve --tenants)",
        description="Edit a tenants file: one 'NAME sha256:HEX' line per tenant (see serve --help, --tenants)."))

    from .openenv.server import DESCRIPTION as OPENENV_DESCRIPTION
    from .openenv.server import EPILOG as OPENENV_EPILOG
    from .openenv.server import add_serve_arguments as add_openenv_arguments

    openenv_serve = _serve_parser(sub, "openenv", "openenv_command",
                                  "serve IdeGym episodes with OpenEnv's protocol (/ws, /reset, /step…)",
                                  "IdeGym episodes for OpenEnv's clients (pip install 'idegym[openenv]').",
                                  help="run an OpenEnv server for a task", description=OPENENV_DESCRIPTION,
                                  epilog=OPENENV_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_openenv_arguments(openenv_serve)

    sandboxes = sub.add_parser("sandboxes", help="list or end the local sandboxes on this host",
                               description="The local backend's sandboxes on this host: list them, or end "
                                           "them (prune) when their control plane is gone.")
    from control_plane.sandboxes_cli import add_arguments as add_sandboxes_arguments

    add_sandboxes_arguments(sandboxes)

    mcp = _commands(sub, "mcp", "mcp_command", "serve IdeGym episodes as MCP tools (stdio or streamable HTTP)",
                    "IdeGym episodes for MCP clients (pip install 'idegym[mcp]').")
    from .integrations.mcp_cli import add_serve_arguments as add_mcp_arguments
    from .integrations.mcp_cli import add_token_arguments as add_mcp_token_arguments

    add_mcp_arguments(mcp.add_parser("serve", help="run an MCP server whose tools act on an IdeGym episode",
                                     description="Run an MCP server whose tools (reset, bash, file tools, "
                                                 "run_checks, submit) act on an IdeGym episode."))
    add_mcp_token_arguments(mcp.add_parser(
        "token", help="print the token `idegym mcp serve` requires over HTTP (made if there is none)",
        description="Print the token `idegym mcp serve` requires over streamable HTTP; it is made (0600) if "
                    "there is none."))

    sub.add_parser("demo", help="run a short real session end to end and print what happened",
                   description="Run a short real session end to end and print what happened.")

    from .eval.cli import DESCRIPTION as EVAL_DESCRIPTION
    from .eval.cli import EPILOG as EVAL_EPILOG
    from .eval.cli import add_eval_arguments

    evaluate = sub.add_parser("eval", help="run an agent on a set of tasks and report the pass rate",
                              description=EVAL_DESCRIPTION, epilog=EVAL_EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_eval_arguments(evaluate)

    from control_plane.backends.local.oci.cli import DESCRIPTION as IMAGES_DESCRIPTION
    from control_plane.backends.local.oci.cli import add_arguments as add_images_arguments

    images = sub.add_parser("images", help="the local image store: list, push to a registry",
                            description=IMAGES_DESCRIPTION)
    add_images_arguments(images)
    from .tasks.sources.validate import DESCRIPTION as TASKS_DESCRIPTION
    from .tasks.sources.validate import EPILOG as TASKS_EPILOG
    from .tasks.sources.validate import add_tasks_arguments

    tasks = sub.add_parser("tasks", help="list, show and validate the tasks of a source",
                           description=TASKS_DESCRIPTION, epilog=TASKS_EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add_tasks_arguments(tasks)

    args = parser.parse_args(argv)
    if args.command == "sandbox":
        from sandbox_server.cli import run_serve

        run_serve(args)
    elif args.command == "control-plane" and args.cp_command == "tenants":
        from control_plane.cli import run_tenants

        sys.exit(run_tenants(args))
    elif args.command == "control-plane":
        from control_plane.cli import run_serve as run_cp

        run_cp(args)
    elif args.command == "openenv":
        from .openenv.server import run_serve as run_openenv

        sys.exit(run_openenv(args))
    elif args.command == "sandboxes":
        from control_plane.sandboxes_cli import run as run_sandboxes

        sys.exit(run_sandboxes(args))
    elif args.command == "mcp" and args.mcp_command == "token":
        from .integrations.mcp_cli import run_token

        sys.exit(run_token(args))
    elif args.command == "mcp":
        from .integrations.mcp import run_serve as run_mcp

        sys.exit(run_mcp(args))
    elif args.command == "demo":
        from .demo import main as demo

        sys.exit(demo())
    elif args.command == "tasks":
        from .tasks.sources.validate import run_tasks_command

        try:
            sys.exit(run_tasks_command(args))
        except BrokenPipeError:  # `idegym tasks list humaneval | head`
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(0)
    elif args.command == "eval":
        from .eval.cli import run_eval

        sys.exit(run_eval(args))
    elif args.command == "images":
        from control_plane.backends.local.oci.cli import run as run_images

        sys.exit(run_images(args))


if __name__ == "__main__":
    main()
