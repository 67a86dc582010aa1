"""A task's services beside its main sandbox (Harbor's docker-compose environments), started the
same way by ``IdeGymEnv`` and by the Harbor environment provider.

``environment/docker-compose.yaml`` (what Harbor reads) names the task's services beside
``main`` (the agent's, built from ``environment/Dockerfile`` or ``docker_image`` as for any
task). Every service is a sandbox of the same client, started in dependency order
(``depends_on``; a ``service_healthy`` condition waits for the service's ``healthcheck``), all in
one network namespace — the first sandbox's (``network_of``): they reach each other on
127.0.0.1, and each service's name is an ``/etc/hosts`` entry for it, so ``http://db:5432`` means
what it means under compose. The network policy is the task's (public or none). A service's
process is its ``entrypoint``/``command`` (else its Dockerfile's ENTRYPOINT and CMD), started in
the background as its ``user`` with its ``environment`` in its ``working_dir``. The services are
stopped together.

Not honoured, and said: ``ports`` (nothing is published to the host), ``volumes`` (nothing of
the host is mounted; named volumes are each service's own directories), ``network_mode`` and
``networks`` (one network for all), ``deploy``/resource keys (the limits are main's),
``privileged``/``cap_add`` (a service has a sandbox's privileges: no Docker daemon inside).

The starting is a plan without I/O (:func:`bring_up`): a generator that yields :class:`Start`,
:class:`Run` and :class:`Pause` steps and receives their answers, so that the synchronous env
and the asynchronous provider drive one implementation. Nothing here imports ``harbor``: the
provider runs in Harbor's Python (3.12+), the env in ours.
"""

from __future__ import annotations

import os
import re
import shlex
import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict

from control_plane.dockerfile import final_command, final_entrypoint

from ..errors import IdeGymError

MAIN = "main"
_VAR = re.compile(r"\$(?:\{(\w+)(?:(:?-)([^}]*))?\}|(\w+))|\$\$")
# ``expose`` is not among them: on the task's one network every port of a service reaches the others.
IGNORED = ("ports", "volumes", "network_mode", "networks", "deploy", "restart", "container_name",
           "platform", "cap_add", "cap_drop", "privileged", "shm_size", "ulimits", "tmpfs", "logging", "labels")


class ComposeError(IdeGymError, ValueError):
    """A compose file that cannot be run, or a service that did not start, and why."""


