"""Fork a live sandbox into N (``docs/fork.md``) against starting N fresh ones and replaying its changes.

A parent sandbox holds a project of 5,000 (then 50,000) files, 100 of which it changed. Timed,
from the client: ``Sandbox.fork(n)`` until every child answered a bash call, for n = 1, 8, 32;
and the baseline: starting n sandboxes of the same image and replaying the parent's 100 changes
into each (one bash call per sandbox writing the 100 files: the cheapest replay there is), until
every one answered. Both draw from a warm pool that is full and idle before each repetition
(refilling it is not timed); the fork also without a warm pool (children launched on the fork's
layers). Beside the totals: how long the fork call itself took (the rest is the children's
first answers), how long the parent was paused (frozen while its changes were copied), and the
same bash calls again on the children once they run: the floor this host sets (its load) under
any "ready" time.

And with the control plane's default configuration (no ``--warm-pool`` flags: nothing sized for
the fork), a fork into 8 every ``BENCH_FORK_EVERY`` seconds (1.5) as a trainer forks a group per
prompt, beside the warm-pool row of the same run (one control plane per project size, side by
side, their forks alternated: the sizes' ratio is of the same moments), with where its time went: the control plane
(the fork call less the backend's part), the layer's copy (the parent frozen in it), making the
children (remounting warm sandboxes or launching new ones: how many of each), and the children's
first answers; and each child's first call against its next (a new child must not pay for
what a later call does not); in the warm-pool rows also against the same call once the host is
as quiet as when the fork began (the pool full again): a call to a child that is only idle, not
new, as a new child's processes sat idle since its warm-up. Beside each default control plane,
one with a warm pool of 8 filled before each of its forks, their forks alternated: the two
configurations' ratio is of the same moments (the warm-pool rows above run at another part's
load), and both are broken down the same way.

Disk: a child's own directory (its writable layers, log, record) against an unused sandbox's,
and the fork layer, which all children of one fork share, separately.

``BENCH_FORK_N`` repetitions per row (default 5), ``BENCH_FORK_SIZES`` (default ``5000,50000``),
``BENCH_FORK_COUNTS`` (default ``1,8,32``: the warm-pool rows; the default configuration's is 8).
``BENCH_FORK_WARM_ONLY=1``: the warm-pool fork rows alone (no fresh + replay, no fork without a
pool, no default configuration), from a pool as large as the full run's (``BENCH_FORK_POOL``,
default the largest count): with ``BENCH_FORK_COUNTS=8``, an A/B round of the warm-pool target
in a minute or two.
Writes ``results/fork.json`` and ``results/fork.png``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import sqlite3
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from ._common import RESULTS, Progress, Result, Stats, check_target, stats_table, table
from ._servers import control_plane, make_project

N = int(os.environ.get("BENCH_FORK_N", "5"))
SIZES = [int(s) for s in os.environ.get("BENCH_FORK_SIZES", "5000,50000").split(",")]
COUNTS = tuple(int(c) for c in os.environ.get("BENCH_FORK_COUNTS", "1,8,32").split(",") if c)
COLD_COUNTS = tuple(c for c in (1, 8) if c in COUNTS)
WARM_ONLY = os.environ.get("BENCH_FORK_WARM_ONLY") == "1"
POOL = int(os.environ.get("BENCH_FORK_POOL") or max(COUNTS, default=0))
EVERY = float(os.environ.get("BENCH_FORK_EVERY", "1.5"))
GROUP = 8
CHANGED = 100


def _changes(files: int) -> str:
    """Bash that changes 100 of the project's files (spread over its packages) the same way every time."""
    step = files // CHANGED
    return "; ".join(f"echo 'CHANGED = {i}' >> pkg{i % 50:02d}/mod{i % 7}/file{i}.py"
                     for i in range(0, files, step)[:CHANGED])


def _register(url: str, project: Path, tag: str) -> None:
    from idegym_env.client import IdeGymClient

    with IdeGymClient(url, name="bench-images") as client:
        client.build_images(json.dumps({"images": [{"tag": tag, "project": {"path": str(project)}}]}), timeout=1800)


def _pool_ready(url: str, tag: str) -> int:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("idegym_warm_pool_ready{") and tag in line))


