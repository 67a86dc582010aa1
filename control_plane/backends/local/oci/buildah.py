"""Running buildah: our own storage and registries configuration, and reading its image store.

Every buildah command runs in a private mount and pid namespace (``unshare --mount --pid``):
whatever it mounts (build containers, layers) and starts goes away with it, even when it is
killed; without network
it also gets an empty network namespace (``unshare --net``) — buildah's ``chroot`` isolation
cannot take ``--network none`` itself, and bases are local, so a build needs no network unless
its ``RUN`` steps may use it.

A store is a directory ``home`` with ``storage/`` (the overlay driver's graph root), ``run/``,
``tmp/`` and the generated ``storage.conf``, ``registries.conf`` and ``policy.json``; other
stores (the shared cache of bases) are read as *additional image stores* (read-only, shared).
Sandboxes use the layer directories of an image (``<store>/overlay/<layer>/diff``, native
overlayfs format) as their lower layers, read through containers-storage's JSON records.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .settings import OciError, OciSettings

log = logging.getLogger(__name__)

DRIVER = "overlay"
LINE_LIMIT = 1 << 20  # a longer line of output (no newline in sight) is passed on in pieces of this
POLICY = {"default": [{"type": "insecureAcceptAnything"}]}


def available() -> str | None:
    """Why OCI builds cannot run here, or None."""
    for tool in ("buildah", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian package {'buildah' if tool == 'buildah' else 'util-linux'}; " \
                   "`make system-deps` installs it)"
    if os.geteuid() != 0:
        return "OCI image builds need root (buildah's overlay storage, mmdebstrap's root mode)"
    return None


def storage_name(tag: str) -> str:
    """The name an image of the local store has in buildah's store (``FROM <tag>`` finds it)."""
    first = tag.split("/", 1)[0]
    if "/" in tag and ("." in first or ":" in first or first == "localhost"):
        return tag
    return f"localhost/{tag}"


STEP_LINE = re.compile(r"^STEP \d+/\d+: ")



async def output_lines(stream: asyncio.StreamReader, limit: int = LINE_LIMIT) -> AsyncIterator[str]:
    """A process's output, line by line, all of it: a line past ``limit`` comes in pieces of
    ``limit`` (``StreamReader.readline`` would drop what it had buffered of it)."""
    pending = b""
    while chunk := await stream.read(1 << 16):
        *complete, pending = (pending + chunk).split(b"\n")
        for raw in complete:
            for at in range(0, max(len(raw), 1), limit):
                yield raw[at:at + limit].decode(errors="replace")
        while len(pending) >= limit:
            yield pending[:limit].decode(errors="replace")
            pending = pending[limit:]
    if pending:
        yield pending.decode(errors="replace")

@dataclass
class Result:
    returncode: int
    tail: list[str] = field(default_factory=list)
    timed_out: bool = False
    step: str | None = None  # the last ``STEP n/m: …`` line buildah printed: where it stopped

    def message(self, lines: int = 25) -> str:
        """What went wrong first (the step, buildah's error), then its last lines."""
        errors = [ln for ln in self.tail if ln.startswith(("Error:", "error", "level=error"))]
        head = [f"failed at {self.step}"] if self.step else []
        head += errors[-1:]
        text = "\n".join(self.tail[-lines:])
        return "\n".join(head + ["buildah's last lines:", text]) if head else text


@dataclass(frozen=True)
class ImageInfo:
    id: str
    names: tuple[str, ...]
    config: dict[str, Any]
    layers: tuple[Path, ...]  # diff directories, top layer first
    labels: dict[str, str]