class Service(BaseModel):
    """One service of a compose file, as read (``main`` is the task's own sandbox)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    build_context: Path | None = None
    dockerfile: str | None = None  # the text
    image: str | None = None
    command: tuple[str, ...] | None = None
    entrypoint: tuple[str, ...] | None = None
    environment: dict[str, str] = {}
    depends_on: dict[str, str] = {}  # name -> condition
    healthcheck: tuple[str, ...] | None = None  # an argv (CMD) or ("sh", "-c", text) (CMD-SHELL)
    health_interval: float = 1.0
    health_deadline: float = 120.0
    working_dir: str | None = None
    user: str | None = None
    ignored: tuple[str, ...] = ()

    def process(self) -> list[str] | None:
        """What runs: compose's entrypoint/command over the image's (compose semantics: an
        ``entrypoint`` drops the image's CMD)."""
        entry = list(self.entrypoint) if self.entrypoint is not None else None
        if entry is None and self.dockerfile is not None:
            entry = final_entrypoint(self.dockerfile)
        command = list(self.command) if self.command is not None else None
        if command is None and self.entrypoint is None and self.dockerfile is not None:
            command = final_command(self.dockerfile)
        argv = [*(entry or []), *(command or [])]
        return argv or None


def _expand(text: str, env: dict[str, str]) -> str:
    def sub(found: re.Match[str]) -> str:
        if found.group(0) == "$$":
            return "$"
        name = found.group(1) or found.group(4)
        value = env.get(name)
        if found.group(2) == ":-" and not value:
            return found.group(3)
        if found.group(2) == "-" and value is None:
            return found.group(3)
        return value or ""
    return _VAR.sub(sub, text)


def _walk(value: Any, env: dict[str, str]) -> Any:
    if isinstance(value, str):
        return _expand(value, env)
    if isinstance(value, list):
        return [_walk(v, env) for v in value]
    if isinstance(value, dict):
        return {k: _walk(v, env) for k, v in value.items()}
    return value


def _argv(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return ("/bin/sh", "-c", value)
    return tuple(str(v) for v in value)


def _seconds(value: Any, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, (int, float)):
        return float(value)
    total = 0.0
    for number, unit in re.findall(r"([\d.]+)(ms|s|m|h)", str(value)):
        total += float(number) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    return total or default


def read_compose(path: Path, env: dict[str, str] | None = None) -> dict[str, Service]:
    """The services of a compose file (``${VAR}`` from ``env``, Harbor's ``CONTEXT_DIR`` the
    file's directory); ``main`` is always one of them."""
    variables = {**os.environ, "CONTEXT_DIR": str(path.parent), **(env or {})}
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ComposeError(f"{path}: not a readable compose file: {exc}") from exc
    raw = _walk(doc.get("services") or {}, variables)
    if not isinstance(raw, dict):
        raise ComposeError(f"{path}: services must be a mapping")
    services: dict[str, Service] = {}
    for name, spec in raw.items():
        spec = spec or {}
        fields: dict[str, Any] = {"name": str(name)}
        build = spec.get("build")
        if isinstance(build, str):
            build = {"context": build}
        if isinstance(build, dict):
            context = (path.parent / build.get("context", ".")).resolve()
            dockerfile = context / build.get("dockerfile", "Dockerfile")
            if not dockerfile.is_file():
                raise ComposeError(f"{path}: service {name!r} builds {dockerfile}, which does not exist")
            fields.update(build_context=context, dockerfile=dockerfile.read_text(encoding="utf-8"))
        fields.update(image=spec.get("image"), command=_argv(spec.get("command")),
                      entrypoint=_argv(spec.get("entrypoint")))
        environment = spec.get("environment") or {}
        if isinstance(environment, list):
            environment = dict(item.split("=", 1) if "=" in item else (item, variables.get(item, ""))
                               for item in environment)
        fields["environment"] = {str(k): "" if v is None else str(v) for k, v in environment.items()}
        depends = spec.get("depends_on") or {}
        if isinstance(depends, list):
            depends = {d: {"condition": "service_started"} for d in depends}
        fields["depends_on"] = {str(k): str((v or {}).get("condition", "service_started"))
                                for k, v in depends.items()}
        health = spec.get("healthcheck") or {}
        test = health.get("test")
        if test and not health.get("disable") and test != ["NONE"]:
            if isinstance(test, str):
                fields["healthcheck"] = ("/bin/sh", "-c", test)
            elif test[0] == "CMD-SHELL":
                fields["healthcheck"] = ("/bin/sh", "-c", " ".join(test[1:]))
            else:
                fields["healthcheck"] = tuple(str(t) for t in (test[1:] if test[0] == "CMD" else test))
            interval = _seconds(health.get("interval"), 30.0)
            fields["health_interval"] = min(interval, 1.0)
            retries = int(health.get("retries", 3))
            fields["health_deadline"] = _seconds(health.get("start_period"), 0) + interval * retries
        fields.update(working_dir=spec.get("working_dir"), user=None if spec.get("user") is None else str(spec["user"]),
                      ignored=tuple(key for key in IGNORED if key in spec))
        services[str(name)] = Service(**fields)
    services.setdefault(MAIN, Service(name=MAIN))
    for service in services.values():
        for dep in service.depends_on:
            if dep not in services:
                raise ComposeError(f"{path}: service {service.name!r} depends on {dep!r}, which is not a service")
        if service.name != MAIN and service.dockerfile is None and not service.image:
            raise ComposeError(f"{path}: service {service.name!r} has neither build nor image")
    return services


def start_order(services: dict[str, Service]) -> list[str]:
    """Services in an order that starts each after what it depends on (main as late as it can)."""
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            raise ComposeError(f"services depend on each other in a cycle through {name!r}")
        visiting.add(name)
        for dep in sorted(services[name].depends_on):
            visit(dep)
        visiting.discard(name)
        order.append(name)

    for name in sorted(n for n in services if n != MAIN):
        visit(name)
    visit(MAIN)
    return order


def process_command(service: Service) -> str | None:
    """The shell line that starts a service's process in the background (its log in /tmp)."""
    argv = service.process()
    if argv is None:
        return None
    exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in service.environment.items())
    where = f"cd {shlex.quote(service.working_dir)} && " if service.working_dir else ""
    line = " ".join(shlex.quote(a) for a in argv)
    return (f"{exports}{where}nohup {line} > /tmp/idegym-service-{service.name}.log 2>&1 < /dev/null & "
            "echo started")


def hosts_line(services: dict[str, Service]) -> str:
    return "127.0.0.1 " + " ".join(sorted(services))


def entrypoint_command(entrypoint: tuple[str, ...] | list[str]) -> str:
    """The shell line that starts an image's ENTRYPOINT as Harbor's docker environment does: its
    command replaced by ``sh -c "sleep infinity"`` (an entrypoint script that starts a service,
    then ``exec "$@"``), in the background; its output in /tmp/idegym-entrypoint.log."""
    argv = " ".join(shlex.quote(a) for a in [*entrypoint, "sh", "-c", "sleep infinity"])
    return f"nohup {argv} >/tmp/idegym-entrypoint.log 2>&1 </dev/null &"


# -- starting them: a plan the env and the provider drive -------------------------------------------------


@dataclass(frozen=True)
class Start:
    """Start ``service``'s sandbox (``main``: the task's own), in the network namespace of server
    ``network_of`` (None: a namespace of its own). Answer: its server id."""

    service: Service
    network_of: int | None


@dataclass(frozen=True)
class Run:
    """Run ``command`` (bash) in the started sandbox of ``service`` as ``user`` (None: its default).
    Answer: ``(exit code, output)``."""

    service: str
    command: str
    user: str | None = None


@dataclass(frozen=True)
class Pause:
    seconds: float


Plan = Generator[Start | Run | Pause, Any, None]


def bring_up(services: dict[str, Service]) -> Plan:
    """Start every service (``main`` among them) in dependency order, each after those it waits
    for are healthy, in the first one's network, named in each one's /etc/hosts, each one's
    process started; raises :class:`ComposeError` naming the service that did not come up."""
    owner: int | None = None
    hosts = f"echo {shlex.quote(hosts_line(services))} >> /etc/hosts"
    for name in start_order(services):
        service = services[name]
        for dep, condition in sorted(service.depends_on.items()):
            if condition == "service_healthy":
                yield from _healthy(services[dep])
        server = yield Start(service, owner)
        owner = server if owner is None else owner
        code, output = yield Run(name, hosts, "root")
        if code != 0:
            raise ComposeError(f"naming the services in /etc/hosts of {name!r} failed: {output[-500:]}")
        command = process_command(service) if name != MAIN else None
        if command is not None:
            code, output = yield Run(name, command, service.user)
            if code != 0:
                raise ComposeError(f"compose service {name!r} did not start: {output[-500:]}")


def _healthy(service: Service) -> Plan:
    """Run the service's healthcheck until it passes or its start period and retries are spent."""
    if service.healthcheck is None:
        return
    deadline = time.monotonic() + max(service.health_deadline, 5.0)
    check = " ".join(shlex.quote(a) for a in service.healthcheck)
    while True:
        code, output = yield Run(service.name, check)
        if code == 0:
            return
        if time.monotonic() > deadline:
            raise ComposeError(f"service {service.name!r} did not become healthy ({check} kept failing: "
                               f"{output.strip()[-300:]})")
        yield Pause(service.health_interval)


__all__ = ["Service", "ComposeError", "read_compose", "start_order", "process_command", "hosts_line",
           "entrypoint_command", "bring_up", "Start", "Run", "Pause", "Plan", "MAIN"]
