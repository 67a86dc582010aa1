"""Every code block of docs/integrations.md and docs/openenv.md, run as written.

Each block is taken from the markdown when the test runs and executed unchanged: Python blocks by
the venv's interpreter, shell blocks by bash (a block that starts a server runs in the background
until the next block, its client, has run). What a block leaves to its reader comes from the
environment, as the docs say: ``$IDEGYM_URL`` is this module's control plane, ``$MODEL`` the TRL
test's tiny policy saved to a directory, ``$XDG_STATE_HOME`` a directory of the test (the MCP
server's token). A block this file does not run fails ``test_every_block_is_run``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cp_helpers import ControlPlaneProcess
from tests.helpers import REPO
from tests.integration_helpers import alive, control_plane  # noqa: F401 - fixture
from tests.side_venvs import HARBOR_VENV, INSTALLS, NEMO_VENV, VERIFIERS_VENV, VERL_VENV, side_venv

pytestmark = pytest.mark.timeout(900)
DOCS = {"integrations": REPO / "docs" / "integrations.md", "openenv": REPO / "docs" / "openenv.md"}
VENV_BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Block:
    doc: str
    section: str  # the heading above it
    index: int  # its place among the section's blocks
    lang: str
    text: str

    @property
    def key(self) -> str:
        return f"{self.doc}: {self.section} [{self.index}]"


def blocks() -> dict[str, Block]:
    found: dict[str, Block] = {}
    for doc, path in DOCS.items():
        section, counts = "", {}
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            if line.startswith("#"):
                section = line.lstrip("#").strip()
            elif line.startswith("```"):
                end = lines.index("```", i + 1)
                index = counts.get(section, 0)
                counts[section] = index + 1
                block = Block(doc, section, index, line[3:].strip(), "\n".join(lines[i + 1:end]) + "\n")
                found[block.key] = block
                i = end
            i += 1
    return found


HARBOR = "integrations: Harbor [0]"
TRL = "integrations: TRL [0]"
SKYRL = "integrations: SkyRL [0]"
MCP_SERVE, MCP_CLIENT = "integrations: MCP [0]", "integrations: MCP [1]"
OPENENV = "OpenEnv: `idegym openenv serve`"
OPENENV_SERVE, OPENENV_CLIENT = f"openenv: {OPENENV} [0]", f"openenv: {OPENENV} [1]"
OPENENV_CP = "openenv: Through the control plane: servers of kind `openenv` [0]"
OPENENV_APP = "openenv: In Python [0]"
MINI = "integrations: mini-swe-agent [0]"
NEMO = "integrations: NeMo Gym [0]"
VERL = "integrations: verl [0]"
VF_NATIVE = "integrations: verifiers / prime-rl [0]"
VF_SERVE, VF_EVAL = "integrations: verifiers through OpenEnv [0]", "integrations: verifiers through OpenEnv [1]"
RUN = {HARBOR, TRL, SKYRL, MCP_SERVE, MCP_CLIENT, OPENENV_SERVE, OPENENV_CLIENT, OPENENV_CP, OPENENV_APP,
       MINI, NEMO, VERL, VF_NATIVE, VF_SERVE, VF_EVAL}
# The plug-ins whose frameworks clash with the main venv run in their own (the Makefile's).
NEMO_PYTHON, VERL_PYTHON = NEMO_VENV / "bin" / "python", VERL_VENV / "bin" / "python"
VERIFIERS_BIN = VERIFIERS_VENV / "bin"


def test_every_block_is_run() -> None:
    assert set(blocks()) == RUN, "a code block of the docs that this file does not run, or one it lost"


@pytest.fixture
def environment(control_plane: ControlPlaneProcess, tmp_path: Path) -> dict[str, str]:  # noqa: F811
    return {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "IDEGYM_URL": control_plane.url,
            "XDG_STATE_HOME": str(tmp_path / "state"), "PYTHONDONTWRITEBYTECODE": "1", "TRL_EXPERIMENTAL_SILENCE": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def run(key: str, environment: dict[str, str], cwd: Path, timeout: float = 600, python: Path | None = None) -> str:
    """Run one block to its end (a Python block by ``python``, default this venv's); its stdout."""
    block = blocks()[key]
    argv = [str(python or sys.executable), "-c", block.text] if block.lang == "python" else [
        "bash", "-euo", "pipefail", "-c", block.text]
    proc = subprocess.run(argv, cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{key} failed (exit code {proc.returncode}):\n{block.text}\n---\n{output[-4000:]}"
    return proc.stdout


@pytest.fixture
def server_block(environment: dict[str, str], tmp_path: Path) -> Iterator:
    """Start a block that serves, in the background, and wait for its port."""
    started: list[subprocess.Popen] = []

    def start(key: str, port: int) -> subprocess.Popen:
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0, f"port {port}, which {key} uses, is taken"
        log = open(tmp_path / f"server-{port}.log", "w")  # noqa: SIM115 - the process writes it
        proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", blocks()[key].text], cwd=tmp_path,
                                env=environment, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)
        started.append(proc)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"{key} ended:\n{(tmp_path / f'server-{port}.log').read_text()[-3000:]}"
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    return proc
            time.sleep(0.2)
        raise AssertionError(f"{key} did not listen on {port}: {(tmp_path / f'server-{port}.log').read_text()}")

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


@pytest.mark.heavy
def test_harbor_block(environment: dict[str, str], control_plane: ControlPlaneProcess,  # noqa: F811
                      image_cache: Path) -> None:
    if os.environ.get(INSTALLS):  # the block runs `make harbor-venv`: not beside `make test`'s own
        side_venv(HARBOR_VENV)
    jobs = REPO / "jobs"  # where `harbor run` puts its jobs by default
    before = set(jobs.iterdir()) if jobs.exists() else None
    try:
        run(HARBOR, {**environment, "IDEGYM_IMAGE_CACHE": str(image_cache)}, REPO, timeout=900)
        made = sorted(set(jobs.iterdir()) - (before or set()))
        assert len(made) == 2, made  # the embedded control plane's run, then the one on $IDEGYM_URL
        for job in made:
            [trial] = [json.loads(p.read_text()) for p in job.glob("*/result.json")]
            assert trial.get("exception_info") is None, trial.get("exception_info")
            assert trial["verifier_result"]["rewards"]["reward"] == 1.0
    finally:
        if before is None:
            subprocess.run(["rm", "-rf", str(jobs)], check=True)
        else:
            for job in set(jobs.iterdir()) - before:
                subprocess.run(["rm", "-rf", str(job)], check=True)
    assert alive(control_plane) == 0


@pytest.mark.heavy
def test_trl_block(environment: dict[str, str], control_plane: ControlPlaneProcess,  # noqa: F811
                   tmp_path: Path) -> None:
    from tests.integration_helpers import fix_arguments
    from tests.test_integrations_trl import tiny_policy, tool_call

    tokenizer, model = tiny_policy(tool_call("edit_file", fix_arguments()))
    tokenizer.save_pretrained(tmp_path / "model")
    model.save_pretrained(tmp_path / "model")
    out = run(TRL, {**environment, "MODEL": str(tmp_path / "model")}, tmp_path)
    rewards = [float(v) for v in re.findall(r"'rewards/IdeGymTRLEnv/mean': '([0-9.]+)'", out)]
    assert rewards and 0 < rewards[-1] <= 1, out[-3000:]  # python-roman-numerals solved, lru-cache not
    assert alive(control_plane) == 0


def test_skyrl_block(environment: dict[str, str], control_plane: ControlPlaneProcess,  # noqa: F811
                     tmp_path: Path) -> None:
    out = run(SKYRL, environment, tmp_path).splitlines()
    assert "roman.py" in out and out[-1].split()[0] == "True" and 0 <= float(out[-1].split()[1]) < 1, out
    assert alive(control_plane) == 0


def test_mcp_blocks(environment: dict[str, str], control_plane: ControlPlaneProcess,  # noqa: F811
                    server_block, tmp_path: Path) -> None:
    server = server_block(MCP_SERVE, 8765)  # the stdio line ends at once (no input), then HTTP serves
    out = run(MCP_CLIENT, environment, tmp_path)
    assert "Roman" in out and "roman.py" in out and "exit code 1" in out, out  # run_checks: red until fixed
    graded = re.search(r"^([0-9.]+) \[checks\]$", out, re.M)  # print(reward, summary)
    assert graded and 0 <= float(graded.group(1)) < 1, out  # untouched
    os.killpg(server.pid, signal.SIGTERM)
    assert server.wait(60) == 0
    assert alive(control_plane) == 0


def test_openenv_blocks(environment: dict[str, str], control_plane: ControlPlaneProcess,  # noqa: F811
                        server_block, tmp_path: Path) -> None:
    server = server_block(OPENENV_SERVE, 8000)
    out = run(OPENENV_CLIENT, environment, tmp_path)
    assert out.splitlines()[0].startswith("1 ") and out.splitlines()[-1].startswith("0.625 True"), out
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(60)
    out = run(OPENENV_CP, environment, tmp_path)
    assert "roman.py" in out, out
    run(OPENENV_APP, environment, tmp_path)
    assert alive(control_plane) == 0


def test_mini_swe_agent_block(environment: dict[str, str], control_plane: ControlPlaneProcess,  # noqa: F811
                              tmp_path: Path) -> None:
    out = run(MINI, {**environment, "MSWEA_SILENT_STARTUP": "1"}, tmp_path).splitlines()
    status, reward = out[-1].split()[:2]
    assert status == "Submitted" and 0 <= float(reward) < 1, out  # submitted at once: the untouched project
    assert alive(control_plane) == 0


def test_nemo_gym_block(environment: dict[str, str], control_plane: ControlPlaneProcess,  # noqa: F811
                        tmp_path: Path) -> None:
    side_venv(NEMO_VENV)
    out = run(NEMO, environment, tmp_path, python=NEMO_PYTHON).splitlines()
    assert "roman.py" in out and 0 <= float(out[-1]) < 1, out
    assert alive(control_plane) == 0


def test_verl_block(environment: dict[str, str], tmp_path: Path) -> None:
    side_venv(VERL_VENV)
    run(VERL, environment, tmp_path, python=VERL_PYTHON)
    check = ("import hydra, pandas\n"
             "from omegaconf import OmegaConf\n"
             "from verl.experimental.agent_loop.agent_loop import AgentLoopBase\n"
             "[loop] = OmegaConf.load('agent_loops.yaml')\n"
             "assert loop.name == 'idegym' and issubclass(hydra.utils.get_class(loop._target_), AgentLoopBase)\n"
             "rows = pandas.read_parquet('train.parquet')\n"
             "print(len(rows), set(rows.agent_name), sorted({r['task'] for r in rows.extra_info}))\n")
    proc = subprocess.run([str(VERL_PYTHON), "-c", check], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[0] == "16 {'idegym'} ['python-lru-cache', 'python-roman-numerals']", proc.stdout


@pytest.mark.heavy
def test_verifiers_blocks(environment: dict[str, str], control_plane: ControlPlaneProcess,  # noqa: F811
                          server_block, tmp_path: Path) -> None:
    from http.server import ThreadingHTTPServer
    from threading import Thread

    from idegym_env.tasks import load_task
    from tests.integration_helpers import TASK
    from tests.test_integrations_verifiers import Policy, action

    side_venv(VERIFIERS_VENV)
    fix = load_task(TASK).solution[0]
    scripts = [[action(fix.tool, **fix.arguments.model_dump()), action("submit")], [action("submit")]]
    policy = ThreadingHTTPServer(("127.0.0.1", 0), Policy)
    Thread(target=policy.serve_forever, daemon=True).start()
    # vf-eval from verifiers' venv; uv on PATH keeps verifiers from installing one for its chat program
    vf_environment = {**environment, "OPENAI_BASE_URL": f"http://127.0.0.1:{policy.server_address[1]}/v1",
                      "OPENAI_API_KEY": "unused",
                      "PATH": f"{VERIFIERS_BIN}:{REPO / '.venv-uv' / 'bin'}:{environment['PATH']}"}
    try:
        for block, reward, serve in ((VF_NATIVE, "idegym_reward", None), (VF_EVAL, "openenv_reward", VF_SERVE)):
            Policy.play(scripts)
            server = server_block(serve, 8000) if serve else None
            out = run(block, vf_environment, tmp_path, timeout=400)
            scores = sorted(float(x) for x in re.findall(rf'"{reward}": \{{\s*"score": ([0-9.]+)', out))
            assert len(scores) == 2 and scores[0] < 1.0 and scores[1] == 1.0, out[-3000:]  # gave up; solved
            if server is not None:
                os.killpg(server.pid, signal.SIGTERM)
                server.wait(60)
            assert alive(control_plane) == 0
    finally:
        policy.shutdown()
