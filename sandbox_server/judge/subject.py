"""The grader's side of the judge: the code under test as proxies to a process of its own.

A test module of a judge-tier task reaches the code under test only through this module::

    from idegym_judge import subject

    roman = subject.module("roman")               # Python: the project's roman.py
    qs = subject.module("src/querystring.js", runtime="node")
    java = subject.java(classpath="build")        # Java: classes compiled into build/
    Fraction = java.cls("mathlib.Fraction")
    rb = subject.process(["./build/driver"])      # anything else: a driver speaking the protocol

Every call (``roman.to_roman(4)``, ``Fraction(1, -2).numerator()``) is a request to the subject
process, which runs as the sandbox's tool user (when the grader runs as root) with a pinned
environment; the answer is plain data (or a handle on an object that stays in the subject), so
the code under test cannot reach the test's assertions, the test runner or its report. A
subject that crashes, exits or hangs past ``IDEGYM_JUDGE_CALL_TIMEOUT`` seconds fails the call
with ``SubjectError``; the next call starts a fresh process.
"""

from __future__ import annotations

import builtins
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

HERE = os.path.dirname(os.path.abspath(__file__))
SUBJECTS = os.path.join(HERE, "subjects")
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
_SHARED_TMP = "/tmp" if os.path.isdir("/tmp") else None


class SubjectError(Exception):
    """The subject process failed to answer: it crashed, exited, hung or spoke garbage."""


class SubjectLost(SubjectError):
    """A handle on an object of a subject process that has since ended."""


class RemoteError(Exception):
    """Base of the exceptions raised by the code under test (re-raised here by name)."""

    remote_type = ""
    remote_traceback = ""


_EXCEPTION_CLASSES: dict[str, type] = {}
_EXIT_TYPES = {"SystemExit", "KeyboardInterrupt", "GeneratorExit"}


def _builtin_base(builtin: str | None) -> type:
    found = getattr(builtins, builtin or "", None)
    if builtin in _EXIT_TYPES or not (isinstance(found, type) and issubclass(found, Exception)):
        return RemoteError
    key = f"builtins.{builtin}"
    if key not in _EXCEPTION_CLASSES:
        _EXCEPTION_CLASSES[key] = type(found.__name__, (RemoteError, found), {"remote_type": key})
    return _EXCEPTION_CLASSES[key]


def exception_class(full_name: str, chain: tuple[str, ...] = (), builtin: str | None = None) -> type:
    """The local stand-in for the subject's exception class ``full_name``: one per name, so that
    ``assertRaises(mod.MyError)`` catches what the subject raises; it derives from the stand-ins
    of its bases and from the builtin exception they end in, so ``assertRaises(ValueError)``
    catches a subclass of ValueError too."""
    if builtin and full_name == f"builtins.{builtin}":
        return _builtin_base(builtin)
    if full_name not in _EXCEPTION_CLASSES:
        rest = chain[1:] if chain and chain[0] == full_name else chain
        base = exception_class(rest[0], rest[1:], builtin) if rest else _builtin_base(builtin)
        module_name, _, name = full_name.rpartition(".")
        cls = type(name or full_name, (base,), {"remote_type": full_name})
        cls.__module__ = module_name or "subject"
        _EXCEPTION_CLASSES[full_name] = cls
    return _EXCEPTION_CLASSES[full_name]


def _remote_exception(doc: dict) -> BaseException:
    name = str(doc.get("type") or "Exception")
    builtin = doc.get("builtin")
    message = str(doc.get("message") or "")
    if name.rpartition(".")[2] in _EXIT_TYPES or builtin in _EXIT_TYPES:
        return SubjectError(f"the code under test raised {name} ({message}) instead of answering")
    exc = exception_class(name, tuple(map(str, doc.get("chain") or ())), builtin)(message)
    exc.remote_traceback = str(doc.get("traceback") or "")
    return exc


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
        self._home = tempfile.mkdtemp(prefix="idegym-subject-", dir=_SHARED_TMP)
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
            root._id = self._request(request)["id"]
            root._generation = self.generation

    def close(self) -> None:
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            for stream in (self._proc.stdin, self._proc.stdout):
                try:
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
            raise _remote_exception(answer["err"])
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
            return _remote_exception(doc)
        raise protocol.ProtocolError(f"unknown value tag {tag!r}")

    def root(self, request: dict) -> RemoteObject:
        """A handle that survives restarts: ``request`` is sent again in each new process."""
        value = self.request(request)
        if not isinstance(value, RemoteObject):
            raise SubjectError(f"{request} answered {value!r}, not an object")
        self.roots.append((value, request))
        return value


