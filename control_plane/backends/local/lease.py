"""Leases: a local sandbox ends itself once the control plane that owns it stops renewing it.

The backend renews one lease per state directory (``<state>/lease``: its mtime is the last
renewal, its content the time-to-live in seconds) from a thread of its own, so a busy event loop
never lets it lapse. Every sandbox gets a monitor, started before anything runs in it: a small
shell process outside the sandbox, in its own session (it survives the control plane), that looks
at the lease every ``interval``
seconds and exits once the sandbox is gone (if only its directory is gone, with processes left in
its cgroups — its state directory was removed under it — it ends them). When the lease has not
been renewed for its TTL it
ends the sandbox the way ``teardown.py`` does, with host tools only: it freezes and kills every
process in the sandbox's cgroups and its recorded processes (the namespace's init ends the rest),
unmounts what the sandbox has mounted on the host, and removes its directories and cgroups. A
sandbox deleted while its cgroups could not be removed yet (a killed task still leaving them)
keeps its monitor, which removes them once it sees the sandbox's directory gone.

A control plane that is SIGKILLed and never restarted so leaks nothing past the TTL; one that is
restarted on the same state directory in time adopts its sandboxes as before.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import threading
import time
from pathlib import Path

from sandbox_server import procfs

from ...constants import DEFAULT_ORPHAN_TTL, LEASE_FILE
from .handle_data import LocalHandleData

log = logging.getLogger(__name__)

# Held (a shared flock) by every running backend of the state directory, for its whole run: a
# lease still fresh after a clean stop belongs to nobody then (``idegym sandboxes prune``).
OWNER_LOCK = "lease.lock"
PIDS_FILE = "lease-pids"  # in the sandbox's directory: what it runs, for its monitor

MONITOR = r"""
lease=$1 ttl=$2 interval=$3 sb=$4 run=$5 step_ms=$6
shift 6
recs=
while [ $# -gt 0 ] && [ "$1" != -- ]; do recs="$recs $1"; shift; done
[ $# -gt 0 ] && shift
groups=$*
procs() { for g in $groups; do find "$g" -name cgroup.procs -exec cat {} + 2>/dev/null; done; }
release_space() {
  # The space's bind of itself (layer_mounts.py): the last monitor out removes it, once nothing
  # is mounted below it. A plain umount fails while anything holds a file below it (another
  # monitor's directory or its log, which is in its layer and keeps that layer's loop device and
  # image open): this one lets go of its own, then tries for a while.
  cd /
  exec 2>/dev/null
  root=${sb%/*}
  i=0
  while [ $i -lt 50 ] && grep -q "^[0-9]* [0-9]* [^ ]* /[^ ][^ ]* $root " /proc/self/mountinfo; do
    grep -q " $root/" /proc/self/mountinfo && break
    umount "$root" 2>/dev/null && break
    sleep 0.1; i=$((i + 1))
  done
}
rmgroups() {  # (a killed task leaves its group a moment after; many ending at once, long after)
  i=0
  while [ $i -lt 400 ]; do  # 10 s at 0.1 s, then up to 5 min at 1 s: never an empty group left
    [ -e "$sb" ] && return  # a new sandbox of the same name: the groups are its own now
    left=
    for p in $(procs); do kill -9 "$p" 2>/dev/null; done
    for g in $groups; do
      find "$g" -depth -type d -exec rmdir {} + 2>/dev/null
      [ -d "$g" ] && left=1
    done
    [ -z "$left" ] && break
    if [ $i -lt 100 ]; then sleep 0.1; else sleep 1; fi
    i=$((i + 1))
  done
  for g in $groups; do rmdir "${g%/*}" "${g%/*/*}" 2>/dev/null; done
}
cd "$sb" || exit 0  # the working directory follows the sandbox's directory if it is moved
seen= same=0
# One process per look (the sleep): with 1,000 sandboxes, 1,000 monitors. The lease's second
# word changes at every renewal; unchanged for ttl seconds of looks, it lapsed.
while :; do
  PWD=/ sleep "$interval"  # (its environment need not name the sandbox)
  if ! [ "$sb" -ef . ]; then  # moved, or deleted
    here=$(readlink "/proc/$$/cwd")
    case $here in
      *" (deleted)")  # deleted (its groups, when the delete could not remove them yet, are ours to
        # remove); or its state directory was removed under a running sandbox
        [ -e "$sb" ] && exit 0  # a new sandbox of the same name: the groups are its own now
        [ -n "$(procs)" ] && break
        rmgroups
        release_space  # (a monitor the delete did not end: it held the space until now)
        exit 0 ;;
      *) sb=$here ;;
    esac
  fi
  given= renewal=
  read -r given renewal 2>/dev/null < "$lease"
  case $given in ''|*[!0-9]*) ;; *) ttl=$given ;; esac
  if [ -z "$renewal" ]; then  # a lease without its renewal's mark: by its age
    [ $(($(date +%s) - $(stat -c %Y "$lease" 2>/dev/null || echo 0))) -ge "$ttl" ] && break
    continue
  fi
  if [ "$renewal" != "$seen" ]; then seen=$renewal same=0; else same=$((same + 1)); fi
  [ $((same * step_ms)) -ge $((ttl * 1000)) ] && break
