"""``idegym sandboxes list|prune``: the local backend's sandboxes on this host, for a user who
lost track of them (a control plane killed, a state directory forgotten).

A sandbox is found from what it leaves on the host: its directory and record under a state
directory's ``sandboxes/`` (and ``builds/sandboxes/``), and its cgroups (``idegym/<key>/<name>``,
the key naming the state directory). ``--all`` looks at every state directory a local backend
has run on since boot, and at every IdeGym cgroup, even one whose state directory is gone.
``prune`` ends them as a delete does (processes, mounts, cgroups, files); it leaves alone the
sandboxes of a control plane that is still running on their state directory, unless ``--force``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sandbox_server import procfs

from .backends.base import BackendError
from .backends.local import teardown
from .backends.local.cgroups import Cgroups, controller_mounts
from .backends.local.handle_data import LocalHandleData
from .backends.local.layout import Space, pick_run_root, read_meta, registered_states, state_key
from .backends.local.lease import LEASE_FILE, owned
from .config import ControlPlaneConfig

CGROUP_PARENT = "idegym"  # LocalBackend's default cgroup_parent
SPACES = (("sandboxes", "sandboxes"), ("builds", "builds/sandboxes"))


@dataclass
class Found:
    name: str
    space: str
    state_dir: str | None  # None: only cgroups are left, of a state directory that is gone
    image: str | None
    running: bool
    processes: int
    age_s: float | None
    lease_age_s: float | None

    @property
    def owner_alive(self) -> bool:
        """Whether a control plane may still own it: a fresh lease, a state directory that exists
        without a lease (a control plane that predates leases), or no known state directory at
        all. Such sandboxes are pruned only with --force; those whose state directory is gone, whose
        lease lapsed or whose control plane stopped (no running backend holds the state), always."""
        if self.state_dir is None:
            return True
        if not Path(self.state_dir).is_dir():
            return False
        if self.lease_age_s is not None and not owned(Path(self.state_dir)):
            return False  # stopped (cleanly or not): a lease nobody renews any more
        return self.lease_age_s is None or self.lease_age_s < _ttl(self.state_dir)


def _ttl(state_dir: str | None) -> float:
    try:
        return float(Path(state_dir or "", LEASE_FILE).read_text().split()[0])  # "TTL MARK"
    except (OSError, ValueError, IndexError):
        return 0.0


def _lease_age(state_dir: Path) -> float | None:
    try:
        return time.time() - (state_dir / LEASE_FILE).stat().st_mtime
    except OSError:
        return None


def _spaces(state_dir: Path) -> list[Space]:
    key = state_key(state_dir)
    run_root = pick_run_root(state_dir, key)
    return [Space(kind, state_dir / rel, Cgroups(f"{CGROUP_PARENT}/{key}" + ("-build" if kind == "builds" else "")),
                  state_dir, run_root) for kind, rel in SPACES]


def in_state(state_dir: Path) -> list[Found]:
    found = []
    lease = _lease_age(state_dir)
    for space in _spaces(state_dir):
        names = {e.name for e in os.scandir(space.root) if e.is_dir()} if space.root.is_dir() else set()
        names |= space.cgroups.names()
        for name in sorted(names):
            meta = read_meta(space.root / name) or LocalHandleData()
            paths = {c: p for c, p in space.cgroups.paths(name).items() if os.path.isdir(p)}
            try:
                age = time.time() - (space.root / name / "sandbox.json").stat().st_mtime
            except OSError:
                age = None
            found.append(Found(name, space.kind, str(state_dir), meta.image,
                               procfs.recorded_alive(meta.server), len(Cgroups.procs(paths)), age, lease))
    return found


def on_host() -> list[Found]:
    """Every state directory registered since boot, and IdeGym cgroups of unknown ones."""
    states = registered_states()
    found = [f for key, state in sorted(states.items()) if state.is_dir() for f in in_state(state)]
    for point in controller_mounts().values():
        top = point / CGROUP_PARENT
        if not top.is_dir():
            continue
        for keydir in top.iterdir():
            key = keydir.name.removesuffix("-build")
            if not keydir.is_dir() or (key in states and states[key].is_dir()):
                continue
            for group in keydir.iterdir():
                if group.is_dir() and not any(f.name == group.name and f.space.endswith(keydir.name) for f in found):
                    groups = {c: str(m / CGROUP_PARENT / keydir.name / group.name)
                              for c, m in controller_mounts().items()}
                    procs = Cgroups.procs(groups)
                    state = _state_of(procs)
                    found.append(Found(group.name, f"cgroups {CGROUP_PARENT}/{keydir.name}",
                                       str(state) if state else None, None, False, len(procs), None,
                                       _lease_age(state) if state else None))
    return found


def _state_of(procs: set[int]) -> Path | None:
    """The state directory a sandbox's bubblewrap names (``--bind <state>/sandboxes/<name>/root /``)."""
    for pid in sorted(procs):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"bwrap") and b"--bind" in argv:
            space = Path(os.fsdecode(argv[argv.index(b"--bind") + 1])).parent.parent  # .../sandboxes
            return space.parent.parent if space.parent.name == "builds" else space.parent
    return None