def _wait_pool(url: str, tag: str, want: int, state: Path, live: int = 1, timeout: float = 900) -> None:
    """Until the pool holds ``want`` ready sandboxes of ``tag`` and the sandboxes stopped before
    are gone (only the pool's and ``live`` others are left in ``state``): each sample starts on
    a host that is not still tearing down the last one's sandboxes; then ``EVERY`` seconds to
    settle, as the default configuration's forks get (half a second after its last fill, a
    fork's children took 3 ms longer to make, 4 ms longer in all, than two seconds later)."""
    deadline = time.monotonic() + timeout
    sandboxes = state / "sandboxes"
    while _pool_ready(url, tag) < want or sum(1 for _ in sandboxes.iterdir()) > want + live:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the warm pool did not reach {want} sandboxes of {tag} in {timeout:g} s")
        time.sleep(0.2)
    time.sleep(EVERY)


def _all_answer(sandboxes: list) -> list[float]:
    """Each sandbox answers a bash call (all at once); each call's seconds."""
    def call(sandbox: Any) -> float:
        t = time.perf_counter()
        answer = sandbox.bash("true")
        assert answer.exit_code == 0, answer
        return time.perf_counter() - t

    with concurrent.futures.ThreadPoolExecutor(len(sandboxes)) as pool:
        return list(pool.map(call, sandboxes))


def _du_kib(path: Path) -> int:
    out = subprocess.run(["du", "-sk", "--one-file-system", str(path)], capture_output=True, text=True)
    return int(out.stdout.split()[0]) if out.returncode == 0 else 0


def _stop_all(sandboxes: list) -> None:
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda s: s.stop(), sandboxes))


def _records(state: Path, children: list) -> list[dict[str, Any]]:
    """The backend's records of the children (their handles' data)."""
    db = sqlite3.connect(f"file:{state / 'control-plane.db'}?mode=ro", uri=True)
    try:
        rows = [db.execute("SELECT handle FROM servers WHERE id = ?", (c.server_id,)).fetchone() for c in children]
    finally:
        db.close()
    return [json.loads(row[0])["data"] for row in rows]


def _paused_ms(state: Path, children: list) -> float:
    """How long the parent was frozen for this fork (the backend records it in each child's handle)."""
    return float(_records(state, children)[0].get("fork_frozen_ms", float("nan")))


def _disk(state: Path, client: Any, tag: str, children: list) -> dict[str, float]:
    """KiB of a child's own directory against an unused sandbox's; the shared fork layer apart."""
    idle = client.start(tag, reuse="NONE")
    try:
        own = [_du_kib(state / "sandboxes" / c.info.service_name) for c in children]
        base = _du_kib(state / "sandboxes" / idle.info.service_name)
        newest = max((p for p in (state / "forks").glob("f-*")), key=lambda p: p.stat().st_mtime)
        return {"child directory KiB (largest of 8)": max(own), "unused sandbox directory KiB": base,
                "extra disk per child KiB": max(own) - base, "shared fork layer KiB": _du_kib(newest)}
    finally:
        idle.stop()


def _project(files: int, tmp: Path) -> tuple[Path, str, str]:
    """The project of ``files`` files (made once), its image tag and the parent's changes."""
    root = tmp / f"project{files}"
    return (root if root.is_dir() else make_project(root, files)), f"bench/fork{files}:1", _changes(files)


BESIDE = f"fork into {GROUP} (warm pool of {GROUP}, beside the default configuration)"
IDLE = "a child's call after idle (the pool full again)"
# The parts of a fork's time, the same for every row that breaks one down (p50 of each).
BREAKDOWN = ("the fork call", "control plane (the fork call less the backend's part)", "backend: prepare",
             "backend: snapshot", "backend: freeze", "backend: frozen", "backend: children",
             "one child made (the slowest)", "the first answers (after the call)", "a child's first call",
             "a child's next call", IDLE)


