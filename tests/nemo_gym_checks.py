"""Run by tests/test_integrations_nemo_gym.py in .venv-nemo-gym (Python 3.12, NeMo Gym installed):
the ``idegym`` provider found through NeMo Gym's own registry (its entry point), selected from a
YAML block, driven through NeMo Gym's ``Sandbox`` API and through the sandbox environment of
NeMo Gym's ``mini_swe_agent_2`` agent with mini-swe-agent's ``DefaultAgent`` and
``DeterministicModel``, against the control plane at argv[1]. Prints one JSON line per check;
exits non-zero on the first failure."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")

import yaml  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.config import builtin_config_dir  # noqa: E402
from minisweagent.models.test_models import DeterministicModel, make_output  # noqa: E402
from nemo_gym.sandbox import (  # noqa: E402
    Sandbox,
    SandboxCreateError,
    SandboxSpec,
    SandboxStatus,
    get_provider_class,
    list_providers,
    resolve_provider_config,
)
from omegaconf import OmegaConf  # noqa: E402
from responses_api_agents.mini_swe_agent_2.sandbox_environment import MiniSWESandboxEnvironment  # noqa: E402

from idegym_env.integrations import InfrastructureError  # noqa: E402
from idegym_env.integrations.nemo_gym import IdeGymSandboxProvider, grade  # noqa: E402
from idegym_env.tasks import load_task  # noqa: E402

TASK = "python-roman-numerals"


def report(check: str, **fields: object) -> None:
    print(json.dumps({"check": check, **fields}), flush=True)


def fix_command() -> str:
    fix = load_task(TASK).solution[0].arguments.model_dump()
    return ("python3 - <<'EOF'\nimport pathlib\np = pathlib.Path(" + repr(fix["path"]) + ")\n"
            "lines = p.read_text().splitlines(keepends=True)\n"
            f"lines[{fix['start_line'] - 1}:{fix['end_line']}] = [{fix['new_content']!r}]\n"
            "p.write_text(''.join(lines))\nEOF")


def registry() -> None:
    assert "idegym" in list_providers(), list_providers()
    assert get_provider_class("idegym") is IdeGymSandboxProvider
    report("registry", providers=list_providers())


def sandbox_api(url: str, work: Path) -> None:
    # Selected by YAML alone: a named block, referenced from an agent's config.
    config = OmegaConf.create(yaml.safe_load(f"sandbox:\n  idegym:\n    control_plane_url: {url}\n"
                                             "agent:\n  sandbox_provider: sandbox\n"))
    provider = resolve_provider_config(config.agent.sandbox_provider, config)
    assert provider == {"idegym": {"control_plane_url": url}}, provider
    box = Sandbox(provider).start(SandboxSpec(image="idegym/builtin:latest", workdir="/tmp", env={"LEVEL": "easy"},
                                              files={"/tmp/in/given.txt": "hello\n"},
                                              resources={"cpu": 1, "memory_mib": 512}))
    try:
        assert box.status() == SandboxStatus.RUNNING
        r = box.exec("cat /tmp/in/given.txt; echo $LEVEL $EXTRA; pwd", env={"EXTRA": "x"})
        assert (r.return_code, r.stdout, r.error_type) == (0, "hello\neasy x\n/tmp\n", None), r
        r = box.exec("echo out; echo err >&2; exit 3", cwd="/")
        assert (r.return_code, r.stdout, r.stderr, r.error_type) == (3, "out\n", "err\n", None), r
        report("exec")
        r = box.exec("echo started; sleep 60", timeout_s=1)
        assert r.error_type == "timeout" and r.return_code == 125 and r.stdout == "started\n", r
        report("exec-timeout")
        big = os.urandom(300_000)
        for target in ("/tmp/deep/dir/big.bin", "data/big.bin"):  # outside the project (bash), inside (file API)
            src, back = work / "big.bin", work / "back" / target.replace("/", "_")
            src.write_bytes(big)
            box.upload(src, target)
            box.download(target, back)
            assert back.read_bytes() == big, target
        try:
            box.download("/tmp/no-such-file", work / "missing")
        except FileNotFoundError:
            pass
        else:
            raise AssertionError("downloading a missing file must fail")
        report("files")
    finally:
        box.stop()
    assert box.status() == SandboxStatus.STOPPED
    report("stopped")


def refusals(url: str) -> None:
    for spec, words in ((SandboxSpec(image="idegym/builtin:latest", resources={"gpu": 1}), "no GPUs"),
                        (SandboxSpec(image="idegym/builtin:latest", entrypoint=["sleep", "1"]), "no entrypoint"),
                        (SandboxSpec(), "names no image"),
                        (SandboxSpec(image="idegym-task:no-such-task"), "no IdeGym task"),
                        (SandboxSpec(image="no/such-image:1"), "did not start")):
        box = Sandbox({"idegym": {"control_plane_url": url}})
        try:
            box.start(spec)
        except SandboxCreateError as exc:
            assert words in str(exc), (words, str(exc))
        else:
            raise AssertionError(f"{spec} must be refused")
        finally:
            box.stop()  # NeMo Gym's Sandbox.__del__ would stop it, and hangs if that runs at interpreter exit
    report("refusals")


def episode(url: str, commands: list[str]) -> tuple[dict, dict]:
    """One episode of NeMo Gym's mini_swe_agent_2 sandbox environment on the task, graded."""
    env = MiniSWESandboxEnvironment(image=f"idegym-task:{TASK}", provider={"idegym": {"control_plane_url": url}},
                                    cwd=".", user=None, instance_id="roman")
    try:
        defaults = yaml.safe_load((builtin_config_dir / "default.yaml").read_text())
        model = DeterministicModel(outputs=[make_output(f"step {i}", [{"command": c}]) for i, c in enumerate(commands)])
        agent = DefaultAgent(model, env, **{**defaults["agent"], "system_template": "You code.",
                                            "instance_template": "{{task}}"})
        result = agent.run(load_task(TASK).instruction)
        return result, grade(env._sandbox)
    finally:
        env.cleanup()


def episodes(url: str) -> None:
    result, graded = episode(url, ["cat -n roman.py", fix_command(), "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"])
    assert result["exit_status"] == "Submitted", result
    assert graded["reward"] == 1.0 and graded["checks"]["tests"]["scores"]["passed"] == 8, graded
    report("episode-solved", reward=graded["reward"])
    result, graded = episode(url, ["echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"])
    assert result["exit_status"] == "Submitted" and graded["reward"] < 1.0, graded
    report("episode-unsolved", reward=graded["reward"])


def sandbox_gone(url: str) -> None:
    box = Sandbox({"idegym": {"control_plane_url": url}}).start(SandboxSpec(image=f"idegym-task:{TASK}"))
    try:
        held = box._async_sandbox._handle.raw
        held.sandbox.stop()  # the sandbox goes away behind NeMo Gym's back (a crash, a reaper)
        r = box.exec("ls")
        assert r.error_type == "sandbox" and r.return_code == 125 and "not usable" in r.stderr, r
        assert box.status() == SandboxStatus.STOPPED
        try:
            grade(box)
        except InfrastructureError as exc:
            report("sandbox-gone", error=str(exc))
        else:
            raise AssertionError("grading a dead sandbox must raise, not score")
    finally:
        box.stop()


def main(url: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        registry()
        sandbox_api(url, Path(tmp))
        refusals(url)
        episodes(url)
        sandbox_gone(url)


if __name__ == "__main__":
    main(sys.argv[1])
