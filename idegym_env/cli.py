"""The ``idegym`` command: one entry point, one subcommand per job."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="idegym",
        description="IdeGym: disposable coding sandboxes as reinforcement-learning environments.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sandbox = sub.add_parser("sandbox", help="the in-sandbox server", description="The in-sandbox server.")
    sandbox_sub = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="COMMAND")
    serve = sandbox_sub.add_parser("serve", help="run the sandbox server (tools, rewards, reset, code runner)",
                                   description="Run the sandbox server: bash and file tools, rewards, project "
                                               "reset and a code runner over HTTP.")
    from sandbox_server.cli import add_serve_arguments

    add_serve_arguments(serve)

    cp = sub.add_parser("control-plane", help="the orchestrator (clients, servers, forwarding…)",
                        description="The IdeGym control plane.")
    cp_sub = cp.add_subparsers(dest="cp_command", required=True, metavar="COMMAND")
    cp_serve = cp_sub.add_parser("serve", help="run the control plane (local backend by default)",
                                 description="Run the control plane. With no options it runs on this machine: "
                                             "sandboxes are local processes isolated with bubblewrap.")
    from control_plane.cli import add_serve_arguments as add_cp_arguments

    add_cp_arguments(cp_serve)

    openenv = sub.add_parser("openenv", help="serve IdeGym episodes with OpenEnv's protocol (/ws, /reset, /step…)",
                             description="IdeGym episodes for OpenEnv's clients (pip install 'idegym[openenv]').")
    openenv_sub = openenv.add_subparsers(dest="openenv_command", required=True, metavar="COMMAND")
    from .openenv.server import DESCRIPTION as OPENENV_DESCRIPTION
    from .openenv.server import EPILOG as OPENENV_EPILOG
    from .openenv.server import add_serve_arguments as add_openenv_arguments

    openenv_serve = openenv_sub.add_parser("serve", help="run an OpenEnv server for a task",
                                           description=OPENENV_DESCRIPTION, epilog=OPENENV_EPILOG,
                                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add_openenv_arguments(openenv_serve)

    sandboxes = sub.add_parser("sandboxes", help="list or end the local sandboxes on this host",
                               description="The local backend's sandboxes on this host: list them, or end "
                                           "them (prune) when their control plane is gone.")
    from control_plane.sandboxes_cli import add_arguments as add_sandboxes_arguments

    add_sandboxes_arguments(sandboxes)

    mcp = sub.add_parser("mcp", help="serve IdeGym episodes as MCP tools (stdio or streamable HTTP)",
                         description="IdeGym episodes for MCP clients (pip install 'idegym[mcp]').")
    mcp_sub = mcp.add_subparsers(dest="mcp_command", required=True, metavar="COMMAND")
    mcp_serve = mcp_sub.add_parser("serve", help="run an MCP server whose tools act on an IdeGym episode",
                                   description="Run an MCP server whose tools (reset, bash, file tools, run_checks, "
                                               "submit) act on an IdeGym episode.")
    from .integrations.mcp_cli import add_serve_arguments as add_mcp_arguments

    add_mcp_arguments(mcp_serve)

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
    elif args.command == "control-plane":
        from control_plane.cli import run_serve as run_cp

        run_cp(args)
    elif args.command == "openenv":
        from .openenv.server import run_serve as run_openenv

        sys.exit(run_openenv(args))
    elif args.command == "sandboxes":
        from control_plane.sandboxes_cli import run as run_sandboxes

        sys.exit(run_sandboxes(args))
    elif args.command == "mcp":
        from .integrations.mcp import run_serve as run_mcp

        sys.exit(run_mcp(args))
    elif args.command == "demo":
        from .demo import main as demo

        sys.exit(demo())
    elif args.command == "tasks":
        from .tasks.sources.validate import run_tasks_command

        sys.exit(run_tasks_command(args))
    elif args.command == "eval":
        from .eval.cli import run_eval

        sys.exit(run_eval(args))
    elif args.command == "images":
        from control_plane.backends.local.oci.cli import run as run_images

        sys.exit(run_images(args))


if __name__ == "__main__":
    main()