class Buildah:
    def __init__(self, home: Path, settings: OciSettings, additional: tuple[Path, ...] = ()) -> None:
        self.home = home
        self.settings = settings
        self.additional = tuple(additional)  # other stores' homes (read-only image stores)
        self.graphroot = home / "storage"

    # -- configuration -----------------------------------------------------------------------

    def ensure(self) -> None:
        for sub in ("storage", "run", "tmp"):
            (self.home / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.home, 0o700)
        for home in self.additional:
            (home / "storage").mkdir(parents=True, exist_ok=True)
        extra = ", ".join(json.dumps(str(h / "storage")) for h in self._remembered_stores())
        storage = (f"[storage]\ndriver = \"{DRIVER}\"\ngraphroot = {json.dumps(str(self.graphroot))}\n"
                   f"runroot = {json.dumps(str(self.home / 'run'))}\n"
                   f"[storage.options]\nadditionalimagestores = [{extra}]\n"
                   "[storage.options.overlay]\nmountopt = \"nodev\"\n")
        registries = self._registries_conf()
        for name, text in (("storage.conf", storage), ("registries.conf", registries),
                           ("policy.json", json.dumps(POLICY))):
            path = self.home / name
            if not path.exists() or path.read_text() != text:
                tmp = path.with_name(f".{name}.{os.getpid()}.{threading.get_ident()}")
                tmp.write_text(text)
                tmp.replace(path)

    def _remembered_stores(self) -> list[Path]:
        """The additional stores, and every one this store used before (its images' lower
        layers may live there: a changed cache location must not break them)."""
        record = self.home / "additional-stores.json"
        try:
            known = [Path(p) for p in json.loads(record.read_text())]
        except (OSError, ValueError):  # none yet: what the configuration names, if any
            try:
                conf = (self.home / "storage.conf").read_text()
                line = re.search(r"^additionalimagestores = (\[.*\])$", conf, re.MULTILINE)
                known = [Path(p).parent for p in json.loads(line.group(1))] if line else []
            except (OSError, ValueError):
                known = []
        stores = list(dict.fromkeys([*self.additional, *known]))
        if stores != known:
            tmp = record.with_name(f".{record.name}.{os.getpid()}.{threading.get_ident()}")
            tmp.write_text(json.dumps([str(p) for p in stores]))
            tmp.replace(record)
        self.additional = tuple(p for p in stores if (p / "storage").is_dir())
        return list(self.additional)

    def _registries_conf(self) -> str:
        mirror = self.settings.registry
        if not mirror:  # nothing is pulled: every base is local, short names resolve only locally
            return 'unqualified-search-registries = []\nshort-name-mode = "disabled"\n'
        insecure = "true" if self.settings.insecure_registry else "false"
        host = mirror.split("/", 1)[0]
        return ('unqualified-search-registries = ["docker.io"]\nshort-name-mode = "permissive"\n'
                f'[[registry]]\nprefix = "docker.io"\nlocation = {json.dumps(mirror)}\ninsecure = {insecure}\n'
                f'[[registry]]\nprefix = {json.dumps(host)}\nlocation = {json.dumps(host)}\ninsecure = {insecure}\n')

    def env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8", "HOME": str(self.home),
                "TMPDIR": str(self.home / "tmp"), "BUILDAH_ISOLATION": "chroot",
                "CONTAINERS_STORAGE_CONF": str(self.home / "storage.conf"),
                "CONTAINERS_REGISTRIES_CONF": str(self.home / "registries.conf"),
                "XDG_RUNTIME_DIR": str(self.home / "run")}

    def argv(self, args: list[str], network: bool) -> list[str]:
        # Its own pid namespace too: killing unshare kills its child (--kill-child), the
        # namespace's init, and with it every process of the build (RUN steps included).
        prefix = ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child", "--mount-proc"]
        if not network:
            prefix.append("--net")
        return [*prefix, "--", "buildah", *args]

    @property
    def policy(self) -> str:
        return str(self.home / "policy.json")

    # -- running -----------------------------------------------------------------------------

    async def run(self, args: list[str], *, network: bool, emit: Callable[[str], None] | None = None,
                  timeout: float = 3600.0, keep: int = 200, cwd: Path | None = None) -> Result:
        """Run buildah, passing each output line to ``emit``; the last ``keep`` lines are kept."""
        proc = await asyncio.create_subprocess_exec(
            *self.argv(args, network), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, env=self.env(), start_new_session=True, cwd=str(cwd) if cwd else None)
        tail: deque[str] = deque(maxlen=keep)
        timed_out = False
        step: str | None = None

        async def pump() -> None:
            assert proc.stdout is not None
            async for line in output_lines(proc.stdout):
                if STEP_LINE.match(line):
                    nonlocal step
                    step = line[:300]
                tail.append(line)
                if emit is not None:
                    emit(line)

        try:
            await asyncio.wait_for(pump(), timeout)
            await proc.wait()
        except (TimeoutError, asyncio.CancelledError) as exc:
            timed_out = isinstance(exc, TimeoutError)
            _kill_group(proc.pid)
            await asyncio.shield(proc.wait())
            if not timed_out:
                raise
        code = -signal.SIGKILL if timed_out or proc.returncode is None else proc.returncode
        return Result(code, list(tail), timed_out, step)

    def query(self, args: list[str], timeout: float = 120.0) -> str:
        proc = subprocess.run(self.argv(args, network=False), capture_output=True, env=self.env(), timeout=timeout)
        if proc.returncode != 0:
            raise OciError(f"buildah {' '.join(args[:2])} failed: {proc.stderr.decode(errors='replace').strip()}", 500)
        return proc.stdout.decode()

    # -- the image store ---------------------------------------------------------------------

    def image_id(self, name: str) -> str | None:
        try:
            out = self.query(["inspect", "--type", "image", "--format", "{{.FromImageID}}", name])
        except OciError:
            return None
        return out.strip() or None

    def containers(self) -> set[str]:
        data = json.loads(self.query(["containers", "--json"]) or "null") or []
        return {c["id"] for c in data}

    def remove_containers(self, ids: set[str]) -> None:
        if ids:
            subprocess.run(self.argv(["rm", *sorted(ids)], network=False), capture_output=True, env=self.env(),
                           timeout=300)

    def tag(self, image: str, *names: str) -> None:
        self.query(["tag", image, *names])

    def inspect(self, image: str) -> ImageInfo:
        data = json.loads(self.query(["inspect", "--type", "image", image]))
        ident = data["FromImageID"]
        record = self._image_record(ident)
        oci = data.get("OCIv1") or {}
        config = oci.get("config") or {}
        return ImageInfo(ident, tuple(record.get("names") or ()), config, tuple(self._layer_chain(record["layer"])),
                         dict(config.get("Labels") or {}))

    def _stores(self) -> list[Path]:
        return [self.graphroot, *(h / "storage" for h in self.additional)]

    def _image_record(self, ident: str) -> dict[str, Any]:
        for store in self._stores():
            for record in _read_json(store / f"{DRIVER}-images" / "images.json"):
                if record.get("id") == ident:
                    return record
        raise OciError(f"image {ident[:12]} is not in buildah's store", 500)

    def _layer_chain(self, top: str) -> list[Path]:
        layers: dict[str, tuple[Path, dict[str, Any]]] = {}
        for store in self._stores():
            for record in _read_json(store / f"{DRIVER}-layers" / "layers.json"):
                layers.setdefault(record["id"], (store, record))
        chain, current = [], top
        while current:
            if current not in layers:
                raise OciError(f"layer {current[:12]} of an image is missing from buildah's stores", 500)
            store, record = layers[current]
            diff = store / DRIVER / current / "diff"
            if not diff.is_dir():
                raise OciError(f"layer directory {diff} is missing", 500)
            chain.append(diff)
            current = record.get("parent") or ""
            if len(chain) > 500:
                raise OciError("an image's layer chain does not end (a loop?)", 500)
        return chain


def _read_json(path: Path) -> list[dict[str, Any]]:
    try:
        return json.loads(path.read_text()) or []
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise OciError(f"cannot read {path}: {exc}", 500) from exc


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
