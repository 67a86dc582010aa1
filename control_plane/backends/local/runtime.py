"""How the sandbox server's own Python runtime and the host's toolchains appear in a sandbox.

Everything is bound read-only at neutral paths under ``/opt/idegym`` so that no host home
directory is ever visible, and only what runs is bound, never a whole home or prefix (where
credentials live: ``~/.cargo/credentials.toml``, ``config.toml``…): the interpreter's ``bin`` and
``lib`` (of ``sys.base_prefix``) under ``/opt/idegym/python``, each site-packages directory at
``/opt/idegym/site/<n>``, a compiled copy of the ``sandbox_server`` package (when it is not inside
a site-packages directory, e.g. an editable install) at ``/opt/idegym/src``, and of rustup and
cargo their toolchains, ``settings.toml`` and ``bin`` under ``/opt/idegym/toolchains/...``.
The server starts with ``python -I -c <bootstrap>``, which adds exactly those paths and calls
the ``main(argv)`` of its server kind's module (``server_kinds.py``).
"""

from __future__ import annotations

import compileall
import hashlib
import importlib.util
import logging
import os
import shutil
import site
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .user_cache import prune, user_cache_dir

INSIDE = "/opt/idegym"
TOOL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PYTHON_PARTS = ("bin", "lib")  # of the interpreter's prefix: what it needs to run
RUSTUP_PARTS = ("toolchains", "update-hashes", "settings.toml")  # what rustup's proxies (cargo, rustc…) read

# The bound site-packages (the control plane's virtualenv) go before the interpreter's own, so
# the sandbox runs the very packages the control plane was installed with; ``first`` goes before
# the interpreter's own paths too (a server kind's extra packages).
BOOTSTRAP = (
    "import sys, site\n"
    "sys.path[:0] = {first!r}\n"
    "base = list(sys.path)\n"
    "for p in {sites!r}:\n"
    "    site.addsitedir(p)\n"
    "sys.path[:] = {src!r} + [p for p in sys.path if p not in base] + base\n"
    "from {module} import main\n"
    "main(sys.argv[1:])\n"
)
SERVER_MODULE = "sandbox_server.cli"
# Imported by every sandbox server: without their bytecode each start compiles them again.
SERVER_DEPENDENCIES = ("aiohttp", "pydantic")
# A package copy unused this long is removed (one in use is touched at every control plane start).
COPY_RETENTION = 7 * 86400.0


log = logging.getLogger(__name__)


@dataclass
class Runtime:
    python: str  # the interpreter's path inside the sandbox
    binds: list[tuple[str, str]] = field(default_factory=list)  # (host path, path inside), read-only
    server_env: dict[str, str] = field(default_factory=dict)
    tool_env: dict[str, str] = field(default_factory=dict)
    sites: list[str] = field(default_factory=list)  # site directories inside, added with site.addsitedir
    src: list[str] = field(default_factory=list)  # package copies inside, first on sys.path
    first: list[str] = field(default_factory=list)  # extra paths before the interpreter's own
    # Directories inside that hold only binds (of parts of a host directory): made read-only tmpfs.
    skeletons: list[str] = field(default_factory=list)
    host_python: str = sys.executable

    def bootstrap(self, module: str = SERVER_MODULE) -> str:
        return BOOTSTRAP.format(first=self.first, sites=self.sites, src=self.src, module=module)

    def argv(self, module: str = SERVER_MODULE) -> list[str]:
        """The command that starts ``module``'s ``main(argv)`` in a sandbox."""
        return [self.python, "-I", "-c", self.bootstrap(module)]


def _under(path: Path, parent: str) -> bool:
    return path == Path(parent) or Path(parent) in path.parents


