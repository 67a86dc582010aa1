"""User-mode networking for a sandbox allowed the network (``network=True`` or an image's
``network: true``).

Such a sandbox still has its own network namespace; slirp4netns gives it a tap device
(10.0.2.100/24, gateway 10.0.2.2, DNS 10.0.2.3) and relays its connections as ordinary sockets
of the host. So it reaches what the host reaches, except:

* the host's loopback: ``--disable-host-loopback`` refuses the gateway address that would lead
  there, and the sandbox's own 127.0.0.1 is its own;
* other sandboxes: each has its own namespace, and nothing is forwarded into one.

* any other address of the host (its interface addresses, bridges): slirp4netns runs in a cgroup
  whose packets to the host's own addresses the host's firewall refuses (``netguard.py``).

slirp4netns runs in its own mount namespace with only CAP_NET_BIND_SERVICE and a
seccomp filter, in the sandbox's server cgroups (its work is the sandbox's), and it exits when the
sandbox does: its ``--exit-fd`` is a pipe whose other end only bubblewrap and the namespace's
processes hold.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
from collections.abc import Callable
from typing import Any

from sandbox_server import procfs
from sandbox_server.polling import wait_until

from ..base import BackendError
from . import cgroups, netguard
from .handle_data import LocalHandleData

SLIRP = "slirp4netns"
RESOLV_CONF = b"nameserver 10.0.2.3\n"  # slirp4netns forwards it to the host's resolver
READY_TIMEOUT = 10.0


def require() -> str:
    """slirp4netns's path; a clear error when it is missing."""
    path = shutil.which(SLIRP)
    if path is None:
        raise BackendError("a sandbox with network needs slirp4netns (its own network namespace with user-mode "
                           "networking): install the Debian package slirp4netns (`make system-deps`)", 500)
    return path


def resolv_conf_fd() -> int:
    """A pipe holding the sandbox's ``/etc/resolv.conf`` (bubblewrap copies it in)."""
    read_fd, write_fd = os.pipe()
    os.write(write_fd, RESOLV_CONF)
    os.close(write_fd)
    return read_fd


def start(slirp: str, init: Any, exit_fd: int, data: LocalHandleData, log: Any,
          track: Callable[[subprocess.Popen], None], set_up: Callable[[], bool], groups: dict[str, str]) -> None:
    """Give the network namespace of the sandbox's ``init`` (a ``procfs.record``) its tap device,
    once bubblewrap has set the namespace up (``set_up``); returns once it is configured.
    slirp4netns is born in ``groups`` (the server's: the tools' OOM killer never picks it);
    records it as ``data.net``."""
    if not wait_until(lambda: set_up() or not procfs.recorded_alive(init),
                      READY_TIMEOUT, first=0.0005, cap=0.002) or not procfs.recorded_alive(init):
        raise BackendError("bubblewrap did not set up the sandbox's namespaces")
    ready_r, ready_w = os.pipe()
    argv = [slirp, "--configure", "--mtu=65520", "--disable-host-loopback", "--enable-sandbox", "--enable-seccomp",
            f"--ready-fd={ready_w}", f"--exit-fd={exit_fd}", str(init[0]), "tap0"]
    try:
        with cgroups.born_in(groups):
            popen = subprocess.Popen(netguard.confined(argv), pass_fds=(ready_w, exit_fd), stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=log, start_new_session=True, cwd="/",
                                     env={"PATH": os.environ.get("PATH", os.defpath)})
    finally:
        os.close(ready_w)
    track(popen)
    try:
        data.net = procfs.record(popen.pid)
        ready, _, _ = select.select([ready_r], [], [], READY_TIMEOUT)
        if not ready or not os.read(ready_r, 1):
            raise BackendError(f"slirp4netns did not set up the sandbox's network within {READY_TIMEOUT:g} s "
                               "(its messages are in the sandbox's server log)")
    except BaseException:
        if popen.poll() is None:
            popen.send_signal(signal.SIGKILL)
            popen.wait()
        raise
    finally:
        os.close(ready_r)
