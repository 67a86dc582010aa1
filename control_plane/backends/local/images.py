"""The local image store: registered projects, built and imported images, by tag.

An image is a directory ``<state>/images/data/<id>/`` holding ``image.json``, the layers it adds
to each root tree (``layers/usr``, ``layers/etc``… — overlayfs upper directories, whiteouts
included) and its full project (``project/``). A tag points at an id through
``images/refs/<slug>.json``; ids never change once written, so re-registering a tag never alters
a running sandbox or an image built on the old one (an image records its base by *id*). The
built-in image is made once per state directory (``builtin_image.py``); what images are
made of, and copying their trees, is in ``image_trees.py``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...appuser import APPUSER
from ...image_tags import check_image_tag
from ...images import BUILTIN_IMAGE
from .builtin_image import BUILTIN_ID, materialize_builtin
from .image_trees import TREES, ImageError, chown_tree, copy_tree

log = logging.getLogger(__name__)


def check_tag(tag: str) -> str:
    try:
        return check_image_tag(tag)
    except ValueError as exc:
        raise ImageError(str(exc)) from None


def slug(tag: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "_", tag)[:60] + "-" + hashlib.sha1(tag.encode()).hexdigest()[:8]


@dataclass(frozen=True)
class ResolvedImage:
    """An image with its whole base chain resolved to directories (top layer first)."""

    tag: str
    id: str
    lowers: dict[str, tuple[str, ...]]
    project: str
    env: dict[str, str] = field(default_factory=dict)
    network: bool = False
    # An OCI image: the lower layers of the whole root filesystem (top first; ``lowers`` is
    # then empty), see ``oci.rootfs``.
    rootfs: tuple[str, ...] = ()
    project_dir: str = "/home/appuser/work"  # where the sandbox's project is (an OCI image's WORKDIR)

    @property
    def is_oci(self) -> bool:
        return bool(self.rootfs)


class ImageStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.refs = root / "refs"
        self.data = root / "data"
        self._cache: dict[str, ResolvedImage] = {}

    # -- lookup ----------------------------------------------------------------------------------

    def ensure(self) -> None:
        """Create the store and the built-in image (once per state directory)."""
        self.refs.mkdir(parents=True, exist_ok=True)
        self.data.mkdir(parents=True, exist_ok=True)
        if (self.data / BUILTIN_ID / "image.json").exists():
            return
        with self._lock():
            if (self.data / BUILTIN_ID / "image.json").exists():
                return
            started = time.monotonic()
            how = materialize_builtin(self.data)
            self._write_ref(BUILTIN_IMAGE, BUILTIN_ID)
            log.info("the built-in image (%s) in %.0f ms", how, (time.monotonic() - started) * 1000)

    def image_id(self, tag: str) -> str | None:
        try:
            return json.loads((self.refs / f"{slug(tag)}.json").read_text())["id"]
        except (OSError, ValueError, KeyError):
            return None

    def exists(self, tag: str) -> bool:
        ident = self.image_id(tag)
        return ident is not None and (self.data / ident / "image.json").exists()

    def tags(self) -> list[str]:
        out = []
        for ref in self.refs.glob("*.json"):
            try:
                out.append(json.loads(ref.read_text())["tag"])
            except (OSError, ValueError, KeyError):
                continue
        return sorted(out)

    def resolve(self, tag: str) -> ResolvedImage | None:
        ident = self.image_id(tag)
        if ident is None:
            return None
        cached = self._cache.get(ident)
        if cached is not None and cached.tag == tag:
            return cached
        resolved = self.resolve_id(ident, tag)
        self._cache[ident] = resolved
        return resolved

    def resolve_id(self, ident: str, tag: str | None = None) -> ResolvedImage:
        lowers: dict[str, list[str]] = {t: [] for t in TREES}
        env: dict[str, str] = {}
        network = False
        project: str | None = None
        chain = []
        current: str | None = ident
        while current is not None:
            meta = self._meta(current)
            chain.append(meta)
            current = meta.get("base_id")
            if len(chain) > 64:
                raise ImageError(f"image {ident}: base chain too deep (a loop?)")
        rootfs = self._oci_rootfs(chain)
        project_dir = next((m["project_dir"] for m in chain if m.get("project_dir")), "/home/appuser/work")
        for meta in chain:
            d = self.data / meta["id"]
            for tree in TREES:
                layer = d / "layers" / tree
                if tree in meta.get("layers", []):
                    lowers[tree].append(str(layer))
            if meta.get("host_usr"):
                lowers["usr"].append("/usr")
            if project is None and (d / "project").is_dir():
                project = str(d / "project")
        for meta in reversed(chain):  # the top image's values win
            env.update(meta.get("env", {}))
            network = network or bool(meta.get("network"))
        if project is None:
            raise ImageError(f"image {ident} has no project directory")
        return ResolvedImage(tag or chain[0]["tag"], ident, {t: tuple(v) for t, v in lowers.items()},
                             project, env, network, rootfs, project_dir)

    def _oci_rootfs(self, chain: list[dict[str, Any]]) -> tuple[str, ...]:
        """The root's lowers when the chain ends in an OCI image (only projects may sit above it)."""
        oci = [meta for meta in chain if meta.get("kind") == "oci"]
        if not oci:
            return ()
        top = chain[0]
        if chain[-1] is not oci[0] or any(meta.get("layers") for meta in chain if meta is not oci[0]):
            raise ImageError(f"image {top['tag']!r} stacks filesystem layers on the OCI image {oci[0]['tag']!r}: "
                             "build it from a Dockerfile instead")
        layers = [str(self.data / oci[0]["id"] / "adapt"), *oci[0]["oci"]["layers"]]
        for layer in layers:
            if not os.path.isdir(layer):
                raise ImageError(f"image {top['tag']!r}: its layer {layer} is gone (was the image cache removed?); "
                                 "build the image again")
        return tuple(layers)

    def _meta(self, ident: str) -> dict[str, Any]:
        try:
            return json.loads((self.data / ident / "image.json").read_text())
        except (OSError, ValueError) as exc:
            raise ImageError(f"image data {ident} is missing or damaged: {exc}") from exc

    # -- adding images ---------------------------------------------------------------------------

    def new_image_dir(self, tag: str) -> Path:
        path = self.data / f".tmp-{slug(tag)}.{secrets.token_hex(4)}"
        (path / "layers").mkdir(parents=True)
        return path

    def commit(self, tmp: Path, tag: str, base: str | None, *, base_id: str | None = None,
               env: dict[str, str] | None = None, network: bool = False, notes: list[str] | None = None) -> str:
        """Turn a directory prepared by ``new_image_dir`` into the image ``tag``; returns its id."""
        check_tag(tag)
        if base is not None and base_id is None:
            base_id = self.image_id(base)
            if base_id is None:
                raise ImageError(f"base image {base!r} is not in the local image store")
        ident = tmp.name.removeprefix(".tmp-")
        layers = [t for t in TREES if (tmp / "layers" / t).is_dir() and any((tmp / "layers" / t).iterdir())]
        for tree in TREES:
            if tree not in layers and (tmp / "layers" / tree).exists():
                shutil.rmtree(tmp / "layers" / tree)
        meta = {"tag": tag, "id": ident, "base": base, "base_id": base_id, "layers": layers,
                "env": env or {}, "network": network, "created": time.time(), "notes": notes or []}
        (tmp / "image.json").write_text(json.dumps(meta, indent=1))
        tmp.rename(self.data / ident)
        self._write_ref(tag, ident)
        return ident

    def add_oci(self, tag: str, ident: str, prepared: Path | None, meta: dict[str, Any]) -> str:
        """Point ``tag`` at the OCI image ``ident``, moving ``prepared`` (``adapt/``, ``project/``)
        into the store unless that image is there already (ids are content-addressed)."""
        check_tag(tag)
        target = self.data / ident
        if not (target / "image.json").exists():
            if prepared is None:
                raise ImageError(f"image data {ident} is missing")
            full = {"tag": tag, "id": ident, "kind": "oci", "base": None, "base_id": None, "layers": [],
                    "created": time.time(), **meta}
            (prepared / "image.json").write_text(json.dumps(full, indent=1))
            try:
                prepared.rename(target)
            except OSError:
                if not (target / "image.json").exists():  # not a concurrent import of the same image
                    raise
        self._write_ref(tag, ident)
        self._cache.pop(ident, None)
        return ident

    def meta(self, tag: str) -> dict[str, Any] | None:
        ident = self.image_id(tag)
        return self._meta(ident) if ident else None

    def register_project(self, tag: str, directory: Path, base: str = BUILTIN_IMAGE) -> str:
        check_tag(tag)
        directory = Path(directory).resolve()
        if not directory.is_dir():
            raise ImageError(f"project directory {directory} does not exist")
        if not self.exists(base):
            raise ImageError(f"base image {base!r} is not in the local image store")
        tmp = self.new_image_dir(tag)
        try:
            copy_tree(directory, tmp / "project")
            chown_tree(tmp / "project", APPUSER[1], APPUSER[2])
            self.commit(tmp, tag, base)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return tag

    def _write_ref(self, tag: str, ident: str) -> None:
        ref = self.refs / f"{slug(tag)}.json"
        tmp = ref.with_suffix(f".{secrets.token_hex(4)}.tmp")
        tmp.write_text(json.dumps({"tag": tag, "id": ident}))
        tmp.replace(ref)

    def _lock(self):
        return _FileLock(self.root / ".lock")


class _FileLock:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