def detect() -> Runtime:
    binds: list[tuple[str, str]] = []
    skeletons: list[str] = []
    # The server makes no TLS connections; an empty CA store spares it the ~40 ms aiohttp spends
    # loading the system's certificates at import time. Tools never see these variables.
    server_env = {"PATH": TOOL_PATH, "LANG": "C.UTF-8", "HOME": "/root",
                  "SSL_CERT_FILE": "/dev/null", "SSL_CERT_DIR": "/nonexistent"}
    base = Path(sys.base_prefix).resolve()
    exe = Path(os.path.realpath(sys.executable))
    if _under(base, "/usr"):
        python = str(exe)
    else:
        binds += [(str(base / part), f"{INSIDE}/python/{part}") for part in PYTHON_PARTS if (base / part).is_dir()]
        skeletons.append(f"{INSIDE}/python")
        python = f"{INSIDE}/python/{exe.relative_to(base)}" if _under(exe, str(base)) else str(exe)
        libdir = base / "lib"
        if any(libdir.glob("libpython*.so*")):
            server_env["LD_LIBRARY_PATH"] = f"{INSIDE}/python/lib"
    sites: list[str] = []
    site_dirs = [Path(p).resolve() for p in site.getsitepackages() if Path(p).is_dir()]
    for index, path in enumerate(site_dirs):
        if _under(path, "/usr") or _under(path, str(base)):
            inside = str(path) if _under(path, "/usr") else f"{INSIDE}/python/{path.relative_to(base)}"
        else:
            inside = f"{INSIDE}/site/{index}"
            binds.append((str(path), inside))
        sites.append(inside)
    _warn_without_bytecode()
    src: list[str] = []
    import sandbox_server

    package = Path(sandbox_server.__file__).resolve().parent
    if not any(_under(package, str(d)) for d in site_dirs):
        copy = sync_package(package)
        binds.append((str(copy), f"{INSIDE}/src"))
        src.append(f"{INSIDE}/src")
    if "IDEGYM_TOOL_SPAWNER" in os.environ:  # the servers' --[no-]tool-spawner, chosen for the control plane
        server_env["IDEGYM_TOOL_SPAWNER"] = os.environ["IDEGYM_TOOL_SPAWNER"]
    tool_env = {"PATH": TOOL_PATH, "LANG": "C.UTF-8"}
    home = Path(os.path.expanduser("~"))
    rustup = Path(os.environ.get("RUSTUP_HOME") or home / ".rustup")
    cargo = Path(os.environ.get("CARGO_HOME") or home / ".cargo")
    if (rustup / "toolchains").is_dir() and (cargo / "bin").is_dir():
        rustup, cargo = rustup.resolve(), cargo.resolve()
        binds += [(str(rustup / part), f"{INSIDE}/toolchains/rustup/{part}") for part in RUSTUP_PARTS
                  if (rustup / part).exists()]
        binds.append((str(cargo / "bin"), f"{INSIDE}/toolchains/cargo/bin"))
        skeletons += [f"{INSIDE}/toolchains/rustup", f"{INSIDE}/toolchains/cargo"]
        tool_env.update(RUSTUP_HOME=f"{INSIDE}/toolchains/rustup", CARGO_HOME=f"{INSIDE}/toolchains/cargo",
                        PATH=f"{TOOL_PATH}:{INSIDE}/toolchains/cargo/bin")
    return Runtime(python=python, binds=binds, server_env=server_env, tool_env=tool_env, sites=sites, src=src,
                   skeletons=skeletons)


def _warn_without_bytecode() -> None:
    """Sandbox servers see site-packages read-only, so they cannot cache the bytecode they lack:
    an install without it (``uv pip install`` by default) costs every sandbox start ~0.5 s."""
    missing = []
    for name in SERVER_DEPENDENCIES:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
        if origin and origin.endswith(".py") and not os.path.exists(importlib.util.cache_from_source(origin)):
            missing.append(name)
    if missing:
        log.warning("%s installed without bytecode: every sandbox start compiles them again. Reinstall "
                    "with bytecode (uv pip install --compile-bytecode, or pip) or run python -m compileall "
                    "on %s", ", ".join(missing), sys.prefix)


def runtime_cache_dir() -> Path:
    """Where the compiled package copies live: shared by every state directory of this user
    (``$IDEGYM_RUNTIME_CACHE``, default ``~/.cache/idegym/runtime``), so that a control plane on
    a new state directory does not compile them again (the judge's Java subject alone is ~1.5 s)."""
    return user_cache_dir("runtime", "IDEGYM_RUNTIME_CACHE")


def sync_package(package: Path, dest_root: Path | None = None) -> Path:
    """A compiled copy of a package, e.g. ``sandbox_server`` (refreshed when the sources change).

    Bound read-only, the package could not cache its bytecode; compiling it once here saves
    every sandbox start the compile time.
    """
    dest_root = runtime_cache_dir() if dest_root is None else dest_root
    files = sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                   and p.suffix not in (".pyc", ".pyo"))
    digest = hashlib.sha256(f"{package.name}\0{sys.version}\n".encode())
    for path in files:
        st = path.stat()
        digest.update(f"{path.relative_to(package)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    stamp = digest.hexdigest()[:16]
    dest = dest_root / stamp
    if (dest / ".complete").exists():
        os.utime(dest / ".complete")
        return dest
    dest_root.mkdir(parents=True, exist_ok=True)
    os.chmod(dest_root, 0o755)  # (the copies are bound into sandboxes; nothing in them is secret)
    # a running sandbox has its copy bound: a copy in use is younger than COPY_RETENTION
    prune(dest_root, COPY_RETENTION)
    tmp = dest_root / f".tmp-{stamp}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    target = tmp / package.name
    for path in files:
        out = target / path.relative_to(package)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, out)
    compileall.compile_dir(str(target), quiet=2)
    if package.name == "sandbox_server":
        from sandbox_server.judge import precompile

        precompile(target / "judge")  # the judge's Java subject: compiled once here, not at every grading
    (tmp / ".complete").write_text(stamp)
    for mode_dir in [tmp, *tmp.rglob("*")]:
        if mode_dir.is_dir():
            os.chmod(mode_dir, 0o755)
    try:
        tmp.rename(dest)
    except OSError:  # another control plane won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
