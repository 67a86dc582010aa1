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

from idegym_env.integrations.harbor import DownloadTooLarge, IdeGymEnvironment


def report(check: str, **fields: object) -> None:
    print(json.dumps({"check": check, **fields}), flush=True)


def memory_mib(field: str) -> float:
    """This process's VmRSS or VmHWM (its peak since ``reset_peak``), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


async def peak_growth(operation: object) -> float:
    """How far above its resident size before ``operation`` this process's peak went (MiB)."""
    before = memory_mib("VmRSS")
    reset_peak()
    await operation  # type: ignore[misc]
    return memory_mib("VmHWM") - before


def disk_bytes(path: Path) -> int:
    return sum(p.lstat().st_blocks * 512 for p in [path, *path.rglob("*")]) if path.exists() else 0


async def downloads_are_streamed_bounded_and_keep_holes(url: str, env_dir: Path, trial: TrialPaths,
                                                        env: IdeGymEnvironment, work: Path) -> None:
    """A sparse 1 GiB file arrives with its holes (bound 2 GiB) and costs no memory; under a 16 MiB
    bound it is refused, as is a dense 64 MiB file, before they take disk or memory."""
    gib = 1 << 30
    made = await env.exec("mkdir -p /logs/agent/run /opt/dense && cd /logs/agent/run && truncate -s 1G sparse.bin && "
                          "printf head | dd of=sparse.bin conv=notrunc status=none && "
                          "printf tail | dd of=sparse.bin bs=1 seek=$((1024*1024*1024-4)) conv=notrunc status=none && "
                          "head -c 64M /dev/urandom > /opt/dense/dense.bin && echo ok > /logs/agent/run/small.txt")
    assert made.return_code == 0, made
    growth = {}
    got = work / "sparse.bin"
    growth["sparse file"] = await peak_growth(env.download_file("/logs/agent/run/sparse.bin", got))
    with open(got, "rb") as fh:
        assert fh.read(4) == b"head" and (fh.seek(gib - 4), fh.read(4))[1] == b"tail"
    assert got.stat().st_size == gib and disk_bytes(got) < 1 << 20, disk_bytes(got)
    tree = work / "agent-logs"
    growth["sparse dir"] = await peak_growth(env.download_dir("/logs/agent", tree))
    assert (tree / "run" / "sparse.bin").stat().st_size == gib and disk_bytes(tree) < 1 << 20, disk_bytes(tree)
    assert (tree / "run" / "small.txt").read_text() == "ok\n"
    chosen, kept = work / "chosen", work / "kept"
    await env.download_dir_filtered(source_dir="/logs/agent", target_dir=chosen, include=["run/*.txt"])
    await env.download_dir_with_exclusions(source_dir="/logs/agent", target_dir=kept, exclude=["*.bin"])
    for tree in (chosen, kept):
        assert sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file()) == ["run/small.txt"]
    dense = work / "dense.bin"
    growth["dense file"] = await peak_growth(env.download_file("/opt/dense/dense.bin", dense))
    assert dense.stat().st_size == 64 << 20
    report("downloads-streamed", growth_mib={k: round(v, 1) for k, v in growth.items()})
    assert all(v < 48 for v in growth.values()), growth  # a 64 MiB file held in memory would be more

    small = IdeGymEnvironment(env_dir, "provider-checks-small", "provider-checks-small__1__env", trial,
                              EnvironmentConfig(), control_plane_url=url, image="idegym/builtin:latest",
                              network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK), download_limit_mb=16)
    await small.start(force_build=False)
    refused: dict[str, str] = {}
    try:
        await small.exec("mkdir -p /logs/agent/run /opt/dense && truncate -s 1G /logs/agent/run/sparse.bin && "
                         "head -c 64M /dev/urandom > /opt/dense/dense.bin")
        out = work / "refused"
        out.mkdir()
        for name, operation in (("sparse file", small.download_file("/logs/agent/run/sparse.bin", out / "s.bin")),
                                ("sparse dir", small.download_dir("/logs/agent", out / "agent")),
                                ("dense file", small.download_file("/opt/dense/dense.bin", out / "d.bin")),
                                ("dense dir", small.download_dir("/opt/dense", out / "dense")),
                                ("dense dir, filtered", small.download_dir_filtered(
                                    source_dir="/opt/dense", target_dir=out / "filtered", include=["*.bin"])),
                                ("dense dir, excluding", small.download_dir_with_exclusions(
                                    source_dir="/opt/dense", target_dir=out / "excluding", exclude=["*.txt"]))):
            before = memory_mib("VmRSS")
            reset_peak()
            try:
                await operation
            except DownloadTooLarge as exc:
                refused[name] = str(exc)
                assert "download_limit_mb=16" in str(exc), exc
            else:
                raise AssertionError(f"{name}: a download over the bound must be refused")
            growth[f"refused {name}"] = memory_mib("VmHWM") - before
            assert disk_bytes(out) < 1 << 20, (name, disk_bytes(out), sorted(out.rglob("*")))
            assert not list(out.glob(".idegym-download-*")), name  # nothing left behind
    finally:
        await small.stop(delete=True)
    report("downloads-bounded", growth_mib={k: round(v, 1) for k, v in growth.items()},
           message=refused["dense file"][:300])
    assert all(v < 48 for v in growth.values()), growth


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
                            persistent_env={"TRIAL_VAR": "t"}, download_limit_mb=2048)
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

        await downloads_are_streamed_bounded_and_keep_holes(url, env_dir, trial, env, work)

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
    (bad_dir / "Dockerfile").write_text("FROM debian:bookworm\nRUN false\n")  # the suite's cached base
    bad = IdeGymEnvironment(bad_dir, "bad-build", "bad-build__1__env", trial, EnvironmentConfig(),
                            control_plane_url=url, network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK))
    try:
        await bad.start(force_build=False)
    except SandboxBuildFailedError as exc:
        report("build-failure", message=str(exc)[:300])
    else:
        await bad.stop(delete=True)
        raise AssertionError("a Dockerfile that cannot build must fail the start")
    # Harbor recovers logs and artifacts after any failure: after a failed start that is nothing,
    # not a second error ("not running") printed before the first
    await bad.download_dir("/logs/agent", work / "after-failure")
    await bad.download_file("/logs/artifacts/result.json", work / "after-failure.json")
    assert not (work / "after-failure").exists() and not (work / "after-failure.json").exists()
    report("nothing-to-download-after-a-failed-start")

    print(json.dumps({"done": True}), flush=True)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(sys.argv[1], Path(tmp)))
