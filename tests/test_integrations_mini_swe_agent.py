"""mini-swe-agent: ``IdeGymEnvironment`` made by mini-swe-agent's own ``get_environment`` from a
YAML ``environment`` section and driven by its ``DefaultAgent`` (the builtin ``default.yaml``
templates) with its ``DeterministicModel``, on a real control plane."""

from __future__ import annotations

import os

import pytest
import yaml

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")

from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.config import builtin_config_dir  # noqa: E402
from minisweagent.environments import get_environment  # noqa: E402
from minisweagent.models.test_models import DeterministicModel, make_output  # noqa: E402

from idegym_env.integrations import InfrastructureError  # noqa: E402
from idegym_env.integrations._episode import close_shared_clients  # noqa: E402
from idegym_env.integrations.mini_swe_agent import IdeGymEnvironment  # noqa: E402
from tests.integration_helpers import TASK, alive, control_plane, fix_arguments  # noqa: E402,F401 - fixture

pytestmark = pytest.mark.timeout(300)

CLASS = "idegym_env.integrations.mini_swe_agent.IdeGymEnvironment"


@pytest.fixture(autouse=True, scope="module")
def _clients():  # type: ignore[no-untyped-def]
    yield
    close_shared_clients()


def default_config() -> dict:
    return yaml.safe_load((builtin_config_dir / "default.yaml").read_text())


def make_env(cp, **extra) -> IdeGymEnvironment:  # type: ignore[no-untyped-def]
    """The environment as mini-swe-agent makes it: its default.yaml's section with ours over it."""
    section = yaml.safe_load(f"environment_class: {CLASS}\ntask: {TASK}\ncontrol_plane_url: {cp.url}\n")
    env = get_environment({**default_config()["environment"], **section, **extra})
    assert isinstance(env, IdeGymEnvironment)
    return env


def agent(env: IdeGymEnvironment, commands: list[str], **agent_config) -> DefaultAgent:  # type: ignore[no-untyped-def]
    model = DeterministicModel(outputs=[make_output(f"THOUGHT: step {i}", [{"command": c}])
                                        for i, c in enumerate(commands)])
    return DefaultAgent(model, env, **{**default_config()["agent"], **agent_config})


def fix_command() -> str:
    """The bundled fix as one bash command (a heredoc'd Python edit)."""
    fix = fix_arguments()
    return ("python3 - <<'EOF'\nimport pathlib\np = pathlib.Path(" + repr(fix["path"]) + ")\n"
            "lines = p.read_text().splitlines(keepends=True)\n"
            f"lines[{fix['start_line'] - 1}:{fix['end_line']}] = [{fix['new_content']!r}]\n"
            "p.write_text(''.join(lines))\nEOF")


def test_default_agent_solves_the_task_and_the_reward_is_on_the_env(control_plane) -> None:  # noqa: F811
    env = make_env(control_plane)
    runner = agent(env, ["cat -n roman.py", fix_command(), "$IDEGYM_JUDGE tests/ | tail -n 3",
                         "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git status --short 2>/dev/null; true"])
    result = runner.run(env.instruction)
    assert result["exit_status"] == "Submitted" and result["reward"] == 1.0
    assert env.reward == 1.0
    assert env.grading["tests"]["scores"] == {**env.grading["tests"]["scores"], "passed": 8, "total": 8}
    texts = [m["content"] if isinstance(m["content"], str) else str(m["content"]) for m in runner.messages]
    assert "Roman" in texts[1] and "Linux" in texts[1]  # the instruction and the sandbox's uname, rendered
    assert "def to_roman" in texts[3] and "<returncode>0</returncode>" in texts[3]
    assert runner.serialize()["info"]["idegym"]["reward"] == 1.0  # in the saved trajectory too
    assert alive(control_plane) == 0  # graded: the sandbox went back when the episode ended
    env.cleanup()


