"""Keep networked sandboxes off the host: no address of the host is reachable through slirp4netns.

slirp4netns relays a sandbox's connections as ordinary sockets of the host's network namespace,
so without more, a sandbox reaches every address of the host but its loopback: its interface
addresses (where a trainer's Ray GCS or a database listens on ``0.0.0.0``), bridges, anything a
listener binds. Filtering inside the sandbox's namespace would need the host's addresses at the
sandbox's start (missing those it gains later) and would rely on the sandbox's root having no
``CAP_NET_ADMIN``/``CAP_NET_RAW``. So the filter sits on the host, keyed to who makes the sockets:

* every slirp4netns joins one group of the cgroup-v2 hierarchy (``GROUP``) before it runs (a
  socket belongs to the group of the process that made it);
* one host firewall chain (``CHAIN``, jumped to from ``OUTPUT``, IPv4 and IPv6) refuses that
  group's packets to every address the kernel counts as local (``addrtype LOCAL``: the host's
  addresses, whenever they were added, and loopback) — but DNS to a resolver on the host, which
  slirp4netns forwards the sandbox's queries to.

The chain is written atomically (``iptables-restore --noflush``) and only ever matches that group,
so it changes nothing for other processes; it stays installed after the control plane ends, as
harmless as it is useful to the next one. Without iptables, or without a cgroup-v2 hierarchy that
can be mounted, networked sandboxes are refused with a message that says what to install.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import threading
from pathlib import Path

from ..base import BackendError

GROUP = "idegym-sandbox-net"
CHAIN = "IDEGYM-SANDBOX-NET"
OWN_MOUNT = Path("/run/idegym/cgroup2")  # where the cgroup-v2 hierarchy is mounted when it is nowhere
RESOLV_CONF = Path("/etc/resolv.conf")

_lock = threading.Lock()
_procs: Path | None = None


def cgroup2_root() -> Path:
    """Where the cgroup-v2 hierarchy is mounted (``/sys/fs/cgroup`` or its hybrid
    ``/sys/fs/cgroup/unified``), mounting it at ``OWN_MOUNT`` when it is nowhere."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1].replace("\\040", " "))
    OWN_MOUNT.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "cgroup2", "none", str(OWN_MOUNT)], capture_output=True, text=True)
    if done.returncode != 0:
        raise BackendError(f"a sandbox with network needs the cgroup-v2 hierarchy to keep it off the host's "
                           f"addresses, and mounting it failed: {done.stderr.strip()}", 500)
    return OWN_MOUNT


def local_resolvers(resolv_conf: Path = RESOLV_CONF) -> list[str]:
    """The host's name servers that are addresses of the host itself (slirp4netns forwards DNS there)."""
    try:
        lines = resolv_conf.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            try:
                address = ipaddress.ip_address(fields[1].split("%", 1)[0])
            except ValueError:
                continue
            if address.is_loopback or _is_local(str(address)):
                found.append(str(address))
    return found


def _is_local(address: str) -> bool:
    done = subprocess.run(["ip", "route", "get", address], capture_output=True, text=True)
    return done.returncode == 0 and done.stdout.startswith("local ")


def _rules(family: int, resolvers: list[str]) -> str:
    match = f"-m cgroup --path {GROUP}"
    lines = ["*filter", f":{CHAIN} - [0:0]"]  # (declaring the chain empties it, in the same commit)
    for resolver in resolvers:
        if ipaddress.ip_address(resolver).version == family:
            lines += [f"-A {CHAIN} {match} -d {resolver} -p {proto} --dport 53 -j RETURN" for proto in ("udp", "tcp")]
    lines += [f"-A {CHAIN} {match} -m addrtype --dst-type LOCAL -p tcp -j REJECT --reject-with tcp-reset",
              f"-A {CHAIN} {match} -m addrtype --dst-type LOCAL -j REJECT", "COMMIT", ""]
    return "\n".join(lines)


def _install_chain(tool: str, family: int, resolvers: list[str]) -> None:
    restore = shutil.which(f"{tool}-restore")
    if restore is None or shutil.which(tool) is None:
        raise BackendError(f"a sandbox with network needs {tool} to keep it off the host's addresses: install the "
                           "Debian package iptables (`make net-deps`)", 500)
    done = subprocess.run([restore, "-w", "--noflush"], input=_rules(family, resolvers), capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise BackendError(f"{tool}-restore could not install the chain that keeps networked sandboxes off the "
                           f"host: {done.stderr.strip()}", 500)
    if subprocess.run([tool, "-w", "-C", "OUTPUT", "-j", CHAIN], capture_output=True).returncode != 0:
        done = subprocess.run([tool, "-w", "-I", "OUTPUT", "-j", CHAIN], capture_output=True, text=True)
        if done.returncode != 0:
            raise BackendError(f"{tool} could not jump to {CHAIN} from OUTPUT: {done.stderr.strip()}", 500)


def install() -> Path:
    """Make the group and install the chains (once per process); the group's ``cgroup.procs``."""
    global _procs
    with _lock:
        if _procs is not None and _procs.exists():
            return _procs
        group = cgroup2_root() / GROUP
        # The rules name the group as it is when they are written: a group made anew needs them anew.
        group.mkdir(exist_ok=True)
        resolvers = local_resolvers()
        _install_chain("iptables", 4, resolvers)
        if os.path.exists("/proc/net/if_inet6"):
            _install_chain("ip6tables", 6, resolvers)
        _procs = group / "cgroup.procs"
        return _procs


def confined(argv: list[str]) -> list[str]:
    """``argv`` started in ``GROUP`` (it joins the group, then executes ``argv``)."""
    procs = install()
    join = 'echo $$ > "$1" || { echo "idegym: cannot join $1" >&2; exit 1; }; shift; exec "$@"'
    return ["/bin/sh", "-c", join, "sh", str(procs), *argv]
