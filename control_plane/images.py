"""Image definitions: the build YAML accepted by ``POST /api/build-push-images``.

::

    images:
      - name: python-calc                # the tag is "<name>:<12-hex content hash>" unless `tag` is given
        tag: idegym/python-calc:1        # optional; must match ^[a-z0-9._/:@-]+$
        base: idegym/builtin:latest      # optional (default); or another built image's tag
        project:                         # optional; one of
          path: ./calc                   #   a directory on the control plane's host
          # git: https://…   ref: main   #   a git repository (needs git, and network for remote URLs)
          # archive: ./calc.tar.gz       #   a .tar.gz / .zip archive
        commands:                        # run as root in a build sandbox, in order
          - pip install pytest
        env: {PYTHONDONTWRITEBYTECODE: "1"}
        network: true                    # the build (and sandboxes of this image) may use the network
        rebuild: false                   # an existing tag is not built again unless this is true

The upstream format's fields are accepted too: ``plugins`` (a ``project`` plugin supplies the
project; other plugin types do not apply to a local image and are noted in the job log),
``runtime_class_name``, ``resources``, ``platforms``. Upstream base names such as
``debian-bookworm-20250520-slim`` map to the built-in image, since no registry is reachable.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import yaml

from .backends.base import Backend, ImageBuilder, ImageDefinition

BUILTIN_IMAGE = "idegym/builtin:latest"
TAG = re.compile(r"^[a-z0-9._/:@-]+$")
NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$")
UPSTREAM_BASES = {"debian-bookworm-20250520-slim", "ubuntu-jammy-20250530", "debian", "ubuntu", "default"}
PROJECT_KEYS = ("path", "git", "archive")


def _project(entry: dict[str, Any], notes: list[str]) -> dict[str, Any] | None:
    project = entry.get("project")
    for plugin in entry.get("plugins") or []:
        if not isinstance(plugin, dict):
            raise ValueError(f"plugins entries must be mappings, got {plugin!r}")
        kind = plugin.get("type")
        if kind == "project":
            source = plugin.get("source") if isinstance(plugin.get("source"), dict) else plugin
            project = {k: v for k, v in source.items() if k in (*PROJECT_KEYS, "ref", "url")}
            if "url" in project and "git" not in project and "archive" not in project:
                url = project.pop("url")
                project["archive" if str(url).endswith((".zip", ".tar.gz", ".tgz")) else "git"] = url
        else:
            notes.append(f"plugin {kind!r} does not apply to a local image; ignored")
    if project is None:
        return None
    if not isinstance(project, dict) or sum(k in project for k in PROJECT_KEYS) != 1:
        raise ValueError(f"project must have exactly one of {', '.join(PROJECT_KEYS)}; got {project!r}")
    return project


def parse_build_yaml(text: str) -> list[ImageDefinition]:
    """Parse the build YAML. Raises ``ValueError`` with a message naming the faulty entry."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"not valid YAML: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
        raise ValueError("expected a mapping with an 'images:' list")
    definitions = []
    for index, entry in enumerate(doc["images"]):
        where = f"images[{index}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected a mapping")
        notes: list[str] = []
        base = str(entry.get("base") or BUILTIN_IMAGE)
        if base in UPSTREAM_BASES:
            notes.append(f"base {base!r} maps to {BUILTIN_IMAGE} (the host's toolchains)")
            base = BUILTIN_IMAGE
        commands = entry.get("commands") or []
        if not isinstance(commands, list) or not all(isinstance(c, str) for c in commands):
            raise ValueError(f"{where}.commands: expected a list of strings")
        env = entry.get("env") or {}
        if not isinstance(env, dict):
            raise ValueError(f"{where}.env: expected a mapping")
        try:
            project = _project(entry, notes)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from exc
        for ignored in ("runtime_class_name", "resources", "platforms"):
            if entry.get(ignored) is not None:
                notes.append(f"{ignored} is set per server at start time; ignored here")
        content = {"base": base, "project": project, "commands": commands, "env": env,
                   "network": bool(entry.get("network", False))}
        tag = entry.get("tag")
        if tag is None:
            name = entry.get("name")
            if not isinstance(name, str) or not NAME.match(name):
                raise ValueError(f"{where}: give a 'name' (lowercase letters, digits, '.', '_', '-') or a 'tag'")
            digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:12]
            tag = f"{name}:{digest}"
        if not isinstance(tag, str) or not TAG.match(tag) or len(tag) > 383:
            raise ValueError(f"{where}: tag {tag!r} must match ^[a-z0-9._/:@-]+$ (lowercase)")
        definitions.append(ImageDefinition(tag=tag, base=base, project=project, commands=list(commands),
                                           env={str(k): str(v) for k, v in env.items()},
                                           network=content["network"], raw={**entry, "_notes": notes}))
    return definitions


def builder_for(backend: Backend) -> ImageBuilder | None:
    """The backend's image builder, if it has one."""
    factory = getattr(backend, "image_builder", None)
    return factory() if callable(factory) else None
