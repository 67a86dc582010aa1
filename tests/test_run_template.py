"""Isolated Python runs forked from the runs' template interpreter (``sandbox_server/run_template.py``):
each starts as ``python3 -u main.py`` would, shares nothing with another run, and the template
holds nothing of any run, cannot be reached from one, comes back when it dies and goes with its
server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import SandboxProcess, wait_until
from tests.test_sandbox_runner import IMAGE_PATH, _live_children, _pid_ns, _template_of, _zygote_of

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="isolated runs need root (namespaces)")

PYTHON = "/usr/bin/python3"
# What a program sees of its start; only modules of a plain start are loaded before its first import.
START = r"""
import sys
modules = sorted(sys.modules)
import json, os
print(json.dumps({"modules": modules, "argv": sys.argv, "orig_argv": sys.orig_argv, "file": __file__,
                  "path0": sys.path[0], "globals": sorted(globals()), "executable": sys.executable,
                  "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd"))[:3], "cwd": os.getcwd(),
                  "home": os.environ["HOME"], "flags": list(sys.flags), "stdout": [sys.stdout.encoding,
                  sys.stdout.line_buffering, sys.stdout.write_through], "pid": os.getpid(), "ppid": os.getppid(),
                  "forked": b"run_template.py" in open("/proc/self/cmdline", "rb").read()}))
"""


def _server(project: Path, tmp: Path, *extra: str) -> SandboxProcess:
    tmp.mkdir()
    return SandboxProcess(project, "unix", tmp, extra=["--isolated-runs", "--runner-concurrency", "2",
                                                        "--tool-env", f"PATH={IMAGE_PATH}", *extra])


@pytest.fixture
def forking(project: Path, tmp_path: Path) -> Iterator[SandboxProcess]:
    proc = _server(project, tmp_path / "forking")
    yield proc
    proc.stop()


def _run(server: SandboxProcess, code: str, *args: str) -> dict:
    body = server.post("/execute", {"language": "python", "code": code, "args": list(args), "timeout": 30}).json()
    assert body["exitCode"] == 0, body
    return body


def test_a_python_run_is_forked_from_the_template_and_starts_as_python3_would(forking: SandboxProcess,
                                                                               tmp_path: Path) -> None:
    """A run's program is a fork of the template, not a new interpreter, and what it sees of its
    start is what ``python3 -u main.py a`` shows run directly: the modules loaded, argv, the
    script's path and directory first on sys.path, its globals, only stdin, stdout and stderr
    open, its own HOME and directory, the interpreter's flags and stdout's buffering.

    Can fail: on main every run was a fresh python3 (``forked`` False); with the template's
    modules left in ``sys.modules`` (ctypes, _socket…) or its ``__main__`` kept, the lists differ.
    """
    seen = json.loads(_run(forking, START, "a")["stdout"])
    direct_dir = tmp_path / "direct"
    direct_dir.mkdir()
    (direct_dir / "main.py").write_text(START)
    env = {"PATH": IMAGE_PATH, "HOME": str(direct_dir), "LANG": "C.UTF-8",
           **{k: v for k, v in os.environ.items() if k.startswith("PYTHON")}}
    direct = json.loads(subprocess.run([PYTHON, "-u", "main.py", "a"], cwd=direct_dir, env=env, check=True,
                                       capture_output=True, text=True).stdout)
    assert seen["forked"] is True and direct["forked"] is False
    assert (seen["pid"], seen["ppid"]) == (2, 1), seen
    run_dir = seen["cwd"]
    assert seen["home"] == run_dir and seen["file"] == f"{run_dir}/main.py" and seen["path0"] == run_dir, seen
    assert (direct["home"], direct["file"], direct["path0"]) == (str(direct_dir), f"{direct_dir}/main.py",
                                                                 str(direct_dir))
    for key in ("modules", "argv", "globals", "fds", "flags", "stdout"):
        assert seen[key] == direct[key], key
    assert seen["orig_argv"] == ["python3", "-u", "main.py", "a"] and seen["executable"] == direct["executable"]


def test_a_forked_run_fails_as_python3_does(forking: SandboxProcess) -> None:
    """Uncaught exceptions, syntax errors, exit codes and messages are python3's: the traceback
    starts at the script (nothing of the template's frames), a KeyboardInterrupt ends the run by
    SIGINT, ``sys.exit('text')`` prints the text and exits 1.

    Can fail: with the exception left to the template's frame the traceback named run_template.py."""
    cases = {
        "def f():\n    raise ValueError('boom')\nf()\n": (
            1, 'Traceback (most recent call last):\n  File "{d}/main.py", line 3, in <module>\n    f()\n'
               '  File "{d}/main.py", line 2, in f\n    raise ValueError(\'boom\')\nValueError: boom\n'),
        "x = (\n": (1, '  File "{d}/main.py", line 1\n    x = (\n        ^\nSyntaxError: \'(\' was never closed\n'),
        "import sys\nsys.exit('bye')\n": (1, "bye\n"),
        "raise KeyboardInterrupt\n": (130, 'Traceback (most recent call last):\n  File "{d}/main.py", line 1, in '
                                          "<module>\n    raise KeyboardInterrupt\nKeyboardInterrupt\n"),
        "import atexit\natexit.register(print, 'at exit')\nraise SystemExit(3)\n": (3, ""),
    }
    for code, (exit_code, stderr) in cases.items():
        body = forking.post("/execute", {"language": "python", "code": code, "files": [
            {"path": "where.txt", "content": ""}]}).json()
        run_dir = body["stderr"].split('File "', 1)[1].split("/main.py", 1)[0] if 'File "' in body["stderr"] else ""
        assert body["exitCode"] == exit_code, (code, body)
        assert body["stderr"] == stderr.format(d=run_dir), (code, body)
    assert forking.post("/execute", {"language": "python", "code": "import atexit\natexit.register(print, 'bye')\n"
                                     }).json()["stdout"] == "bye\n"


def test_forked_runs_share_nothing_but_the_template(forking: SandboxProcess) -> None:
    """What one forked run changes in its interpreter (a module's state, sys, its environment, an
    imported module) is not in the next: each is a fork of the template, which never ran either.
    Both share the template's hash seed (docs/security.md says so).

    Can fail: with programs run in one long-lived interpreter (a scratch copy reusing the spare)
    the second run saw the first's module and variable. On main the hash seeds differed."""
    first = _run(forking, "import os, sys, json\njson.leak = 1\nsys.leak = 1\nos.environ['LEAK'] = '1'\n"
                          "print(hash('seed'))\n")
    second = _run(forking, "import os, sys\nprint(hash('seed'))\nprint(hasattr(sys, 'leak'), 'LEAK' in os.environ, "
                           "'json' in sys.modules)\n")
    seed1 = first["stdout"].strip()
    seed2, leaks = second["stdout"].splitlines()
    assert leaks == "False False False", second
    assert seed1 == seed2, (first, second)


def test_without_the_template_each_run_has_a_hash_seed_of_its_own(project: Path, tmp_path: Path) -> None:
    """``--no-runner-template``: every run starts a fresh python3 (the path before the template),
    with a hash seed of its own.

    Can fail: with the option ignored the runs were forked and shared the template's seed."""
    proc = _server(project, tmp_path / "fresh", "--no-runner-template")
    try:
        code = "print(hash('seed'), b'run_template.py' in open('/proc/self/cmdline', 'rb').read())\n"
        seeds = {_run(proc, code)["stdout"] for _ in range(3)}
    finally:
        proc.stop()
    assert len(seeds) == 3 and all(s.endswith(" False\n") for s in seeds), seeds


def _memory_holds(pid: int, needle: bytes) -> bool:
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("r") or line.rstrip().endswith(("[vvar]", "[vsyscall]")):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                if needle in mem.read(end - start):
                    return True
            except OSError:
                continue
    return False


@pytest.mark.security
def test_the_template_holds_nothing_of_a_run_and_no_run_can_reach_it(forking: SandboxProcess) -> None:
    """After runs with a secret in their code, arguments and stdin, the template's command line,
    environment and memory hold none of it; a run sees only its own init and itself, so it can
    neither signal the template nor open its /proc entry (nor ptrace it: it has no pid to name).

    Can fail: on main there was no template; with the run's request sent to the template (a
    scratch copy that cloned with the spec) its memory held the secret."""
    secret = f"idegym-secret-{os.getpid()}-{time.monotonic_ns()}"
    template = _template_of(_zygote_of(forking))
    code = (f"import os, sys\nsecret = {secret!r}\ninput()\nresults = []\nfor sig in (0, 9):\n    try:\n"
            f"        os.kill({template}, sig)\n        results.append('signalled')\n"
            "    except ProcessLookupError:\n        results.append('no such process')\n"
            f"print(sorted(p for p in os.listdir('/proc') if p.isdigit()), os.path.exists('/proc/{template}'), "
            "results)\n")
    for _ in range(2):
        body = forking.post("/execute", {"language": "python", "code": code, "args": [secret],
                                         "stdin": secret + "\n"}).json()
        assert body["stdout"] == "['1', '2'] False ['no such process', 'no such process']\n", body
    assert _template_of(_zygote_of(forking)) == template  # the same template, alive
    needle = secret.encode()
    assert needle not in Path(f"/proc/{template}/cmdline").read_bytes()
    assert needle not in Path(f"/proc/{template}/environ").read_bytes()
    assert b"IDEGYM_CALL" not in Path(f"/proc/{template}/environ").read_bytes()
    assert not _memory_holds(template, needle)


def test_a_dead_template_is_started_again(forking: SandboxProcess) -> None:
    """A template killed (OOM, a stray signal) is replaced: the next runs are forked from a new one.

    Can fail: with the zygote not noticing the template's exit (``_Zygote.forget``) the runs fell
    back to fresh interpreters for good; on main there was no template to kill."""
    zygote = _zygote_of(forking)
    first = _template_of(zygote)
    assert json.loads(_run(forking, START)["stdout"])["forked"] is True  # it is up
    os.kill(first, signal.SIGKILL)
    assert wait_until(lambda: first not in _live_children(zygote), 10)
    for _ in range(3):  # the spares cloned before the kill still serve; then the new template's
        seen = json.loads(_run(forking, START)["stdout"])
        assert seen["forked"] is True, seen
    assert wait_until(lambda: [p for p in _live_children(zygote) if _pid_ns(p) == _pid_ns(zygote)], 10)
    assert _template_of(zygote) != first


def test_a_stopped_server_leaves_nothing_of_the_template(project: Path, tmp_path: Path) -> None:
    """Stopping the server ends the zygote, its template and every spare: none is left running.

    Can fail: with the template's parent-death signal left out (a scratch copy) it outlived its
    zygote."""
    proc = _server(project, tmp_path / "stop")
    try:
        zygote = _zygote_of(proc)
        _run(proc, "print(1)\n")
        template = _template_of(zygote)
        family = [zygote, *_live_children(zygote)]
        assert template in family and len(family) >= 3, family  # zygote, template, spares
    finally:
        proc.stop()
    assert wait_until(lambda: not [p for p in family if Path(f"/proc/{p}").exists() and _alive(p)], 10), family


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.security
def test_a_forked_root_run_has_the_capabilities_of_an_executed_one(forking: SandboxProcess) -> None:
    """A run as root forked from the template (which clones with CAP_SYS_ADMIN) has the
    capabilities an executed program gets (none of CAP_SYS_ADMIN and CAP_SYS_PTRACE): it cannot
    make its read-only view writable again nor uncover the server's hidden directories.

    Can fail: with the spare keeping its own capability sets (the fork before
    ``_lose_tool_capabilities``) the forked program held CAP_SYS_ADMIN and remounted / writable."""
    status = "print([l.split()[1] for l in open('/proc/self/status') if l.startswith(('CapEff', 'CapPrm'))])\n"
    forked = _run(forking, status)["stdout"]
    executed = forking.post("/execute", {"language": "bash", "code": "grep -E '^Cap(Prm|Eff)' /proc/self/status | "
                                         "awk '{print $2}' | paste -sd' '"}).json()["stdout"].split()
    assert forked == f"{executed}\n".replace('"', "'"), (forked, executed)
    assert int(executed[1], 16) & (1 << 21 | 1 << 19) == 0, executed
    remount = "import ctypes\nprint(ctypes.CDLL(None).mount(None, b'/', None, 32 | 4096, None))\n"
    assert _run(forking, remount)["stdout"] == "-1\n"
