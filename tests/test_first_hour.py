"""Issue 20, the first hour: what a new user trips over, one test (at least) per point.

Can fail: on main before this branch, ``step()`` after ``terminated`` ran the tool and graded
again; ``reset(options=...)`` was ignored; a test script that exited 0 without a report, or a
pytest task without pytest, gave no ``tests_verdict`` and nothing in ``episodes.jsonl``; a dead
URL said ``POST /api/clients: ConnectError``; ``idegym eval`` exited 0 when no episode could run;
``idegym sandbox serve`` printed nothing; ``--help`` showed no default for ``--inactive-timeout``;
a 3,000,000-character output said "1032234 characters cut"; ``close()`` stopped the embedded
control plane (seconds) and the next ``gym.make`` started another.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest

from idegym_env.client import IdeGymClient, NotFound, TransportError
from idegym_env.embedded import EmbeddedControlPlane
from idegym_env.env import EpisodeEnded, IdeGymEnv
from tests.helpers import REPO, embedded_control_plane, free_port, process_alive, wait_until

PY_TASK = "python-roman-numerals"
IDEGYM = [sys.executable, "-m", "idegym_env.cli"]


def _lines_until(proc: subprocess.Popen, pattern: str, timeout: float) -> list[str]:
    """Lines of ``proc``'s stderr up to the first that matches ``pattern`` (fails after ``timeout``)."""
    assert proc.stderr is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if re.search(pattern, line):
            return seen
    raise AssertionError(f"no line matching {pattern!r} within {timeout} s; got {seen}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the control plane's --help ------------------------------------------------------------------------

def _parser(env: dict[str, str]) -> argparse.ArgumentParser:
    from control_plane import cli

    saved = dict(os.environ)
    os.environ.update(env)
    try:
        parser = argparse.ArgumentParser()
        cli.add_serve_arguments(parser)
        return parser
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _sample(action: argparse.Action) -> tuple[str, object]:
    """A value for the action's variable and what the flag's default must then be."""
    if action.const is True and action.nargs == 0:
        return "1", not action.default
    if isinstance(action, argparse.BooleanOptionalAction):  # --x/--no-x: the variable says which
        return ("0" if action.default else "1"), not action.default
    if action.choices:
        other = next(c for c in action.choices if c != action.default)
        return str(other), other
    if isinstance(action.default, list):
        return "a,b", ["a", "b"]
    if action.type in (int, float) or isinstance(action.default, int | float):
        return "7", (action.type or type(action.default))("7")
    if action.type is not None and getattr(action.type, "__name__", "") in ("Path", "PosixPath", "_optional_path"):
        return "/tmp/first-hour", Path("/tmp/first-hour")
    return "first-hour", "first-hour"


@pytest.mark.parametrize("backend", ["local", "kubernetes"])
def test_control_plane_help_names_every_default_and_variable(backend: str) -> None:
    base = {"IDEGYM_CONTROL_PLANE_BACKEND": backend}
    parser = _parser(base)
    checked = 0
    for action in parser._actions:
        if action.dest == "help":
            continue
        text = action.help or ""
        assert "default" in text, f"{action.option_strings}: {text!r} shows no default"
        variables = re.findall(r"\$(IDEGYM_[A-Z0-9_]+)", text)
        if not variables:
            assert "no environment variable" in text, f"{action.option_strings}: {text!r} names no variable"
            conventional = f"IDEGYM_CONTROL_PLANE_{action.dest.upper()}"
            assert getattr(_parser({**base, conventional: "1"}).parse_args([]), action.dest) == action.default
            continue
        if action.dest in ("backend", "auth", "build_root") or action.dest.startswith("k8s_"):
            continue  # read later, in config_from_args (the --k8s-* ones only with --backend kubernetes)
        value, expected = _sample(action)
        parsed = _parser({**base, variables[0]: value}).parse_args([])
        assert getattr(parsed, action.dest) == expected, (action.option_strings, variables[0], value)
        checked += 1
    assert checked >= 15
    shown = subprocess.run([*IDEGYM, "control-plane", "serve", "--help"], capture_output=True, text=True,
                           cwd=REPO, env={**os.environ, **base}, timeout=60).stdout
    flat = " ".join(shown.split())
    assert "[$IDEGYM_CONTROL_PLANE_INACTIVE_TIMEOUT, default 600]" in flat
    assert "[$IDEGYM_CONTROL_PLANE_WARM_POOL, default 2]" in flat
    if backend == "kubernetes":
        assert "[$IDEGYM_K8S_NAMESPACE, default idegym]" in flat


def test_a_boolean_variable_of_0_is_off() -> None:
    assert _parser({"IDEGYM_CONTROL_PLANE_NETWORK": "0"}).parse_args([]).network is False
    assert _parser({"IDEGYM_CONTROL_PLANE_NETWORK": "yes"}).parse_args([]).network is True


# -- errors that say what to do -----------------------------------------------------------------------

def test_an_invalid_reuse_strategy_lists_the_valid_ones() -> None:
    from control_plane.models import ServerReuseStrategy

    with pytest.raises(ValueError, match="SOMETIMES") as caught:
        ServerReuseStrategy("SOMETIMES")
    assert all(name in str(caught.value) for name in ("RESET", "RESTART", "NONE"))
    assert ServerReuseStrategy("RESET") is ServerReuseStrategy.RESET


def test_a_dead_control_plane_url_names_it_and_says_what_to_do() -> None:
    url = f"http://idegym:secret-token@127.0.0.1:{free_port()}"
    with pytest.raises(TransportError) as caught:
        IdeGymEnv(PY_TASK, control_plane_url=url)
    message = str(caught.value)
    assert re.search(r"127\.0\.0\.1:\d+", message) and "secret-token" not in message
    assert "idegym control-plane serve" in message and "control_plane_url=None" in message


def test_another_http_service_is_not_taken_for_a_control_plane(tmp_path: Path) -> None:
    class NotOurs(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's spelling
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotOurs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(NotFound) as caught:
            IdeGymEnv(PY_TASK, control_plane_url=f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()
    message = str(caught.value)
    assert "is not an IdeGym control plane" in message and f":{server.server_port}" in message
    assert "idegym control-plane serve" in message
    # A sandbox server (the other thing listening on such a port) answers with an error of ours.
    from tests.helpers import SandboxProcess

    (tmp_path / "project").mkdir()
    sandbox = SandboxProcess(tmp_path / "project", "tcp", tmp_path)
    try:
        with pytest.raises(NotFound, match="is not an IdeGym control plane"):
            IdeGymClient(f"http://127.0.0.1:{sandbox.port}").register()
    finally:
        sandbox.stop()


def test_eval_exits_non_zero_and_says_so_first_when_episodes_failed_on_infrastructure(tmp_path: Path) -> None:
    task = tmp_path / "unbuildable"  # its image cannot be built: an infrastructure error, not a reward
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "environment" / "Dockerfile").write_text("FROM debian:bookworm\nRUN false\n")
    (task / "instruction.md").write_text("Nothing to do.\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (task / "task.toml").write_text('version = "1.0"\n')
    done = subprocess.run([*IDEGYM, "eval", "--tasks", f"harbor:{task}", "--agent", "noop",
                           "--out", str(tmp_path / "out"), "--no-progress"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    first = done.stdout.strip().splitlines()[0]
    assert "1 of 1 episodes ended in an INFRASTRUCTURE ERROR" in first, done.stdout
    assert "infrastructure error" in done.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["overall"]["infrastructure_errors"] == 1
    assert (tmp_path / "out" / "summary.md").read_text().splitlines()[0] == first
    record = json.loads((tmp_path / "out" / "episodes.jsonl").read_text().splitlines()[0])
    assert record["error_kind"] == "env" and "image build failed" in record["error"], record["error"]


# -- servers that say what they do ---------------------------------------------------------------------

def test_sandbox_serve_prints_its_address_and_that_tools_run_unisolated(tmp_path: Path) -> None:
    import httpx

    (tmp_path / "project").mkdir()
    proc = subprocess.Popen([*IDEGYM, "sandbox", "serve", "--port", "0", "--project", str(tmp_path / "project")],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=REPO)
    try:
        lines = _lines_until(proc, r"UNISOLATED", 120)
        address = re.search(r"listening on (http://127\.0\.0\.1:\d+)", "\n".join(lines))
        assert address, lines
        assert httpx.get(f"{address.group(1)}/api/health", timeout=60).status_code == 200
        warning = next(line for line in lines if "UNISOLATED" in line)
        user = "root (uid 0, ROOT)" if os.geteuid() == 0 else f"(uid {os.geteuid()})"
        assert "not inside a sandbox" in warning and user in warning
    finally:
        _stop(proc)


def test_a_sandbox_server_in_a_local_sandbox_does_not_warn(control_plane: EmbeddedControlPlane) -> None:
    with IdeGymClient(control_plane.url) as client, client.start() as sandbox:
        sandbox.bash("true")
        logs = [p.read_text(errors="replace") for p in control_plane.state_dir.rglob("server.log")]
    started = [log for log in logs if "listening on" in log]
    assert started and not any("UNISOLATED" in log for log in started), logs


# -- the output-cut marker ------------------------------------------------------------------------------

def _server_output(n: int) -> str:
    from sandbox_server.output import BoundedOutput

    captured = BoundedOutput(1 << 20)
    captured.feed(b"x" * n)
    return captured.text()


def test_the_cut_marker_counts_what_the_sandbox_server_dropped_too() -> None:
    from idegym_env.spaces import UnicodeText
    from idegym_env.tools.bash import format_output
    from sandbox_server.models import BashCommandResponse

    text = format_output(BashCommandResponse(stdout=_server_output(3_000_000) + "END", stderr="", exit_code=0))
    space = UnicodeText(max_length=16_384)
    (before,) = map(int, re.findall(r"…\[(\d+) characters cut\]…", space.fit(text)))
    assert 1_030_000 < before < 1_040_000  # what main said (1032234): only the env's cut of what the server kept
    env = IdeGymEnv.__new__(IdeGymEnv)
    env.observation_space = space
    fitted = env._fit(text)
    (cut,) = re.findall(r"…\[(\d+) characters cut\]…", fitted)
    kept = fitted.count("x") - 1  # one x is in "[exit code 0]"
    assert int(cut) == 3_000_000 - kept and len(fitted) <= 16_384 and fitted.endswith("END\n[exit code 0]")
    assert "bytes omitted" not in fitted


def test_fit_keeps_earlier_markers_whole_or_counts_them() -> None:
    from idegym_env.spaces import UnicodeText
    from sandbox_server.output import omitted_marker

    space = UnicodeText(max_length=200)
    for head in (0, 10, 95, 150, 400):
        for count in (3, 5_000):
            mark = omitted_marker(count)
            text = "A" * head + mark + "Z" * 300
            span = (head, head + len(mark), count)
            fitted = space.fit(text, cut_before=[span])
            assert len(fitted) <= 200 and space.contains(fitted)
            (cut,) = map(int, re.findall(r"…\[(\d+) characters cut\]…", fitted))
            shown = fitted.count("A") + fitted.count("Z")
            if mark in fitted:  # kept whole: the cut counts only what it removed
                assert cut == head + 300 - shown
            else:  # removed whole, never in part
                assert "omitted" not in fitted and cut == head + 300 - shown + count


# -- with a control plane ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def control_plane() -> Iterator[EmbeddedControlPlane]:
    yield from embedded_control_plane(warm_pool=1)


def test_step_after_the_end_raises_and_never_grades_again(control_plane: EmbeddedControlPlane) -> None:
    env = IdeGymEnv(PY_TASK, control_plane_url=control_plane.url, max_steps=2)
    try:
        env.reset(seed=0)
        _, reward, terminated, _, info = env.step({"tool": "submit"})
        assert terminated and info["submitted"]
        for action in ({"tool": "submit"}, {"tool": "bash", "arguments": {"command": "touch /tmp/after"}}):
            with pytest.raises(EpisodeEnded, match=r"call reset\(\)"):
                env.step(action)
        assert isinstance(EpisodeEnded("x"), gym.error.ResetNeeded)
        env.reset()
        assert "after" not in env.sandbox.bash("ls /tmp").stdout  # the refused step never ran
        env.step({"tool": "bash", "arguments": {"command": "true"}})
        _, _, terminated, truncated, info = env.step({"tool": "bash", "arguments": {"command": "true"}})
        assert truncated and not terminated and info["truncated_by"] == "max_steps"
        with pytest.raises(EpisodeEnded):
            env.step({"tool": "submit"})
    finally:
        env.close()


def test_reset_options_switch_the_task_and_refuse_unknown_ones(control_plane: EmbeddedControlPlane,
                                                               tmp_path: Path) -> None:
    env = IdeGymEnv(PY_TASK, control_plane_url=control_plane.url)
    try:
        obs, info = env.reset(seed=0)
        assert "Roman" in obs and info["task_id"] == PY_TASK
        obs, info = env.reset(options={"task": "python-lru-cache"})
        assert info["task_id"] == "python-lru-cache" and env.task.id == "python-lru-cache" and "LRU" in obs
        assert env.max_steps == env.task.max_steps
        assert env.sandbox.bash("ls").stdout != ""
        listing = env.sandbox.bash("ls").stdout
        assert "roman.py" not in listing, listing
        with pytest.raises(ValueError, match="unknown reset option.*'task'"):
            env.reset(options={"tsk": PY_TASK})
        narrow = tmp_path / "narrow"
        (narrow / "project").mkdir(parents=True)
        (narrow / "project" / "a.txt").write_text("a\n")
        (narrow / "task.yaml").write_text(textwrap.dedent("""\
            id: narrow
            title: bash only
            language: shell
            instruction: nothing
            tools: [bash, submit]
            test: {script: "true"}
            """))
        with pytest.raises(ValueError, match="another action space"):
            env.reset(options={"task": str(narrow)})
        obs, info = env.reset(options={"task": PY_TASK})  # still usable, and back
        assert info["task_id"] == PY_TASK and "Roman" in obs
    finally:
        env.close()


def test_make_vec_async_says_why_and_what_to_use(control_plane: EmbeddedControlPlane) -> None:
    with pytest.raises(ValueError, match="vector_entry_point.*'sync'.*shared_memory"):
        gym.make_vec("IdeGym-v0", num_envs=2, vectorization_mode="async", task=PY_TASK,
                     control_plane_url=control_plane.url)


def test_openenv_step_after_the_end_says_to_reset(control_plane: EmbeddedControlPlane) -> None:
    pytest.importorskip("openenv.core", reason="needs the [openenv] extra (openenv-core)")
    from idegym_env.openenv.environment import IdeGymOpenEnv
    from idegym_env.openenv.models import IdeAction

    env = IdeGymOpenEnv(PY_TASK, control_plane_url=control_plane.url)
    try:
        env.reset()
        assert env.step(IdeAction(tool="submit")).done
        after = env.step(IdeAction(tool="submit"))
        assert after.done and "call reset" in after.error and "call reset" in after.text
    finally:
        env.close()


def test_a_3_mb_output_says_how_much_was_really_cut(control_plane: EmbeddedControlPlane) -> None:
    env = IdeGymEnv(PY_TASK, control_plane_url=control_plane.url)
    try:
        env.reset(seed=0)
        obs, *_ = env.step({"tool": "bash", "arguments": {"command": "python3 -c \"print('x' * 3_000_000)\""}})
    finally:
        env.close()
    (cut,) = map(int, re.findall(r"…\[(\d+) characters cut\]…", obs))
    newline = 1  # print's newline, which the observation drops with the rest of the middle or the end
    assert cut + obs.count("x") - 1 in (3_000_000, 3_000_000 + newline), (cut, obs.count("x"))


def test_snapshot_and_restore_on_the_local_backend_as_documented(control_plane: EmbeddedControlPlane,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    doc = (REPO / "docs" / "snapshots.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", doc, re.S)
    assert '"http://localhost:8000"' in code
    exec(compile(code.replace('"http://localhost:8000"', repr(control_plane.url)), "docs/snapshots.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    group, tag = printed[0].split()
    assert group.isdigit() and tag == "idegym/builtin:latest"
    assert printed[1:] == ["ready", "", "warm", ""] or printed[1:] == ["ready", "warm"], printed


def test_openenv_serve_says_what_it_is_doing(control_plane: EmbeddedControlPlane) -> None:
    pytest.importorskip("openenv.core", reason="needs the [openenv] extra (openenv-core)")
    import httpx

    proc = subprocess.Popen([*IDEGYM, "openenv", "serve", "--task", PY_TASK, "--port", "0",
                             "--control-plane-url", control_plane.url],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=REPO)
    try:
        lines = _lines_until(proc, r"serving task", 120)
        assert any(f"preparing task {PY_TASK}" in line for line in lines), lines
        address = re.search(r"serving task \S+ on (http://127\.0\.0\.1:\d+)", lines[-1])
        assert address, lines
        assert httpx.get(f"{address.group(1)}/health", timeout=60).status_code == 200
    finally:
        _stop(proc)
    assert proc.returncode == 0


# -- grading that could not run ------------------------------------------------------------------------

NO_PYTEST_IMAGE = "first-hour/no-pytest:1"


def _task(root: Path, name: str, test: str, *, image: str | None = None) -> Path:
    task = root / name
    (task / "project" / "tests").mkdir(parents=True)
    (task / "project" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (task / "project" / "tests" / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n")
    lines = [f"id: {name}", "title: first hour", "language: python", "instruction: Make add correct.",
             f"test: {json.dumps({'script': test, 'timeout': 60})}", "reward: test_pass_fraction", "max_steps: 3",
             "editable: [calc.py]"]
    if image:
        lines.append(f"image: {image}")
    (task / "task.yaml").write_text("\n".join(lines) + "\n")
    return task


@pytest.fixture(scope="module")
def grading_tasks(control_plane: EmbeddedControlPlane, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tasks")
    pytest_task = _task(root, "fh-pytest", 'python -m pytest -q --junitxml="$IDEGYM_REPORT_DIR/report.xml" tests',
                        image=NO_PYTEST_IMAGE)
    # An image whose Python has no pytest: the built-in one with pytest removed.
    drop = ("for m in pytest _pytest; do d=$(python3 -c \"import os, $m; print(os.path.dirname($m.__file__))\") "
            "&& rm -rf \"$d\"; done; ! python3 -c 'import pytest'")
    yaml_text = json.dumps({"images": [{"tag": NO_PYTEST_IMAGE, "project": {"path": str(pytest_task / "project")},
                                        "commands": [drop]}]})
    with IdeGymClient(control_plane.url) as client:
        client.build_images(yaml_text, timeout=600)
    report = ('<testsuite tests="2"><testcase classname="tests.test_calc" name="test_add"/>'
              '<testcase classname="tests.test_calc" name="test_sub"><failure message="1 != 2"/></testcase>'
              '</testsuite>')
    return {
        "no_pytest": pytest_task,
        "silent": _task(root, "fh-silent", "echo all good here; exit 0"),
        "half": _task(root, "fh-half", f"cat > \"$IDEGYM_REPORT_DIR/report.xml\" <<'EOF'\n{report}\nEOF\nexit 0"),
    }


@pytest.mark.parametrize("case, cause", [("no_pytest", "No module named pytest"), ("silent", "all good here")])
def test_no_test_ran_is_its_own_status_with_the_cause_in_sight(control_plane: EmbeddedControlPlane,
                                                               grading_tasks: dict[str, Path], case: str,
                                                               cause: str) -> None:
    env = IdeGymEnv(grading_tasks[case], control_plane_url=control_plane.url, render_mode="ansi")
    try:
        env.reset(seed=0)
        obs, reward, terminated, _, info = env.step({"tool": "submit"})
        transcript = env.render()
    finally:
        env.close()
    assert terminated and reward == 0.0
    assert info["tests_verdict"] == "no_tests" and info["checks"]["tests"]["exit_code"] == (1 if case == "no_pytest"
                                                                                             else 0)
    assert "tests: no_tests — no test ran" in obs and cause in obs
    assert "tests: no_tests — no test ran" in transcript and cause in transcript


def test_a_report_with_a_failure_fails_whatever_the_exit_code(control_plane: EmbeddedControlPlane,
                                                              grading_tasks: dict[str, Path]) -> None:
    env = IdeGymEnv(grading_tasks["half"], control_plane_url=control_plane.url)
    try:
        env.reset(seed=0)
        obs, reward, terminated, _, info = env.step({"tool": "submit"})
    finally:
        env.close()
    assert terminated and reward == 0.5 and info["tests_verdict"] == "failed"
    assert info["checks"]["tests"]["exit_code"] == 0 and info["checks"]["tests"]["status"] == "failure"
    assert "tests: failed — 1/2 passed, 1 failed" in obs


def test_eval_records_no_tests_with_its_cause(control_plane: EmbeddedControlPlane, grading_tasks: dict[str, Path],
                                              tmp_path: Path) -> None:
    from idegym_env.eval import evaluate

    result = evaluate([grading_tasks["no_pytest"], grading_tasks["silent"]], "noop", out=tmp_path / "out",
                      control_plane_url=control_plane.url, progress=False)
    records = {r["task"]: r for r in map(json.loads, (tmp_path / "out" / "episodes.jsonl").read_text().splitlines())}
    for task, cause in (("fh-pytest", "No module named pytest"), ("fh-silent", "all good here")):
        record = records[task]
        assert record["checks"]["tests"]["verdict"] == "no_tests", record
        assert cause in record["checks"]["tests"]["output_tail"] and cause in record["error"]
        assert record["error_kind"] == "grading" and record["passed"] is False
        assert "no test ran" in (tmp_path / "out" / record["transcript"]).read_text()
    assert result.summary["overall"]["errors"] == 2 and result.summary["overall"]["infrastructure_errors"] == 0


# -- the embedded control plane's lifetime ----------------------------------------------------------------

def test_gym_make_after_close_finds_the_embedded_control_plane(monkeypatch: pytest.MonkeyPatch) -> None:
    from idegym_env import embedded

    embedded.shutdown()  # whatever an earlier test left in its grace period
    env = gym.make("IdeGym-v0")
    env.reset(seed=0)
    first = embedded._shared
    assert first is not None
    started = time.perf_counter()
    env.close()
    closing = time.perf_counter() - started
    assert closing < 0.5, f"close() took {closing:.2f} s"
    assert first.process.poll() is None, "the control plane stays up for its grace period"
    started = time.perf_counter()
    again = gym.make("IdeGym-v0")
    making = time.perf_counter() - started
    try:
        assert embedded._shared is first, "a new embedded control plane was started"
        assert making < 3.0, f"gym.make took {making:.2f} s with the control plane up"
    finally:
        monkeypatch.setenv("IDEGYM_EMBEDDED_GRACE", "1")
        again.close()
    assert wait_until(lambda: first.process.poll() is not None, 60), "it did not stop after its grace period"
    assert embedded._shared is None and not first.state_dir.exists()


def test_the_embedded_control_plane_ends_at_interpreter_exit_within_its_grace() -> None:
    script = textwrap.dedent("""\
        import gymnasium as gym, idegym_env
        from idegym_env import embedded
        env = gym.make("IdeGym-v0")
        env.reset(seed=0)
        print(embedded._shared.process.pid, embedded._shared.state_dir, flush=True)
        env.close()
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "IDEGYM_EMBEDDED_GRACE": "600"})
    assert done.returncode == 0, done.stderr
    pid, state_dir = done.stdout.split()
    assert wait_until(lambda: not process_alive(int(pid)), 30), "the control plane outlived the interpreter"
    assert not Path(state_dir).exists()

