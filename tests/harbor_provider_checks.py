"""Run by tests/test_integrations_harbor.py in .venv-harbor (Python 3.12, Harbor installed):
``IdeGymEnvironment`` driven directly through Harbor's ``BaseEnvironment`` API against the
control plane at argv[1]. Prints one JSON line per check; exits non-zero on the first failure."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

from harbor.environments.base import SandboxBuildFailedError
from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths

from idegym_env.integrations.harbor import IdeGymEnvironment


def report(check: str, **fields: object) -> None:
    print(json.dumps({"check": check, **fields}), flush=True)


async def main(url: str, work: Path) -> None:
    env_dir = work / "environment"
    env_dir.mkdir()
    (env_dir / "Dockerfile").write_text("FROM debian:bookworm\nWORKDIR /app\n")
    trial = TrialPaths(work / "trial")
    trial.mkdir()
    config = EnvironmentConfig(cpus=1, memory_mb=512, env={"TASK_LEVEL": "easy"})
    env = IdeGymEnvironment(env_dir, "provider-checks", "provider-checks__1__env", trial, config,
                            control_plane_url=url, image="idegym/builtin:latest",
                            network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK),
                            persistent_env={"TRIAL_VAR": "t"})
    assert env.type() == "idegym" and env.capabilities.disable_internet and not env.capabilities.mounted
    await env.start(force_build=False)
    try:
        r = await env.exec("echo $TASK_LEVEL $TRIAL_VAR $EXTRA; id -un; pwd", env={"EXTRA": "x"})
        assert r.return_code == 0 and r.stdout.split() [:3] == ["easy", "t", "x"], r
        assert r.stdout.split()[3] == "root", r  # Harbor's default: the container's user, root here
        report("exec-env-user", stdout=r.stdout)
        r = await env.exec("id -un; pwd", user="appuser", cwd="/tmp")
        assert r.stdout.split() == ["appuser", "/tmp"], r
        r = await env.exec("exit 3")
        assert r.return_code == 3
        report("exec-user-cwd-exit")
        try:
            await env.exec("sleep 30", timeout_sec=1)
        except RuntimeError as exc:
            assert "timed out" in str(exc)
        else:
            raise AssertionError("a timed-out exec must raise")
        report("exec-timeout")

        big = os.urandom(3_000_000)  # several bash calls each way
        src = work / "big.bin"
        src.write_bytes(big)
        src.chmod(0o750)
        await env.upload_file(src, "/opt/data/big.bin")
        r = await env.exec("stat -c '%a %s' /opt/data/big.bin")
        assert r.stdout.split() == ["750", str(len(big))], r
        back = work / "back.bin"
        await env.download_file("/opt/data/big.bin", back)
        assert back.read_bytes() == big
        report("file-roundtrip", bytes=len(big))

        tree = work / "tree"
        (tree / "sub").mkdir(parents=True)
        (tree / "a.txt").write_text("alpha\n")
        (tree / "sub" / "run.sh").write_text("#!/bin/bash\necho ran\n")
        (tree / "sub" / "run.sh").chmod(0o755)
        await env.upload_dir(tree, "/tests")
        r = await env.exec("/tests/sub/run.sh && cat /tests/a.txt && ls -a /tmp | grep -c idegym-transfer || true")
        assert r.stdout.split()[:2] == ["ran", "alpha"] and r.stdout.split()[2] == "0", r
        await env.exec("mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt")
        out = work / "verifier"
        await env.download_dir("/logs/verifier", out)
        assert (out / "reward.txt").read_text() == "1\n"
        assert await env.is_dir("/tests/sub") and await env.is_file("/tests/a.txt")
        report("dir-roundtrip")

        try:
            await env.download_file("/no/such/file", work / "x")
        except RuntimeError as exc:
            assert "No such file" in str(exc), exc
        else:
            raise AssertionError("downloading a missing file must raise")
        report("missing-file")

        await env._sandbox.stop()  # the sandbox goes away under the trial: an error, never a result
        try:
            await env.exec("true")
        except RuntimeError as exc:
            assert "gone" in str(exc), exc
        else:
            raise AssertionError("exec on a dead sandbox must raise")
        report("sandbox-gone")
    finally:
        await env.stop(delete=True)
    try:
        await env.exec("true")
    except RuntimeError as exc:
        assert "not running" in str(exc)
    report("stopped")

    # an unreachable control plane is an error of its own, before any trial work
    down = IdeGymEnvironment(env_dir, "down", "down__1__env", trial, EnvironmentConfig(),
                             control_plane_url="http://127.0.0.1:9", image="idegym/builtin:latest")
    try:
        await down.start(force_build=False)
    except RuntimeError as exc:
        assert "unreachable" in str(exc), exc
        report("control-plane-down")
    # a build that cannot be done is Harbor's SandboxBuildFailedError with our message
    bad_dir = work / "bad"
    bad_dir.mkdir()
    (bad_dir / "Dockerfile").write_text("FROM ubuntu:24.04\nRUN false\n")
    bad = IdeGymEnvironment(bad_dir, "bad-build", "bad-build__1__env", trial, EnvironmentConfig(),
                            control_plane_url=url, network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK))
    try:
        await bad.start(force_build=False)
    except SandboxBuildFailedError as exc:
        report("build-failure", message=str(exc)[:300])
    else:
        await bad.stop(delete=True)
        raise AssertionError("a Dockerfile that cannot build must fail the start")

    print(json.dumps({"done": True}), flush=True)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(sys.argv[1], Path(tmp)))
