"""The SWE-bench family's other row shapes, as :mod:`.swe` profiles and tasks.

* **SWE-rebench** rows carry ``install_config`` (a dict, or its JSON): ``python`` (the image's
  Python), ``pre_install`` (shell commands, before the project), ``pip_packages``,
  ``reqs_path`` (requirements files of the project), ``install`` (the project's install),
  ``test_cmd`` (the command the tests run with; the listed tests' files are appended) and
  ``log_parser`` (how its output reads). They become a profile: ``FROM python:<python>`` (built
  here from Debian when no registry answers), the commands as ``RUN`` steps, the test log turned
  into a JUnit report by the parser it names (``log_junit.py``).
* **SWE-smith, SWE-Gym, R2E-Gym** rows name a prebuilt image (``image_name`` or
  ``docker_image``) whose ``/testbed`` holds the repository at its base commit: the task runs on
  that image (pulled when a registry answers or a mirror is configured, else the build says the
  image is not available and why), and at grading the test files the test patch touches are
  taken back to the base commit and the test patch applied, before the listed tests run.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from ..task import TaskError

LOG_JUNIT = ".idegym/log_junit.py"
IMAGE_PROJECT_DIR = "/testbed"
PATCH_EOF = "IDEGYM_TEST_PATCH_EOF"
KNOWN_KEYS = {"python", "pre_install", "pip_packages", "reqs_path", "install", "test_cmd", "log_parser", "packages",
              "env_yml_path", "no_use_env", "base_image_name", "docker_specs", "eval_commands", "test_directives"}


def read_install_config(value: Any) -> dict[str, Any] | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"install_config is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError("install_config must be an object")
    return value


def _commands(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value.strip() else []
    return [str(v) for v in value if str(v).strip()]


def rebench_profile(config: dict[str, Any]) -> dict[str, Any]:
    """The profile fields an SWE-rebench ``install_config`` stands for."""
    python = str(config.get("python") or "3.11")
    base = config.get("base_image_name") or f"python:{python}"
    lines = [f"FROM {base}"]
    lines += [f"RUN {cmd}" for cmd in _commands(config.get("pre_install"))]
    install: list[str] = []
    packages = _commands(config.get("pip_packages"))
    if packages:
        install.append("python -m pip install " + " ".join(shlex.quote(p) for p in packages))
    for path in _commands(config.get("reqs_path")):
        install.append(f"python -m pip install -r {shlex.quote(path)}")
    install += _commands(config.get("install"))
    fields: dict[str, Any] = {"dockerfile": "\n".join(lines) + "\n", "install": tuple(install)}
    test_cmd = _commands(config.get("test_cmd"))
    if test_cmd:
        command = " && ".join(test_cmd)
        fields["test_cmd"] = command if "{tests}" in command else command + " {tests}"
    if config.get("log_parser"):
        fields["log_parser"] = str(config["log_parser"])
    return fields


def log_test_command(command: str, parser: str, report: str) -> str:
    """Run ``command`` (the tests), keep its log, and write the JUnit report the parser reads from it."""
    return (f"set -o pipefail\n{command} 2>&1 | tee \"${{IDEGYM_REPORT_DIR:-.}}/swe-test.log\"\nstatus=$?\n"
            f"python3 {LOG_JUNIT} {shlex.quote(parser)} \"${{IDEGYM_REPORT_DIR:-.}}/swe-test.log\" {report} || "
            "echo 'the test log has no test the parser recognises' >&2\nexit $status\n")


def known_parser(name: str) -> None:
    from .log_junit import PARSERS

    if name not in PARSERS:
        raise TaskError(f"log parser {name!r} is not one IdeGym reads ({', '.join(sorted(PARSERS))})")


def restore_and_patch_script(base_commit: str, test_patch: str, files: list[str]) -> str:
    """Grading's first stage on an image's repository: the files the test patch touches back to
    the base commit (a file it adds, removed), then the test patch applied."""
    if PATCH_EOF in test_patch:
        raise TaskError("the test patch contains the here-document delimiter")
    quoted = " ".join(shlex.quote(f) for f in files)
    body = test_patch if test_patch.endswith("\n") else test_patch + "\n"
    # (the repository's files belong to the tool user; grading runs this as root)
    return ("set -e\nexport GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0='*'\n"
            f"for f in {quoted}; do\n"
            f"  if git cat-file -e {base_commit}:\"$f\" 2>/dev/null; then git checkout -q {base_commit} -- \"$f\"; "
            "else rm -f -- \"$f\"; fi\ndone\n"
            f"git apply --whitespace=nowarn <<'{PATCH_EOF}'\n{body}{PATCH_EOF}\n")


__all__ = ["read_install_config", "rebench_profile", "log_test_command", "restore_and_patch_script", "LOG_JUNIT",
           "IMAGE_PROJECT_DIR", "KNOWN_KEYS", "known_parser"]
