"""How the sandbox server's own Python runtime and the host's toolchains appear in a sandbox.

Everything is bound read-only at neutral paths under ``/opt/idegym`` so that no host home
directory is ever visible, and only what runs is bound, never a whole home or prefix (where
credentials live: ``~/.cargo/credentials.toml``, ``config.toml``…):

* ``/opt/idegym/site``: the closure of the server kind's own imports (``closure.py``), compiled;
  nothing else of any Python environment of the host (no site-packages directory, so no other
  package's data: HumanEval's solutions, SWE instances' fixed releases, our own task data);
* ``/opt/idegym/python``: the interpreter (when it is not the image's ``/usr``): its executable,
  its standard library with the interpreter's own site-packages hidden under an empty
  directory, and its ``libpython``;
* of rustup and cargo their toolchains, ``settings.toml`` and ``bin`` under ``/opt/idegym/toolchains/...``.

The server starts with ``python -I -S -c <bootstrap>``: no site directory at all, the closure
first on ``sys.path``, then the ``main(argv)`` of its server kind's module (``server_kinds.py``).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from ...settings import ControlPlaneSettings
from .closure import EMPTY, SITE, Closure, assemble

INSIDE = "/opt/idegym"
SITE_INSIDE = f"{INSIDE}/site"
PYTHON_INSIDE = f"{INSIDE}/python"
TOOL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RUSTUP_PARTS = ("toolchains", "update-hashes", "settings.toml")  # what rustup's proxies (cargo, rustc…) read
# Where an interpreter keeps installed packages inside its standard library's directory.
SITE_DIR_NAMES = ("site-packages", "dist-packages")

BOOTSTRAP = (
    "import sys\n"
    "sys.path[:0] = {path!r}\n"
    "from {module} import main\n"
    "main(sys.argv[1:])\n"
)
SERVER_MODULE = "sandbox_server.cli"
# What ``sandbox_server`` runs on: its own package (with the judge's subjects and the native
# helpers) and what importing every module of it loads; uvloop is imported when the server starts.
SERVER_CLOSURE = Closure("sandbox-server", packages=("sandbox_server",), resources=("sandbox_server",),
                         imports=("sandbox_server.*", "uvloop"))


@dataclass
class Runtime:
    python: str  # the interpreter's path inside the sandbox
    binds: list[tuple[str, str]] = field(default_factory=list)  # (host path, path inside), read-only, in order
    server_env: dict[str, str] = field(default_factory=dict)
    tool_env: dict[str, str] = field(default_factory=dict)
    path: list[str] = field(default_factory=list)  # directories inside, first on the server's sys.path
    # Directories inside that hold only binds (of parts of a host directory): made read-only tmpfs.
    skeletons: list[str] = field(default_factory=list)
    empty: str = ""  # an empty host directory: bound over what must not be seen (see ``hidden``)

    def bootstrap(self, module: str = SERVER_MODULE) -> str:
        return BOOTSTRAP.format(path=self.path, module=module)

    def argv(self, module: str = SERVER_MODULE) -> list[str]:
        """The command that starts ``module``'s ``main(argv)`` in a sandbox."""
        return [self.python, "-I", "-S", "-c", self.bootstrap(module)]


def _under(path: Path, parent: str) -> bool:
    return path == Path(parent) or Path(parent) in path.parents


def standard_library() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def hidden(stdlib: Path, inside: str, empty: str) -> list[tuple[str, str]]:
    """Binds of ``empty`` over the site directories in ``stdlib`` (bound at ``inside``): the
    interpreter's own installed packages, which no sandbox is to see."""
    return [(empty, f"{inside}/{name}") for name in SITE_DIR_NAMES if (stdlib / name).is_dir()]


def detect(closure: Closure = SERVER_CLOSURE) -> Runtime:
    binds: list[tuple[str, str]] = []
    skeletons: list[str] = []
    # The server makes no TLS connections; an empty CA store spares it the ~40 ms aiohttp spends
    # loading the system's certificates at import time. Tools never see these variables.
    server_env = {"PATH": TOOL_PATH, "LANG": "C.UTF-8", "HOME": "/root",
                  "SSL_CERT_FILE": "/dev/null", "SSL_CERT_DIR": "/nonexistent"}
    entry = assemble(closure)
    empty = str(entry / EMPTY)
    base = Path(sys.base_prefix).resolve()
    exe = Path(os.path.realpath(sys.executable))
    if _under(base, "/usr") or not _under(exe, str(base)):
        python = str(exe)  # the image's own (the built-in image is the host's /usr)
    else:
        python = f"{PYTHON_INSIDE}/{exe.relative_to(base)}"
        stdlib = standard_library()
        stdlib_inside = f"{PYTHON_INSIDE}/{stdlib.relative_to(base)}"
        binds += [(str(exe), python), (str(stdlib), stdlib_inside), *hidden(stdlib, stdlib_inside, empty)]
        libs = sorted((base / "lib").glob("libpython*.so*"))
        binds += [(str(lib), f"{PYTHON_INSIDE}/lib/{lib.name}") for lib in libs]
        if libs:
            server_env["LD_LIBRARY_PATH"] = f"{PYTHON_INSIDE}/lib"
        skeletons += [PYTHON_INSIDE, str(Path(python).parent), f"{PYTHON_INSIDE}/lib"]
    binds.append((str(entry / SITE), SITE_INSIDE))
    env = ControlPlaneSettings.from_env()
    if env.tool_spawner is not None:  # the servers' --[no-]tool-spawner, chosen for the control plane
        server_env["IDEGYM_TOOL_SPAWNER"] = env.tool_spawner
    tool_env = {"PATH": TOOL_PATH, "LANG": "C.UTF-8"}
    home = Path.home()
    rustup = env.rustup_home or home / ".rustup"
    cargo = env.cargo_home or home / ".cargo"
    if (rustup / "toolchains").is_dir() and (cargo / "bin").is_dir():
        rustup, cargo = rustup.resolve(), cargo.resolve()
        binds += [(str(rustup / part), f"{INSIDE}/toolchains/rustup/{part}") for part in RUSTUP_PARTS
                  if (rustup / part).exists()]
        binds.append((str(cargo / "bin"), f"{INSIDE}/toolchains/cargo/bin"))
        skeletons += [f"{INSIDE}/toolchains/rustup", f"{INSIDE}/toolchains/cargo"]
        tool_env.update(RUSTUP_HOME=f"{INSIDE}/toolchains/rustup", CARGO_HOME=f"{INSIDE}/toolchains/cargo",
                        PATH=f"{TOOL_PATH}:{INSIDE}/toolchains/cargo/bin")
    return Runtime(python=python, binds=binds, server_env=server_env, tool_env=tool_env, path=[SITE_INSIDE],
                   skeletons=list(dict.fromkeys(skeletons)), empty=empty)
