"""``python -m benchmarks.grpo --quick``: the GRPO rollout benchmark's smoke run writes results
that hold together (2 prompts × a group of 4 at 8 in flight, real sandboxes; 15-60 s here, so ``slow``).

Claims: every child was graded on every side with the task's reward (the run itself checks that
and fails otherwise); the rates are the rollouts over the wall times and the ratio is theirs; the
pool figures count every leader and fork child once; each phase's p50 is at most its p95; the
control plane's routes and the sandbox's round trip were read; the one-at-a-time probe holds all
10 calls and the grade; the plot is a PNG; and nothing of the run is left behind (no cgroup of
the raw ceiling's, no embedded control plane's state)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.grpo import CPU_ROOT, PHASES, QUICK, SANDBOXES_TOP

REPO = Path(__file__).resolve().parent.parent

if not (os.geteuid() == 0 and shutil.which("bwrap")):  # pragma: no cover
    pytest.skip("the benchmark runs real sandboxes (needs root and bubblewrap)", allow_module_level=True)


@pytest.mark.slow  # 15-60 s on this 2-core host, by its load: a benchmark's smoke run, not an acceptance test
def test_quick_run_writes_sane_results(tmp_path: Path) -> None:
    state_root = tmp_path / "embedded"
    state_root.mkdir()
    env = {**os.environ, "IDEGYM_EMBEDDED_STATE_ROOT": str(state_root), "IDEGYM_EMBEDDED_GRACE": "0"}
    done = subprocess.run([sys.executable, "-m", "benchmarks.grpo", "--quick", "--results", str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((tmp_path / "grpo_quick.json").read_text())
    figures = data["figures"]
    rollouts = QUICK.prompts * QUICK.group

    [row] = figures["rollouts"]
    assert row["in flight"] == QUICK.levels[0] and row["rollouts"] == rollouts
    for side in ("IdeGym", "raw"):
        assert row[f"{side} s"] > 0
        assert row[f"{side} rollouts/s"] == pytest.approx(rollouts / row[f"{side} s"], rel=1e-3)
    assert row["IdeGym / raw"] == pytest.approx(row["IdeGym rollouts/s"] / row["raw rollouts/s"], rel=1e-3)
    assert figures["rewards as the task expects on every side"] is True

    [work] = figures["a member's calls and grade, seconds per rollout (no start, fork, discard)"]
    assert work["IdeGym s"] > 0 and work["raw s"] > 0
    assert work["raw s / IdeGym s"] == pytest.approx(work["raw s"] / work["IdeGym s"], rel=1e-2)

    [pool] = figures["warm pool under load"]
    assert pool["leaders from the pool"] + pool["leaders that waited on a start"] == QUICK.prompts
    children = QUICK.prompts * (QUICK.group - 1)
    assert pool["fork children from the pool"] + pool["fork children that waited on a start"] == children

    steps = {s["phase"]: s for s in figures["p50 and p95 per step and per grade"]}
    assert set(steps) == set(PHASES)
    for step in steps.values():
        assert 0 < step["IdeGym p50 ms"] <= step["IdeGym p95 ms"]
        assert 0 < step["raw p50 ms"] <= step["raw p95 ms"]
    for share in figures["seconds per rollout by phase"]:
        assert all(share[f"{p} s"] >= 0 for p in PHASES) and share["grade s"] > 0

    routes = {r["route"]: r for r in figures["control plane: mean ms per call by route, and the sandbox round trip"]}
    forwarded = routes["/api/forward/{client_id}/{server_id}/{path}"]
    assert forwarded["calls"] >= rollouts * 10 and routes["/api/idegym-servers/fork"]["calls"] == QUICK.prompts
    assert 0 < routes["sandbox round trip (forwarded calls)"]["mean_ms"] <= forwarded["mean_ms"]

    probe = {r["call"]: r for r in figures["one call at a time (idle sandbox vs host copy)"]}
    assert len(probe) == 11 and probe["grade"]["fresh sandbox (restart) p50 ms"] > 0
    assert all(r["IdeGym p50 ms"] > 0 and r["raw p50 ms"] > 0 for r in probe.values())
    assert all(r["in the sandbox p50 ms"] > 0 for call, r in probe.items() if call.endswith("bash"))

    assert (tmp_path / "grpo_quick.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(CPU_ROOT.glob(f"{SANDBOXES_TOP}/bench-raw-*")), "the raw ceiling's cgroup was left"
    assert not list(state_root.iterdir()), "an embedded control plane's state was left"