def _breakdown(parts: dict[str, list[float]], row: str, total: float, call: float,
               records: list[dict[str, Any]], first: list[float], later: list[float]) -> None:
    """Where one fork's ``total`` seconds went (``BREAKDOWN``): the fork call (``call``) and the
    backend's parts of it (its records of the children), then the children's first answers."""
    ms = records[0].get("fork_ms", {})
    add = lambda key, value: parts.setdefault(f"{row}: {key}", []).append(value)  # noqa: E731
    add("the fork call", call)
    add("control plane (the fork call less the backend's part)", call - ms.get("total", float("nan")) / 1e3)
    for key in ("prepare", "snapshot", "freeze", "frozen", "children", "total"):
        add(f"backend: {key}", ms.get(key, float("nan")) / 1e3)
    slowest = max(r.get("fork_ms", {}).get("this child", float("nan")) for r in records)
    add("one child made (the slowest)", slowest / 1e3)
    add("the first answers (after the call)", total - call)
    parts.setdefault(f"{row}: a child's first call", []).extend(first)
    parts.setdefault(f"{row}: a child's next call", []).extend(later)


def _measure_warm_and_cold(files: int, project: Path, tag: str, change: str, tmp: Path, result: Result,
                           samples: dict[str, list[float]], parts: dict[str, list[float]]) -> None:
    """Fork into each of ``COUNTS`` from a full warm pool, against fresh sandboxes replaying the
    changes; then fork without a warm pool."""
    from idegym_env.client import IdeGymClient

    pool = POOL
    state = tmp / f"cp{files}"
    with control_plane(state, ["--warm-pool", str(pool), "--warm-pool-max", str(pool),
                               "--max-servers", str(4 * pool + 10)]) as url:
        _register(url, project, tag)
        with IdeGymClient(url, name=f"bench-fork-{files}") as client:
            parent = client.start(tag, reuse="NONE")
            assert parent.bash(change).exit_code == 0
            for count in COUNTS:
                fork_s, fresh_s = [], []
                progress = Progress(f"{files} files: fork / fresh+replay into {count}", (1 if WARM_ONLY else 2) * N)
                for _ in range(N):
                    _wait_pool(url, tag, pool, state)
                    t = time.perf_counter()
                    children = parent.fork(count)
                    returned = time.perf_counter()
                    first = _all_answer(children)
                    fork_s.append(time.perf_counter() - t)
                    parts.setdefault(f"{files} files: fork into {count}: parent paused", []).append(
                        _paused_ms(state, children) / 1e3)
                    t_again = time.perf_counter()  # the same calls again, on sandboxes that run: the host's floor
                    later = _all_answer(children)
                    parts.setdefault(f"{files} files: fork into {count}: the children answer again", []).append(
                        time.perf_counter() - t_again)
                    _breakdown(parts, f"{files} files: fork into {count}", fork_s[-1], returned - t,
                               _records(state, children), first, later)
                    # Once the host is as quiet as when the fork began (the pool full again, then
                    # EVERY seconds), the same calls once more: what a call costs on a child
                    # that is not new, only idle (docs/fork.md: the first call costs as much).
                    _wait_pool(url, tag, pool, state, live=1 + count)
                    parts.setdefault(f"{files} files: fork into {count}: {IDLE}", []).extend(_all_answer(children))
                    progress.step()
                    if count == 8 and f"{files} files: extra disk per child KiB" not in result.figures:
                        for key, value in _disk(state, client, tag, children).items():
                            result.figures[f"{files} files: {key}"] = value
                    _stop_all(children)
                    if WARM_ONLY:
                        continue
                    _wait_pool(url, tag, pool, state)
                    t = time.perf_counter()
                    with concurrent.futures.ThreadPoolExecutor(count) as threads:
                        fresh = list(threads.map(lambda _: client.start(tag, reuse="NONE"), range(count)))
                        for answer in threads.map(lambda s: s.bash(change), fresh):
                            assert answer.exit_code == 0, answer
                    fresh_s.append(time.perf_counter() - t)
                    progress.step()
                    _stop_all(fresh)
                samples[f"{files} files: fork into {count} (warm pool)"] = fork_s
                if fresh_s:
                    samples[f"{files} files: {count} fresh + replay 100 changes (warm pool)"] = fresh_s
            parent.stop()
    if WARM_ONLY:
        return
    with control_plane(tmp / f"cold{files}", ["--warm-pool", "0", "--warm-pool-max", "0"]) as url:
        _register(url, project, tag)
        with IdeGymClient(url, name=f"bench-fork-cold-{files}") as client:
            parent = client.start(tag, reuse="NONE")
            assert parent.bash(change).exit_code == 0
            for count in COLD_COUNTS:
                cold = []
                progress = Progress(f"{files} files: fork into {count}, no warm pool", N)
                for _ in range(N):
                    t = time.perf_counter()
                    children = parent.fork(count)
                    _all_answer(children)
                    cold.append(time.perf_counter() - t)
                    progress.step()
                    _stop_all(children)
                    time.sleep(1.0)  # the children's teardown, before the next fork
                samples[f"{files} files: fork into {count} (no warm pool)"] = cold
            parent.stop()


