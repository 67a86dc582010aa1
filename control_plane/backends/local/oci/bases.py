"""Building the bases of :mod:`.catalog` with mmdebstrap, once, into the shared cache.

A base is built once per *recipe* (release, variant, packages, hooks, mirror — hashed into its
key) and kept in the shared cache's buildah store under the name its reference stands for
(``docker.io/library/python:3.12``…), which every state directory reads as an additional image
store. The Debian archive is the one apt uses here; the Ubuntu archive is
``$IDEGYM_UBUNTU_MIRROR``, else Ubuntu's own when it answers (its keyring is the host's, else
taken once from Debian's ``ubuntu-archive-keyring`` package, which apt verifies).

What differs from Docker Hub's images: the package lists from the build are kept (so
``apt-get install`` works without ``apt-get update``), and the toolchains are the distribution's.
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
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .buildah import Buildah
from .catalog import SLIM_EXCLUDES, SLIM_INCLUDES, TOOL_PATH, BaseSpec
from .refs import reachable
from .settings import DebianMirror, OciError, OciSettings, find_debian_mirror

log = logging.getLogger(__name__)

UBUNTU_ARCHIVE = "http://archive.ubuntu.com/ubuntu"
UBUNTU_SECURITY = "http://security.ubuntu.com/ubuntu"
UBUNTU_KEYRING = Path("/usr/share/keyrings/ubuntu-archive-keyring.gpg")
UBUNTU_COMPONENTS = "main restricted universe multiverse"  # as the official ubuntu image's sources
NEWEST_DEBIAN = "trixie"  # its main archive has ubuntu-archive-keyring


@dataclass
class BuiltBase:
    spec: BaseSpec
    key: str
    image_id: str
    python_version: str | None
    debian_version: str | None
    cached: bool
    seconds: float
    versions: dict[str, str] = field(default_factory=dict)  # what the probes found: {"go": "1.22.12"}


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

    # -- the archives ---------------------------------------------------------------------------------

    def ubuntu_archive(self) -> DebianMirror | None:
        """The Ubuntu archive to build ``ubuntu:*`` from: ``$IDEGYM_UBUNTU_MIRROR`` (``none`` turns it
        off), else Ubuntu's own when it answers; None when there is none (blocking: a probe)."""
        configured = self.settings.ubuntu_mirror
        if configured and configured.lower() in ("none", "off", "0"):
            return None
        if configured:
            archive = configured.rstrip("/")
            return DebianMirror(archive, archive, "IDEGYM_UBUNTU_MIRROR")
        if reachable(f"{UBUNTU_ARCHIVE}/dists/noble/Release"):
            return DebianMirror(UBUNTU_ARCHIVE, UBUNTU_SECURITY, "archive.ubuntu.com (reachable)")
        return None

    def mirror_for(self, spec: BaseSpec) -> DebianMirror:
        if spec.release.distro == "ubuntu":
            mirror = self.ubuntu_archive()
            if mirror is None:
                raise OciError(f"{spec.name} needs an Ubuntu archive and none is reachable or configured "
                               "(IDEGYM_UBUNTU_MIRROR)", 500)
            return mirror
        return find_debian_mirror(self.settings.debian_mirror)

    async def _ubuntu_keyring(self, emit: Callable[[str], None]) -> Path:
        """The Ubuntu archive's keyring: the host's, else Debian's ``ubuntu-archive-keyring`` package
        extracted once into the cache (downloaded by apt, verified by Debian's archive keys)."""
        if UBUNTU_KEYRING.is_file():
            return UBUNTU_KEYRING
        kept = self.root / "bases" / "ubuntu-archive-keyring.gpg"
        if kept.is_file():
            return kept
        emit("the Ubuntu archive's keyring: taking Debian's ubuntu-archive-keyring package (mmdebstrap, verified by "
             "the Debian archive's keys)")
        debian = find_debian_mirror(self.settings.debian_mirror)
        work = self.root / "bases" / f"tmp-keyring-{secrets.token_hex(3)}"
        work.mkdir(parents=True)
        try:
            tar = work / "keyring.tar"
            argv = ["mmdebstrap", "--mode=root", "--variant=extract", "--include=ubuntu-archive-keyring",
                    "--format=tar", NEWEST_DEBIAN, str(tar), f"deb {debian.archive} {NEWEST_DEBIAN} main"]
            proc = await asyncio.create_subprocess_exec(*argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                        stderr=subprocess.STDOUT, start_new_session=True,
                                                        env={"PATH": os.environ.get("PATH", os.defpath),
                                                             "HOME": str(work), "TMPDIR": str(work)})
            out, _ = await asyncio.wait_for(proc.communicate(), 600)
            if proc.returncode != 0:
                raise OciError("could not take the Ubuntu archive's keyring from the Debian archive:\n"
                               + out.decode(errors="replace")[-2000:], 500)
            with tarfile.open(tar) as archive:
                member = archive.extractfile("./usr/share/keyrings/ubuntu-archive-keyring.gpg")
                if member is None:
                    raise OciError("Debian's ubuntu-archive-keyring package has no ubuntu-archive-keyring.gpg", 500)
                data = member.read()
            tmp = kept.with_suffix(f".{secrets.token_hex(3)}.tmp")
            tmp.write_bytes(data)
            tmp.replace(kept)
            return kept
        finally:
            shutil.rmtree(work, ignore_errors=True)

    # -- building ---------------------------------------------------------------------------------------

    async def ensure(self, spec: BaseSpec, emit: Callable[[str], None], timeout: float = 1800.0) -> BuiltBase:
        """The base, built now unless the cache has it; ``spec.name`` then names it in the store."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.ensure_dirs)
        mirror = await loop.run_in_executor(None, self.mirror_for, spec)
        key = spec.key(mirror.archive)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            # A lock per base (its key, as its record): a cached base is not held up by another
            # one's build (a minute or more), and one base is built once, its record written by one.
            fd = await loop.run_in_executor(None, _flock, self.root / "bases" / f".{key}.lock")
            try:
                return await self._ensure_locked(spec, key, mirror, emit, timeout)
            finally:
                os.close(fd)

    async def _ensure_locked(self, spec: BaseSpec, key: str, mirror: DebianMirror, emit: Callable[[str], None],
                             timeout: float) -> BuiltBase:
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        record_path = self.root / "bases" / f"{key}.json"
        record = _load(record_path)
        image_id = await loop.run_in_executor(None, self.buildah.image_id, record["image_id"]) if record else None
        if record and image_id:
            if spec.name not in record.get("names", []):
                await loop.run_in_executor(None, self.buildah.tag, record["image_id"], spec.name)
                record["names"] = sorted({*record.get("names", []), spec.name})
                _save(record_path, record)
            versions = record.get("versions") or {}
            emit(f"base {spec.name}: cached ({key}, {spec.release.title} {record.get('debian_version')}"
                 f"{_versions_text(record.get('python_version'), versions)})")
            return BuiltBase(spec, key, record["image_id"], record.get("python_version"),
                             record.get("debian_version"), True, time.monotonic() - started, versions)
        emit(f"base {spec.name}: building {spec.release.title} ({'slim ' if spec.slim else ''}minbase"
             f"{' + ' + ' '.join(spec.packages) if spec.packages else ''}) with mmdebstrap from {mirror.archive}"
             f"{' and ' + ', '.join(spec.suites) if spec.suites else ''}")
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
                  "versions": facts["versions"], "layer_digest": facts["digest"], "built": time.time(),
                  "seconds": round(time.monotonic() - started, 1)}
        _save(record_path, record)
        emit(f"base {spec.name}: built in {record['seconds']:.0f} s ({spec.release.title} {facts.get('debian')}"
             f"{_versions_text(facts.get('python'), facts['versions'])})")
        return BuiltBase(spec, key, image_id, facts.get("python"), facts.get("debian"), False,
                         time.monotonic() - started, facts["versions"])

    async def _mmdebstrap(self, spec: BaseSpec, mirror: DebianMirror, work: Path, emit: Callable[[str], None],
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
        if spec.release.distro == "ubuntu":
            args.append(f"--keyring={await self._ubuntu_keyring(emit)}")
        if spec.packages:
            args.append("--include=" + ",".join(spec.packages))
        if spec.slim:
            args += [f"--dpkgopt=path-exclude={p}" for p in SLIM_EXCLUDES]
            args += [f"--dpkgopt=path-include={p}" for p in SLIM_INCLUDES]
        version_file = "debian_version" if spec.release.distro == "debian" else "lsb-release"
        hooks = [f'cat "$1/etc/{version_file}" > {_q(debian_out)}']
        if spec.python is not None:
            hooks += ['rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED',
                      f'chroot "$1" python3 -c "import platform; print(platform.python_version())" > {_q(python_out)}']
        for command in spec.hooks:
            hooks.append(f"chroot \"$1\" /bin/sh -ec {_sq(command)}")
        probe_files = {}
        for label, command in spec.probes:
            probe_files[label] = work / f"probe-{label}"
            hooks.append(f"chroot \"$1\" /bin/sh -c {_sq('PATH=' + _probe_path(spec) + '; ' + command)} "
                         f"> {_q(probe_files[label])} 2>&1 || true")
        args += [f"--customize-hook={h}" for h in hooks]
        if spec.release.distro == "ubuntu":
            parts = UBUNTU_COMPONENTS
            sources = [f"deb {mirror.archive} {suite} {parts}", f"deb {mirror.archive} {suite}-updates {parts}",
                       f"deb {mirror.security} {suite}-security {parts}"]
        else:
            sources = [f"deb {mirror.archive} {suite} main", f"deb {mirror.archive} {suite}-updates main"]
            if mirror.security:
                sources.append(f"deb {mirror.security} {suite}-security main")
        sources += [f"deb {mirror.archive} {extra} main" for extra in spec.suites]
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
        versions = {label: (_read(path) or "").splitlines()[-1:] for label, path in probe_files.items()}
        return {"tar": tar, "digest": digest, "size": tar.stat().st_size, "python": _read(python_out),
                "debian": _release_text(_read(debian_out)), "versions": {k: v[0] for k, v in versions.items() if v}}

    async def _import(self, spec: BaseSpec, key: str, work: Path, facts: dict[str, Any]) -> str:
        """The tar as a one-layer OCI image (an OCI layout made here), pulled into the cache store."""
        loop = asyncio.get_running_loop()
        # Pulled by a relative path: buildah names an image pulled from a layout after its path,
        # which must then be a valid reference (the cache's own path may not be: ".cache").
        layout = work / f"idegym-base-{key}"
        labels = {"org.idegym.base.key": key, "org.idegym.base.debian": spec.release.codename,
                  "org.idegym.base.debian-version": facts.get("debian") or ""}
        if spec.release.distro != "debian":
            labels = {"org.idegym.base.key": key, f"org.idegym.base.{spec.release.distro}": spec.release.codename,
                      "org.idegym.base.release-version": facts.get("debian") or ""}
        env = dict(_env_pairs(spec, facts))
        if spec.python is not None:
            labels["org.idegym.base.python"] = facts.get("python") or ""
            env.setdefault("LANG", "C.UTF-8")
        for label, version in facts["versions"].items():
            labels[f"org.idegym.base.{label}"] = version
        cmd = ["python3"] if spec.python is not None else ["bash"]
        config: dict[str, Any] = {"Env": [f"{k}={v}" for k, v in env.items()], "Cmd": cmd, "Labels": labels}
        image_config = {"architecture": _arch(), "os": "linux", "config": config,
                        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{facts['digest']}"]},
                        "history": [{"created_by": f"mmdebstrap --variant=minbase {spec.release.codename} "
                                                   f"(idegym {key})"}]}
        await loop.run_in_executor(None, _write_layout, layout, facts["tar"], facts["digest"], image_config, key)
        result = await self.buildah.run(["pull", "--quiet", "--signature-policy", self.buildah.policy,
                                         f"oci:{layout.name}:{key}"], network=False, timeout=1800, cwd=work)
        if result.returncode != 0:
            raise OciError(f"importing the base {spec.name} into buildah failed:\n{result.message()}", 500)
        image_id = result.tail[-1].strip() if result.tail else ""
        if not re.fullmatch(r"[0-9a-f]{64}", image_id):
            raise OciError(f"buildah pull printed no image id: {result.message()}", 500)
        await loop.run_in_executor(None, self.buildah.tag, image_id, spec.name)
        return image_id


def _env_pairs(spec: BaseSpec, facts: dict[str, Any]) -> list[tuple[str, str]]:
    """PATH first, then the spec's variables with the probes' versions filled in ({go})."""
    values = dict(facts["versions"])
    pairs = [("PATH", TOOL_PATH)]
    for name, value in spec.env:
        filled = re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), ""), value)
        pairs = [(k, v) for k, v in pairs if k != name] + [(name, filled)]
    return pairs


def _probe_path(spec: BaseSpec) -> str:
    return next((v for k, v in spec.env if k == "PATH"), TOOL_PATH)


def _versions_text(python: str | None, versions: dict[str, str]) -> str:
    found = ([f"python3 {python}"] if python else []) + [f"{k} {v}" for k, v in versions.items()]
    return ", " + ", ".join(found) if found else ""


def _release_text(text: str | None) -> str | None:
    """/etc/debian_version as it is; an Ubuntu lsb-release's DISTRIB_RELEASE."""
    if text and "DISTRIB_RELEASE=" in text:
        found = re.search(r"^DISTRIB_RELEASE=(.*)$", text, re.MULTILINE)
        return found.group(1).strip() if found else None
    return text


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
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _q(path: Path) -> str:
    return _sq(str(path))


def _sq(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


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
