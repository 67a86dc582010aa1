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
the code under test cannot reach the test's assertions, the test runner or its report. A handle
takes part in no operator of the test (``==``, ``-``, ``in``, ``len``, ``bool``…: a ``TypeError``);
ask the object instead, by method (``cache.call_method("__len__")``), and assert on the data. A
subject that crashes, exits or hangs past ``IDEGYM_JUDGE_CALL_TIMEOUT`` seconds fails the call
with ``SubjectError``; the next call starts a fresh process.

This module is that API; a subject process is ``subject_process.py``, the handles on its objects
and the stand-ins of its exceptions ``remote.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from . import protocol
from .remote import RemoteError, RemoteObject, SubjectError, SubjectLost, exception_class
from .subject_process import PINNED_ENV, SHARED_TMP, Subject, close_subjects

HERE = os.path.dirname(os.path.abspath(__file__))
SUBJECTS = os.path.join(HERE, "subjects")


def close_all() -> None:
    """End every subject process this grader started and remove what it compiled (the runner
    calls it at the end)."""
    close_subjects()
    if JavaSubject._compiled is not None:
        shutil.rmtree(JavaSubject._compiled, ignore_errors=True)
        JavaSubject._compiled = None


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
            out = tempfile.mkdtemp(prefix="idegym-judge-java-", dir=SHARED_TMP)
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


__all__ = ["JavaSubject", "ProcessSubject", "RemoteError", "RemoteObject", "SubjectError", "SubjectLost", "close_all",
           "exception_class", "java", "module", "process"]