_LIVE: list[Subject] = []


def close_all() -> None:
    """End every subject process this grader started and remove what it compiled (the runner
    calls it at the end)."""
    while _LIVE:
        _LIVE.pop().close()
    if JavaSubject._compiled is not None:
        shutil.rmtree(JavaSubject._compiled, ignore_errors=True)
        JavaSubject._compiled = None


def _encode_arg(subject: Subject, value):
    def make_ref(obj):
        if isinstance(obj, RemoteObject):
            if obj._subject is not subject:
                raise TypeError("an object of one subject cannot be passed to another")
            return {protocol.TAG: "ref", "id": obj._id}
        raise TypeError(f"cannot send a {type(obj).__name__} to the subject: only plain data and its own objects")
    return protocol.encode(value, make_ref)


class RemoteObject:
    """An object that lives in the subject process; using it sends requests there."""

    __slots__ = ("_subject", "_id", "_generation", "_type", "_repr", "__weakref__")

    def __init__(self, subject: Subject, doc: dict) -> None:
        object.__setattr__(self, "_subject", subject)
        object.__setattr__(self, "_id", doc.get("id"))
        object.__setattr__(self, "_generation", subject.generation)
        object.__setattr__(self, "_type", str(doc.get("type") or "object"))
        object.__setattr__(self, "_repr", str(doc.get("repr") or ""))

    def _send(self, op: str, **fields):
        doc = {"op": op, "ref": {protocol.TAG: "ref", "id": self._id}, **fields}
        return self._subject.request(doc, self._generation)

    def _args(self, args, kwargs) -> dict:
        return {"args": [_encode_arg(self._subject, a) for a in args],
                "kwargs": _encode_arg(self._subject, dict(kwargs))}

    def _dunder(self, name: str, *args):
        return self._send("dunder", name=name, args=[_encode_arg(self._subject, a) for a in args])

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._send("getattr", name=name)

    def __setattr__(self, name: str, value) -> None:
        self._send("setattr", name=name, value=_encode_arg(self._subject, value))

    def __call__(self, *args, **kwargs):
        return self._send("call", **self._args(args, kwargs))

    def call_method(self, name: str, *args, **kwargs):
        """``obj.name(*args)`` in one request (``obj.name(...)`` takes two)."""
        return self._send("callmethod", name=name, **self._args(args, kwargs))

    def __repr__(self) -> str:
        try:
            return self._dunder("__repr__")
        except SubjectError:
            return f"<remote {self._type} {self._repr}>"

    def __str__(self) -> str:
        return self._dunder("__str__")

    def __len__(self) -> int:
        return self._dunder("__len__")

    # Truth and hashing stay local (an object is true, hashed by identity): neither may be
    # decided by the code under test.
    def __bool__(self) -> bool:
        return True

    def __hash__(self) -> int:
        return id(self)

    def __iter__(self):
        return iter(self._dunder("__list__"))

    def __contains__(self, item) -> bool:
        return self._dunder("__contains__", item)

    def __getitem__(self, key):
        return self._dunder("__getitem__", key)

    def __setitem__(self, key, value) -> None:
        self._dunder("__setitem__", key, value)

    def __delitem__(self, key) -> None:
        self._dunder("__delitem__", key)

    def __int__(self) -> int:
        return self._dunder("__int__")

    def __float__(self) -> float:
        return self._dunder("__float__")

    def __index__(self) -> int:
        return self._dunder("__index__")

    def __neg__(self):
        return self._dunder("__neg__")

    def __abs__(self):
        return self._dunder("__abs__")


def _binary(name: str):
    def method(self, other):
        return self._dunder(name, other)
    method.__name__ = name
    return method


def _comparison(name: str):
    def method(self, other):
        # Only the subject's own objects are compared by the subject: an object that claims to
        # equal the expected string or number would otherwise decide the test ("always equal").
        if not isinstance(other, RemoteObject):
            return NotImplemented
        return self._dunder(name, other)
    method.__name__ = name
    return method