def prune(found: Found, force: bool) -> str:
    if found.owner_alive and not force:
        if found.state_dir is None:
            why = "its state directory is unknown (a control plane may still own it)"
        elif found.lease_age_s is not None:
            why = f"a control plane runs on {found.state_dir} (it renewed the lease {found.lease_age_s:.0f} s ago)"
        else:
            why = f"its state directory {found.state_dir} has no lease (a control plane may still own it)"
        return f"kept: {why}; stop it, or pass --force"
    try:
        if found.space.startswith("cgroups"):
            keydir = found.space.split("/", 1)[1]
            paths = {c: str(m / CGROUP_PARENT / keydir / found.name) for c, m in controller_mounts().items()}
            paths = {c: p for c, p in paths.items() if os.path.isdir(p)}
            left = Cgroups.kill_all(paths)
            stuck = Cgroups.remove(paths)
            if left or stuck:
                return f"left: processes {left}, cgroups {stuck}"
        elif found.state_dir is not None:
            space = next(s for s in _spaces(Path(found.state_dir)) if s.kind == found.space)
            teardown.destroy(found.name, space, None, "bwrap")
            teardown.tidy(space, wait=2.0)  # the monitor just ended may hold the space's bind a moment
        else:
            return "failed: no state directory is known for it"
    except BackendError as exc:
        return f"failed: {exc.message}"
    return "ended"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sandboxes_command", required=True, metavar="COMMAND")
    for name, text in (("list", "show the sandboxes on this host"),
                       ("prune", "end them: processes, mounts, cgroups and files")):
        cmd = sub.add_parser(name, help=text, description=f"{text[0].upper()}{text[1:]} (local backend).")
        where = cmd.add_mutually_exclusive_group()
        where.add_argument("--state-dir", type=Path, default=ControlPlaneConfig().state_dir,
                           help="the control plane's state directory [default ~/.local/state/idegym]")
        where.add_argument("--all", action="store_true",
                           help="every IdeGym sandbox on this host (every state directory used since boot, and "
                                "cgroups left without one)")
        if name == "list":
            cmd.add_argument("--json", action="store_true", help="one JSON object per sandbox")
        else:
            cmd.add_argument("--force", action="store_true",
                             help="also end the sandboxes of a control plane that is still running")


def run(args: argparse.Namespace) -> int:
    found = on_host() if args.all else in_state(args.state_dir.absolute())
    if args.sandboxes_command == "list":
        if args.json:
            for f in found:
                print(json.dumps({**asdict(f), "owner_alive": f.owner_alive}))
            return 0
        if not found:
            print("no sandboxes" + ("" if args.all else f" in {args.state_dir}"))
            return 0
        print(f"{'NAME':<24} {'SPACE':<10} {'RUNNING':<8} {'PROCS':>5} {'AGE':>8} {'OWNER':<8} STATE DIRECTORY")
        for f in found:
            age = f"{f.age_s:.0f}s" if f.age_s is not None else "-"
            owner = "alive?" if f.owner_alive else "gone"
            print(f"{f.name:<24} {f.space[:10]:<10} {'yes' if f.running else 'no':<8} {f.processes:>5} {age:>8} "
                  f"{owner:<8} {f.state_dir or '(unknown)'}")
        return 0
    if os.geteuid() != 0:
        print("idegym sandboxes prune: needs root (sandboxes are root's mounts and cgroups)", file=sys.stderr)
        return 2
    failures = 0
    for f in found:
        outcome = prune(f, args.force)
        failures += outcome.startswith(("failed", "left"))
        print(f"{f.name}: {outcome}")
    if not found:
        print("nothing to prune")
    return 1 if failures else 0
