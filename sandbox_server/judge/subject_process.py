"""One subject process: started on first use with a pinned environment, as the sandbox's tool
user when the grader is root, and started again after it ends; requests go to its stdin, its
answers come back on a pipe of their own (its stdout and stderr are kept for failure messages).
Stdlib only, Python 3.8 syntax.
"""

from __future__ import annotations

import json
import os
import pwd
import selectors
import shutil
import signal
import subprocess
import tempfile
import time

from . import protocol
from .remote import RemoteObject, SubjectError, SubjectLost, exception_class, remote_exception

CALL_TIMEOUT = float(os.environ.get("IDEGYM_JUDGE_CALL_TIMEOUT", "60"))
ANSWER_FD_ENV = "IDEGYM_ANSWER_FD"  # the descriptor a subject writes its answers to
MAX_OUTPUT = 64 << 10  # of the subject's own stdout/stderr kept for failure messages
PINNED_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC", "PYTHONHASHSEED": "0", "PYTHONSAFEPATH": "1",
    "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1", "PYTHONUTF8": "1",
}
# What is still taken from the grader's environment (the task's pinned check environment).
PASSED_ENV = ("PATH", "JAVA_HOME", "NODE_PATH")
# Made here, used by the subject (another user): not under the grader's own private TMPDIR.
SHARED_TMP = "/tmp" if os.path.isdir("/tmp") else None


def _subject_user() -> tuple[int, int, str] | None:
    """The identity subjects run as: ``IDEGYM_SUBJECT_USER`` when the grader is root."""
    name = os.environ.get("IDEGYM_SUBJECT_USER")
    if os.geteuid() != 0 or not name:
        return None
    entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid, entry.pw_name



