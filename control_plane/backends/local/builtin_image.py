"""The built-in image (``idegym/builtin:latest``): the host's own userland, made safe to share.

Its lowest layer is the host's ``/usr``, plus a sanitized ``/etc`` (no shadow, sudoers, ssh host
keys, nothing that is not world-readable; ``root``, ``appuser`` (1000) and ``nobody`` as users),
a ``/var`` skeleton with the dpkg/apt databases, and small ``/opt``, ``/root`` and ``/home``
skeletons; ``python`` and pytest for the host's python3 when it lacks them. The image store
links each state directory to a build shared by every state directory of this user, keyed by what
it is made of (``materialize_builtin``): building it costs ~0.7 s at every new state directory
(each test, each embedded control plane), linking ~30 ms.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import shutil
import site
import stat
import subprocess
import sys
import time
from pathlib import Path

from ...appuser import APPUSER
from ...images import BUILTIN_IMAGE
from ...settings import ControlPlaneSettings
from .image_trees import OPT_SKELETON, TREES, ImageError, copy_tree, host_files
from .user_cache import fill_once, prune, user_cache_dir

log = logging.getLogger(__name__)

BUILTIN_ID = "builtin-v3"  # v3: `python` and pytest (the default test script of ``specs/sandbox-server-api.yaml`` runs)
# Never copied from the host's /etc, whatever their mode.
ETC_DENY = {
    "shadow", "shadow-", "gshadow", "gshadow-", "sudoers", "sudoers.d", ".pwd.lock", "security/opasswd",
    "subuid", "subuid-", "subgid", "subgid-", "machine-id", "hostname", "hosts", "passwd", "passwd-",
    "group", "group-", "resolv.conf", "idegym",
}
ETC_DENY_PATTERNS = (re.compile(r"^ssh/ssh_host_.*"), re.compile(r".*\.key$"), re.compile(r"^ssl/private(/|$)"))
# What the image is made of, besides the control plane's own environment (its pytest): a change
# to any entry below these (size, mode, owner, time) or to these paths gives a new build.
SOURCE_TREES = ("/etc", "/var/lib/dpkg", "/var/lib/apt")
SOURCE_PATHS = ("/usr/bin/python3", "/usr/bin/python", "/var/cache/debconf/config.dat",
                "/var/cache/debconf/templates.dat", "/usr/lib/python3/dist-packages")
SOURCE_GLOBS = ("/usr/lib/python3.*", "/usr/local/lib/python3.*/dist-packages")
# Shared builds are pruned beyond the newest CACHE_KEEP once unused for CACHE_RETENTION.
CACHE_KEEP = 3
CACHE_RETENTION = 7 * 86400.0


def builtin_cache_dir() -> Path:
    """Where the shared builds live: ``$IDEGYM_BUILTIN_CACHE``, default ``~/.cache/idegym/builtin``."""
    return user_cache_dir("builtin", ControlPlaneSettings.from_env().builtin_cache)


def source_key() -> str:
    """A digest of everything ``build_builtin`` reads (~25 ms of stat calls, no reads)."""
    digest = hashlib.sha256(f"{BUILTIN_ID}\0{os.geteuid()}\0{APPUSER}\0{sys.version}\0{sys.prefix}\n".encode())

    def add(path: str, st: os.stat_result) -> None:
        digest.update(f"{path}\0{st.st_mode}\0{st.st_uid}\0{st.st_gid}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())

    def walk(path: str) -> None:
        try:
            entries = list(os.scandir(path))
        except OSError:
            return
        for entry in sorted(entries, key=lambda e: e.name):
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            add(entry.path, st)
            if stat.S_ISDIR(st.st_mode):
                walk(entry.path)

    paths = [*SOURCE_TREES, *SOURCE_PATHS, "/etc/skel", *site.getsitepackages(),
             *sorted(p for pattern in SOURCE_GLOBS for p in glob.glob(pattern))]
    for path in paths:
        try:
            add(path, os.lstat(path))
        except OSError:
            digest.update(f"{path}\0absent\n".encode())
    for tree in SOURCE_TREES:
        walk(tree)
    return digest.hexdigest()[:24]


def materialize_builtin(data: Path) -> str:
    """Put the built-in image at ``data / BUILTIN_ID``: a link to the shared build of this host's
    current sources (built first when there is none), or, when no trusted cache can be had, a
    build of this state directory's own. Returns how it was made.

    A symbolic link, not hard links: a sandbox sees a file's link count, which would then count
    the state directories on this host and change under it."""
    root = builtin_cache_dir()
    key = source_key()
    entry = root / key
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        shared = _trusted(root)
        if shared:
            _share(root, key)
    except (ImageError, OSError) as exc:
        log.warning("built-in image: could not share the build in %s (%s); this state directory builds its own",
                    root, exc)
        shared = False
    if shared and (entry / ".complete").exists():
        link = data / f".tmp-link-{key}-{os.getpid()}"
        link.unlink(missing_ok=True)
        os.symlink(entry / "image", link)
        os.replace(link, data / BUILTIN_ID)
        os.utime(entry / ".complete")
        return f"shared: {entry}"
    tmp = data / f".tmp-{BUILTIN_ID}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        build_builtin(tmp)
        if (data / BUILTIN_ID).is_symlink():  # to a shared build since pruned
            (data / BUILTIN_ID).unlink()
        tmp.rename(data / BUILTIN_ID)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return "built for this state directory"


def _trusted(root: Path) -> bool:
    """Only a cache this user owns, that no one else can write, is used: its files run in every
    sandbox."""
    try:
        st = os.stat(root)
    except OSError:
        return False
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        log.warning("built-in image: not using the shared cache %s (owned by uid %d, mode %o): it must be "
                    "this user's and not writable by others", root, st.st_uid, stat.S_IMODE(st.st_mode))
        return False
    return True


def _share(root: Path, key: str) -> None:
    """Build the image into ``root / key`` (unless another control plane did first: one builds,
    the others wait for it) and prune old builds: only beyond the ``CACHE_KEEP`` newest, and unused
    for ``CACHE_RETENTION`` (a state directory whose build was pruned links a new one at its next
    start)."""
    prune(root, CACHE_RETENTION, keep=CACHE_KEEP, spare=key)

    def fill(tmp: Path) -> None:
        started = time.monotonic()
        os.chmod(tmp, 0o700)
        build_builtin(tmp / "image")
        log.info("built-in image: built in %.0f ms and shared in %s", (time.monotonic() - started) * 1000, root / key)

    fill_once(root, key, fill)


def build_builtin(dest: Path) -> None:
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
    meta: dict[str, object] = {"tag": BUILTIN_IMAGE, "id": BUILTIN_ID, "base": None, "base_id": None,
            "layers": [t for t in TREES if t != "usr" or any((layers / "usr").iterdir())], "host_usr": True,
            "env": {}, "network": False, "created": time.time(),
            "notes": ["the host's /usr, a sanitized /etc, an empty project", *notes]}
    (dest / "image.json").write_text(json.dumps(meta, indent=1))



# Distributions the API's default test script needs (`python -m pytest`), copied from the
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
        needs = (dist.metadata.get_all("Requires-Python") or [None])[0]
        if needs and python_version not in SpecifierSet(needs):
            raise ImageError(f"{name} {dist.version} needs Python {needs}; the host's python3 is {python_version}")
        root = Path(str(dist.locate_file(""))).resolve()
        for entry in dist.files or []:
            src = Path(str(dist.locate_file(entry))).resolve()
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
