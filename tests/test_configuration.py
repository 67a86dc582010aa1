"""Configuration is read in one layer per process kind (``ClientSettings``, ``ControlPlaneSettings``,
``ServerSettings``): no other module of ours reads a variable of its own from ``os.environ``; the
tables of ``docs/configuration.md`` are made from those models; every ``IDEGYM_*`` variable read
anywhere is documented; a variable that does not parse is one clear line."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

PACKAGES = ("idegym_env", "control_plane", "sandbox_server")
NOT_CODE = ("idegym_env/tasks/data/", "idegym_env/tasks/bundled/")  # task content
# The one layer of each process kind, and the generic reader they share.
SETTINGS = {"idegym_env/settings.py", "control_plane/settings.py", "sandbox_server/settings.py",
            "sandbox_server/env_settings.py"}
# Programs IdeGym starts, told what to do through their environment: the judge and its subjects
# (standard library only, on any image's python3), agent harnesses' drivers.
PROGRAMS = ("sandbox_server/judge/", "idegym_env/agents/drivers/")
# Read to be handed on to a program as they are, or to do what another program does with its own
# variable (Ray's address, OpenEnv's web interface): not our configuration.
PASSED_ON = {"PATH", "LANG", "HOME", "TMPDIR", "LD_LIBRARY_PATH", "PYTHONPATH", "RAY_ADDRESS",
             "RAY_NODE_IP_ADDRESS", "ENABLE_WEB_INTERFACE"}
# Reads of a variable named by data: a Harbor task.toml's ``${VAR}`` references.
BY_NAME = {"idegym_env/tasks/sources/harbor.py"}


def _product_files() -> list[Path]:
    files = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if not rel.startswith(NOT_CODE):
                files.append(path)
    return files


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and \
        isinstance(node.value, ast.Name) and node.value.id == "os"


def _reads(tree: ast.AST) -> list[tuple[int, str | None]]:
    """Every read of one variable: (line, its name, or None when the name is not a literal)."""
    found: list[tuple[int, str | None]] = []

    def key(node: ast.AST) -> str | None:
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            by_environ = isinstance(func, ast.Attribute) and _is_environ(func.value) and \
                func.attr in ("get", "pop")
            by_getenv = isinstance(func, ast.Attribute) and func.attr == "getenv" and \
                isinstance(func.value, ast.Name) and func.value.id == "os"
            if (by_environ or by_getenv) and node.args:
                found.append((node.lineno, key(node.args[0])))
        elif isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
            found.append((node.lineno, key(node.slice)))
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators) and \
                any(isinstance(op, ast.In | ast.NotIn) for op in node.ops):
            found.append((node.lineno, key(node.left)))
    # ``env = os.environ.get`` and later ``env("X")``: a reader by another name
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) and \
                _is_environ(node.value.value) and node.value.attr == "get":
            found.append((node.lineno, None))
    return found


def _idegym_names_read() -> dict[str, str]:
    """Every IDEGYM_* variable the product reads, with a place that reads it."""
    names: dict[str, str] = {}
    for path in _product_files():
        rel = path.relative_to(REPO).as_posix()
        for line, name in _reads(ast.parse(path.read_text(), rel)):
            if name and name.startswith("IDEGYM_"):
                names.setdefault(name, f"{rel}:{line}")
    from control_plane.settings import ControlPlaneSettings
    from idegym_env.settings import ClientSettings
    from sandbox_server.settings import ServerSettings

    for model in (ClientSettings, ControlPlaneSettings, ServerSettings):
        for row in model.variables():
            for name in row.names:
                if name.startswith("IDEGYM_") and not name.endswith("*"):
                    names.setdefault(name, model.__name__)
    pattern = re.compile(r"(?:\$\{?|getenv\(\"|process\.env\.|getOrDefault\(\")(IDEGYM_[A-Z0-9_]+)")
    for folder, suffixes in (("idegym_env/agents/drivers", ("*.sh",)),
                             ("sandbox_server/judge/subjects", ("*.c", "*.h", "*.js", "*.java"))):
        for suffix in suffixes:
            for path in sorted((REPO / folder).rglob(suffix)):
                for found in pattern.finditer(path.read_text()):
                    names.setdefault(found.group(1), path.relative_to(REPO).as_posix())
    return names


def test_only_the_settings_read_configuration() -> None:
    strays = []
    for path in _product_files():
        rel = path.relative_to(REPO).as_posix()
        if rel in SETTINGS or rel.startswith(PROGRAMS):
            continue
        for line, name in _reads(ast.parse(path.read_text(), rel)):
            if name is None and rel in BY_NAME:
                continue
            if name not in PASSED_ON:
                strays.append(f"{rel}:{line} reads {name or 'a variable by another name'}")
    assert not strays, "configuration read outside the settings models:\n" + "\n".join(strays)


def test_the_docs_hold_the_tables_the_settings_make() -> None:
    from idegym_env import settings_table

    text = settings_table.DOC.read_text()
    assert settings_table.documented(text) == settings_table.render(), \
        "docs/configuration.md is out of date: run `python -m idegym_env.settings_table --write`"


def test_every_sharing_and_watcher_field_is_one_flag_that_reaches_the_config() -> None:
    """The limits are declared once, on the configuration dataclasses: each gets its flag, its
    variable and its value through to the configuration the control plane runs with."""
    import argparse
    import dataclasses

    from control_plane import cli
    from control_plane.config import SharingConfig, WatcherConfig, flags
    from control_plane.settings import ControlPlaneSettings

    parser = argparse.ArgumentParser()
    cli.add_serve_arguments(parser, ControlPlaneSettings())
    argv, expected = [], {}
    for config in (SharingConfig, WatcherConfig):
        for option, spec in flags(config):
            value = spec.default * 2 + 3
            argv += [option, str(value)]
            expected[(config.__name__, spec.name)] = value
    assert len(expected) == 17 and "stale_operation" not in {name for _, name in expected}
    built = cli.config_from_args(parser.parse_args(argv), ControlPlaneSettings())
    got = {(type(c).__name__, f.name): getattr(c, f.name) for c in (built.sharing, built.watcher)
           for f in dataclasses.fields(c) if (type(c).__name__, f.name) in expected}
    assert got == expected
    sized = cli.config_from_args(parser.parse_args(["--tenant-upload-bytes", "20Gi"]), ControlPlaneSettings())
    assert sized.sharing.tenant_upload_bytes == 20 << 30
    by_variable = ControlPlaneSettings(start_burst=5, watch_interval=0.5)
    parser = argparse.ArgumentParser()
    cli.add_serve_arguments(parser, by_variable)
    built = cli.config_from_args(parser.parse_args([]), by_variable)
    assert (built.sharing.start_burst, built.watcher.interval) == (5, 0.5)


def test_every_command_that_takes_a_control_plane_states_one_rule_for_it(capsys: pytest.CaptureFixture[str]) -> None:
    """``--control-plane-url`` is one option: the URL, else ``$IDEGYM_URL``, else an embedded control
    plane (``settings.chosen_control_plane``), said the same way by every command that has it."""
    import argparse

    from idegym_env import cli
    from idegym_env.settings import add_control_plane_argument

    one = argparse.ArgumentParser()
    add_control_plane_argument(one)
    (option,) = [a for a in one._actions if "--control-plane-url" in a.option_strings]
    assert option.help is not None and "$IDEGYM_URL" in option.help and "embedded" in option.help
    for command in (["eval"], ["mcp", "serve"], ["openenv", "serve"], ["tasks", "validate"]):
        with pytest.raises(SystemExit) as done:
            cli.main([*command, "--help"])
        assert done.value.code == 0
        shown = capsys.readouterr().out
        assert f"--control-plane-url URL {option.help}" in " ".join(shown.split()), (command, shown)


def test_every_variable_read_is_documented() -> None:
    from control_plane.backends.config import KubernetesBackendConfig
    from idegym_env import settings_table

    documented = set(re.findall(r"`(IDEGYM_[A-Z0-9_]+)`", settings_table.DOC.read_text()))
    read = _idegym_names_read()
    assert len(read) > 40
    missing = {name: where for name, where in read.items() if name not in documented}
    assert not missing, f"variables read but not in docs/configuration.md: {missing}"
    kubernetes = (REPO / "docs" / "kubernetes.md").read_text()
    fields = [f"IDEGYM_K8S_{name.upper()}" for name in KubernetesBackendConfig.settings()]
    assert [name for name in fields if f"`{name}`" not in kubernetes] == []


@pytest.mark.parametrize(("command", "variable", "value"), [
    (["control-plane", "serve", "--help"], "IDEGYM_CONTROL_PLANE_PORT", "eighty"),
    (["control-plane", "serve", "--help"], "IDEGYM_CONTROL_PLANE_SANDBOX_STORAGE", "8Q"),
    (["sandbox", "serve", "--port", "0"], "IDEGYM_TOOL_SPAWNER", "perhaps"),
])
def test_a_variable_that_does_not_parse_is_one_line_naming_it(command: list[str], variable: str,
                                                              value: str) -> None:
    done = subprocess.run([sys.executable, "-m", "idegym_env.cli", *command], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, variable: value}, timeout=120)
    assert done.returncode == 2, done
    line = done.stderr.strip()
    assert line.startswith("idegym") and f"${variable}={value!r}: " in line, line
    assert "Traceback" not in line and len(line.splitlines()) == 1, line