class Subject:
    """One subject process (started on first use, restarted after it ends)."""

    def __init__(self, argv: list[str], *, cwd: str | None = None, description: str = "") -> None:
        self.argv = list(argv)
        self.cwd = cwd or os.environ.get("IDEGYM_SUBJECT_DIR") or os.getcwd()
        self.description = description or " ".join(argv)
        self.generation = 0
        self.roots: list[tuple[RemoteObject, dict]] = []  # re-established in a new process
        self._proc: subprocess.Popen | None = None
        self._answers = -1
        self._buffer = b""
        self._output = bytearray()
        self._home: str | None = None
        _LIVE.append(self)

    # -- process ----------------------------------------------------------------------------

    def _start(self) -> None:
        self.close()
        self.generation += 1
        user = _subject_user()
        self._home = tempfile.mkdtemp(prefix="idegym-subject-", dir=SHARED_TMP)
        env = dict(PINNED_ENV)
        env.update({k: os.environ[k] for k in PASSED_ENV if k in os.environ})
        env.update(HOME=self._home, TMPDIR=self._home)
        answers_r, answers_w = os.pipe()
        env[ANSWER_FD_ENV] = str(answers_w)
        if user is not None:  # a JVM reopens it by /proc/self/fd/N, which checks the pipe's owner
            os.fchown(answers_w, user[0], user[1])
        kwargs: dict = {}
        if user is not None:
            os.chown(self._home, user[0], user[1])
            env.update(USER=user[2], LOGNAME=user[2])
            kwargs.update(user=user[0], group=user[1], extra_groups=[])
        try:
            self._proc = subprocess.Popen(
                self.argv, cwd=self.cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, pass_fds=(answers_w,), start_new_session=True, **kwargs)
        except OSError as exc:
            os.close(answers_r)
            raise SubjectError(f"could not start the subject {self.description}: {exc}") from None
        finally:
            os.close(answers_w)
        self._answers = answers_r
        self._buffer = b""
        self._output.clear()
        for root, request in self.roots:
            again = self._request(request)
            if not isinstance(again, RemoteObject):
                raise SubjectError(f"{request} answered {again!r} in the restarted subject, not an object")
            root._rebind(again)

    def close(self) -> None:
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            for stream in (self._proc.stdin, self._proc.stdout):
                try:
                    if stream is not None:
                        stream.close()
                except OSError:
                    pass
            self._proc.wait()
            self._proc = None
        if self._answers >= 0:
            os.close(self._answers)
            self._answers = -1
        if self._home:
            shutil.rmtree(self._home, ignore_errors=True)
            self._home = None

    def output(self) -> str:
        """What the subject printed lately (stdout and stderr), for failure messages."""
        self._drain_output()
        return self._output.decode("utf-8", "replace")

    def _drain_output(self) -> None:
        if self._proc is None or self._proc.stdout is None:
            return
        fd = self._proc.stdout.fileno()
        os.set_blocking(fd, False)
        while True:
            try:
                chunk = os.read(fd, 65536)
            except (BlockingIOError, OSError):
                return
            if not chunk:
                return
            self._output += chunk
            del self._output[:-MAX_OUTPUT]

    # -- requests -----------------------------------------------------------------------------

    def request(self, doc: dict, generation: int | None = None):
        """Send ``doc``; the decoded answer. Raises the subject's exception, or SubjectError."""
        if self._proc is None or self._proc.poll() is not None:
            if generation is not None and self._proc is not None:
                raise SubjectLost(f"the subject {self.description} ended since this object was made: "
                                  f"{self._ended_reason()}")
            self._start()
        elif generation is not None and generation != self.generation:
            raise SubjectLost(f"the subject {self.description} was restarted since this object was made")
        return self._request(doc)

    def _request(self, doc: dict):
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(protocol.dumps(doc).encode("ascii") + b"\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise SubjectError(f"the subject {self.description} is not listening: {self._ended_reason()}") from None
        answer = self._read_answer()
        if "ok" in answer:
            return protocol.decode(answer["ok"], self._resolve)
        if isinstance(answer.get("err"), dict):
            raise remote_exception(answer["err"])
        raise SubjectError(f"the subject {self.description} sent an answer that is neither ok nor err")

    def _read_answer(self) -> dict:
        deadline = time.monotonic() + CALL_TIMEOUT
        selector = selectors.DefaultSelector()
        selector.register(self._answers, selectors.EVENT_READ)
        assert self._proc is not None and self._proc.stdout is not None
        selector.register(self._proc.stdout, selectors.EVENT_READ)
        try:
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.close()
                    raise SubjectError(f"the subject {self.description} did not answer within {CALL_TIMEOUT:g} s "
                                       "(killed)")
                for key, _ in selector.select(remaining):
                    if key.fileobj is self._proc.stdout:
                        self._drain_output()
                        continue
                    chunk = os.read(self._answers, 1 << 20)
                    if not chunk:
                        try:
                            self._proc.wait(1.0)  # closed its answers: it is exiting
                        except subprocess.TimeoutExpired:
                            pass
                        reason = self._ended_reason()
                        self.close()
                        raise SubjectError(f"the subject {self.description} ended without answering: {reason}")
                    self._buffer += chunk
                    if len(self._buffer) > protocol.MAX_LINE:
                        self.close()
                        raise SubjectError(f"the subject {self.description} sent an answer over "
                                           f"{protocol.MAX_LINE} bytes")
        finally:
            selector.close()
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            doc = json.loads(line)
        except (ValueError, RecursionError):
            self.close()
            raise SubjectError(f"the subject {self.description} sent something that is not an answer: "
                               f"{line[:200]!r}") from None
        if not isinstance(doc, dict):
            self.close()
            raise SubjectError(f"the subject {self.description} sent something that is not an answer")
        return doc

    def _ended_reason(self) -> str:
        if self._proc is None:
            return "not running"
        code = self._proc.poll()
        if code is None:
            return "still running"
        tail = self.output().strip()[-500:]
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return how + (f"; its last output:\n{tail}" if tail else "")

    def _resolve(self, doc: dict):
        tag = doc.get(protocol.TAG)
        if tag == "ref":
            return RemoteObject(self, doc)
        if tag == "exctype":
            return exception_class(str(doc.get("type")), tuple(map(str, doc.get("chain") or ())),
                                   doc.get("builtin"))
        if tag == "exc":  # an exception object as a value (e.g. returned)
            return remote_exception(doc)
        raise protocol.JudgeProtocolError(f"unknown value tag {tag!r}")

    def root(self, request: dict) -> RemoteObject:
        """A handle that survives restarts: ``request`` is sent again in each new process."""
        value = self.request(request)
        if not isinstance(value, RemoteObject):
            raise SubjectError(f"{request} answered {value!r}, not an object")
        self.roots.append((value, request))
        return value



_LIVE: list[Subject] = []



def close_subjects() -> None:
    """End every subject process this grader started."""
    while _LIVE:
        _LIVE.pop().close()
