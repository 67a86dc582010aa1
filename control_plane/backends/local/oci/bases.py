"""Distribution bases: ``debian:<release>[-slim]`` and ``python:3.X[-slim]``, built with mmdebstrap.

A base is built once per *recipe* (release, variant, packages, mirror — hashed into its key)
and kept in the shared cache's buildah store under the names Dockerfiles use
(``docker.io/library/debian:bookworm``…), so ``FROM debian:bookworm`` resolves locally, in
every state directory (they read the cache store as an additional image store).

``python:3.X`` is the Debian release whose ``python3`` is closest to 3.X (a tie goes to the
newer one), with pip, venv, ``python`` → ``python3``, and no EXTERNALLY-MANAGED marker (as in
the official image, ``pip install`` works); ``python:3.X-<release>`` takes that release as
asked. Which release a name maps to is said in the build log and recorded in the image.

What differs from Docker Hub's images: the package lists from the build are kept (so
``apt-get install`` works without ``apt-get update``), and the Python is Debian's.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .buildah import Buildah
from .settings import OciError, OciSettings, find_debian_mirror

log = logging.getLogger(__name__)

RECIPE_VERSION = 1
TOOL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Release:
    codename: str
    number: int
    python: tuple[int, int]  # its python3


RELEASES = {"bookworm": Release("bookworm", 12, (3, 11)), "trixie": Release("trixie", 13, (3, 13))}
NEWEST = "trixie"
DEBIAN_ALIASES = {"12": "bookworm", "13": "trixie", "stable": NEWEST, "latest": NEWEST}
MAX_PYTHON_DISTANCE = 1  # minor versions
PYTHON_PACKAGES = ("python3", "python3-pip", "python3-venv", "python-is-python3", "ca-certificates")
SLIM_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/groff/*", "/usr/share/info/*",
                 "/usr/share/lintian/*", "/usr/share/linda/*", "/usr/share/locale/*")
SLIM_INCLUDES = ("/usr/share/doc/*/copyright", "/usr/share/locale/locale.alias")


def python_range() -> tuple[tuple[int, int], tuple[int, int]]:
    pys = [r.python for r in RELEASES.values()]
    low, high = min(pys), max(pys)
    return (low[0], low[1] - MAX_PYTHON_DISTANCE), (high[0], high[1] + MAX_PYTHON_DISTANCE)


def supported_text() -> str:
    (lo, hi) = python_range()
    rels = ", ".join(f"debian:{r.codename} (debian:{r.number})" for r in RELEASES.values())
    pys = "; ".join(f"{r.codename} has python3 {r.python[0]}.{r.python[1]}" for r in RELEASES.values())
    return (f"{rels}, each also -slim, debian:stable/latest = {NEWEST}; python:{lo[0]}.{lo[1]} to "
            f"python:{hi[0]}.{hi[1]} (and -slim, -<release>), mapped to the Debian release with the closest "
            f"python3 ({pys})")


@dataclass(frozen=True)
class BaseSpec:
    """A supported base name and the recipe that builds it."""

    name: str  # as Docker Hub names it: docker.io/library/python:3.12-slim
    release: Release
    slim: bool
    python: tuple[int, int] | None  # the version asked for (python bases)
    note: str | None = None
    packages: tuple[str, ...] = ()

    def recipe(self, mirror: str) -> dict[str, Any]:
        return {"v": RECIPE_VERSION, "release": self.release.codename, "variant": "minbase", "slim": self.slim,
                "packages": sorted(self.packages), "python_base": self.python is not None, "mirror": mirror}

    def key(self, mirror: str) -> str:
        return hashlib.sha256(json.dumps(self.recipe(mirror), sort_keys=True).encode()).hexdigest()[:16]


def _split(ref: str) -> tuple[str, str]:
    """(repository, tag) of a Docker Hub reference; ('', '') for references elsewhere."""
    name = ref.strip()
    if "@" in name:
        return name.split("@", 1)[0], "@"
    for prefix in ("docker.io/", "index.docker.io/", "registry-1.docker.io/"):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    else:
        first = name.split("/", 1)[0]
        if "/" in name and ("." in first or ":" in first or first == "localhost"):
            return "", ""
    name = name.removeprefix("library/")
    repo, _, tag = name.partition(":")
    return repo, tag or "latest"


def resolve(ref: str) -> BaseSpec | None:
    """The base ``ref`` names, None when it is not a family we build (debian, python).

    Raises ``OciError`` for a tag of those families that has no local equivalent.
    """
    repo, tag = _split(ref)
    if repo not in ("debian", "python"):
        return None
    if tag == "@":
        raise OciError(f"base {ref!r} is pinned by digest: a locally built base cannot have that digest. Use a tag "
                       f"({supported_text()}), or configure a registry mirror (--image-registry)")
    tokens = tag.split("-")
    if repo == "debian":
        codename = DEBIAN_ALIASES.get(tokens[0], tokens[0])
        if re.fullmatch(r"\d+\.\d+", tokens[0]):  # a point release: 12.8
            codename = DEBIAN_ALIASES.get(tokens[0].split(".")[0], tokens[0])
        rest = tokens[1:]
        if codename not in RELEASES or rest not in ([], ["slim"]):
            raise OciError(f"base {ref!r} is not supported here: supported bases are {supported_text()}; other "
                           "images need a registry mirror (--image-registry)")
        slim = rest == ["slim"]
        return BaseSpec(f"docker.io/library/debian:{tag}", RELEASES[codename], slim, None)
    version, flags = None, []
    for token in tokens:
        if token == "latest":
            continue
        if re.fullmatch(r"\d+(\.\d+){0,2}", token) and version is None and not flags:
            version = token
        elif token in ("slim", *RELEASES):
            flags.append(token)
        else:
            raise OciError(f"base {ref!r} is not supported here ({token!r} variants are not built locally): "
                           f"supported bases are {supported_text()}; other images need a registry mirror "
                           "(--image-registry)")
    slim = "slim" in flags
    asked_release = next((f for f in flags if f in RELEASES), None)
    wanted: tuple[int, int] | None = None
    if version is not None:
        parts = [int(p) for p in version.split(".")]
        if parts[0] != 3:
            raise OciError(f"base {ref!r}: no Debian release here has Python {version} (supported: {supported_text()})")
        if len(parts) > 1:
            wanted = (3, parts[1])
    if asked_release:
        release = RELEASES[asked_release]
        if wanted and wanted != release.python:
            note = (f"{ref} -> Debian {release.codename} as named; its python3 is "
                    f"{release.python[0]}.{release.python[1]}, not {wanted[0]}.{wanted[1]}")
        else:
            note = f"{ref} -> Debian {release.codename} (python3 {release.python[0]}.{release.python[1]})"
    elif wanted is None:
        release = RELEASES[NEWEST]
        note = f"{ref} -> Debian {release.codename} (python3 {release.python[0]}.{release.python[1]}, the newest here)"
    else:
        def distance(r: Release) -> tuple[int, int]:
            return abs(r.python[1] - wanted[1]), -r.python[1]  # ties go to the newer python3

        release = min(RELEASES.values(), key=distance)
        gap = abs(release.python[1] - wanted[1])
        if gap > MAX_PYTHON_DISTANCE:
            raise OciError(f"base {ref!r}: no Debian release here has a python3 close to {wanted[0]}.{wanted[1]} "
                           f"(supported: {supported_text()})")
        have = f"{release.python[0]}.{release.python[1]}"
        note = (f"{ref} -> Debian {release.codename} (python3 {have})" if gap == 0 else
                f"{ref} -> Debian {release.codename}: its python3 {have} is the closest to {wanted[0]}.{wanted[1]} "
                "a Debian release here has")
    return BaseSpec(f"docker.io/library/python:{tag}", release, slim, wanted or release.python, note,
                    PYTHON_PACKAGES)


@dataclass
class BuiltBase:
    spec: BaseSpec
    key: str
    image_id: str
    python_version: str | None
    debian_version: str | None
    cached: bool
    seconds: float
    notes: list[str] = field(default_factory=list)


class BaseCache:
    """The shared cache: ``<cache>/store`` (a buildah store of bases) and ``bases/<key>.json``."""

    def __init__(self, settings: OciSettings) -> None:
        self.settings = settings
        self.root = settings.cache_dir
        self.buildah = Buildah(self.root / "store", settings)
        self._locks: dict[str, asyncio.Lock] = {}

    @property
    def store_home(self) -> Path:
        return self.buildah.home

    def ensure_dirs(self) -> None:
        (self.root / "bases").mkdir(parents=True, exist_ok=True)
        self.buildah.ensure()

    async def ensure(self, spec: BaseSpec, emit: Callable[[str], None], timeout: float = 1800.0) -> BuiltBase:
        """The base, built now unless the cache has it; ``spec.name`` then names it in the store."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.ensure_dirs)
        mirror = find_debian_mirror(self.settings.debian_mirror)
        key = spec.key(mirror.archive)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            fd = await loop.run_in_executor(None, _flock, self.root / "bases" / ".lock")
            try:
                return await self._ensure_locked(spec, key, mirror, emit, timeout)
            finally:
                os.close(fd)

    async def _ensure_locked(self, spec: BaseSpec, key: str, mirror: Any, emit: Callable[[str], None],
                             timeout: float) -> BuiltBase:
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        record_path = self.root / "bases" / f"{key}.json"
        record = _load(record_path)
        if record and await loop.run_in_executor(None, self.buildah.image_id, record["image_id"]):
            if spec.name not in record.get("names", []):
                await loop.run_in_executor(None, self.buildah.tag, record["image_id"], spec.name)
                record["names"] = sorted({*record.get("names", []), spec.name})
                _save(record_path, record)
            emit(f"base {spec.name}: cached ({key}, Debian {record.get('debian_version')}"
                 f"{', python3 ' + record['python_version'] if record.get('python_version') else ''})")
            return BuiltBase(spec, key, record["image_id"], record.get("python_version"),
                             record.get("debian_version"), True, time.monotonic() - started)
        emit(f"base {spec.name}: building Debian {spec.release.codename} ({'slim ' if spec.slim else ''}minbase"
             f"{' + ' + ' '.join(spec.packages) if spec.packages else ''}) with mmdebstrap from {mirror.archive}")
        work = self.root / "bases" / f"tmp-{key}-{secrets.token_hex(3)}"
        work.mkdir(parents=True)
        try:
            facts = await self._mmdebstrap(spec, mirror, work, emit, timeout)
            emit(f"base {spec.name}: importing the root filesystem ({facts['size'] / 1e6:.0f} MB) into the cache")
            image_id = await self._import(spec, key, work, facts)
        finally:
            await loop.run_in_executor(None, shutil.rmtree, work, True)
        record = {"key": key, "recipe": spec.recipe(mirror.archive), "image_id": image_id, "names": [spec.name],
                  "python_version": facts.get("python"), "debian_version": facts.get("debian"),
                  "layer_digest": facts["digest"], "built": time.time(),
                  "seconds": round(time.monotonic() - started, 1)}
        _save(record_path, record)
        emit(f"base {spec.name}: built in {record['seconds']:.0f} s (Debian {facts.get('debian')}"
             f"{', python3 ' + facts['python'] if facts.get('python') else ''})")
        return BuiltBase(spec, key, image_id, facts.get("python"), facts.get("debian"), False,
                         time.monotonic() - started)

    async def _mmdebstrap(self, spec: BaseSpec, mirror: Any, work: Path, emit: Callable[[str], None],
                          timeout: float) -> dict[str, Any]:
        if shutil.which("mmdebstrap") is None:
            raise OciError("mmdebstrap is not installed (Debian package mmdebstrap; `make system-deps` installs it): "
                           "it builds the Debian bases", 500)
        suite = spec.release.codename
        tar = work / "rootfs.tar"
        scratch = work / "scratch"
        scratch.mkdir()
        python_out, debian_out = work / "python-version", work / "debian-version"
        args = ["mmdebstrap", "--mode=root", "--variant=minbase", "--format=tar", "--skip=output/dev",
                "--skip=cleanup/apt/lists", "--dpkgopt=force-unsafe-io", "--aptopt=APT::Install-Recommends \"false\"",
                "--aptopt=Acquire::Retries \"3\""]
        if spec.packages:
            args.append("--include=" + ",".join(spec.packages))
        if spec.slim:
            args += [f"--dpkgopt=path-exclude={p}" for p in SLIM_EXCLUDES]
            args += [f"--dpkgopt=path-include={p}" for p in SLIM_INCLUDES]
        hooks = [f'cat "$1/etc/debian_version" > {_q(debian_out)}']
        if spec.packages:
            hooks += ['rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED',
                      f'chroot "$1" python3 -c "import platform; print(platform.python_version())" > {_q(python_out)}']
        args += [f"--customize-hook={h}" for h in hooks]
        sources = [f"deb {mirror.archive} {suite} main", f"deb {mirror.archive} {suite}-updates main"]
        if mirror.security:
            sources.append(f"deb {mirror.security} {suite}-security main")
        args += [suite, str(tar), *sources]
        # The chroot mmdebstrap installs into lives on a private tmpfs (dpkg's many small writes and
        # the cleanup cost minutes on a busy disk); the namespace takes it, and any mount, away.
        script = 'mount -t tmpfs -o size=8g,mode=0755 idegym-mmdebstrap "$0" && TMPDIR="$0" exec "$@"'
        argv = ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child", "--mount-proc",
                "--", "sh", "-c", script, str(scratch), *args]
        env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8", "HOME": str(work)}
        tail: list[str] = []
        proc = await asyncio.create_subprocess_exec(*argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                    stderr=subprocess.STDOUT, env=env, start_new_session=True)

        async def pump() -> None:
            assert proc.stdout is not None
            async for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip()
                tail.append(line)
                del tail[:-40]
                if line.startswith(("I: ", "E: ", "W: ")):
                    emit(f"  mmdebstrap: {line}")

        try:
            await asyncio.wait_for(pump(), timeout)
            await proc.wait()
        except (TimeoutError, asyncio.CancelledError) as exc:
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
            await asyncio.shield(proc.wait())
            if isinstance(exc, TimeoutError):
                raise OciError(f"mmdebstrap did not finish within {timeout:g} s", 504) from None
            raise
        if proc.returncode != 0 or not tar.is_file():
            raise OciError(f"mmdebstrap failed building {spec.name} (exit {proc.returncode}):\n"
                           + "\n".join(tail[-20:]), 500)
        digest = await asyncio.get_running_loop().run_in_executor(None, _sha256, tar)
        return {"tar": tar, "digest": digest, "size": tar.stat().st_size,
                "python": _read(python_out), "debian": _read(debian_out)}

    async def _import(self, spec: BaseSpec, key: str, work: Path, facts: dict[str, Any]) -> str:
        """The tar as a one-layer OCI image (an OCI layout made here), pulled into the cache store."""
        loop = asyncio.get_running_loop()
        # Pulled by a relative path: buildah names an image pulled from a layout after its path,
        # which must then be a valid reference (the cache's own path may not be: ".cache").
        layout = work / f"idegym-base-{key}"
        labels = {"org.idegym.base.key": key, "org.idegym.base.debian": spec.release.codename,
                  "org.idegym.base.debian-version": facts.get("debian") or ""}
        env = [f"PATH={TOOL_PATH}"]
        if spec.python is not None:
            labels["org.idegym.base.python"] = facts.get("python") or ""
            env.append("LANG=C.UTF-8")
        config = {"architecture": _arch(), "os": "linux",
                  "config": {"Env": env, "Cmd": ["python3" if spec.python else "bash"], "Labels": labels},
                  "rootfs": {"type": "layers", "diff_ids": [f"sha256:{facts['digest']}"]},
                  "history": [{"created_by": f"mmdebstrap --variant=minbase {spec.release.codename} (idegym {key})"}]}
        await loop.run_in_executor(None, _write_layout, layout, facts["tar"], facts["digest"], config, key)
        result = await self.buildah.run(["pull", "--quiet", "--signature-policy", self.buildah.policy,
                                         f"oci:{layout.name}:{key}"], network=False, timeout=1800, cwd=work)
        if result.returncode != 0:
            raise OciError(f"importing the base {spec.name} into buildah failed:\n{result.message()}", 500)
        image_id = result.tail[-1].strip() if result.tail else ""
        if not re.fullmatch(r"[0-9a-f]{64}", image_id):
            raise OciError(f"buildah pull printed no image id: {result.message()}", 500)
        await loop.run_in_executor(None, self.buildah.tag, image_id, spec.name)
        return image_id


def _write_layout(layout: Path, tar: Path, digest: str, config: dict[str, Any], ref: str) -> None:
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    os.link(tar, blobs / digest)

    def blob(obj: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
        name = hashlib.sha256(data).hexdigest()
        (blobs / name).write_bytes(data)
        return {"digest": f"sha256:{name}", "size": len(data)}

    cfg = blob(config)
    manifest = blob({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                     "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **cfg},
                     "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                                 "digest": f"sha256:{digest}", "size": tar.stat().st_size}]})
    index = {"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                                **manifest, "annotations": {"org.opencontainers.image.ref.name": ref}}]}
    (layout / "index.json").write_text(json.dumps(index))
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')


def _arch() -> str:
    machine = os.uname().machine
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _q(path: Path) -> str:
    return "'" + str(path).replace("'", "'\\''") + "'"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _save(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_suffix(f".{secrets.token_hex(3)}.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)


def _flock(path: Path) -> int:
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd
