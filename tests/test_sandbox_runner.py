"""The code runner: every language whose toolchain is on the host."""

from __future__ import annotations

import glob
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import SandboxProcess

HELLO = {
    "python": ("python3", "import sys\nprint('hello', *sys.argv[1:])\n"),
    "javascript": ("node", "console.log(['hello', ...process.argv.slice(2)].join(' '))\n"),
    "c": ("gcc", '#include <stdio.h>\nint main(int c, char **v) { printf("hello");'
                 ' for (int i = 1; i < c; i++) printf(" %s", v[i]); printf("\\n"); return 0; }\n'),
    "cpp": ("g++", '#include <iostream>\nint main(int c, char **v) { std::cout << "hello";'
                   ' for (int i = 1; i < c; i++) std::cout << " " << v[i]; std::cout << "\\n"; }\n'),
    "java": ("javac", 'public class Hello { public static void main(String[] a) {'
                      ' System.out.println("hello" + (a.length > 0 ? " " + String.join(" ", a) : "")); } }\n'),
    "rust": ("rustc", 'fn main() { let a: Vec<String> = std::env::args().skip(1).collect();'
                      ' let mut s = String::from("hello"); for x in a { s.push(\' \'); s.push_str(&x); }'
                      ' println!("{}", s); }\n'),
    "bash": ("bash", 'echo hello "$@"\n'),
}


@pytest.mark.parametrize("language", sorted(HELLO))
def test_hello_world_with_args(server: SandboxProcess, language: str) -> None:
    binary, code = HELLO[language]
    if shutil.which(binary) is None:
        pytest.skip(f"{binary} not installed")
    resp = server.post("/execute", {"language": language, "code": code, "args": ["a b", "c"], "timeout": 60})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["stdout"] == "hello a b c\n", body
    assert body["exitCode"] == 0 and body["timedOut"] is False


def test_languages_lists_the_toolchains_with_versions(server: SandboxProcess) -> None:
    body = server.get_json("/execute/languages") if hasattr(server, "get_json") else server.client.get(
        "/execute/languages").json()
    names = {lang["language"]: lang for lang in body["languages"]}
    for required in ("python", "javascript", "c", "cpp", "java", "rust", "bash"):
        if shutil.which(HELLO[required][0]):
            assert required in names, required
            assert names[required]["version"][0].isdigit()


def test_compile_error_is_stderr_with_nonzero_exit(server: SandboxProcess) -> None:
    body = server.post("/execute", {"language": "c", "code": "int main(void) { return undefined_name; }"}).json()
    assert body["exitCode"] != 0 and body["stage"] == "compile"
    assert "undefined_name" in body["stderr"]


def test_supporting_files_stdin_and_exit_code(server: SandboxProcess) -> None:
    body = server.post("/execute", {
        "language": "python",
        "code": "import sys, helper\nprint(helper.VALUE, sys.stdin.read().strip())\nsys.exit(7)\n",
        "files": [{"path": "helper.py", "content": "VALUE = 41 + 1\n"}],
        "stdin": "from stdin",
    }).json()
    assert body["stdout"] == "42 from stdin\n" and body["exitCode"] == 7


@pytest.mark.parametrize("bad", ["../escape.py", "/etc/passwd", "a/../../b", "", "x\x00y"])
def test_file_paths_escaping_the_run_directory_are_422(server: SandboxProcess, bad: str) -> None:
    resp = server.post("/execute", {"language": "python", "code": "print(1)",
                                    "files": [{"path": bad, "content": "x"}]})
    assert resp.status_code == 422
    assert resp.json()["detail"][0]["loc"][:2] == ["body", "files"]


def test_unknown_language_is_422(server: SandboxProcess) -> None:
    resp = server.post("/execute", {"language": "cobol-9000", "code": "x"})
    assert resp.status_code == 422 and "available" in resp.json()["message"]


def test_time_limit_sets_timed_out(server: SandboxProcess) -> None:
    started = time.monotonic()
    body = server.post("/execute", {"language": "python", "code": "import time\nprint('go', flush=True)\n"
                                                                  "time.sleep(30)", "timeout": 0.5}).json()
    assert body["timedOut"] is True and body["stdout"] == "go\n"
    assert time.monotonic() - started < 3


def test_run_directory_is_fresh_and_removed(server: SandboxProcess) -> None:
    first = server.post("/execute", {"language": "bash", "code": "pwd; touch leftover; ls"}).json()
    run_dir = first["stdout"].splitlines()[0]
    second = server.post("/execute", {"language": "bash", "code": "pwd; ls"}).json()
    assert second["stdout"].splitlines()[0] != run_dir
    assert "leftover" not in second["stdout"]
    assert not Path(run_dir).exists()
    assert not glob.glob("/tmp/idegym-run-*") or all(d != run_dir for d in glob.glob("/tmp/idegym-run-*"))


def test_concurrent_runs_queue_instead_of_failing(project: Path, tmp_path: Path) -> None:
    proc = SandboxProcess(project, "tcp", tmp_path, extra=["--runner-concurrency", "2"])
    try:
        started = time.monotonic()
        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(lambda i: proc.post("/execute", {
                "language": "bash", "code": f"sleep 0.4; echo {i}"}).json(), range(6)))
        elapsed = time.monotonic() - started
        assert [r["stdout"] for r in results] == [f"{i}\n" for i in range(6)]
        assert elapsed >= 3 * 0.4 - 0.05  # at most two at a time: three waves
    finally:
        proc.stop()
