"""The judge: a test harness whose verdict the code under test cannot reach.

The tests (unittest modules) run in the grader process; the code under test runs in subject
processes of its own and only answers calls with data (``subject.py``, ``protocol.py``).
Subjects: Python modules and Node.js files generically, Java classes through reflection, and
any program that speaks the protocol (a task's own driver, e.g. for C). ``run.py`` is the entry
point inside a sandbox; the sandbox server exposes it to every tool as ``$IDEGYM_JUDGE``.
Stdlib only and Python 3.8 syntax, so any image's ``python3`` can run it.
"""

from __future__ import annotations

import os

HOME = os.path.dirname(os.path.abspath(__file__))
ENTRY = os.path.join(HOME, "run.py")


def judge_env(tool_path: str) -> dict[str, str]:
    """What every tool process gets to run the judge: ``$IDEGYM_JUDGE`` (a command line) and
    ``$IDEGYM_JUDGE_HOME`` (this directory: the subjects, ``subjects/c/judge_driver.h``…).
    The judge runs on the image's ``python3``, else on the server's own interpreter."""
    import shutil
    import sys

    python = shutil.which("python3", path=tool_path)
    command = f"{python} -I {ENTRY}"
    if python is None:
        lib = os.path.join(sys.base_prefix, "lib")
        prefix = f"env LD_LIBRARY_PATH={lib} " if os.environ.get("LD_LIBRARY_PATH") else ""
        command = f"{prefix}{sys.executable} -I {ENTRY}"
    return {"IDEGYM_JUDGE": command, "IDEGYM_JUDGE_HOME": HOME}


JAVA_CLASSES = os.path.join("subjects", "java", "classes")


def precompile(judge_dir: str | os.PathLike) -> bool:
    """Compile the Java subject into ``subjects/java/classes`` of a copy of this package (the
    sandbox runtime's), so gradings need not; False when there is no javac (it compiles then)."""
    import shutil
    import subprocess

    javac = shutil.which("javac")
    if javac is None:
        return False
    source = os.path.join(judge_dir, "subjects", "java", "JudgeSubject.java")
    out = os.path.join(judge_dir, JAVA_CLASSES)
    done = subprocess.run([javac, "-proc:none", "-nowarn", "-d", out, source], capture_output=True)
    return done.returncode == 0
