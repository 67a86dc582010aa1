"""The table of every environment variable IdeGym reads, made from the settings models, for
``docs/configuration.md`` (``tests/test_configuration.py`` checks that the docs hold this table).

    python -m idegym_env.settings_table           # print it
    python -m idegym_env.settings_table --write   # put it into docs/configuration.md
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from sandbox_server.env_settings import EnvSettings, Variable

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
BEGIN = ("<!-- the tables below are made by `python -m idegym_env.settings_table --write`: "
         "edit the settings, not them -->")
END = "<!-- end of the made tables -->"

#: Variables IdeGym sets for the programs it starts (the judge, its subjects, a check's Python,
#: an agent harness's driver, a tool): their interface, read by those programs themselves.
PROGRAM_VARIABLES: tuple[tuple[str, str, str], ...] = (
    ("IDEGYM_JUDGE", "every tool", "the command line of the judge (`$IDEGYM_JUDGE tests/`)"),
    ("IDEGYM_JUDGE_HOME", "every tool", "the judge's directory (its subjects, `subjects/c/judge_driver.h`)"),
    ("IDEGYM_CALL", "every process of a command", "the command's mark, by which its processes are found and "
     "stopped"),
    ("IDEGYM_HIDDEN", "a grading stage", "the task's hidden grading files, readable by root only"),
    ("IDEGYM_REPORT_DIR", "a grading stage", "where the stage writes its report (JUnit XML, the judge's)"),
    ("IDEGYM_PROJECT_ROOT", "an image build's commands, a server kind's start", "the project directory"),
    ("IDEGYM_SUBJECT_USER", "the judge", "the user the code under test runs as"),
    ("IDEGYM_SUBJECT_DIR", "the judge", "the working directory of the code under test"),
    ("IDEGYM_SUBJECT_PYTHON", "the judge", "the interpreter of Python subjects (default: `python3` on the "
     "pinned PATH)"),
    ("IDEGYM_SUBJECT_NODE", "the judge", "the `node` of JavaScript subjects"),
    ("IDEGYM_SUBJECT_JAVA", "the judge", "the `java` of Java subjects"),
    ("IDEGYM_SUBJECT_JAVAC", "the judge", "the `javac` that compiles the Java subject"),
    ("IDEGYM_JUDGE_CALL_TIMEOUT", "the judge", "seconds a subject may take over one call (default 60)"),
    ("IDEGYM_ANSWER_FD", "a judge subject", "the descriptor it answers on"),
    ("IDEGYM_PROJECT_DIR", "a check's Python (the import guard)", "the project whose modules the tests import"),
    ("IDEGYM_PROJECT_MODULES", "a check's Python (the import guard)", "the project's own top-level modules"),
    ("IDEGYM_PYTHONPATH", "a check's Python (the import guard)", "the task's `PYTHONPATH`, added after the "
     "guard"),
    ("IDEGYM_TASK", "an `openenv` sandbox's server", "its task (the image sets it; also the OpenEnv server's "
     "`--task`, above)"),
    ("IDEGYM_INSTRUCTION", "an agent harness's driver", "the task's instruction"),
    ("IDEGYM_STEP_LIMIT", "an agent harness's driver", "the model calls the episode allows"),
    ("IDEGYM_MODEL_NAME", "an agent harness's driver", "the model name to send (default `idegym-policy`)"),
    ("IDEGYM_CALL_TIMEOUT", "an agent harness's driver", "seconds one model call may take (default 900; a "
     "harness's `env` may set it)"),
    ("IDEGYM_COMMAND_TIMEOUT", "an agent harness's driver", "seconds one command of the agent may take (default "
     "120; a harness's `env` may set it)"),
    ("IDEGYM_GATEWAY_URL", "an agent harness's driver", "the episode's model endpoint (also as "
     "`OPENAI_BASE_URL`, with `OPENAI_API_KEY`)"),
)


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def _names(row: Variable) -> str:
    return " / ".join(f"`{name}`" for name in row.names)


def _rows(model: type[EnvSettings], flags: dict[str, tuple[str, str]] | None = None) -> Iterable[str]:
    """``flags``: a flag's help and default, for variables whose text and default are the flag's."""
    for row in model.variables():
        doc, default = row.doc, row.default
        if row.flag and flags and row.flag in flags and not doc:
            doc, shown = flags[row.flag]
            default = shown if default == "–" else default
        flag = f"`{row.flag}`" if row.flag else ""
        yield f"| {_names(row)} | {flag} | {_cell(default)} | {_cell(doc)} |"


def _control_plane_flags() -> dict[str, tuple[str, str]]:
    """``idegym control-plane serve``'s flags in an empty environment: their help (without the
    bracket naming the variable and default) and default."""
    from control_plane.cli import _bytes, _shown, add_serve_arguments
    from control_plane.quantities import format_memory
    from control_plane.settings import ControlPlaneSettings

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser, ControlPlaneSettings())
    flags = {}
    for action in parser._actions:
        for option in action.option_strings:
            text = re.sub(r"\s*\[[^\[\]]*\]$", "", action.help or "")
            if action.dest == "state_dir":
                default = "~/.local/state/idegym"
            elif action.type is _bytes and action.default:
                default = format_memory(action.default)
            else:
                default = _shown(action.default)
            flags[option] = (text, "–" if default == "none" else default)
    return flags


def render() -> str:
    """The tables, as ``docs/configuration.md`` holds them."""
    from control_plane.settings import ControlPlaneSettings
    from sandbox_server.settings import ServerSettings

    from .settings import ClientSettings

    head = "| variable | flag | default | what it does |\n|---|---|---|---|"
    parts = [
        BEGIN,
        "### A client, an env, a trainer (`idegym_env`, `idegym eval`, `idegym openenv serve`)\n\n"
        "Read by `ClientSettings.from_env()` (`idegym_env/settings.py`).\n",
        head, *_rows(ClientSettings),
        "\n### The control plane (`idegym control-plane serve`, `idegym images`, `idegym sandboxes`)\n\n"
        "Read by `ControlPlaneSettings.from_env()` (`control_plane/settings.py`); a flag given on the command "
        "line wins over its variable.\n",
        head, *_rows(ControlPlaneSettings, _control_plane_flags()),
        "\n### A sandbox server (`idegym sandbox serve`, in every sandbox)\n\n"
        "Read by `ServerSettings.from_env()` (`sandbox_server/settings.py`) as each server starts.\n",
        head, *_rows(ServerSettings),
        "\n### Set by IdeGym for the programs it starts\n\n"
        "Not settings: what a program IdeGym starts is told through its environment, and reads itself.\n",
        "| variable | set for | what it says |\n|---|---|---|",
        *(f"| `{name}` | {_cell(whom)} | {_cell(text)} |" for name, whom, text in PROGRAM_VARIABLES),
        END,
    ]
    return "\n".join(parts) + "\n"


def documented(text: str) -> str:
    """The made tables of a document (from ``BEGIN`` to ``END``), or ``""``."""
    start, end = text.find(BEGIN), text.find(END)
    return text[start:end + len(END)] + "\n" if 0 <= start < end else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--write", action="store_true", help=f"replace the tables in {DOC}")
    args = parser.parse_args(argv)
    table = render()
    if not args.write:
        sys.stdout.write(table)
        return 0
    text = DOC.read_text()
    old = documented(text)
    if not old:
        print(f"{DOC} has no {BEGIN!r} … {END!r} section to replace", file=sys.stderr)
        return 1
    DOC.write_text(text.replace(old, table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