def _fork_once(parent: Any, state: Path, row: str, parts: dict[str, list[float]]) -> tuple[float, list]:
    """Fork ``parent`` into ``GROUP`` until every child answered (seconds), its parts under ``row``;
    the children's records."""
    t = time.perf_counter()
    children = parent.fork(GROUP)
    returned = time.perf_counter()
    first = _all_answer(children)
    total = time.perf_counter() - t
    later = _all_answer(children)
    records = _records(state, children)
    _breakdown(parts, row, total, returned - t, records, first, later)
    _stop_all(children)
    return total, records


def _measure_default(tmp: Path, result: Result, samples: dict[str, list[float]],
                     parts: dict[str, list[float]]) -> None:
    """Fork into 8 every ``EVERY`` seconds on control planes of the default configuration, one per
    project size, alive side by side with their forks alternated: the sizes see the same load,
    so their ratio (flat in project size) is one of the same moments. Beside each, a control
    plane with a warm pool of 8 filled before each of its forks (``BESIDE``), its forks alternated
    with the default configuration's: their ratio is of the same moments too (the warm-pool rows
    above run in a part of their own, at another moment's load)."""
    from idegym_env.client import IdeGymClient

    with contextlib.ExitStack() as stack:
        sides = []
        for files in SIZES:
            project, tag, change = _project(files, tmp)
            planes = []
            for kind, flags in (("default", []),
                                ("beside", ["--warm-pool", str(GROUP), "--warm-pool-max", str(GROUP)])):
                state = tmp / f"{kind}{files}"
                url = stack.enter_context(control_plane(state, flags))
                _register(url, project, tag)
                client = stack.enter_context(IdeGymClient(url, name=f"bench-fork-{kind}-{files}"))
                parent = client.start(tag, reuse="NONE")
                assert parent.bash(change).exit_code == 0
                planes.append((url, state, parent))
            sides.append((files, tag, *planes))
        progress = Progress(f"fork into {GROUP} every {EVERY:g} s, default configuration (and a warm pool beside), "
                            f"{' and '.join(map(str, SIZES))} files alternated", N * len(SIZES))
        totals: dict[int, list[float]] = {files: [] for files in SIZES}
        beside: dict[int, list[float]] = {files: [] for files in SIZES}
        remounted: dict[int, list[int]] = {files: [] for files in SIZES}
        for i in range(N):
            for files, tag, (_, state, parent), (warm_url, warm_state, warm_parent) in (
                    sides if i % 2 == 0 else sides[::-1]):
                for kind in (("default", "warm") if i % 2 == 0 else ("warm", "default")):
                    if kind == "default":  # as long after the fork before (the other plane's) as the warm one
                        time.sleep(EVERY)
                        total, records = _fork_once(parent, state, f"{files} files: fork into {GROUP} "
                                                    "(default configuration)", parts)
                        totals[files].append(total)
                        remounted[files].append(sum(bool(r.get("adopted")) for r in records))
                    else:  # its pool full, then as long as the default configuration's fork waits
                        _wait_pool(warm_url, tag, GROUP, warm_state)
                        beside[files].append(_fork_once(warm_parent, warm_state, f"{files} files: {BESIDE}", parts)[0])
                progress.step()
        for files, _tag, (_, _state, parent), (_, _, warm_parent) in sides:
            row = f"{files} files: fork into {GROUP} (default configuration)"
            samples[row] = totals[files]
            samples[f"{files} files: {BESIDE}"] = beside[files]
            result.figures[f"{row}: children remounted from the pool, each fork"] = " ".join(map(str, remounted[files]))
            result.figures[f"{row}: the first fork ms"] = round(totals[files][0] * 1e3, 2)
            parent.stop()
            warm_parent.stop()