def test_submitting_at_once_scores_less_and_a_run_without_submit_is_graded_on_demand(control_plane) -> None:  # noqa: F811
    env = make_env(control_plane)
    result = agent(env, ["echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]).run(env.instruction)
    assert result["exit_status"] == "Submitted" and result["reward"] < 1.0 and env.reward == result["reward"]
    scores = env.grading["tests"]["scores"]
    assert scores["total"] == 8 and scores["passed"] < 8  # graded on the untouched project
    assert alive(control_plane) == 0

    env = make_env(control_plane)  # the step limit ends the run: no submission, no reward yet
    result = agent(env, ["ls", "ls"], step_limit=1).run(env.instruction)
    assert result["exit_status"] == "LimitsExceeded" and env.reward is None
    assert env.grade() is not None and env.reward < 1.0 and env.grading["tests"]["scores"]["total"] == 8
    assert alive(control_plane) == 0


def test_execute_has_cwd_env_and_timeout_semantics(control_plane) -> None:  # noqa: F811
    env = make_env(control_plane, env={"GREETING": "hi"}, timeout=5)
    project = env.execute({"command": "pwd"})["output"].strip()
    assert project.endswith("project") or project.startswith("/")
    assert env.execute({"command": "pwd"}, cwd="/tmp")["output"].strip() == "/tmp"
    assert env.execute({"command": "echo $GREETING"})["output"] == "hi\n"
    # one stream, in the order written, as mini-swe-agent's local and docker environments give it
    mixed = env.execute({"command": "echo one; echo two >&2; echo three; exit 3"})
    assert mixed == {"output": "one\ntwo\nthree\n", "returncode": 3, "exception_info": ""}
    missing = env.execute({"command": "ls"}, cwd="/no/such/dir")
    assert missing["returncode"] == -1 and "/no/such/dir" in missing["exception_info"]

    late = env.execute({"command": "echo started; sleep 77 & sleep 78"}, timeout=1)
    assert late["returncode"] == -1 and late["output"].startswith("started")
    assert "timed out after 1 seconds" in late["exception_info"] and late["extra"]["exception_type"] == "TimeoutExpired"
    # a process that ends while the loop reads it (the killed ones may still be dying) makes tr
    # say so on the one stream: only the count matters
    left = env.execute({"command": "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f 2>/dev/null; echo; done | "
                                   "grep -c '^sleep 7[78] $'"})
    assert left["output"].strip() == "0"  # the command's whole process group was killed
    env.cleanup()
    assert alive(control_plane) == 0
    with pytest.raises(RuntimeError, match="episode has ended"):
        env.execute({"command": "ls"})


def test_dead_sandbox_is_an_error_not_a_zero(control_plane) -> None:  # noqa: F811
    env = make_env(control_plane)
    runner = agent(env, ["true", "ls", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"])
    env.execute({"command": "true"})
    env.episode.env.sandbox.stop()  # the sandbox goes away under the episode (a crash, a reaper)
    with pytest.raises(InfrastructureError, match="not usable"):
        runner.run(env.instruction)
    assert runner.messages[-1]["extra"]["exit_status"] == "InfrastructureError"  # mini-swe-agent's record of it
    assert env.reward is None and env.grade() is None and env.episode.infra_error
    assert alive(control_plane) == 0


def test_configuration_errors_name_the_problem(control_plane) -> None:  # noqa: F811
    with pytest.raises(ValueError, match="no bundled task of that name.*python-roman-numerals"):
        IdeGymEnvironment(task="no-such-task", control_plane_url=control_plane.url)
    with pytest.raises(ValueError, match="control_plane\n.*Extra inputs are not permitted"):
        get_environment({"environment_class": CLASS, "task": TASK, "control_plane": control_plane.url})
    assert alive(control_plane) == 0


def test_sandbox_is_handed_back_when_the_agent_process_exits(control_plane) -> None:  # noqa: F811
    import subprocess
    import sys

    script = ("import os, sys\n"
              "os.environ['MSWEA_SILENT_STARTUP'] = '1'\n"
              "from idegym_env.integrations.mini_swe_agent import IdeGymEnvironment\n"
              f"env = IdeGymEnvironment(task={TASK!r}, control_plane_url={control_plane.url!r})\n"
              "env.execute({'command': 'echo busy'})\n"
              "print('holding', flush=True)\n"
              "sys.exit(0)  # no submission, no cleanup of its own\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "holding" in proc.stdout, proc.stderr[-2000:]
    assert alive(control_plane) == 0
