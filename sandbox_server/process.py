"""Running tool processes: process groups, bounded output, timeouts that kill everything.

One ``Supervisor`` per server. It makes the server a child subreaper, so every process a tool
starts — including daemons that double-fork and ``setsid`` away — stays a descendant of the
server and can be found and ended by ``kill_descendants`` (used by project reset). Exits are
watched through pidfds (no signal handler); orphans re-parented to us are reaped periodically,
so they never linger as zombies.

Every process of a command carries the command's mark in its environment (``IDEGYM_CALL``), so
that a timeout ends the command's whole tree, daemons that double-forked away included. Ending a
tree first stops every process in it (SIGSTOP, until no new one appears) and then kills them, so
that nothing forks its way out — a fork bomb included. Tools that run as root never hold
CAP_SYS_ADMIN or CAP_SYS_PTRACE: the server drops them from its bounding set at start (keeping
them for itself), so tools cannot undo the sandbox's read-only mounts or take over the server.
(No ``preexec_fn``: it would cost every call a few milliseconds.) Tools are the OOM killer's first
choice (oom_score_adj), and when the sandbox's memory cgroup counts an OOM kill during a
command, its result says so. With delegated tool cgroups (``tool_cgroups.py``) every tool is
started from a spawner thread that lives in the tools' groups, and ``Supervisor.stage`` runs a
stage in child groups it empties at the end. One running command's pipes and exit: ``job.py``;
who it runs as: ``users.py``; isolated runs: ``isolated_runs.py``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import errno
import functools
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass

from . import procfs
from .isolated_runs import JailError, Jails, RunTemplate
from .jail import RUN_PIDS_MAX, Isolation, RunSpec
from .job import READ_CHUNK, Job, feed_stdin
from .memory_events import MemoryEvents
from .output import BoundedOutput
from .pipe_watch import PipeWatch
from .polling import until
from .run_template import RunReport
from .spawner import ANSWER_HOLD, SPAWNER, Spawner, SpawnRefused
from .spawner import available as spawner_available
from .tool_cgroups import ToolCgroups
from .trees import freeze_trees, marked_processes, pipe_holders, signal_group_and_holders
from .users import UserSpec, groups_of

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36
PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
CAP_SYS_PTRACE = 19
CAP_SYS_ADMIN = 21
# Root tools never hold these: mounts (the sandbox's read-only /proc/sys is a mount) and ptrace
# of the server (which holds them, to remount the project) would be ways back to them.
ROOT_TOOL_DROPPED_CAPS = (CAP_SYS_ADMIN, CAP_SYS_PTRACE)
TOOL_OOM_SCORE_ADJ = b"500"
MAX_DRAINERS = 256


@dataclass
class ProcessResult:
    exit_code: int
    stdout: BoundedOutput
    stderr: BoundedOutput
    timed_out: bool
    duration: float
    oom_killed: bool = False  # the sandbox's OOM killer ended a process while the command ran
    run_report: RunReport | None = None  # what an isolated run's init told of it


_libc = ctypes.CDLL(None, use_errno=True)
CALL_ENV = "IDEGYM_CALL"  # marks every process of one command (inherited through fork and exec)


def drop_tool_capabilities() -> bool:
    """Take CAP_SYS_ADMIN and CAP_SYS_PTRACE out of this process's bounding set: it keeps them,
    every program it executes as root does not. True when they are out (or were never in)."""
    for cap in ROOT_TOOL_DROPPED_CAPS:
        if _libc.prctl(PR_CAPBSET_READ, cap, 0, 0, 0) == 1 and _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            return False
    return True


class Supervisor:
    """Spawns the server's child processes and reaps orphans re-parented to it."""

    def __init__(self, memory_events: MemoryEvents | None = None, tool_cgroups: ToolCgroups | None = None,
                 isolated_runs: bool = False, spawners: bool = False, run_memory_max: int | None = None,
                 run_spares: int = 1, run_template: RunTemplate | None = None) -> None:
        self._tracked: set[int] = set()
        # Tools of another user started by a process that is that user (spawner.py), uid -> spawner.
        self._spawners: dict[int, Spawner] | None = {} if spawners and spawner_available() else None
        if spawners and os.geteuid() == 0 and self._spawners is None:
            log.info("no tool spawner (%s is not built: make native): tools start the long way", SPAWNER)
        self._staged = False
        self._stage_lock = asyncio.Lock()  # stages queue: the spawner thread is in one stage's groups at a time
        self._spawner_lock = asyncio.Lock()  # one spawner start at a time: a call waits for the one under way
        self._prestart: asyncio.Task | None = None
        self.tool_cgroups = tool_cgroups if tool_cgroups is not None and tool_cgroups.available else None
        # Tools are started from this thread, which lives in the tools' cgroups (tool_cgroups.py).
        self._spawner: concurrent.futures.ThreadPoolExecutor | None = None
        # Isolated runs (isolated_runs.py): their zygote starts with the server, while it holds CAP_SYS_ADMIN.
        self.jails: Jails | None = Jails() if isolated_runs else None
        self.run_memory_max = run_memory_max  # each isolated run's own memory limit (with the tools' cgroups)
        self.run_spares = run_spares  # isolated runs' inits kept ready: as many as may run at once
        self.run_template = run_template  # the interpreter isolated runs are forked from (run_template.py)
        self._drainers = 0
        self._pipes: PipeWatch | None = None  # the tools' pipes' reader, on the loop of the first call
        self._reaper: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.memory_events = memory_events or MemoryEvents(None)
        self._calls = 0
        self.root_tools_confined = os.geteuid() != 0
        self._switch = _user_switch() if os.geteuid() == 0 else None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
                log.warning("could not become a child subreaper; daemons may escape reset")
        except OSError:  # pragma: no cover - non-Linux
            log.warning("prctl unavailable; daemons may escape reset")
        if self.jails is not None:
            # Runs live below the tools' groups, each in child groups of its own (jail.py).
            run_groups = {c: str(d) for c, d in self.tool_cgroups.dirs.items()} if self.tool_cgroups else {}
            if self.jails.start(run_groups, pids_max=RUN_PIDS_MAX, memory_max=self.run_memory_max,
                                spares=self.run_spares, template=self.run_template):
                self.jails.attach(self._loop)
            else:
                log.warning("isolated runs are unavailable: %s", self.jails.reason)
                self.jails = None
        if os.geteuid() == 0:
            self.root_tools_confined = drop_tool_capabilities()
            if not self.root_tools_confined:
                log.warning("cannot drop CAP_SYS_ADMIN/CAP_SYS_PTRACE from the bounding set: tools are refused root")
        if self.tool_cgroups is not None:
            self._spawner = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="idegym-spawner")
            # Queued first: no tool starts before the spawner is in the tools' groups.
            self._spawner.submit(self._join_tool_groups, None)
        self._schedule_reaper()

    def _join_tool_groups(self, stage: str | None) -> None:
        assert self.tool_cgroups is not None
        try:
            self.tool_cgroups.join(stage)
        except OSError as exc:
            log.error("cannot move the tool spawner into the tools' cgroups %s: %s", self.tool_cgroups.root, exc)
            raise

    def start_spawner(self, user: UserSpec) -> None:
        """Start ``user``'s spawner now, in the background, rather than at its first tool call:
        a new sandbox's first call (a fork's child's, a claimed warm one's) then costs what a
        later one does. Nothing when tools of ``user`` would not use one."""
        if self._spawners is None or self._loop is None or user.uid == os.getuid():
            return
        self._prestart = self._loop.create_task(self._spawner_for(user, groups_of(user)))
        self._prestart.add_done_callback(_log_failure)

    def stop(self) -> None:
        if self._prestart is not None:
            self._prestart.cancel()
        if self._reaper is not None:
            self._reaper.cancel()
        self._stop_spawners()
        if self._pipes is not None:
            self._pipes.close()  # the zygote forks servers after its warm-up's: none may share it
            self._pipes = None
        if self.jails is not None:
            self.jails.stop()
        if self._spawner is not None:
            self._spawner.shutdown(wait=True)

    @contextlib.asynccontextmanager
    async def stage(self, name: str) -> AsyncIterator[None]:
        """Run a stage (a grading step, a reward check) in fresh cgroups: every tool started
        inside the block is born in the stage's child groups, and when the block ends every process
        in them (``setsid`` daemons included) is killed and the groups are removed. Stages do not
        nest: one waits for the other to end; tools started concurrently by other requests land in
        the stage too. Raises ``RuntimeError`` without delegated tool cgroups; a survivor (stuck in
        the kernel) is named in a ``RuntimeError`` after the block."""
        groups, spawner = self.tool_cgroups, self._spawner
        if groups is None or spawner is None:
            raise RuntimeError("stages need the tools' cgroups (--tool-cgroups), which this sandbox has not")
        loop = asyncio.get_running_loop()
        async with self._stage_lock:
            await loop.run_in_executor(None, groups.create, name)
            # Every tool the long way, so that it is born in the stage's groups; set first, so that no
            # tool user's spawner is started on the thread once it is in them (it would be ended with them).
            self._staged = True
            try:
                await loop.run_in_executor(spawner, self._join_tool_groups, name)
                yield
            finally:
                self._staged = False
                await loop.run_in_executor(spawner, self._join_tool_groups, None)
                left = await loop.run_in_executor(None, groups.empty, name)
                await loop.run_in_executor(None, groups.remove, name)
        if left:
            raise RuntimeError(f"stage {name!r}: processes {left} did not end")

    def _schedule_reaper(self) -> None:
        assert self._loop is not None
        self._reaper = self._loop.call_later(1.0, self._reap_orphans)

    def _reap_orphans(self) -> None:
        self._reap_orphans_now()
        self._schedule_reaper()

    # -- running ------------------------------------------------------------------------------

    async def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        user: UserSpec | None = None,
        timeout: float,
        grace: float,
        max_output: int | None,
        stdin: bytes | None = None,
        isolation: Isolation | None = None,
        via_spawner: bool = True,
        sinks: tuple[BoundedOutput, BoundedOutput] | None = None,
        stdin_fd: int | None = None,
        on_start: Callable[[int], object] | None = None,
    ) -> ProcessResult:
        """Run ``argv`` in a new session and wait for it, its pipes and, on timeout, its tree;
        with ``isolation``, in namespaces of its own (``jail.py``; needs ``isolated_runs``). A tool
        of another user is started by that user's spawner (``spawner.py``) unless ``via_spawner``
        is false (reward checks: nothing the agent's user can signal takes part in them).

        Returns within ``timeout + grace`` plus a few tens of milliseconds, whatever the command
        does: on timeout the process group, the command's whole process tree (daemons it
        double-forked included) and every process still holding the output pipes get SIGTERM,
        then SIGKILL once ``grace`` has passed. A command that cannot be started because the
        sandbox is out of processes or memory ends with exit code 126 and says why on stderr.
        ``sinks`` take the output instead of the result's own (a background process read as it
        runs); ``stdin_fd`` is the read end of the caller's pipe (closed here once the tool has it);
        ``on_start`` hears the tool's pid once it runs.
        """
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        out, err = sinks if sinks is not None else (BoundedOutput(max_output), BoundedOutput(max_output))
        kwargs: dict = {}
        spawner: Spawner | None = None
        switch: list[int] | None = None  # the groups of another user the long way switches to
        if isolation is not None:
            if self.jails is None:
                raise JailError("isolated runs are unavailable in this sandbox")
        elif user is not None and user.uid != os.getuid():
            groups = groups_of(user)
            spawner = await self._spawner_for(user, groups) if via_spawner else None
            if self._switch is not None:
                switch = groups
            else:
                kwargs.update(user=user.uid, group=user.gid, extra_groups=groups)
        if (user.uid if user is not None else os.getuid()) == 0 and not self.root_tools_confined:
            err.feed(b"idegym: root tools are refused: the server could not drop CAP_SYS_ADMIN/CAP_SYS_PTRACE\n")
            if stdin_fd is not None:
                os.close(stdin_fd)
            return ProcessResult(126, out, err, False, 0.0)
        self._calls += 1
        mark = f"{os.getpid()}.{self._calls}"
        marked = {**env, CALL_ENV: mark} if spawner is None or CALL_ENV in env else None
        ooms = self.memory_events.count()
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        in_r, in_w = os.pipe2(os.O_CLOEXEC) if stdin else (subprocess.DEVNULL, None)
        if stdin_fd is not None:
            in_r = stdin_fd
        proc: subprocess.Popen | None = None
        exit_status: asyncio.Future[int | None] | None = None
        init_pid: asyncio.Future[int] | None = None
        reports: list[RunReport] = []
        try:
            if isolation is not None:
                assert marked is not None
                init_pid, exit_status = self._spawn_isolated(argv, cwd, marked, user, isolation, in_r, out_w, err_w,
                                                             reports.append)
                pid = 0  # known once the zygote answers; the run goes on meanwhile
            else:
                if spawner is not None:
                    try:
                        # A bash call waits for the tool's end anyway: a quick tool's answer may
                        # come with it. Not so a caller that waits for the pid (on_start), nor
                        # a tool that waits for the stdin fed once it is answered.
                        hold = ANSWER_HOLD if on_start is None and in_w is None else 0.0
                        if marked is not None:  # the caller's own mark gives way to ours
                            pid, exit_status = await spawner.spawn(argv, marked, cwd, in_r, out_w, err_w, hold)
                        else:  # a user's environment as it is (a ToolEnv: encoded once), and the mark
                            pid, exit_status = await spawner.spawn(argv, env, cwd, in_r, out_w, err_w, hold,
                                                                   {CALL_ENV: mark})
                    except SpawnRefused as refused:
                        if refused.errno in (errno.EAGAIN, errno.ENOMEM):
                            raise OSError(refused.errno, os.strerror(refused.errno)) from refused
                        if refused.maybe_started:
                            for fd in (out_r, err_r, in_w):
                                if fd is not None:
                                    os.close(fd)
                            await loop.run_in_executor(None, _end_marked, mark)
                            err.feed(f"idegym: the command was interrupted as it started: {refused} (by a "
                                     "process of this sandbox); it may have run in part and was ended\n".encode())
                            return ProcessResult(126, out, err, False, time.monotonic() - started)
                        log.debug("the spawner refused a tool (%s): started the long way", refused)
                if exit_status is None:
                    env = marked if marked is not None else {**env, CALL_ENV: mark}
                    long_way = list(argv)
                    if switch is not None and user is not None and self._switch is not None:
                        # Popen(user=...) cannot vfork: forking this server costs ~2 ms, a helper's exec less.
                        long_way = self._switch(user, switch, argv, env.get("PATH"))
                    proc = await self._spawn(functools.partial(
                        subprocess.Popen, long_way, cwd=cwd, env=dict(env), stdin=in_r, stdout=out_w,
                        stderr=err_w, start_new_session=True, close_fds=True, **kwargs))
                    pid = proc.pid
        except BaseException as exc:
            for fd in (out_r, err_r, in_w):
                if fd is not None:
                    os.close(fd)
            if isinstance(exc, OSError) and exc.errno in (errno.EAGAIN, errno.ENOMEM):
                err.feed(f"idegym: could not start the command: {exc.strerror} (the sandbox is out of processes "
                         "or memory; end some with POST /api/processes/terminate)\n".encode())
                return ProcessResult(126, out, err, False, time.monotonic() - started)
            raise
        finally:
            for fd in (out_w, err_w) + ((in_r,) if in_w is not None or stdin_fd is not None else ()):
                os.close(fd)
        if proc is not None:  # an isolated run's init and a spawner's tools have theirs already
            procfs.write(pid, "oom_score_adj", TOOL_OOM_SCORE_ADJ)  # the OOM killer takes tools first
        if pid:
            self._tracked.add(pid)  # not the reaper's: a spawner's tool is ours if the spawner dies
            if on_start is not None:
                on_start(pid)
        try:
            if self._pipes is None:
                self._pipes = PipeWatch(loop)
            job = Job(loop, self._pipes, pid, {out_r: out, err_r: err}, exit_status)
            job.mark = mark
            if in_w is not None:
                asyncio.ensure_future(feed_stdin(loop, in_w, stdin or b""))
            if not job.done.done():  # (a quick tool of a spawner may be done already: no timer to set)
                timer = loop.call_later(timeout, job.expire)
                try:
                    await job.done
                finally:
                    timer.cancel()
            if init_pid is not None:
                try:
                    job.pid = await init_pid
                except JailError as exc:
                    err.feed(f"idegym: {exc}\n".encode())
            if job.timed_out and job.pid:
                await self._terminate(job, grace)
            for fd in list(job.open_pipes):
                # Pipes still held (a daemon kept them) are drained in the background, so the
                # daemon never dies of SIGPIPE, yet nothing more is retained.
                self._hand_to_drainer(job.watch, fd)
        finally:
            self._tracked.discard(pid)
        returncode = job.exit_code if job.exit_code is not None else 137
        if proc is not None:
            proc.returncode = returncode  # Popen must not reap
        code = 124 if job.timed_out else returncode
        oom = ooms is not None and (self.memory_events.count() or 0) > ooms
        return ProcessResult(code, out, err, job.timed_out, time.monotonic() - started, oom,
                             reports[0] if reports else None)

    async def _spawner_for(self, user: UserSpec, groups: list[int]) -> Spawner | None:
        """The user's spawner, started now unless it runs (or is starting); None while a stage
        runs, or when there is none to be had (the tool is then started the long way). One that
        cannot be started or failed its set-up is reported once, and no other is tried."""
        if self._spawners is None or self._staged or self._loop is None:
            return None
        spawner = self._spawners.get(user.uid)
        if (spawner is not None and spawner.alive and spawner.key == (user.uid, user.gid, tuple(groups))
                and not self._spawner_lock.locked()):
            return spawner  # it runs and no start is under way: no lock to take on every call
        async with self._spawner_lock:
            if self._spawners is None or self._staged:  # while waiting: the start under way failed, or a stage began
                return None
            return await self._spawner_locked(user, groups)

    async def _spawner_locked(self, user: UserSpec, groups: list[int]) -> Spawner | None:
        assert self._spawners is not None and self._loop is not None
        spawner = self._spawners.get(user.uid)
        if spawner is not None and spawner.alive and spawner.key == (user.uid, user.gid, tuple(groups)):
            return spawner
        if spawner is not None:
            spawner.stop()
            if spawner.broken:
                self._no_spawners(f"the tool spawner failed ({spawner.broken})")
                return None
        spawner = self._spawners[user.uid] = Spawner(user.uid, user.gid, groups, TOOL_OOM_SCORE_ADJ)
        try:
            # From the thread in the tools' groups, when there is one: the spawner is born in them.
            await spawner.start(self._loop, self._on_tools_thread if self._spawner is not None else None)
        except OSError as exc:
            self._no_spawners(f"cannot start the tool spawner {SPAWNER}: {exc}")
            return None
        return spawner

    def _keep_spawners(self) -> frozenset[int]:
        """The spawners fit for the next episode (``Spawner.pristine``); the others are stopped."""
        kept = set()
        for uid, spawner in list((self._spawners or {}).items()):
            if spawner.pristine():
                kept.add(spawner.pid)
            elif self._spawners is not None:
                spawner.stop()
                del self._spawners[uid]
        return frozenset(kept)

    def _stop_spawners(self) -> None:
        for spawner in (self._spawners or {}).values():
            spawner.stop()
        if self._spawners:
            self._spawners.clear()

    def _no_spawners(self, why: str) -> None:
        log.warning("%s: tools start the long way", why)
        self._stop_spawners()
        self._spawners = None

    def _spawn_isolated(self, argv: Sequence[str], cwd: str, env: Mapping[str, str], user: UserSpec | None,
                        isolation: Isolation, stdin: int, stdout: int, stderr: int,
                        on_report: Callable[[RunReport], object],
                        ) -> tuple[asyncio.Future[int], asyncio.Future[int | None]]:
        assert self.jails is not None
        who = user or UserSpec.current()
        spec = RunSpec.of(list(argv), dict(env), cwd, who.uid, who.gid, groups_of(who), isolation,
                          int(TOOL_OOM_SCORE_ADJ))
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC) if stdin == subprocess.DEVNULL else None
        try:
            return self.jails.spawn(spec, stdin if null is None else null, stdout, stderr, on_report)
        finally:
            if null is not None:
                os.close(null)

    async def _spawn(self, popen: Callable[[], subprocess.Popen]) -> subprocess.Popen:
        """Start a tool: on the spawner thread when there are tool cgroups. The start is never
        abandoned half-way (the caller closes the fds it passed once this returns)."""
        if self._spawner is None:
            return popen()
        started: list[subprocess.Popen] = []
        try:
            await self._on_tools_thread(lambda: started.append(popen()))
        except asyncio.CancelledError:
            if started:
                procfs.kill(started[0].pid, signal.SIGKILL)
            raise
        return started[0]

    async def _on_tools_thread(self, fn: Callable[[], object]) -> None:
        """``fn()`` on the thread that lives in the tools' cgroups, always to its end: a caller
        cancelled meanwhile hears of it once ``fn`` has returned."""
        assert self._spawner is not None
        future = asyncio.get_running_loop().run_in_executor(self._spawner, fn)
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            while not future.done():
                try:
                    await asyncio.wait([future])
                except asyncio.CancelledError:
                    continue
            raise

    async def _terminate(self, job: Job, grace: float) -> None:
        # The command's tree, taken before any signal: once its top process is gone, what it
        # double-forked is re-parented to the server and can no longer be told apart.
        tree = procfs.process_tree()
        family = set(procfs.descendants(job.pid, tree))
        # A spawner holds its running tools' output (spawner.c) and is no part of any one call.
        spawners = {s.pid for s in (self._spawners or {}).values()}
        holders = set(pipe_holders(job.pipe_ids, spawners)) | marked_processes(f"{CALL_ENV}={job.mark}".encode())
        for pid in holders:
            family.update(procfs.descendants(pid, tree))
        family |= holders
        signal_group_and_holders(job.pid, job.pipe_ids, signal.SIGTERM, spawners)
        for pid in family:
            procfs.kill(pid, signal.SIGTERM)

        def settled() -> bool:
            return job.exit_code is not None and not job.open_pipes and not any(procfs.alive(p) for p in family)

        if not await until(settled, grace, first=0.001, cap=0.01):
            roots = {p for p in family if procfs.alive(p)} | ({job.pid} if job.exit_code is None else set())
            frozen = freeze_trees(roots, include_roots=True)
            signal_group_and_holders(job.pid, job.pipe_ids, signal.SIGKILL, spawners)
            for pid in frozen:
                procfs.kill(pid, signal.SIGKILL)
            await until(settled, 0.3, first=0.005, cap=0.005)

    def _hand_to_drainer(self, watch: PipeWatch, fd: int) -> None:
        watch.remove(fd)
        if self._drainers >= MAX_DRAINERS:
            os.close(fd)
            return
        self._drainers += 1

        def drain() -> None:
            try:
                while os.read(fd, READ_CHUNK):
                    pass
            except BlockingIOError:
                return
            except OSError:
                pass
            watch.remove(fd)
            os.close(fd)
            self._drainers -= 1

        watch.add(fd, drain)

    # -- reset support ------------------------------------------------------------------------

    async def kill_descendants(self, grace: float) -> int:
        """End every process this server started, directly or not. Returns how many there were."""
        spare = self._keep_spawners()
        victims = [p for p in procfs.descendants(os.getpid()) if p not in spare]
        if not victims:
            return 0
        for pid in victims:
            procfs.kill(pid, signal.SIGTERM)
        await until(lambda: not any(procfs.alive(p) for p in victims), grace, first=0.001)
        # Stop everything still there (and what it forks meanwhile), then kill it all: a fork
        # bomb or a daemon that respawns on SIGTERM cannot outrun one scan-and-kill pass.
        survivors = freeze_trees({os.getpid()}, include_roots=False, spare=spare)
        for pid in survivors:
            procfs.kill(pid, signal.SIGKILL)
        await until(lambda: not any(procfs.alive(p) for p in survivors), 2.0, first=0.005, cap=0.005)
        self._reap_orphans_now()
        return len(set(victims) | set(survivors))

    def children(self) -> set[int]:
        """This server's children now (to tell, later, which processes a run left behind)."""
        return set(procfs.children(os.getpid()))

    async def end_new_children(self, before: set[int], grace: float) -> int:
        """End what a finished run left running: the server's children that were not ``before``
        (every process of an ended tree is re-parented to the server, the subreaper: daemons that
        ``setsid``, double-fork or clear their environment included) and their descendants, but
        not the main process of a call still running nor a tool user's spawner. SIGTERM and
        ``grace``, then stopped and killed. Returns how many there were."""
        spare = self._tracked | {s.pid for s in (self._spawners or {}).values()} | {os.getpid()}
        roots = self.children() - before - spare
        if not roots:
            return 0
        tree = procfs.process_tree()
        victims = set(roots)
        for pid in roots:
            victims.update(procfs.descendants(pid, tree))
        for pid in victims:
            procfs.kill(pid, signal.SIGTERM)
        await until(lambda: not any(procfs.alive(p) for p in victims), grace, first=0.001)
        survivors = freeze_trees(roots, include_roots=True)
        for pid in survivors:
            procfs.kill(pid, signal.SIGKILL)
        await until(lambda: not any(procfs.alive(p) for p in survivors), 2.0, first=0.005, cap=0.005)
        self._reap_orphans_now()
        return len(victims | survivors)

    def _reap_orphans_now(self) -> None:
        """Collect exited children we did not start ourselves (daemons re-parented to us)."""
        spawners = {s.pid for s in (self._spawners or {}).values()}  # each reaped by its own stop()
        for pid in procfs.children(os.getpid()):
            if pid not in self._tracked and pid not in spawners:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass


def _log_failure(task: asyncio.Task) -> None:
    """A spawner that could not be started ahead: the first call tries again, and says why."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("the tool spawner could not be started with the server: %r", task.exception())


def _end_marked(mark: str) -> None:
    """Kill every process of one command (its call mark), stopped first so none forks away."""
    for pid in freeze_trees(marked_processes(f"{CALL_ENV}={mark}".encode()), include_roots=True):
        procfs.kill(pid, signal.SIGKILL)


AS_USER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native", "idegym-as-user")


def _user_switch() -> Callable[[UserSpec, list[int], Sequence[str], str | None], list[str]] | None:
    """How a root server runs a program as another user: ``native/idegym-as-user`` (built by
    ``make``; ~0.3 ms) or else setpriv (~1.3 ms: its exec, dynamic linking, options)."""
    if os.access(AS_USER, os.X_OK):
        def as_user(user: UserSpec, groups: list[int], argv: Sequence[str], path: str | None) -> list[str]:
            # found on the tool's PATH, as setpriv's execvp would
            program = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=path) or argv[0]
            return [AS_USER, str(user.uid), str(user.gid), ",".join(map(str, groups)) or "-", program, *argv[1:]]
        return as_user
    setpriv = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
    if setpriv is None:
        return None

    def with_setpriv(user: UserSpec, groups: list[int], argv: Sequence[str], path: str | None) -> list[str]:
        return [setpriv, f"--reuid={user.uid}", f"--regid={user.gid}",
                f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups", "--", *argv]
    return with_setpriv
