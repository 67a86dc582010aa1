"""Where a local sandbox's pieces live, and the plan and record of one launch.

A sandbox ``<name>`` of a *space* (served sandboxes, or image-build sandboxes) has:

* ``<space root>/<name>/`` — its directory: ``sandbox.json`` (the record an orphan sweep and a
  restarted control plane read), ``layers/`` (its writable layers and ``server.log``), ``root/``
  (the mount point of its root tree), ``snap/`` (snapshot layers it was restored from);
* ``<run root>/<short name>/`` — its run directory, bound at ``/run/idegym`` inside (the server
  makes its socket there), and ``<run root>/<short name>.sock``, the hard link the control plane
  connects to;
* ``<cgroup mount>/<parent>/<name>`` in every cgroup v1 controller (``cgroups.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sandbox_server import procfs

from ..base import Limits
from .cgroups import Cgroups
from .fork_layers import ForkStack
from .handle_data import LocalHandleData
from .images import ResolvedImage
from .storage import IMAGE_NAME

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
SOCKET_NAME = "server.sock"
RUN_INSIDE = "/run/idegym"
TOOL_CGROUPS_INSIDE = "/run/idegym-cgroup/tools"  # <ctrl>/: the tools' delegated groups (cgroups.py)
# The tools' OOM-kill counter (v1 counts a kill in the victim's own group: this one and its children).
MEMORY_EVENTS_INSIDE = f"{TOOL_CGROUPS_INSIDE}/memory/memory.oom_control"
META_FILE = "sandbox.json"


def state_key(state_dir: Path) -> str:
    """The short key a state directory's cgroups and socket directory are named by."""
    return hashlib.sha1(str(Path(state_dir).absolute()).encode()).hexdigest()[:10]


INDEX = Path("/run/idegym-index")  # <key> → state directory, for ``idegym sandboxes --all``


def register_state(state_dir: Path, key: str) -> None:
    """Note on the host (until reboot) that a backend runs on ``state_dir``, and which process
    (``[pid, start]`` and its pid namespace): another backend's view of the files may differ
    (a private ``/tmp``), so whether the directory still exists is not for it to judge alone."""
    if os.geteuid() != 0:
        return
    me = procfs.record(os.getpid()) or [os.getpid(), 0]
    try:
        INDEX.mkdir(mode=0o700, exist_ok=True)
        tmp = INDEX / f".{key}.{os.getpid()}"
        tmp.write_text(f"{state_dir}\n{me[0]} {me[1]} {_pid_namespace()}\n")
        tmp.replace(INDEX / key)  # atomic: a reader never sees a half-written entry
    except OSError:
        pass


def registered_states() -> dict[str, Path]:
    return {key: entry.state for key, entry in _entries().items()}


def states_in_use() -> Callable[[str], bool]:
    """Whether the state directory registered as a key may still be in use: its directory is
    visible here, or the process that registered it still runs (or runs in another pid namespace,
    where this one cannot tell). A key's entry is read when it is asked about, never the whole
    index: that grows by every state directory until reboot (1,508 entries after three hours of
    test runs here, 50 ms of CPU at every start to read), while a start asks about the few keys
    with groups; and a read when asked sees a backend that registered since the sweep began,
    already making its sandboxes' groups."""
    here = _pid_namespace()

    def in_use(key: str) -> bool:
        entry = _entry(INDEX / key)
        if entry is None:
            return False
        if entry.state.is_dir():
            return True
        if entry.registrar is None:
            return False
        pid, start, namespace = entry.registrar
        return namespace != here or procfs.alive(pid, start)

    return in_use


@dataclass(frozen=True)
class _Entry:
    state: Path
    registrar: tuple[int, int, str] | None


def _entries() -> dict[str, _Entry]:
    found: dict[str, _Entry] = {}
    try:
        listing = [e for e in os.scandir(INDEX) if not e.name.startswith(".")]
    except OSError:
        return found
    for entry in listing:
        found_entry = _entry(Path(entry.path))
        if found_entry is not None:
            found[entry.name] = found_entry
    return found


def _entry(path: Path) -> _Entry | None:
    """One index entry (``register_state``), or None if there is none."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    if not lines or not lines[0].strip():
        return None
    registrar = None
    parts = lines[1].split() if len(lines) > 1 else []
    if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
        registrar = (int(parts[0]), int(parts[1]), parts[2])
    return _Entry(Path(lines[0].strip()), registrar)


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def pick_run_root(state_dir: Path, key: str) -> Path:
    """Unix socket paths are limited to 107 bytes: keep sockets under a short directory."""
    preferred = state_dir / "run"
    if len(str(preferred)) + 1 + 24 + 1 + len(SOCKET_NAME) <= 100:
        return preferred
    if os.geteuid() == 0 and os.access("/run", os.W_OK):
        return Path(f"/run/idegym-{key}")
    return Path(tempfile.gettempdir()) / f"idegym-{os.getuid()}-{key}"


@dataclass
class Space:
    """Where one family of sandboxes lives: ``sandboxes`` (served) or ``builds`` (image builds)."""

    kind: str
    root: Path
    cgroups: Cgroups
    state_dir: Path
    run_root: Path

    def run_dir(self, name: str) -> Path:
        prefix = "b-" if self.kind == "builds" else ""
        short = name if len(name) <= 24 else hashlib.sha1(name.encode()).hexdigest()[:24]
        return self.run_root / f"{prefix}{short}"


@dataclass
class Plan:
    """Everything one launch needs, decided before anything is made."""

    name: str
    space: Space
    sb: Path
    run: Path
    image: ResolvedImage
    project_lower: str
    run_as_root: bool
    network: bool
    limits: Limits
    pids_max: int | None
    env: dict[str, str]
    kind: str = "idegym"  # a ServerKind value: which server runs in the sandbox (server_kinds.py)
    storage_bytes: int | None = None  # the bound of its layers: the request's, else the backend's default
    storage_inodes: int | None = None
    snapshot: Path | None = None
    export: Path | None = None
    forks: ForkStack | None = None  # a fork's child: the layers it stands on (fork_layers.py)
    lowers: dict[str, list[str]] = field(default_factory=dict)
    isolated_runs: int = 0  # the server runs this many code-runner runs at once, each in namespaces of its own
    host_config: Path | None = None  # a networked sandbox: the host's package configuration, bound read-only
    network_peer: LocalHandleData | None = None  # another sandbox's record: its network namespace is joined

    @property
    def layers(self) -> Path:
        return self.sb / "layers"

    @property
    def layers_image(self) -> Path:
        return self.sb / IMAGE_NAME

    @property
    def log(self) -> Path:
        return self.sb / "layers" / "server.log"


def write_meta(sb: Path, name: str, data: LocalHandleData) -> None:
    """The sandbox's record in its directory: its handle's data (``LocalHandleData.dump``) and name."""
    if not sb.is_dir():
        return
    tmp = sb / f".{META_FILE}.{secrets.token_hex(3)}"
    tmp.write_text(json.dumps({"name": name, **data.dump()}, indent=1))
    tmp.replace(sb / META_FILE)


def read_meta(sb: Path) -> LocalHandleData | None:
    """The sandbox's record in its directory; None when it has none (or not one this can read)."""
    try:
        return LocalHandleData.of(json.loads((sb / META_FILE).read_text()))
    except (OSError, ValueError):  # pydantic's ValidationError is a ValueError
        return None


def tail(path: Path, lines: int = 40, max_bytes: int = 16384) -> str:
    """The last ``lines`` lines of a log file (at most ``max_bytes`` read), or ``""``."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(size - max_bytes, 0))
            data = fh.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])
