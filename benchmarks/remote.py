"""A control plane on another machine: what crossing the wire costs, and how fairly it is shared.

Measured in one run:

* **episode throughput** (reset, 5 bash steps, submit and grading) of one env against the
  embedded control plane and one against a control plane as on another machine
  (``_servers.remote_control_plane``: its own mount namespace, no task data, reached over TCP),
  episodes taking turns so that load from elsewhere hits both alike. Target: the remote one
  reaches at least 90 % of the embedded one's episodes per second;
* **first episode of a new task** (construct the env, which packs, uploads what is missing and
  builds the image; then one episode) on the remote control plane, with a project of
  ``BENCH_FILES`` files: its content new, and its content already uploaded (the build still to
  do). Each case on a task of its own, ``BENCH_FIRST`` times;
* what uploading costs the **embedded** control plane (every env builds through it): a build
  request for an image it already has, with the project's path (``upload=False``, the embedded
  plane reads every directory) and as an upload (a fingerprint of the tree and one question);
  and packing that project the first time;
* **fairness**: four trainers, three episodes in flight each, on a control plane with four
  sandboxes (``--max-servers 4``): each trainer's share of ``BENCH_FAIR`` episodes. Target:
  every share within ±20 % of a quarter.

Writes ``results/remote.json``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._common import Result, check_target, table
from ._servers import REPO, make_project, remote_control_plane

EPISODES = int(os.environ.get("BENCH_N", "20"))
FIRST = int(os.environ.get("BENCH_FIRST", "3"))
FILES = int(os.environ.get("BENCH_FILES", "2000"))
FAIR = int(os.environ.get("BENCH_FAIR", "120"))
TASK = "python-roman-numerals"
STEPS = 5
ACTION = {"tool": "bash", "arguments": {"command": "echo step"}}


def episode(env: Any) -> float:
    started = time.perf_counter()
    env.reset()
    for _ in range(STEPS):
        env.step(ACTION)
    env.step({"tool": "submit"})
    return time.perf_counter() - started


def new_task(root: Path, name: str, files: int) -> Path:
    """A copy of the bundled task with a project of ``files`` more files and content of its own."""
    task = root / name
    shutil.copytree(REPO / "idegym_env" / "tasks" / "bundled" / TASK, task)
    text = (task / "task.yaml").read_text()
    (task / "task.yaml").write_text(re.sub(r"(?m)^id: .*$", f"id: {name}", text))
    make_project(task / "project" / "vendor", files)
    (task / "project" / "vendor" / "unique.txt").write_text(f"{name} {time.time_ns()}\n")
    return task


def first_episode(url: str, task: Path) -> float:
    from idegym_env.env import IdeGymEnv

    started = time.perf_counter()
    env = IdeGymEnv(str(task), control_plane_url=url)
    try:
        episode(env)
    finally:
        env.close()
    return time.perf_counter() - started


def fairness(url: str, total: int) -> dict[str, Any]:
    from idegym_env.client import APIError, IdeGymClient

    trainers = [IdeGymClient(url, name=f"trainer-{i}") for i in range(4)]
    for client in trainers:
        client.register()
    done: Counter[int] = Counter()
    errors: list[str] = []
    stop = threading.Event()
    lock = threading.Lock()

    def worker(index: int) -> None:
        while not stop.is_set():
            try:
                sandbox = trainers[index].start("idegym/builtin:latest", reuse="NONE", server_name=f"t{index}")
                sandbox.bash("true")
                sandbox.stop()
            except APIError as exc:
                errors.append(str(exc))
                return
            with lock:
                done[index] += 1
                if sum(done.values()) >= total:
                    stop.set()

    started = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    for client in trainers:
        client.close()
    n = sum(done.values())
    shares = [done[i] / n for i in range(4)] if n else [0.0] * 4
    return {"episodes": [done[i] for i in range(4)], "shares": shares, "errors": errors[:3],
            "max_deviation_pct": max(abs(s - 0.25) / 0.25 * 100 for s in shares), "seconds": seconds}


def timed(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def run() -> Result:
    from idegym_env import embedded
    from idegym_env.client import IdeGymClient
    from idegym_env.client._uploads import DIGESTS
    from idegym_env.env import IdeGymEnv

    result = Result("remote", "A control plane on another machine: episodes over TCP, uploads, fair shares")
    result.notes.append(f"load average at the start: {os.getloadavg()[0]:.1f}")
    rows: list[list[Any]] = []
    state_root = Path(tempfile.mkdtemp(prefix="idegym-bench-remote-", dir="/var/tmp"))
    work = Path(tempfile.mkdtemp(prefix="idegym-bench-remote-"))
    try:
        with remote_control_plane(state_root / "remote", ["--warm-pool", "2"]) as url:
            # 1. episode throughput, embedded against remote, taking turns
            local_env = IdeGymEnv(TASK, max_steps=1000)
            remote_env = IdeGymEnv(TASK, control_plane_url=url, max_steps=1000)
            times: dict[str, list[float]] = {"embedded": [], "remote": []}
            for env in (local_env, remote_env):  # warm-up: the first episode builds and fills the pool
                episode(env)
            for _ in range(EPISODES):
                times["embedded"].append(episode(local_env))
                times["remote"].append(episode(remote_env))
            local_env.close()
            remote_env.close()
            rate = {k: 1 / statistics.median(v) for k, v in times.items()}
            ratio = rate["remote"] / rate["embedded"]
            for k, v in times.items():
                rows.append([f"episode ({STEPS} steps + grading), {k}", len(v), statistics.median(v) * 1000,
                             f"{rate[k]:.2f} episodes/s"])
            result.figures["episodes_per_second"] = {k: round(v, 3) for k, v in rate.items()}
            result.figures["remote_over_embedded"] = round(ratio, 3)

            # 2. the first episode of a new task: content new, content already uploaded
            fresh, uploaded = [], []
            with IdeGymClient(url, name="bench-uploader") as uploader:
                for i in range(FIRST):
                    fresh.append(first_episode(url, new_task(work, f"bench-new-{i}", FILES)))
                    task = new_task(work, f"bench-uploaded-{i}", FILES)
                    uploader.upload(task / "project")
                    uploaded.append(first_episode(url, task))
            tree = DIGESTS.tree(work / "bench-new-0" / "project")
            rows.append([f"first episode, new content ({FILES} files, {tree.size >> 10} KiB packed)", FIRST,
                         statistics.median(fresh) * 1000, "pack + upload + build + episode"])
            rows.append(["first episode, content already uploaded", FIRST, statistics.median(uploaded) * 1000,
                         "build + episode"])
            result.figures["first_episode_s"] = {"new_content": round(statistics.median(fresh), 3),
                                                 "already_uploaded": round(statistics.median(uploaded), 3),
                                                 "packed_bytes": tree.size, "files": FILES}

        # 3. the embedded control plane: a build it already has, by path and by upload
        project = new_task(work, "bench-embedded", FILES) / "project"
        started = time.perf_counter()
        DIGESTS.tree(project)
        pack_first = time.perf_counter() - started
        plane = embedded.acquire()
        try:
            with IdeGymClient(plane.url, name="bench-embedded") as client:
                doc = json.dumps({"images": [{"tag": "bench/embedded:1", "project": {"path": str(project)}}]})
                client.build_images(doc)
                by_path = timed(lambda: client.build_images(doc, upload=False), 10)
                by_upload = timed(lambda: client.build_images(doc), 10)
        finally:
            embedded.release()
        rows.append([f"embedded: pack {FILES} files the first time", 1, pack_first * 1000, ""])
        rows.append(["embedded: build request of a built image, by path", 10, statistics.median(by_path) * 1000, ""])
        rows.append(["embedded: the same as an upload (fingerprint + ask)", 10,
                     statistics.median(by_upload) * 1000, ""])
        result.figures["embedded_upload_cost_ms"] = {
            "pack_first": round(pack_first * 1000, 1), "by_path": round(statistics.median(by_path) * 1000, 2),
            "by_upload": round(statistics.median(by_upload) * 1000, 2)}

        # 4. fairness: four trainers on four sandboxes
        with remote_control_plane(state_root / "fair", ["--max-servers", "4", "--warm-pool", "2"]) as url:
            fair = fairness(url, FAIR)
        rows.append(["fairness: episodes of trainers 1-4", FAIR, fair["seconds"] * 1000,
                     " / ".join(str(n) for n in fair["episodes"])
                     + f" (max deviation {fair['max_deviation_pct']:.1f} %)"])
        result.figures["fairness"] = fair
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(state_root, ignore_errors=True)
    print()
    print(table(["measurement", "n", "median ms", "note"], rows))
    result.targets = {
        "throughput": check_target("remote episodes per second over embedded", ratio, 0.9, unit="x",
                                   lower_is_better=False),
        "fairness": check_target("largest deviation of a trainer's share from a quarter",
                                 fair["max_deviation_pct"], 20.0, unit="%"),
    }
    if fair["errors"]:
        result.notes.append(f"starts refused: {fair['errors']}")
    for target in result.targets.values():
        print(target["text"])
    return result


if __name__ == "__main__":
    run().write()