for _name in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"):
    setattr(RemoteObject, _name, _comparison(_name))
for _name in ("__add__", "__sub__", "__mul__", "__truediv__", "__floordiv__", "__mod__", "__pow__", "__and__",
              "__or__", "__xor__", "__matmul__"):
    setattr(RemoteObject, _name, _binary(_name))


def _python() -> str:
    return os.environ.get("IDEGYM_SUBJECT_PYTHON") or shutil.which("python3", path=PINNED_ENV["PATH"]) or "python3"


def module(name: str, *, runtime: str = "python", path: list[str] | tuple[str, ...] = (),
           cwd: str | None = None) -> RemoteObject:
    """The code under test's module ``name`` in a new subject process.

    Python: ``name`` is a module name importable from the project directory (``path`` adds
    project-relative directories, e.g. ``["src"]``). Node: ``name`` is a file path relative
    to the project (``"src/querystring.js"``)."""
    if runtime == "python":
        argv = [_python(), "-I", os.path.join(SUBJECTS, "python_subject.py"), cwd or ".", *path]
    elif runtime == "node":
        argv = [os.environ.get("IDEGYM_SUBJECT_NODE") or "node", os.path.join(SUBJECTS, "node_subject.js")]
    else:
        raise ValueError(f"runtime must be 'python' or 'node', not {runtime!r}")
    subject = Subject(argv, cwd=cwd, description=f"{runtime} module {name}")
    return subject.root({"op": "import", "name": name})


class JavaSubject:
    """Classes of the code under test in a JVM of their own (``java -cp CLASSPATH``)."""

    _compiled: str | None = None  # JudgeSubject's classes, compiled once per grader process

    def __init__(self, classpath: str, cwd: str | None = None) -> None:
        java = os.environ.get("IDEGYM_SUBJECT_JAVA") or "java"
        self.subject = Subject([java, "-Xshare:auto", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp",
                                f"{self._judge_classes()}:{classpath}", "JudgeSubject"],
                               cwd=cwd, description=f"java classes in {classpath}")

    @classmethod
    def _judge_classes(cls) -> str:
        shipped = os.path.join(SUBJECTS, "java", "classes")
        if os.path.isfile(os.path.join(shipped, "JudgeSubject.class")):
            return shipped  # compiled with the sandbox runtime (judge.precompile)
        if cls._compiled is None:
            out = tempfile.mkdtemp(prefix="idegym-judge-java-", dir=_SHARED_TMP)
            os.chmod(out, 0o755)  # the subject (another user) reads it
            source = os.path.join(SUBJECTS, "java", "JudgeSubject.java")
            javac = os.environ.get("IDEGYM_SUBJECT_JAVAC") or "javac"
            done = subprocess.run([javac, "-proc:none", "-nowarn", "-d", out, source], capture_output=True, text=True)
            if done.returncode != 0:
                raise SubjectError(f"could not compile the judge's Java subject: {done.stderr.strip()[-2000:]}")
            for dirpath, _, filenames in os.walk(out):
                for name in filenames:
                    os.chmod(os.path.join(dirpath, name), 0o644)
            cls._compiled = out
        return cls._compiled

    def cls(self, name: str) -> RemoteObject:
        """The class ``name`` (fully qualified); call it to construct, use it for static methods."""
        return self.subject.root({"op": "import", "name": name})

    def exception(self, name: str) -> type:
        """The stand-in of Java exception class ``name`` (e.g. ``java.lang.ArithmeticException``)."""
        return exception_class(name)


def java(classpath: str, *, cwd: str | None = None) -> JavaSubject:
    return JavaSubject(classpath, cwd)


class ProcessSubject:
    """A driver program of the task's own (C, C++, …) speaking the protocol: ``call(op, *args)``
    sends ``{"op": op, "args": [...]}`` and returns the answer's data."""

    def __init__(self, argv: list[str], cwd: str | None = None) -> None:
        self.subject = Subject(argv, cwd=cwd, description=" ".join(argv))

    def call(self, op: str, *args):
        return self.subject.request({"op": op, "args": [protocol.encode(a) for a in args]})

    def output(self) -> str:
        return self.subject.output()

    def close(self) -> None:
        self.subject.close()


def process(argv: list[str], *, cwd: str | None = None) -> ProcessSubject:
    return ProcessSubject(argv, cwd)