def _plot(by: dict[str, Stats]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / (2 * len(SIZES))
    series = [(f"{files} files: fork into {{n}} (warm pool)", f"fork, {files:,} files") for files in SIZES]
    series += [(f"{files} files: {{n}} fresh + replay 100 changes (warm pool)", f"fresh + replay, {files:,} files")
               for files in SIZES]
    for i, (pattern, label) in enumerate(series):
        xs = [c + (i - len(series) / 2 + 0.5) * width for c in range(len(COUNTS))]
        ax.bar(xs, [by[pattern.format(n=n)].median_ms for n in COUNTS], width, label=label)
    ax.set_xticks(range(len(COUNTS)), [f"{n} children" for n in COUNTS])
    ax.set_yscale("log")
    ax.set_ylabel("until every child answered bash, p50 (ms, log)")
    ax.axhline(100, color="grey", linestyle=":", linewidth=1)
    ax.set_title("Fork a live sandbox vs fresh sandboxes replaying its 100 changes")
    ax.legend(fontsize=8)
    fig.tight_layout()
    RESULTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(RESULTS / "fork.png", dpi=120)
    plt.close(fig)


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def run() -> Result:
    result = Result("fork", "Fork a live sandbox into N vs N fresh sandboxes replaying its changes")
    samples: dict[str, list[float]] = {}
    parts: dict[str, list[float]] = {}
    loads = [f"start {_load()}"]
    with tempfile.TemporaryDirectory(prefix="bench-fork-") as tmpdir:
        for files in SIZES if COUNTS else ():  # no counts: the default configuration's rows alone
            _measure_warm_and_cold(files, *_project(files, Path(tmpdir)), Path(tmpdir), result, samples, parts)
            loads.append(f"after {files} files {_load()}")
        if not WARM_ONLY:
            _measure_default(Path(tmpdir), result, samples, parts)
            loads.append(f"after the default configuration {_load()}")
    stats = [Stats.of(label, s) for label, s in samples.items()]
    result.stats = stats
    by = {s.label: s for s in stats}
    for label, values in parts.items():
        result.figures[f"{label} p50 ms"] = round(statistics.median(values) * 1e3, 2)
    result.figures["load average (1, 5, 15 min)"] = "; ".join(loads)
    print()
    print(stats_table(stats))
    print()
    if WARM_ONLY:
        return _warm_only(result, by)
    rows = []
    for files in SIZES:
        for n in COUNTS:
            fork, fresh = by[f"{files} files: fork into {n} (warm pool)"], \
                by[f"{files} files: {n} fresh + replay 100 changes (warm pool)"]
            rows.append([f"{files} files, {n} children", fork.median_ms,
                         result.figures[f"{files} files: fork into {n}: the fork call p50 ms"],
                         result.figures[f"{files} files: fork into {n}: parent paused p50 ms"],
                         result.figures[f"{files} files: fork into {n}: the children answer again p50 ms"],
                         fresh.median_ms, f"{fresh.median_ms / fork.median_ms:.1f}x"])
    if rows:
        print(table(["case", "fork p50 ms", "fork call ms", "parent paused ms", "answer again ms",
                     "fresh+replay p50 ms", "fork faster"], rows))
    print()
    side = []
    for files in SIZES:  # the default configuration beside a warm pool sized and filled for the fork, alternated
        default = by[f"{files} files: fork into {GROUP} (default configuration)"].median_ms
        warm = by[f"{files} files: {BESIDE}"].median_ms
        first = result.figures[f"{files} files: fork into {GROUP} (default configuration): a child's first call p50 ms"]
        later = result.figures[f"{files} files: fork into {GROUP} (default configuration): a child's next call p50 ms"]
        # A figure, not a target: after its first fork the default configuration keeps 8 members
        # too, so both remount warm members the same way and their ratio is 1 within the noise.
        result.figures[f"{files} files: default configuration / warm pool"] = round(default / warm, 3)
        result.figures[f"{files} files: a child's first call / its next"] = round(first / later, 3)
        side.append([f"{files} files", warm, default, f"{default / warm:.2f}x", first, later, f"{first / later:.2f}x"])
    for files in SIZES:  # the rows' parts side by side: where a warm pool's fork differs
        rows = [f"{files} files: fork into {GROUP}", f"{files} files: {BESIDE}",
                f"{files} files: fork into {GROUP} (default configuration)"]
        print(table([f"{files} files, fork into {GROUP}: where the time goes (p50 ms)", "warm pool (its own part)",
                     "warm pool (beside)", "default configuration (beside)"],
                    [[key, *(result.figures.get(f"{row}: {key} p50 ms", float("nan")) for row in rows)]
                     for key in BREAKDOWN]))
    for label, value in result.figures.items():
        if "(default configuration): " in label and not label.endswith(" p50 ms"):
            print(f"{label}: {value}")
    print()
    print(table([f"fork into {GROUP}, alternated", "warm pool p50 ms", "default config p50 ms", "default / warm",
                 "first call p50 ms", "next call p50 ms", "first / next"], side))
    small, large = min(SIZES), max(SIZES)
    for files in SIZES:
        default = by[f"{files} files: fork into {GROUP} (default configuration)"].median_ms
        result.targets[f"default{files}"] = check_target(
            f"8 children ready p50, default configuration ({files} files)", default, 100.0)
        result.targets[f"first_call{files}"] = check_target(
            f"a new child's first call / its next ({files} files)",
            result.figures[f"{files} files: a child's first call / its next"], 1.5, unit="x")
    _warm_targets(result, by)
    if large != small:
        result.targets["flat"] = check_target(
            f"8 children, default configuration, {large} vs {small} files",
            by[f"{large} files: fork into {GROUP} (default configuration)"].median_ms
            / by[f"{small} files: fork into {GROUP} (default configuration)"].median_ms, 1.5, unit="x")
    for files in SIZES:
        extra = result.figures.get(f"{files} files: extra disk per child KiB")
        if extra is not None:
            result.targets[f"disk{files}"] = check_target(
                f"extra disk per child, no writes of its own ({files} files)", extra / 1024, 1.0, unit="MiB")
    _print_targets(result)
    if COUNTS:
        _plot(by)
    return result


def _warm_targets(result: Result, by: dict[str, Stats]) -> None:
    if GROUP in COUNTS:
        for files in SIZES:
            result.targets[f"warm{files}"] = check_target(
                f"8 children ready p50, warm pool ({files} files)",
                by[f"{files} files: fork into {GROUP} (warm pool)"].median_ms, 50.0)
            # A figure beside the first/next target: a new child's first call against a call to a
            # child that is only idle as long (docs/fork.md: the first call costs what that costs).
            row = f"{files} files: fork into {GROUP}"
            ratio = round(result.figures[f"{row}: a child's first call p50 ms"]
                          / result.figures[f"{row}: {IDLE} p50 ms"], 3)
            result.figures[f"{files} files: a child's first call / a call after idle (warm pool)"] = ratio
            print(f"{files} files, fork into {GROUP} (warm pool): a child's first call / a call after idle: {ratio}x")


def _print_targets(result: Result) -> None:
    print()
    for target in result.targets.values():
        print(target["text"])
    print(f"load average (1, 5, 15 min): {result.figures['load average (1, 5, 15 min)']}")
    result.notes.append("2-core host shared with other agents' test runs; load average (1, 5, 15 min) "
                        f"{result.figures['load average (1, 5, 15 min)']}")


def _warm_only(result: Result, by: dict[str, Stats]) -> Result:
    """``BENCH_FORK_WARM_ONLY``'s report: the warm-pool rows' parts and their targets."""
    for files in SIZES:
        for n in COUNTS:
            row = f"{files} files: fork into {n}"
            print(table([f"{row} (warm pool of {POOL}): where the time goes (p50 ms)", ""],
                        [[key, result.figures.get(f"{row}: {key} p50 ms", float("nan"))] for key in BREAKDOWN]))
    _warm_targets(result, by)
    _print_targets(result)
    return result


if __name__ == "__main__":
    run().write()
