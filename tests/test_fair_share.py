"""Sharing one control plane: a creation queue instead of 429s, fair turns, quotas per tenant and
per client, metrics per client (``control_plane/admission.py``, ``uploads.py``).

Can fail: on main a start past ``--max-servers`` answered 429 at once (the client raises
``Busy``), so trainers bursting together got errors in proportion to their luck, a tenant's
burst took the whole quota from the other, and there were no per-tenant or per-client limits.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cp_helpers import ControlPlaneProcess
from tests.helpers import wait_until

BUILTIN = "idegym/builtin:latest"


def metric(cp_http, name: str) -> dict[str, float]:
    """``{client_id: value}`` of one per-client metric of ``/metrics``."""
    text = cp_http.get("/metrics").text
    return {m.group(1): float(m.group(2)) for m in
            re.finditer(rf'^{name}\{{client_id="([^"]*)",[^}}]*\}} (\S+)$', text, re.M)}


# -- four trainers, one control plane ------------------------------------------------------------------


@pytest.fixture
def crowded(tmp_path: Path) -> Iterator[ControlPlaneProcess]:
    proc = ControlPlaneProcess(tmp_path / "state", ["--max-servers", "4", "--warm-pool", "2", "--ephemeral"],
                               build_roots=[])
    yield proc
    proc.stop()


def test_four_bursting_trainers_each_get_a_quarter_without_a_429(crowded: ControlPlaneProcess) -> None:
    """Four trainers with three episodes in flight each, four sandboxes in all: every start waits
    its turn (none is refused) and each trainer holds its share of the sandboxes within ±20 %.

    The share is the control plane's own count of each client's live servers (``/metrics``),
    sampled while every trainer has asked: a server counts from its turn to its sandbox's end,
    which is what the turns divide. Time seen from the client between ``start()`` returning and
    ``stop()`` is not: it leaves out how long each sandbox took to make (a warm one or a cold one),
    so its shares follow which trainer drew the warm pool's sandboxes. Sampling starts once every
    trainer has finished an episode: before that, the trainer whose threads happened to ask first
    holds three of the four sandboxes for one episode, which says nothing about the turns."""
    import httpx

    from idegym_env.client import APIError, IdeGymClient

    trainers = [IdeGymClient(crowded.url, name=f"trainer-{i}") for i in range(4)]
    for client in trainers:
        client.register()
    ids = [c.client_id for c in trainers]
    done: Counter[int] = Counter()
    errors: list[str] = []
    stop = threading.Event()
    peak = [0]
    lock = threading.Lock()
    live = [0]
    held: Counter[int] = Counter()  # live servers of each trainer, summed over the samples

    def worker(index: int) -> None:
        client = trainers[index]
        while not stop.is_set():
            try:
                sandbox = client.start(BUILTIN, reuse="NONE", server_name=f"t{index}")
                with lock:
                    live[0] += 1
                    peak[0] = max(peak[0], live[0])
                sandbox.bash("true")
                with lock:
                    live[0] -= 1
                sandbox.stop()
            except APIError as exc:
                errors.append(f"trainer {index}: {exc}")
                return
            with lock:
                done[index] += 1
                if sum(done.values()) >= 56:
                    stop.set()

    def sample() -> None:
        with httpx.Client(base_url=crowded.address, auth=crowded.auth, timeout=30) as http:
            while not stop.wait(0.02):
                with lock:
                    if len(done) < 4:  # not every trainer has had its turn once yet
                        continue
                servers = metric(http, "idegym_client_servers")
                held.update({i: int(servers.get(client_id, 0)) for i, client_id in enumerate(ids)})

    threads = [threading.Thread(target=worker, args=(i,)) for _ in range(3) for i in range(4)]
    sampler = threading.Thread(target=sample)
    for t in [*threads, sampler]:
        t.start()
    for t in [*threads, sampler]:
        t.join(240)
    try:
        assert errors == [], errors[:3]
        total = sum(held.values())
        assert total > 0, "no sample was taken"
        shares = {i: held[i] / total for i in range(4)}
        assert all(0.8 * 0.25 <= s <= 1.2 * 0.25 for s in shares.values()), (shares, done)
        assert all(done[i] >= 0.5 * sum(done.values()) / 4 for i in range(4)), done
        assert peak[0] <= 4
        waited = metric(crowded.http, "idegym_client_start_wait_seconds_total")
        started = metric(crowded.http, "idegym_client_starts_total")
        assert all(waited.get(i, 0) > 0 for i in ids), waited  # they did wait their turns ...
        assert all(int(started[i]) >= done[n] for n, i in enumerate(ids)), started  # ... and each is counted
    finally:
        for client in trainers:
            client.close()


def test_finished_servers_give_way_to_a_waiting_start(crowded: ControlPlaneProcess) -> None:
    """FINISHED servers (kept for reuse) do not hold the quota against another trainer's start."""
    from idegym_env.client import IdeGymClient

    with IdeGymClient(crowded.url, name="finisher") as first, IdeGymClient(crowded.url, name="newcomer") as second:
        held = [first.start(BUILTIN, reuse="NONE", server_name=f"f{i}") for i in range(4)]
        for sandbox in held:
            sandbox.finish()
        started = time.monotonic()
        sandbox = second.start(BUILTIN, reuse="NONE", server_name="n", timeout=60)
        assert time.monotonic() - started < 30
        assert sandbox.bash("echo ok").stdout == "ok\n"
        statuses = Counter(s.availability.value for s in first.sandboxes(include_terminal=True))
        assert statuses == {"FINISHED": 3, "STOPPED": 1}, statuses


