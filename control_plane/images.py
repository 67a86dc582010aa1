"""Image definitions: the build YAML accepted by ``POST /api/build-push-images``.

::

    images:
      - name: python-calc                # the tag is "<name>:<12-hex content hash>" unless `tag` is given
        tag: idegym/python-calc:1        # optional; must match ^[a-z0-9._/:@-]+$
        base: idegym/builtin:latest      # optional (default); or another built image's tag
        project:                         # optional; one of
          upload: sha256:…               #   a tree the client uploaded (uploads.py; what clients send)
          # path: ./calc                 #   a directory on the control plane's host (under --build-root)
          # git: https://…   ref: main   #   a git repository (needs git, and network for remote URLs)
          # archive: ./calc.tar.gz       #   a .tar.gz / .zip archive
        commands:                        # run as root in a build sandbox, in order (set -eux)
          - pip install pytest
        env: {PYTHONDONTWRITEBYTECODE: "1"}
        network: true                    # sandboxes of this image (and its build) may use the network
        build_network: true              # only the build may (RUN apt-get ...); its sandboxes stay offline
        rebuild: false                   # an existing tag is not built again unless this is true
      - name: task-env                   # a Dockerfile, built with buildah (no `commands` then)
        dockerfile: |                    # its text, or a path in the build context ("Dockerfile")
          FROM python:3.12-slim
          COPY . /home/appuser/work/
        context: upload:sha256:…         # the build context: an upload, or a directory under --build-root
                                         # (default: the project, else empty)
        build_args: {PIP_INDEX: "..."}   # --build-arg
        project_dir: /app                # where the image holds the project (default: its final
                                         # WORKDIR, else /home/appuser/work)

The upstream format's fields are accepted too: ``plugins`` (``project`` supplies the project,
``permissions`` and ``user`` become commands; other types are noted in the job log),
``commands`` as a Dockerfile-ish string, ``runtime_class_name``, ``resources``, ``platforms``.
Each backend's builder says what it makes of the rest. The local one builds Dockerfiles, and
YAML entries whose ``base`` is a distribution image (``debian:bookworm``, ``python:3.12``…), as
OCI images with buildah (see ``backends.local.oci``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox_server.http import MAX_JSON_DEPTH, json_depth_exceeds

from .appuser import APPUSER
from .backends.base import ImageDefinition
from .build_sources import check_git, host_sources
from .constants import BUILTIN_IMAGE
from .image_tags import check_image_tag
from .tree_pack import REFERENCE_PREFIX, check_digest

if TYPE_CHECKING:
    from .uploads import StoredUpload


DEFAULT_NAME = "idegym-image"


@functools.cache
def _no_aliases() -> type:
    """Safe YAML without aliases: ten nested aliases of ten make 10^10 nodes once walked. Made on
    first use: importing PyYAML took 13 ms of CPU at every control plane start, builds or not."""
    import yaml

    class NoAliases(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(None, None, "aliases (*name) are not accepted in a build YAML",
                                                  mark)
            return super().compose_node(parent, index)

    return NoAliases


def load_build_yaml(text: str) -> Any:
    """The YAML document; ``ValueError`` when it does not parse, uses aliases or nests deeper
    than ``MAX_JSON_DEPTH`` levels."""
    import yaml

    try:
        doc = yaml.load(text, Loader=_no_aliases())  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        raise ValueError(f"the build YAML does not parse: {exc}") from exc
    except RecursionError:
        doc = None
    else:
        if not json_depth_exceeds(doc):
            return doc
    raise ValueError(f"the build YAML nests deeper than the limit of {MAX_JSON_DEPTH} levels")


Uploads = Callable[[str], "StoredUpload"]  # an upload's digest -> where it is (NotFound when absent)


def parse_build_yaml(text: str, registry: str | None = None, uploads: Uploads | None = None) -> list[ImageDefinition]:
    """The ``images:`` list of a build YAML as ``ImageDefinition``s with deterministic tags.

    Accepts the upstream fields (``name``, ``base``, ``plugins`` — ``project``, ``permissions``,
    ``user`` become local equivalents —, ``commands`` as a list or a Dockerfile-ish string,
    ``runtime_class_name``, ``resources``…) plus local ones (``tag``, ``project: {path|git|archive}``,
    ``env``, ``network``). What does not apply locally is listed by ``local_notes`` for the job log.
    ``uploads`` finds the trees named by ``upload`` references (the project's ``path`` and the
    ``context`` become their directories). Raises ``ValueError`` with a readable message on
    malformed input.
    """
    doc = load_build_yaml(text)
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list) or not doc["images"]:
        raise ValueError("the build YAML must have a non-empty top-level `images:` list")
    out = []
    for index, entry in enumerate(doc["images"]):
        if not isinstance(entry, dict):
            raise ValueError(f"images[{index}] must be a mapping, not {type(entry).__name__}")
        out.append(_definition(entry, index, registry, uploads))
    return out


def _definition(entry: dict[str, Any], index: int, registry: str | None = None,
                uploads: Uploads | None = None) -> ImageDefinition:
    where = f"images[{index}]"
    content_hash = hashlib.sha256(json.dumps([entry, _inputs_digest(entry)], sort_keys=True, default=str)
                                  .encode()).hexdigest()[:12]
    tag = entry.get("tag")
    if tag is None:
        name = str(entry.get("name") or DEFAULT_NAME).lower()
        tag = f"{registry.rstrip('/')}/{name}:{content_hash}" if registry else f"{name}:{content_hash}"
    tag = str(tag)
    try:
        check_image_tag(tag)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    base = str(entry.get("base") or BUILTIN_IMAGE)
    project = _project(entry.get("project"), where)
    commands: list[str] = []
    for p_index, plugin in enumerate(entry.get("plugins") or []):
        if not isinstance(plugin, dict) or "type" not in plugin:
            raise ValueError(f"{where}.plugins[{p_index}] must be a mapping with a `type`")
        kind = plugin["type"]
        if kind == "project":
            if project is not None:
                raise ValueError(f"{where}: only one project is supported")
            project = _project_plugin(plugin, f"{where}.plugins[{p_index}]")
        elif kind == "permissions":
            commands.extend(_permission_commands(plugin.get("paths") or {}))
        elif kind == "user":
            commands.extend(_user_commands(plugin))
    commands.extend(_commands(entry.get("commands"), where))
    env = entry.get("env") or {}
    if not isinstance(env, dict):
        raise ValueError(f"{where}.env must be a mapping of names to values")
    project, context, archive = _resolve_uploads(project, entry.get("context"), where, uploads)
    docker = _dockerfile({**entry, "context": context} if context is not None else entry, where, project)
    if archive is not None:
        docker["context_archive"] = archive
    if docker.get("dockerfile") is not None:
        if commands:
            raise ValueError(f"{where}: give either a `dockerfile` or `commands`/plugins, not both")
        from .dockerfile import base_images

        bases = base_images(docker["dockerfile"], docker["build_args"])
        base = bases[0] if bases else "scratch"
    network, build_network = (_flag(entry, key, where) for key in ("network", "build_network"))
    return ImageDefinition(tag=tag, base=base, project=project, commands=commands,
                           env={str(k): str(v) for k, v in env.items()}, raw=entry, network=network,
                           build_network=build_network, **docker)


def _flag(entry: dict[str, Any], key: str, where: str) -> bool:
    value = entry.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"{where}.{key} must be true or false, not {value!r}")
    return value


def upload_reference(context: Any) -> str | None:
    """The digest a ``context: upload:<digest>`` names, or None for a directory."""
    if isinstance(context, str) and context.startswith(REFERENCE_PREFIX):
        return context[len(REFERENCE_PREFIX):]
    return None


def _resolve_uploads(project: dict[str, Any] | None, context: Any, where: str, uploads: Uploads | None
                     ) -> tuple[dict[str, Any] | None, Any, str | None]:
    """The project and context with their upload references made directories, and the archive
    of the upload that is the build context (the context's, else the project's)."""
    archive = None
    digest = upload_reference(context)
    if digest is not None:
        stored = _stored(digest, f"{where}.context", uploads)
        context, archive = str(stored.tree), str(stored.archive)
    if project is not None and "upload" in project:
        stored = _stored(project["upload"], f"{where}.project.upload", uploads)
        project = {"path": str(stored.tree), "upload": project["upload"]}
        if context is None:
            archive = str(stored.archive)
    return project, context, archive


def _stored(digest: str, where: str, uploads: Uploads | None) -> StoredUpload:
    try:
        check_digest(digest)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    if uploads is None:
        raise ValueError(f"{where}: uploads cannot be read here")
    return uploads(digest)


def _dockerfile(entry: dict[str, Any], where: str, project: dict[str, Any] | None) -> dict[str, Any]:
    """``dockerfile`` (text, or a path in the build context), ``context``, ``build_args``, ``project_dir``."""
    out: dict[str, Any] = {"build_args": {}}
    value = entry.get("dockerfile")
    context = entry.get("context")
    if context is not None:
        if not isinstance(context, str) or not context.strip():
            raise ValueError(f"{where}.context must be a directory path")
        out["context"] = context
    args = entry.get("build_args") or {}
    if not isinstance(args, dict):
        raise ValueError(f"{where}.build_args must be a mapping of names to values")
    out["build_args"] = {str(k): str(v) for k, v in args.items()}
    project_dir = entry.get("project_dir")
    if project_dir is not None:
        if (not isinstance(project_dir, str) or not project_dir.startswith("/") or ".." in project_dir.split("/")
                or not project_dir.strip("/")):
            raise ValueError(f"{where}.project_dir must be an absolute path in the image, e.g. /home/appuser/work")
        out["project_dir"] = project_dir.rstrip("/")
    if value is None:
        return out
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}.dockerfile must be the Dockerfile's text or a path in the build context")
    if "\n" in value.strip() or " " in value.strip():
        out["dockerfile"] = value
        return out
    if context is None and not (project and "path" in project):
        raise ValueError(f"{where}.dockerfile {value!r} is a path: it needs a build context (`context:` or a "
                         "`project: {path: ...}`) to be found in")
    root = Path(str(context if context is not None else project["path"])).expanduser()  # type: ignore[index]
    path = (root / value).resolve()
    if not path.is_relative_to(root.resolve()):
        raise ValueError(f"{where}.dockerfile {value!r} is outside the build context {root}")
    try:
        out["dockerfile"] = path.read_text()
    except OSError as exc:
        raise ValueError(f"{where}.dockerfile {value!r}: cannot read {path}: {exc.strerror}") from None
    out["dockerfile_path"] = value
    return out


def _inputs_digest(entry: dict[str, Any]) -> str:
    """What a build reads besides the YAML: a Dockerfile named by path and the local directories
    (``context``, ``project.path``), by name, size, mode and mtime, so a changed input makes a
    new tag and an unchanged one is a cache hit."""
    digest = hashlib.sha256()
    dirs = [entry.get("context")]
    project = entry.get("project")
    if isinstance(project, dict):
        dirs.append(project.get("path"))
    for value in dirs:
        if not isinstance(value, str):
            continue
        root = Path(value).expanduser()
        if not root.is_dir():
            continue
        count = 0
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames) + dirnames:
                full = os.path.join(dirpath, name)
                try:
                    st = os.lstat(full)
                except OSError:
                    continue
                digest.update(f"{os.path.relpath(full, root)}\0{st.st_size}\0{st.st_mode}\0{st.st_mtime_ns}\n".encode())
                count += 1
            if count > 200_000:  # a huge tree: its name and the YAML decide
                break
    return digest.hexdigest()


def _project(value: Any, where: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"{where}.project must be a mapping")
    if "upload" in value:
        if any(k in value for k in ("path", "git", "archive", "ref", "subdir")):
            raise ValueError(f"{where}.project: an `upload` is the whole project; give it alone")
        try:
            return {"upload": check_digest(value["upload"])}
        except ValueError as exc:
            raise ValueError(f"{where}.project.upload: {exc}") from None
    if any(k in value for k in ("path", "git", "archive")):
        return _checked({k: value[k] for k in ("path", "git", "archive", "ref", "subdir") if k in value}, where)
    repo = value.get("repository")
    if isinstance(repo, dict) and {"owner", "name"} <= repo.keys():
        server = repo.get("server", "github.com")
        return _checked({"git": f"https://{server}/{repo['owner']}/{repo['name']}.git",
                         "ref": str(value.get("reference") or "HEAD"),
                         **({"subdir": value["path"]} if value.get("path") else {})}, where)
    raise ValueError(f"{where}.project needs `upload`, `path`, `git` or `archive` (or an upstream `repository`)")


def _project_plugin(plugin: dict[str, Any], where: str) -> dict[str, Any]:
    source = plugin.get("source")
    if source == "local":
        return {"path": plugin.get("path") or "."}
    if source in ("git", "git-clone", "resource"):
        if not plugin.get("url"):
            raise ValueError(f"{where}: a {source} project needs `url`")
        out = {"git": plugin["url"], "ref": str(plugin.get("ref") or "HEAD")}
        if source == "resource" and plugin.get("path"):
            out["subdir"] = plugin["path"]
        return _checked(out, where)
    if source == "archive":
        return {"archive": plugin.get("path") or plugin.get("url")}
    raise ValueError(f"{where}: unknown project source {source!r} (local, git, git-clone, resource, archive)")


def _checked(project: dict[str, Any], where: str) -> dict[str, Any]:
    if "git" in project:
        check_git(str(project["git"]), str(project.get("ref") or "HEAD"), f"{where}.project")
    return project


def host_sources_of(text: str) -> list[tuple[str, str]]:
    """``(field, host path)`` for every host file the build YAML ``text`` reads (checked against
    the build roots before anything is read; see ``build_sources``). Raises ``ValueError`` for a
    malformed source; YAML that does not parse yields none (the parser then says why)."""
    doc = load_build_yaml(text)
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
        return []
    out: list[tuple[str, str]] = []
    for index, entry in enumerate(doc["images"]):
        if not isinstance(entry, dict):
            continue
        where = f"images[{index}]"
        projects = [_project(entry.get("project"), where)]
        for p_index, plugin in enumerate(entry.get("plugins") or []):
            if isinstance(plugin, dict) and plugin.get("type") == "project":
                projects.append(_project_plugin(plugin, f"{where}.plugins[{p_index}]"))
        for project in projects:
            out.extend(host_sources(project, {}, where))
        out.extend(host_sources(None, entry, where))
    return out


def _permission_commands(paths: dict[str, Any]) -> list[str]:
    out = []
    for path, conf in paths.items():
        conf = conf or {}
        owner, group, mode = conf.get("owner"), conf.get("group") or conf.get("owner"), conf.get("mode")
        if owner:
            out.append(f"chown -R {owner}:{group} {shlex.quote(path)}")
        elif group:
            out.append(f"chgrp -R {group} {shlex.quote(path)}")
        if mode:
            out.append(f"chmod -R {mode} {shlex.quote(path)}")
    return out


def _user_commands(plugin: dict[str, Any]) -> list[str]:
    name = str(plugin.get("username", ""))
    uid = int(plugin.get("uid", 1000))
    if not name or name == APPUSER.name or uid == APPUSER.uid:
        return []  # appuser (uid 1000) always exists locally
    shell = shlex.quote(str(plugin.get("shell", "/bin/bash")))
    gid = int(plugin.get("gid", uid))
    group = str(plugin.get("group") or name)
    return [f"getent group {group} >/dev/null || groupadd -g {gid} {group}",
            f"id -u {name} >/dev/null 2>&1 || useradd -m -u {uid} -g {group} -s {shell} {name}"]


def _commands(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        text = value.replace("\\\n", " ")
        lines = [re.sub(r"^\s*RUN\s+", "", line) for line in text.splitlines()]
        return [line for line in lines if line.strip()]
    if isinstance(value, list) and all(isinstance(c, str) for c in value):
        return [c for c in value if c.strip()]
    raise ValueError(f"{where}.commands must be a list of strings or a string")
