"""The host's cache of built images: an image built once per host, whichever control plane asks.

Every state directory has a buildah store of its own; a Dockerfile image one control plane built
would be built again, from scratch, by the next (an embedded one per trainer, one per test).
Instead a build runs in this cache's buildah store (``<cache>/store``, which reads the bases'
store as the state directories do) under a key of everything its result depends on
(``build_key``), and every state directory reads that store as an *additional image store*, as
the bases': the control plane that built the image and any that find its key later take it from
there, its layers read where they are (only our small adaptation layer and the project's copy are
made per state directory, ``build.OciBuilder._import``). buildah's own layer cache is then shared
too: a step another control plane ran is ``Using cache`` here.

``<cache>/<key>.json``: the record, renamed into place only once the build committed its image,
so a control plane killed while building leaves nothing another one takes as complete (an image
without a record, or a record whose image is gone, is a miss); ``.<key>.lock``: held while a key
is looked up, built and recorded, so two control planes building one key at once build it once;
``.builds.lock``: held shared by every build running here, so that the working containers of a
build that was killed (``buildah bud`` removes its own unless it is killed) are removed when no
build is running (``building``).
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import secrets
import stat
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .buildah import Buildah
from .rootfs import ADAPT_VERSION
from .settings import OciSettings

# What the key is made of changes: old records must not match (bump with build_key's inputs).
KEY_VERSION = 1
LOCK_POLL = 0.2  # seconds between tries of a lock another control plane holds
BUILDS_LOCK = ".builds.lock"
NAME = "localhost/idegym-build"


@dataclass(frozen=True)
class BuildInputs:
    """What a build's result depends on, as ``OciBuilder`` runs it.

    ``dockerfile`` is the text buildah reads (bases rewritten to image ids, here-documents
    lowered, the host configuration's ARG lines added); ``bases`` the ids of the images it builds
    on; ``host_files`` the directory of the host's package configuration bound into networked RUN
    steps and ``host_proxies`` the proxy variables they get (hashed: they may hold credentials)."""

    dockerfile: str
    context: Path
    build_args: dict[str, str]
    labels: dict[str, str]
    bases: tuple[str, ...]
    network: bool
    host_files: Path | None = None
    host_proxies: dict[str, str] | None = None


def build_key(inputs: BuildInputs, buildah_version: str) -> str:
    """A key two builds share only when their inputs are the same: the Dockerfile, the context's
    names, kinds, modes and contents (not owners or times: COPY makes files root's unless told,
    and Docker's own cache ignores times too), the build arguments and labels, the bases' ids,
    whether RUN steps had the network and with which host configuration, buildah's version and
    our adaptation layer's."""
    material = {
        "version": KEY_VERSION, "adapt": ADAPT_VERSION, "buildah": buildah_version,
        "dockerfile": inputs.dockerfile, "context": tree_digest(inputs.context),
        "build_args": sorted(inputs.build_args.items()), "labels": sorted(inputs.labels.items()),
        "bases": sorted(inputs.bases), "network": inputs.network,
        "host_files": tree_digest(inputs.host_files) if inputs.host_files is not None else None,
        "host_proxies": sorted((inputs.host_proxies or {}).items()),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]


def tree_digest(root: Path) -> str:
    """The names, kinds, permission bits and contents of everything under ``root`` (links not followed)."""
    digest = hashlib.sha256()

    def walk(directory: Path, rel: str) -> None:
        with os.scandir(directory) as found:
            entries = sorted(found, key=lambda e: e.name)
        for entry in entries:
            path = f"{rel}/{entry.name}" if rel else entry.name
            info = entry.stat(follow_symlinks=False)
            mode = stat.S_IMODE(info.st_mode)
            if entry.is_symlink():
                digest.update(f"L {path} {os.readlink(entry.path)}\0".encode())
            elif entry.is_dir(follow_symlinks=False):
                digest.update(f"D {path} {mode:o}\0".encode())
                walk(Path(entry.path), path)
            elif entry.is_file(follow_symlinks=False):
                with open(entry.path, "rb") as fh:
                    content = hashlib.file_digest(fh, "sha256").hexdigest()
                digest.update(f"F {path} {mode:o} {content}\0".encode())
            else:
                digest.update(f"S {path} {stat.S_IFMT(info.st_mode):o} {mode:o}\0".encode())

    walk(root, "")
    return digest.hexdigest()


class BuildCache:
    """Published builds: looked up and published under a key's lock (``claim``)."""

    def __init__(self, settings: OciSettings, bases: Path) -> None:
        """``bases``: the home of the bases' store, which builds here build on."""
        self.root = settings.builds_dir
        self.buildah = Buildah(self.root / "store", settings, additional=(bases,))
        self._version: str | None = None

    @property
    def store_home(self) -> Path:
        return self.buildah.home

    def ensure_dirs(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)  # the operator's, as the bases' store
        self.buildah.ensure()

    def buildah_version(self) -> str:
        if self._version is None:
            self._version = subprocess.run(["buildah", "--version"], capture_output=True, text=True,
                                           timeout=60).stdout.strip()
        return self._version

    @asynccontextmanager
    async def claim(self, key: str, emit: Callable[[str], None]) -> AsyncIterator[None]:
        """The key's lock, for the lookup, a build and its publication: another control plane
        building the same key waits, then finds it published."""
        fd = os.open(self.root / f".{key}.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            await _flock(fd, fcntl.LOCK_EX, lambda: emit(
                f"waiting for another build of the same image (the host's build cache, key {key})"))
            yield
        finally:
            os.close(fd)

    @asynccontextmanager
    async def building(self) -> AsyncIterator[None]:
        """Held, shared, by every build in the cache's store. A build that finds none running holds
        it alone first and removes the working containers that builds killed mid-way left: with no
        build running, every container in this store is one (state directories only read it)."""
        fd = os.open(self.root / BUILDS_LOCK, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            if _try_flock(fd, fcntl.LOCK_EX):
                await asyncio.to_thread(self._remove_leftovers)
            await _flock(fd, fcntl.LOCK_SH)  # (from exclusive: not atomic; a build between cleans again)
            yield
        finally:
            os.close(fd)

    def remove_leftovers(self) -> int:
        """The working containers killed builds left, removed unless a build is running; how many (blocking)."""
        fd = os.open(self.root / BUILDS_LOCK, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            return self._remove_leftovers() if _try_flock(fd, fcntl.LOCK_EX) else 0
        finally:
            os.close(fd)

    def _remove_leftovers(self) -> int:
        left = self.buildah.containers()
        self.buildah.remove_containers(left)
        return len(left)

    def lookup(self, key: str) -> dict[str, Any] | None:
        """The published record of ``key`` whose image is whole in the store, or None (blocking)."""
        try:
            record = json.loads((self.root / f"{key}.json").read_text())
        except (OSError, ValueError):
            return None
        ident = record.get("image_id") if isinstance(record, dict) else None
        if not isinstance(ident, str) or self.buildah.image_id(ident) != ident:
            return None
        os.utime(self.root / f"{key}.json")  # used now (``prune``)
        return record

    def sees(self, image_ids: tuple[str, ...]) -> bool:
        """Whether a build in the cache's store finds these bases (an image only a state directory
        has, built before its control plane shared builds, is not there) (blocking)."""
        return all(self.buildah.image_id(ident) == ident for ident in image_ids)

    def publish(self, key: str, image_id: str, tag: str, seconds: float) -> None:
        """Write the record of an image built into the cache's store as ``NAME:key``: it is whole (blocking)."""
        record = {"key": key, "image_id": image_id, "tag": tag, "seconds": round(seconds, 1), "built": time.time()}
        _save(self.root / f"{key}.json", record)

    def prune(self, unused_for: float, keep: set[str], dry_run: bool = False) -> list[dict[str, Any]]:
        """Remove the published images no control plane took or published for ``unused_for``
        seconds, but those whose top layer is in ``keep`` (the layer directories an image store of
        this host reads: an image built on a published one reads its layers too), each under its
        key's lock, its record first (nobody takes it meanwhile); and images a build killed before
        its record was written left. What was (or would be) removed (blocking). buildah's layer
        cache (the steps' unnamed images) stays."""
        removed: list[dict[str, Any]] = []
        if not (self.root / "store").is_dir():
            return removed
        self.buildah.ensure()
        now = time.time()
        published = {name.rsplit(":", 1)[1]: image["id"]
                     for image in json.loads(self.buildah.query(["images", "--json"]) or "null") or []
                     for name in image.get("names") or [] if name.startswith(f"{NAME}:")}
        records = {path.stem for path in self.root.glob("*.json")}
        for key in sorted(records | set(published)):
            fd = os.open(self.root / f".{key}.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                record_path = self.root / f"{key}.json"
                try:
                    used, record = record_path.stat().st_mtime, json.loads(record_path.read_text())
                except (OSError, ValueError):
                    used, record = None, {}
                ident = str(record.get("image_id") or published.get(key) or "")
                present = bool(ident) and self.buildah.image_id(ident) == ident
                if (used is not None and used > now - unused_for) or \
                        (present and str(self.buildah.inspect(ident).layers[0]) in keep):
                    continue
                removed.append({"key": key, "image_id": ident or None, "tag": record.get("tag"),
                                "unused_days": round((now - used) / 86400, 1) if used else None})
                if dry_run:
                    continue
                record_path.unlink(missing_ok=True)
                if present:
                    self.buildah.query(["rmi", "--force", ident])  # (its name and a tag's it was built as)
            finally:
                os.close(fd)  # (lock files stay: one removed while another process waits on it would let a third in)
        return removed


def _try_flock(fd: int, operation: int) -> bool:
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


async def _flock(fd: int, operation: int, on_wait: Callable[[], None] | None = None) -> None:
    """Polled, not a blocking ``flock`` on a thread: a cancelled build leaves no thread waiting to
    take the lock for nobody."""
    if _try_flock(fd, operation):
        return
    if on_wait is not None:
        on_wait()
    while not _try_flock(fd, operation):
        await asyncio.sleep(LOCK_POLL)


def _save(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(3)}.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)