done
echo "idegym: the lease of $sb lapsed: ending the sandbox" >&2
# The pids of a sandbox cut off while it was made (started, not yet in its cgroups; record_pids).
recs="$recs $(cat "$sb/lease-pids" 2>/dev/null)"
for g in $groups; do case $g in */freezer/*) echo FROZEN > "$g/freezer.state" 2>/dev/null ;; esac; done
for p in $(procs); do kill -9 "$p" 2>/dev/null; done
for rec in $recs; do
  p=${rec%%:*}
  started=$(sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null | cut -d' ' -f20)
  [ "$started" = "${rec#*:}" ] && kill -9 "$p" 2>/dev/null
done
for g in $groups; do
  case $g in */freezer/*) find "$g" -name freezer.state -exec sh -c 'echo THAWED > "$1"' _ {} \; ;; esac
done
i=0
while [ $i -lt 100 ] && [ -n "$(procs)" ]; do
  for p in $(procs); do kill -9 "$p" 2>/dev/null; done
  sleep 0.1; i=$((i + 1))
done
grep " $sb/" /proc/self/mountinfo | cut -d' ' -f5 | sort -r | while read -r m; do umount -l "$m"; done
rm -rf "$sb" "$run" "$run.sock"
rmgroups
release_space
exit 0
"""


def owned(state_dir: Path) -> bool:
    """Whether a running backend holds ``state_dir`` (its ``OWNER_LOCK``)."""
    try:
        fd = os.open(state_dir / OWNER_LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class Lease:
    """The lease of one state directory, renewed every ``ttl / 4`` seconds (at most 30)."""

    def __init__(self, state_dir: Path, ttl: float = DEFAULT_ORPHAN_TTL) -> None:
        self.path = state_dir / LEASE_FILE
        self.ttl = max(float(ttl), 1.0)
        self.interval = min(max(self.ttl / 4, 0.25), 30.0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._owner: int | None = None

    def start(self) -> None:
        if self._owner is None:
            self._owner = os.open(self.path.with_name(OWNER_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(self._owner, fcntl.LOCK_SH)
        self.renew()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="idegym-lease", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing (the sandboxes left then end after the TTL unless a new run renews)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._owner is not None:
            os.close(self._owner)  # (releases the flock)
            self._owner = None

    def renew(self) -> None:
        """The lease's time-to-live and a mark of this renewal (monitors watch it change)."""
        tmp = self.path.with_name(f".{LEASE_FILE}.{os.getpid()}")
        tmp.write_text(f"{int(self.ttl)} {time.time_ns()}\n")
        tmp.replace(self.path)  # atomic: a monitor never reads a half-written TTL

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.renew()
            except OSError as exc:  # e.g. the disk is full: say so, keep trying
                log.error("cannot renew the sandboxes' lease %s: %s", self.path, exc)

    def age(self) -> float | None:
        """Seconds since the last renewal (None: no lease)."""
        try:
            return time.time() - self.path.stat().st_mtime
        except OSError:
            return None

    def watch(self, data: LocalHandleData) -> subprocess.Popen:
        """Start the monitor of a sandbox (``data``: its handle's data, with the pids recorded so
        far); records it in ``data``. The caller reaps the returned process."""
        records = [f"{pid}:{start}" for pid, start in data.processes().values()]
        groups = list(data.cgroups.values())
        argv = ["sh", "-c", MONITOR, "idegym-lease", str(self.path), str(int(self.ttl)), f"{self.interval:g}",
                data.dir, data.run_dir, str(max(int(self.interval * 1000), 1)), *records, "--", *groups]
        with open(data.log, "ab") as logf:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=logf,
                                    start_new_session=True, cwd="/",
                                    env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"})
        data.lease_monitor = procfs.record(proc.pid)
        return proc


def record_pids(data: LocalHandleData, *extra: list[int] | None) -> None:
    """Write the sandbox's recorded pids (and ``extra`` ``[pid, start]`` records) where its
    monitor reads them when it ends the sandbox. The monitor starts before anything runs in
    the sandbox, and its processes join the sandbox's cgroups only once they run: a control
    plane killed in between leaves them to the monitor by this file."""
    records = [*data.processes().values(), *(r for r in extra if r)]
    path = Path(data.dir) / PIDS_FILE
    tmp = path.with_name(f".{PIDS_FILE}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(" ".join(f"{pid}:{start}" for pid, start in records) + "\n")
    tmp.replace(path)
