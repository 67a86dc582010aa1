"""The embedded control plane: started on demand when no URL is given, gone when done.

It runs as a child process (``idegym control-plane serve --ephemeral``) with its own state
directory, so an interpreter that crashes cannot corrupt anybody else's state, and its own token
(``url`` carries it as credentials: ``http://idegym:<token>@127.0.0.1:<port>``); ``close()`` (or
interpreter exit) stops it, and ``--ephemeral`` makes it delete every sandbox it created. It
watches its parent: if this process is killed outright, it still shuts down and cleans up.
One instance is shared by every environment of the process (``acquire()``/``release()``). When
the last one releases it, it stays up for ``grace_seconds()`` (``$IDEGYM_EMBEDDED_GRACE``, default
60; 0 stops it at once), so that the next ``gym.make`` does not pay for a new one; it ends at
interpreter exit at the latest (``shutdown()`` ends it now). Its state directory is made in
``$IDEGYM_EMBEDDED_STATE_ROOT`` (default: the temporary directory).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from control_plane import ephemeral_state
from control_plane.auth import read_token, token_path
from control_plane.constants import DEFAULT_ORPHAN_TTL, LEASE_FILE, TOKEN_USER

from .ready_pipe import read_ready
from .settings import ClientSettings

START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0  # from SIGTERM; the control plane's own shutdown takes at most ~10 s
STATE_PREFIX = "idegym-embedded-"
LAPSE_MARGIN = 60.0  # seconds past a lease's TTL before its directory counts as abandoned
KEPT_LOGS_RETENTION = 7 * 86400.0  # a failed run's kept logs (no lease left) are swept after this


def sweep_lapsed_state_dirs(root: Path) -> list[Path]:
    """Remove the state directories of embedded control planes that were killed outright (with
    their embedding process): the lease they renewed has lapsed, so their sandboxes have ended
    (by their monitors), but nothing was left to delete the directory itself."""
    removed = []
    now = time.time()
    for path in root.glob(f"{STATE_PREFIX}*"):
        lease = path / LEASE_FILE
        try:
            if not lease.exists():  # only the logs of a run where something failed are left
                if now - path.stat().st_mtime > KEPT_LOGS_RETENTION:
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(path)
                continue
            ttl = float((lease.read_text().split() or [str(DEFAULT_ORPHAN_TTL)])[0])  # "TTL MARK"
            lapsed = now - lease.stat().st_mtime > ttl + LAPSE_MARGIN
            if not lapsed or any((path / "sandboxes").iterdir()):
                continue  # alive, or its sandboxes' monitors have not finished
        except (OSError, ValueError):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def state_root() -> Path:
    """Where embedded control planes make their state directories: ``$IDEGYM_EMBEDDED_STATE_ROOT``,
    else the temporary directory."""
    return ClientSettings.from_env().embedded_state_root or Path(tempfile.gettempdir())


class EmbeddedControlPlane:
    def __init__(self, *, warm_pool: int = 2, extra_args: list[str] | None = None,
                 state_dir: Path | None = None, build_roots: Sequence[str | os.PathLike] = ("/",)) -> None:
        """``build_roots``: where image builds may read host files. Every directory by default:
        this control plane's one client is its owner (it holds the token, which lives in this
        private state directory), and it reads files as its owner, who can read them anyway;
        the env builds task images from wherever its tasks are."""
        self._owns_state = state_dir is None
        if state_dir is None:
            root = state_root()
            root.mkdir(parents=True, exist_ok=True)
            sweep_lapsed_state_dirs(root)
            state_dir = Path(tempfile.mkdtemp(prefix=STATE_PREFIX, dir=root))
        self.state_dir = state_dir
        self.log_path = self.state_dir / "control-plane.log"
        read_fd, write_fd = os.pipe()
        argv = [sys.executable, "-m", "control_plane", "--port", "0", "--state-dir", str(self.state_dir),
                "--ephemeral", "--warm-pool", str(warm_pool), "--ready-fd", str(write_fd), "--auth", "token",
                "--tenants=",  # single-tenant with its private token, whatever the environment says
                "--parent-pid", str(os.getpid()), *(["--remove-state"] if self._owns_state else []),
                *(f"--build-root={root}" for root in build_roots),
                *(extra_args or [])]
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(argv, pass_fds=(write_fd,), stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        os.close(write_fd)
        line = read_ready(read_fd, START_TIMEOUT).decode()
        if not line.startswith("ready "):
            self.close()
            log = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            raise RuntimeError(f"the embedded control plane did not start within {START_TIMEOUT:g} s:\n{log}")
        self.port = int(line.split()[1])
        self.address = f"http://127.0.0.1:{self.port}"  # to show; it carries no credentials
        token = token_path(self.state_dir)  # made by the control plane as it started
        self.auth = (TOKEN_USER, read_token(token, strict=True)) if token.exists() else None
        # What to hand to clients (here, in Ray actors, in subprocesses): the credentials travel
        # with it, so treat it as a secret.
        self.url = f"http://{TOKEN_USER}:{self.auth[1]}@127.0.0.1:{self.port}" if self.auth else self.address
        self._closed = False
        atexit.register(self.close)

    def close(self) -> None:
        """Stop the control plane (it deletes its sandboxes) and remove its state."""
        with _closing:  # a grace timer and interpreter exit may both get here
            if getattr(self, "_closed", False):
                return
            self._closed = True
        why = ""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                why = f"it did not stop within {STOP_TIMEOUT:g} s of SIGTERM and was killed"
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()
        if self._owns_state:
            # The control plane removed its state (--remove-state), but for the logs an error named;
            # killed, or ended by a signal it did not handle, it left the state here.
            if not why and self.process.returncode not in (0, -signal.SIGTERM):
                why = f"it exited with status {self.process.returncode}"
            if why or ephemeral_state.only_logs_left(self.state_dir):
                ephemeral_state.remove(self.state_dir, keep_logs=True)
                print(f"idegym: something failed in the embedded control plane ({why or 'an error named its logs'}); "
                      f"its logs are kept in {self.state_dir}", file=sys.stderr)
            else:
                shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedControlPlane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_shared: EmbeddedControlPlane | None = None
_users = 0
_lock = threading.Lock()
_closing = threading.Lock()
_idle_timer: threading.Timer | None = None
_exiting = False  # set at interpreter exit: no grace timer (a thread started then never runs)


def grace_seconds() -> float:
    """How long the shared control plane outlives its last user: ``$IDEGYM_EMBEDDED_GRACE``."""
    return max(ClientSettings.from_env().embedded_grace, 0.0)


def _cancel_idle_timer() -> None:
    global _idle_timer
    if _idle_timer is not None:
        _idle_timer.cancel()
        _idle_timer = None


def acquire() -> EmbeddedControlPlane:
    """The process-wide embedded control plane, started on first use (or still up from the last)."""
    global _shared, _users
    with _lock:
        if _exiting:
            raise RuntimeError("the interpreter is exiting: no embedded control plane starts now")
        _cancel_idle_timer()
        if _shared is None or _shared._closed or _shared.process.poll() is not None:
            _shared = EmbeddedControlPlane()
        _users += 1
        return _shared


def release() -> None:
    """Drop one user; after the last, the control plane stops once ``grace_seconds()`` pass
    without a new one. Returns at once (unless the grace is 0)."""
    global _users, _idle_timer
    with _lock:
        _users = max(_users - 1, 0)
        if _users or _shared is None:
            return
        # At interpreter exit (an env closed by its finaliser, a script that never called close()),
        # a grace timer would keep the process alive, or hang it: a thread started while the
        # interpreter finalises never runs, and Thread.start() waits for it forever.
        grace = 0.0 if _exiting or sys.is_finalizing() else grace_seconds()
        if grace > 0:
            _cancel_idle_timer()
            _idle_timer = threading.Timer(grace, _stop_if_idle, args=(_shared,))
            _idle_timer.daemon = True  # interpreter exit does not wait for it: atexit closes the control plane
            try:
                _idle_timer.start()
                return
            except RuntimeError:  # Python >= 3.12 starts no thread once exit began (an atexit hook released)
                _idle_timer = None
    _stop_if_idle(_shared)


def _stop_if_idle(control_plane: EmbeddedControlPlane) -> None:
    global _shared
    with _lock:
        if _shared is not control_plane or _users:
            return  # someone took it again
        _shared = None
    control_plane.close()


@atexit.register
def _at_exit() -> None:
    global _exiting
    _exiting = True
    shutdown()


def shutdown() -> None:
    """Stop the shared control plane now, whoever uses it (their calls then fail)."""
    global _shared, _users
    with _lock:
        _cancel_idle_timer()
        control_plane, _shared, _users = _shared, None, 0
    if control_plane is not None:
        control_plane.close()