def test_a_start_that_waited_too_long_says_which_limit_held_it(tmp_path: Path) -> None:
    from idegym_env.client import Busy, IdeGymClient

    proc = ControlPlaneProcess(tmp_path / "state", ["--max-servers", "1", "--client-max-servers", "1",
                                                    "--queue-timeout", "2", "--warm-pool", "0", "--ephemeral"],
                               build_roots=[])
    try:
        with IdeGymClient(proc.url, name="greedy") as client:
            client.start(BUILTIN, reuse="NONE", server_name="one")
            started = time.monotonic()
            with pytest.raises(Busy, match=r"waited 2 s for a turn to make 1 sandbox: .*holds 1 of 1 "
                                           r"\(--max-servers\).*\(--client-max-servers\)"):
                client.start(BUILTIN, reuse="NONE", server_name="two")
            assert 2 <= time.monotonic() - started < 30
            refused = metric(proc.http, "idegym_client_starts_refused_total")
            assert refused[client.client_id] == 1
    finally:
        proc.stop()


def test_the_start_rate_spaces_sandboxes_out(tmp_path: Path) -> None:
    """``--start-rate 2``, bursts of one: four starts asked at once get their turns (their servers
    are made) at least half a second apart, and none is refused."""
    from idegym_env.client import IdeGymClient

    proc = ControlPlaneProcess(tmp_path / "state", ["--start-rate", "2", "--start-burst", "1", "--warm-pool", "0",
                                                    "--ephemeral"], build_roots=[])
    try:
        with IdeGymClient(proc.url, name="rated") as client:
            threads = [threading.Thread(target=client.start, args=(BUILTIN,),
                                        kwargs={"reuse": "NONE", "server_name": f"r{i}"}) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            made = sorted(s.created_at for s in client.sandboxes())
            assert len(made) == 4
            gaps = [b - a for a, b in zip(made, made[1:], strict=False)]
            assert min(gaps) >= 490, gaps  # ms; the bucket refills a token every 500
            assert metric(proc.http, "idegym_client_start_wait_seconds_total")[client.client_id] > 0
    finally:
        proc.stop()


# -- two tenants ----------------------------------------------------------------------------------------


@pytest.fixture
def two_tenants(tmp_path: Path) -> Iterator[tuple[ControlPlaneProcess, dict[str, str], dict[str, str]]]:
    file = tmp_path / "tenants"
    tokens = {}
    for name in ("alice", "bob"):
        made = subprocess.run([sys.executable, "-m", "idegym_env.cli", "control-plane", "tenants", "add", name,
                               "--file", str(file)], capture_output=True, text=True, check=True)
        tokens[name] = made.stdout.strip()
    proc = ControlPlaneProcess(tmp_path / "state", [
        "--tenants", str(file), "--max-servers", "6", "--tenant-max-servers", "2", "--client-max-servers", "2",
        "--tenant-max-builds", "1", "--tenant-upload-bytes", "64Ki", "--warm-pool", "1", "--ephemeral"],
        build_roots=[])
    urls = {n: f"http://{n}:{t}@127.0.0.1:{proc.port}" for n, t in tokens.items()}
    yield proc, urls, tokens
    proc.stop()


@pytest.mark.security
def test_each_tenants_quotas_hold_under_a_burst_of_the_other(two_tenants, tmp_path: Path) -> None:
    """Alice bursts eight starts from two clients: she never holds more than her two sandboxes,
    the rest wait; Bob's starts meanwhile take their turn at once."""
    import httpx

    from idegym_env.client import IdeGymClient

    cp, urls, tokens = two_tenants
    alice_http = httpx.Client(base_url=cp.address, auth=("alice", tokens["alice"]))
    alice = [IdeGymClient(urls["alice"], name=f"alice-{i}") for i in range(2)]
    for client in alice:
        client.register()
    release = threading.Event()
    boxes: list = []
    errors: list[str] = []

    def burst(client: IdeGymClient, i: int) -> None:
        try:
            boxes.append(client.start(BUILTIN, reuse="NONE", server_name=f"a{i}"))
            release.wait(120)
            boxes[-1].stop()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(str(exc))

    threads = [threading.Thread(target=burst, args=(alice[i % 2], i)) for i in range(8)]
    for t in threads:
        t.start()
    peak = 0
    try:
        assert wait_until(lambda: sum(metric(alice_http, "idegym_client_starts_waiting").values()) == 6, 60)
        with IdeGymClient(urls["bob"], name="bob") as bob:
            started = time.monotonic()
            mine = [bob.start(BUILTIN, reuse="NONE", server_name=f"b{i}") for i in range(2)]
            assert time.monotonic() - started < 30
            assert [s.bash("echo bob").stdout for s in mine] == ["bob\n", "bob\n"]
            peak = int(sum(metric(alice_http, "idegym_client_servers").values()))
        release.set()
        while any(t.is_alive() for t in threads):
            peak = max(peak, int(sum(metric(alice_http, "idegym_client_servers").values())))
            time.sleep(0.1)
        assert errors == [] and len(boxes) == 8
        assert peak <= 2
    finally:
        release.set()
        for t in threads:
            t.join(120)
        for client in alice:
            client.close()
        alice_http.close()


@pytest.mark.security
def test_uploads_and_builds_are_each_tenants_own(two_tenants, tmp_path: Path) -> None:
    """An upload of Alice's is still missing for Bob (asking reveals nothing of hers), her upload
    quota is hers, and her builds wait for her own build turn, never Bob's."""
    import httpx

    from idegym_env.client import APIError, IdeGymClient

    cp, urls, tokens = two_tenants
    project = tmp_path / "project"
    project.mkdir()
    (project / "data.txt").write_text("alice's\n")
    big = tmp_path / "big"
    big.mkdir()
    (big / "blob.bin").write_bytes(b"\0" * (96 << 10))
    with IdeGymClient(urls["alice"], name="alice") as alice, IdeGymClient(urls["bob"], name="bob") as bob:
        digest = alice.upload(project)
        asked = httpx.post(f"{cp.address}/api/uploads/missing", json={"digests": [digest]},
                           auth=("bob", tokens["bob"]))
        assert asked.json()["missing"] == [digest]
        with pytest.raises(APIError) as refused:
            alice.upload(big)
        assert refused.value.status == 413 and "--tenant-upload-bytes" in refused.value.message
        assert bob.upload(project) == digest  # Bob sends it himself; his quota is his own

        two = {"images": [{"tag": f"a/{i}:1", "project": {"upload": digest}} for i in range(2)]}
        jobs = alice.build_images(json.dumps(two))
        waited = [j for j in jobs if "waiting for a build turn" in (j.details or "")]
        assert len(waited) == 1 and "tenant 'alice' holds 1 of 1 (--tenant-max-builds)" in waited[0].details
        job, = bob.build_images(json.dumps({"images": [{"tag": "b/0:1", "project": {"upload": digest}}]}))
        assert job.status == "success" and "waiting" not in (job.details or "")
