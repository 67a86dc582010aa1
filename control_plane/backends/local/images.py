"""The local image store: the built-in image, registered projects, built images.

An image is a directory ``<state>/images/data/<id>/`` holding ``image.json``, the layers it adds
to each root tree (``layers/usr``, ``layers/etc``… — overlayfs upper directories, whiteouts
included) and its full project (``project/``). A tag points at an id through
``images/refs/<slug>.json``; ids never change once written, so re-registering a tag never alters
a running sandbox or an image built on the old one (an image records its base by *id*).

The built-in image (``idegym/builtin:latest``) is the host's own userland: the host's ``/usr`` as
its lowest layer, plus a sanitized ``/etc`` (no shadow, sudoers, ssh host keys, nothing that is
not world-readable; ``root``, ``appuser`` (1000) and ``nobody`` as users), a ``/var`` skeleton with
the dpkg/apt databases, and small ``/opt``, ``/root`` and ``/home`` skeletons. It is generated
once per state directory.
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
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...appuser import APPUSER
from ...image_tags import check_image_tag
from ...images import BUILTIN_IMAGE
from ...images import parse_build_yaml as parse_images_yaml  # noqa: F401 - re-exported

log = logging.getLogger(__name__)

BUILTIN_ID = "builtin-v3"  # v3: `python` and pytest (the seed's default test script runs)
TREES = ("usr", "etc", "var", "opt", "root", "home")
ROOTFS = "rootfs"  # an OCI image's one tree: the whole root (oci/rootfs.py)
ALL_TREES = (*TREES, ROOTFS)
HOSTNAME = "sandbox"
# Mount points the backend binds its runtime on (created in the built-in /opt layer).
OPT_SKELETON = (
    "idegym/python", "idegym/src", "idegym/site/0", "idegym/site/1", "idegym/site/2", "idegym/site/3",
    "idegym/toolchains/rustup", "idegym/toolchains/cargo", "idegym/image/project", "idegym/layer",
    "idegym/export",
)
# Never copied from the host's /etc, whatever their mode.
ETC_DENY = {
    "shadow", "shadow-", "gshadow", "gshadow-", "sudoers", "sudoers.d", ".pwd.lock", "security/opasswd",
    "subuid", "subuid-", "subgid", "subgid-", "machine-id", "hostname", "hosts", "passwd", "passwd-",
    "group", "group-", "resolv.conf", "idegym",
}
ETC_DENY_PATTERNS = (re.compile(r"^ssh/ssh_host_.*"), re.compile(r".*\.key$"), re.compile(r"^ssl/private(/|$)"))


class ImageError(Exception):
    pass


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
            tmp = self.data / f".tmp-{BUILTIN_ID}-{secrets.token_hex(4)}"
            try:
                _build_builtin(tmp)
                tmp.rename(self.data / BUILTIN_ID)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            self._write_ref(BUILTIN_IMAGE, BUILTIN_ID)
            log.info("generated the built-in image in %.0f ms", (time.monotonic() - started) * 1000)

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


# -- copying helpers ---------------------------------------------------------------------------------


def copy_tree(src: Path, dst: Path, *, hardlink: bool = False) -> None:
    """``cp -a`` (modes, owners, times, xattrs incl. overlay whiteouts); ``hardlink`` links files.

    ``src`` itself must be a real directory, never a symlink: a sandbox can replace directories
    it can see (e.g. its project layer's ``upper``) with a link to anywhere on the host, so the
    source is opened with O_NOFOLLOW and copied through that descriptor.
    """
    try:
        fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ImageError(f"cannot copy {src}: not a directory ({exc.strerror})") from exc
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.exists():
            shutil.rmtree(dst)
        st = os.fstat(fd)
        dst.mkdir()
        os.chmod(dst, stat.S_IMODE(st.st_mode))
        if os.geteuid() == 0:
            os.chown(dst, st.st_uid, st.st_gid)
        args = ["cp", "-a", "-l" if hardlink else "--reflink=auto", f"/proc/self/fd/{fd}/.", str(dst)]
        proc = subprocess.run(args, capture_output=True, pass_fds=(fd,))
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        os.close(fd)
    if proc.returncode != 0:
        if hardlink:  # e.g. across filesystems: fall back to a real copy
            shutil.rmtree(dst, ignore_errors=True)
            copy_tree(src, dst)
            return
        raise ImageError(f"copying {src} to {dst} failed: {proc.stderr.decode(errors='replace').strip()}")


def chown_tree(root: Path, uid: int, gid: int) -> None:
    if os.geteuid() != 0:
        return
    os.lchown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, gid)


# -- the built-in image ---------------------------------------------------------------------------


def _build_builtin(dest: Path) -> None:
    layers = dest / "layers"
    for tree in TREES:
        (layers / tree).mkdir(parents=True)
    notes = _python_layer(layers / "usr")
    _sanitized_etc(Path("/etc"), layers / "etc")
    _var_skeleton(layers / "var")
    for rel in OPT_SKELETON:
        (layers / "opt" / rel).mkdir(parents=True, exist_ok=True)
    os.chmod(layers / "opt" / "idegym" / "layer", 0o700)
    os.chmod(layers / "opt" / "idegym" / "export", 0o700)
    _skel(layers / "root", 0, 0, 0o700)
    home = layers / "home" / "appuser"
    _skel(home, APPUSER[1], APPUSER[2], 0o755)
    (home / "work").mkdir()
    _own(home / "work", APPUSER[1], APPUSER[2])
    (dest / "project").mkdir()
    _own(dest / "project", APPUSER[1], APPUSER[2])
    os.chmod(dest / "project", 0o755)
    meta = {"tag": BUILTIN_IMAGE, "id": BUILTIN_ID, "base": None, "base_id": None,
            "layers": [t for t in TREES if t != "usr" or any((layers / "usr").iterdir())], "host_usr": True,
            "env": {}, "network": False, "created": time.time(),
            "notes": ["the host's /usr, a sanitized /etc, an empty project", *notes]}
    (dest / "image.json").write_text(json.dumps(meta, indent=1))


# Distributions the seed's default test script needs (`python -m pytest`), copied from the
# environment the control plane runs in when the host's python3 lacks them: no network needed.
PYTEST_DISTRIBUTIONS = ("pytest",)


def _python_layer(usr: Path) -> list[str]:
    """``python`` -> ``python3`` and pytest for the host's python3, as a layer over its /usr."""
    notes: list[str] = []
    if not os.path.exists("/usr/bin/python3"):
        return ["no /usr/bin/python3 on the host: the built-in image has no Python"]
    if not os.path.lexists("/usr/bin/python"):
        (usr / "bin").mkdir(parents=True, exist_ok=True)
        os.symlink("python3", usr / "bin" / "python")
        notes.append("`python` is python3")
    code = ("import sys; print('%d.%d.%d' % sys.version_info[:3]); "
            "import importlib.util as u; print(bool(u.find_spec('pytest')))")
    probe = subprocess.run(["/usr/bin/python3", "-I", "-c", code],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        return [*notes, f"the host's python3 does not run: {probe.stderr.strip()[-200:]}"]
    version, has_pytest = probe.stdout.split()
    if has_pytest == "True":
        return notes
    try:
        copied = _copy_distributions(PYTEST_DISTRIBUTIONS, version,
                                     usr / "local" / "lib" / f"python{version.rsplit('.', 1)[0]}" / "dist-packages")
    except ImageError as exc:
        log.warning("built-in image: no pytest: %s", exc)
        return [*notes, f"no pytest: {exc}"]
    bindir = usr / "local" / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    for script in ("pytest", "py.test"):
        (bindir / script).write_text("#!/usr/bin/python3\nimport sys\nfrom pytest import console_main\n"
                                     "sys.exit(console_main())\n")
        os.chmod(bindir / script, 0o755)
    notes.append(f"pytest for the host's python3 {version} ({', '.join(copied)}, from the control plane's environment)")
    return notes


def _copy_distributions(names: tuple[str, ...], python_version: str, dest: Path) -> list[str]:
    """Copy installed pure-Python distributions and what they require (markers evaluated for
    ``python_version``) into ``dest``; returns ``name==version`` of each."""
    from importlib import metadata

    try:
        from packaging.markers import Marker
        from packaging.requirements import Requirement
        from packaging.specifiers import SpecifierSet
    except ImportError as exc:
        raise ImageError("the `packaging` module is missing") from exc
    env = {"python_version": python_version.rsplit(".", 1)[0], "python_full_version": python_version,
           "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
    todo, done, out = list(names), set(), []
    while todo:
        name = todo.pop(0)
        key = name.lower().replace("_", "-")
        if key in done:
            continue
        done.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError as exc:
            raise ImageError(f"{name} is not installed next to the control plane (pip install pytest)") from exc
        needs = dist.metadata.get("Requires-Python")
        if needs and python_version not in SpecifierSet(needs):
            raise ImageError(f"{name} {dist.version} needs Python {needs}; the host's python3 is {python_version}")
        root = Path(dist.locate_file("")).resolve()
        for entry in dist.files or []:
            src = Path(dist.locate_file(entry)).resolve()
            if not src.is_relative_to(root) or "__pycache__" in src.parts or not src.is_file():
                continue
            if src.suffix in (".so", ".pyd"):
                raise ImageError(f"{name} is not pure Python; it cannot be copied for another interpreter")
            target = dest / src.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
        out.append(f"{dist.metadata['Name']}=={dist.version}")
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or Marker(str(req.marker)).evaluate(env):
                todo.append(req.name)
    return out


def _own(path: Path, uid: int, gid: int) -> None:
    if os.geteuid() == 0:
        os.lchown(path, uid, gid)


def _skel(target: Path, uid: int, gid: int, mode: int) -> None:
    target.mkdir(parents=True, exist_ok=True)
    skel = Path("/etc/skel")
    if skel.is_dir():
        for entry in skel.iterdir():
            if entry.is_file() and not entry.is_symlink() and os.access(entry, os.R_OK):
                shutil.copy2(entry, target / entry.name)
                _own(target / entry.name, uid, gid)
    os.chmod(target, mode)
    _own(target, uid, gid)


def _etc_denied(rel: str) -> bool:
    return rel in ETC_DENY or rel.split("/", 1)[0] in ETC_DENY or any(p.match(rel) for p in ETC_DENY_PATTERNS)


def _sanitized_etc(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copystat(src, dst)
    for dirpath, dirnames, filenames in os.walk(src):
        rel_dir = os.path.relpath(dirpath, src)
        rel_dir = "" if rel_dir == "." else rel_dir
        keep = []
        for name in dirnames:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            if _etc_denied(rel):
                continue
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(full), dst / rel)
                continue
            if st.st_mode & 0o005 != 0o005:  # not world-readable and searchable
                continue
            (dst / rel).mkdir()
            shutil.copystat(full, dst / rel, follow_symlinks=False)
            _own(dst / rel, st.st_uid, st.st_gid)
            keep.append(name)
        dirnames[:] = keep
        for name in filenames:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            full = os.path.join(dirpath, name)
            if _etc_denied(rel):
                continue
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(full), dst / rel)
            elif stat.S_ISREG(st.st_mode) and st.st_mode & 0o004:
                shutil.copy2(full, dst / rel, follow_symlinks=False)
                _own(dst / rel, st.st_uid, st.st_gid)
    _write_accounts(src, dst)
    for name, text in host_files().items():
        (dst / name).write_text(text)
        os.chmod(dst / name, 0o644)


def host_files() -> dict[str, str]:
    """The /etc files every sandbox gets, whatever its image (hostname, hosts, resolv.conf…)."""
    try:  # name resolution for sandboxes with network; the content, never a link to the host's
        resolv = Path("/etc/resolv.conf").read_text()
    except OSError:
        resolv = ""
    return {"hostname": HOSTNAME + "\n",
            "hosts": f"127.0.0.1\tlocalhost\n127.0.1.1\t{HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                     "ff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n",
            "resolv.conf": resolv or "nameserver 127.0.0.1\n",
            "machine-id": secrets.token_hex(16) + "\n"}


def _parse_db(path: Path) -> list[list[str]]:
    try:
        return [line.split(":") for line in path.read_text().splitlines() if line and not line.startswith("#")]
    except OSError:
        return []


def _write_accounts(src: Path, dst: Path) -> None:
    """passwd/group with the host's system accounts (uid < 1000), appuser (1000) and nobody."""
    name, uid, gid, home = APPUSER
    users = [u for u in _parse_db(src / "passwd") if len(u) == 7 and u[2].isdigit() and int(u[2]) < 1000
             and u[0] != name]
    if not any(u[0] == "root" for u in users):
        users.insert(0, ["root", "x", "0", "0", "root", "/root", "/bin/bash"])
    users = [["root", "x", "0", "0", "root", "/root", "/bin/bash"] if u[0] == "root" else u for u in users]
    users.append([name, "x", str(uid), str(gid), "", home, "/bin/bash"])
    users.append(["nobody", "x", "65534", "65534", "nobody", "/nonexistent", "/usr/sbin/nologin"])
    known = {u[0] for u in users}
    groups = []
    for g in _parse_db(src / "group"):
        if len(g) != 4 or not g[2].isdigit() or int(g[2]) >= 1000 or g[0] == name:
            continue
        g[1] = "x"
        g[3] = ",".join(m for m in g[3].split(",") if m in known)
        groups.append(g)
    groups.append([name, "x", str(gid), ""])
    if not any(g[0] == "nogroup" for g in groups):
        groups.append(["nogroup", "x", "65534", ""])
    (dst / "passwd").write_text("".join(":".join(u) + "\n" for u in users))
    (dst / "group").write_text("".join(":".join(g) + "\n" for g in groups))
    # Locked entries only: tools such as useradd/passwd expect the files to exist.
    (dst / "shadow").write_text("".join(f"{u[0]}:*:19000:0:99999:7:::\n" for u in users))
    (dst / "gshadow").write_text("".join(f"{g[0]}:*::{g[3]}\n" for g in groups))
    for fname, mode in (("passwd", 0o644), ("group", 0o644), ("shadow", 0o640), ("gshadow", 0o640)):
        os.chmod(dst / fname, mode)
    shadow_gid = next((int(g[2]) for g in groups if g[0] == "shadow"), 0)
    for fname in ("shadow", "gshadow"):
        _own(dst / fname, 0, shadow_gid)


def _var_skeleton(dst: Path) -> None:
    for rel, mode in (("backups", 0o755), ("cache", 0o755), ("cache/apt/archives/partial", 0o755),
                      ("cache/debconf", 0o755), ("lib", 0o755), ("lib/misc", 0o755), ("local", 0o755),
                      ("log", 0o755), ("mail", 0o755), ("opt", 0o755), ("spool", 0o755), ("tmp", 0o1777)):
        (dst / rel).mkdir(parents=True, exist_ok=True)
        os.chmod(dst / rel, mode)
    os.symlink("/run/lock", dst / "lock")
    os.symlink("/run", dst / "run")
    for rel in ("lib/dpkg", "lib/apt"):
        src = Path("/var") / rel
        if src.is_dir():
            try:
                copy_tree(src, dst / rel)
            except ImageError as exc:  # e.g. unreadable parts when not root: apt/dpkg just see less
                log.warning("built-in image: could not copy /var/%s: %s", rel, exc)
    for name in ("config.dat", "templates.dat"):  # never passwords.dat
        src = Path("/var/cache/debconf") / name
        if src.is_file():
            shutil.copy2(src, dst / "cache" / "debconf" / name)


# -- notes on the build YAML ---------------------------------------------------------------------

_IGNORED_TOP = {
    "runtime_class_name": "sandboxes run under bubblewrap locally, not a container runtime",
    "resources": "limits come from each server request's `resources`",
    "platforms": "local images are built for this host only",
    "base_image": None,
}


def local_notes(raw: dict[str, Any]) -> list[str]:
    """What a build YAML entry asks for that the local backend ignores or translates."""
    notes = []
    for key, why in _IGNORED_TOP.items():  # noqa: B007
        if key in raw and why:
            notes.append(f"`{key}` ignored: {why}")
    for plugin in raw.get("plugins") or []:
        kind = plugin.get("type") if isinstance(plugin, dict) else None
        if kind == "base-system":
            notes.append("plugin `base-system` ignored: the built-in image uses the host's installed packages "
                         "(install more with `commands` and `network: true`)")
        elif kind == "user":
            if str(plugin.get("username")) == APPUSER[0] or int(plugin.get("uid", 1000)) == APPUSER[1]:
                notes.append("plugin `user` ignored: `appuser` (uid 1000) always exists locally")
            else:
                notes.append(f"plugin `user` translated to useradd commands for {plugin.get('username')!r}")
            if plugin.get("sudo"):
                notes.append("`sudo: true` ignored: sandboxes run with no_new_privs; use run_as_root instead")
        elif kind == "idegym-server":
            notes.append("plugin `idegym-server` ignored: the local backend injects its own sandbox server")
        elif kind in ("pycharm", "idea", "mcp-upstream"):
            notes.append(f"plugin `{kind}` ignored: not available in local images")
        elif kind == "permissions":
            notes.append("plugin `permissions` translated to chown/chmod commands")
        elif kind not in ("project", None):
            notes.append(f"plugin `{kind}` ignored: unknown to the local backend")
    return notes
