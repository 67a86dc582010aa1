"""Cost of one tool call, every way a user can make it, side by side in one run.

For bash ``true``, ``echo hello`` and a 1 MB output:

* raw subprocess in this process (the floor), alternated in blocks with the calls below (the
  isolated-call targets are their difference: both under the same load);
* our sandbox server, unsandboxed, called directly over its Unix socket (``Sandbox.connect``);
* a sandbox of the control plane (local backend: bubblewrap, tools as ``appuser``, started by the
  tool user's spawner as by default) called over its own socket, and the same sandbox through the
  control plane with our client (``Prefer: wait``: one round trip) and with a plain
  ``httpx.Client`` as a user writes it, interleaved: the difference is the forward's overhead
  (target 1 ms); over the raw subprocess, an isolated call (targets: 1.0 ms with our client,
  1.5 ms with httpx); then where one such call's time goes (``_call_breakdown.py``: the caller's
  CPU, the control plane's handler and sandbox round trip, the command's time in the sandbox,
  each process's CPU and sleeps per call), and the isolated call's overhead in shares: the
  sandbox's (its own socket over the raw subprocess), the forward's, and httpx's over our client;
* the same through another control plane whose servers have no spawner (``IDEGYM_TOOL_SPAWNER=0``:
  each tool starts the long way, through the as-user helper), interleaved with a raw subprocess;
* through the control plane with the published ``idegym-client`` 0.13.1 (202 and polling, as
  its users see it today; run in its own Python 3.12 venv);
* SWE-ReX's local server and client (``swe-rex``), stateless ``execute`` and a bash session.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from sandbox_server.models import BashCommandResponse

from ._call_breakdown import breakdown
from ._common import Result, Stats, check_target, interleaved, measure, stats_table, table
from ._servers import CLIENT_PYTHON, control_plane, sandbox_server, swerex_server

N = int(os.environ.get("BENCH_N", "200"))
# The raw subprocess and the calls through the sandbox alternate in blocks of this many: each
# measured under the same load, and a call's work after its answer (a server's bookkeeping) lands
# on the first call of the next block, not on every raw one.
BLOCK = 10
COMMANDS = {
    "true": "true",
    "echo": "echo hello",
    "1MB output": "head -c 1000000 /dev/zero | tr '\\0' x",
}

PUBLISHED_SCRIPT = r"""
import asyncio, json, sys, time, urllib.parse
from idegym.api.auth import BasicAuth
from idegym.api.orchestrator.servers import ServerReuseStrategy
from idegym.client import IdeGYMClient

async def main(url, commands, n):
    out = {}
    parts = urllib.parse.urlsplit(url)  # the control plane's token comes as the URL's credentials
    auth = BasicAuth(username=parts.username or "u", password=parts.password or "p")
    url = f"{parts.scheme}://{parts.hostname}:{parts.port}"
    async with IdeGYMClient(orchestrator_url=url, name="bench", namespace="idegym", auth=auth) as client:
        server = await client.start_server(image_tag="idegym/builtin:latest", reuse_strategy=ServerReuseStrategy.NONE)
        for label, cmd in commands.items():
            for _ in range(5):
                await server.execute_bash(cmd)
            samples = []
            for _ in range(n if label != "1MB output" else max(n // 4, 10)):
                t = time.perf_counter()
                await server.execute_bash(cmd)
                samples.append(time.perf_counter() - t)
            out[label] = samples
        await client.stop_server(server)
    print(json.dumps(out))

asyncio.run(main(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])))
"""


class PlainHttpx:
    """The forward called as a user of a plain ``httpx.Client`` writes it (kept alive, Basic auth,
    ``Prefer: wait``), the answer validated by the same wire model our client uses."""

    def __init__(self, url: str, auth: tuple[str, str] | None, client_id: str, server_id: int) -> None:
        import httpx

        self._http = httpx.Client(base_url=url, auth=auth)
        self._path = f"/api/forward/{client_id}/{server_id}/api/tools/bash"

    def bash(self, command: str) -> BashCommandResponse:
        response = self._http.post(self._path, json={"command": command}, headers={"Prefer": "wait=600"})
        response.raise_for_status()
        return BashCommandResponse.model_validate_json(response.content)

    def close(self) -> None:
        self._http.close()


def _raw(command: str) -> Callable[[], object]:
    return lambda: subprocess.run(["bash", "-c", command], capture_output=True, check=True)


def _n(label: str) -> int:
    return max(N // 4, 10) if label == "1MB output" else N


def run() -> Result:
    from idegym_env.client import IdeGymClient, Sandbox

    result = Result("tool_call",
                    "One tool call: raw subprocess, sandbox server, control plane, published client, SWE-ReX")
    samples: dict[str, dict[str, list[float]]] = {label: {} for label in COMMANDS}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        (tmp / "project").mkdir()
        (tmp / "state").mkdir()
        with sandbox_server(tmp / "project", tmp / "state") as sock:
            sandbox = Sandbox.connect(unix_socket=sock)
            for label, cmd in COMMANDS.items():
                samples[label]["sandbox server (direct)"] = measure(
                    f"sandbox server: {label}", lambda c=cmd: sandbox.bash(c), _n(label))
            sandbox.close()
        with control_plane(tmp / "cp", ["--warm-pool", "0"]) as url:
            with IdeGymClient(url, name="bench") as client:
                sandbox = client.start(reuse="NONE")
                # The same sandbox called over its own socket: what the forward adds, nothing else.
                sockets = sorted((tmp / "cp" / "run").glob("*.sock"))
                assert len(sockets) == 1, f"expected the one sandbox's socket, found {sockets}"
                inside = Sandbox.connect(unix_socket=str(sockets[0]))
                over_httpx = PlainHttpx(client.settings.url, client.settings.auth, client.client_id,
                                        sandbox.server_id)
                for label, cmd in COMMANDS.items():
                    both = interleaved({
                        "raw subprocess": _raw(cmd),
                        "sandboxed server (direct)": lambda c=cmd: inside.bash(c),
                        "control plane, Prefer: wait": lambda c=cmd: sandbox.bash(c),
                        "control plane via httpx": lambda c=cmd: over_httpx.bash(c),
                    }, _n(label), label=f"raw subprocess vs sandboxed server vs control plane: {label}", block=BLOCK)
                    samples[label] = {"raw subprocess": both.pop("raw subprocess"), **samples[label], **both}
                breakdowns = {
                    "our client": breakdown(lambda: sandbox.bash("true").duration_seconds, N, client.settings.url,
                                            client.settings.auth),
                    "plain httpx": breakdown(lambda: over_httpx.bash("true").duration_seconds, N,
                                             client.settings.url, client.settings.auth),
                }
                inside.close()
                over_httpx.close()
                sandbox.stop()
            if CLIENT_PYTHON.exists():
                print("  published idegym-client 0.13.1 (202 + polling) ...", flush=True)
                proc = subprocess.run([str(CLIENT_PYTHON), "-c", PUBLISHED_SCRIPT, url, json.dumps(COMMANDS),
                                       str(min(N, 100))], capture_output=True, text=True, timeout=900)
                if proc.returncode == 0:
                    for label, values in json.loads(proc.stdout.strip().splitlines()[-1]).items():
                        samples[label]["control plane, published client (202 + poll)"] = values
                else:
                    result.notes.append(f"published client run failed: {proc.stderr[-500:]}")
            else:
                result.notes.append("published client not measured: .venv-client missing (make client-venv)")
        _without_tool_spawner(tmp, samples)
        try:
            _swerex(samples)
        except ImportError:
            result.notes.append("SWE-ReX not measured: pip install swe-rex")
        except Exception as exc:  # noqa: BLE001 - a comparison's failure (its session times out under load) keeps ours
            result.notes.append(f"SWE-ReX not measured: {type(exc).__name__}: {exc}")
            for by_method in samples.values():
                for name in [n for n in by_method if n.startswith("SWE-ReX")]:
                    del by_method[name]  # a mode cut off half-way
    for label, by_method in samples.items():
        stats = [Stats.of(f"{method}: {label}", s) for method, s in by_method.items()]
        result.stats += stats
        print(f"\nbash {label!r}:")
        print(stats_table(stats, baseline=f"raw subprocess: {label}"))
        base = by_method["raw subprocess"]
        for stat in stats[1:]:
            result.figures[f"{stat.label} overhead ms"] = round(stat.median_ms - Stats.of("", base).median_ms, 3)
    direct = Stats.of("", samples["true"]["sandboxed server (direct)"]).median_ms
    via = Stats.of("", samples["true"]["control plane, Prefer: wait"]).median_ms
    target = check_target("control-plane forward overhead over a direct call to the same sandbox (median, bash true)",
                          via - direct, 1.0)
    result.targets["forward_overhead"] = target
    raw = Stats.of("", samples["true"]["raw subprocess"]).median_ms
    isolated = check_target("isolated call through the control plane with our client over a raw subprocess "
                            "(median, bash true)", via - raw, 1.0)
    result.targets["isolated_call_overhead"] = isolated
    plain = Stats.of("", samples["true"]["control plane via httpx"]).median_ms
    isolated_httpx = check_target("isolated call through the control plane with a plain httpx.Client over a raw "
                                  "subprocess (median, bash true)", plain - raw, 1.5)
    result.targets["isolated_call_overhead_httpx"] = isolated_httpx
    # The long way, for comparison (no target: it is what the spawner saves).
    again = Stats.of("", samples["true"]["raw subprocess (again)"]).median_ms
    long_way = Stats.of("", samples["true"][LONG_WAY]).median_ms - again
    result.figures["isolated call overhead, no spawner (the long way), over the raw subprocess ms"] = round(long_way, 3)
    raw_mean = Stats.of("", samples["true"]["raw subprocess"]).mean_ms
    rows = [[part] + [round(b[part], 3) for b in breakdowns.values()] for part in next(iter(breakdowns.values()))]
    rows.append(["raw subprocess (mean, the interleaved row)"] + [round(raw_mean, 3)] * len(breakdowns))
    print("\nwhere one call's time goes (bash true through the control plane; ms per call, means of "
          f"{N} calls in a row):")
    print(table(["part", *breakdowns], rows))
    for caller, parts in breakdowns.items():
        for part, value in parts.items():
            result.figures[f"breakdown, {caller}: {part} ms"] = round(value, 3)
    # Each share the difference of two interleaved medians: what a target needs cut, and where.
    shares = {
        "the sandbox: its own socket, over the raw subprocess": direct - raw,
        "the forward: through the control plane with our client, over its own socket": via - direct,
        "httpx: a plain httpx.Client through the control plane, over our client": plain - via,
    }
    print("\nthe isolated call's overhead by share (bash true; differences of the interleaved rows' medians):")
    print(table(["share", "ms"], [[share, round(value, 3)] for share, value in shares.items()]))
    for share, value in shares.items():
        result.figures[f"isolated call share, {share} ms"] = round(value, 3)
    print("\n" + "\n".join(t["text"] for t in (target, isolated, isolated_httpx)))
    print(f"the same without the tool spawner (each tool the long way, through the as-user helper), over the raw "
          f"subprocess interleaved with it: {long_way:.3f} ms (no target)")
    return result


LONG_WAY = "control plane, Prefer: wait, no spawner (the long way)"


def _without_tool_spawner(tmp: Path, samples: dict[str, dict[str, list[float]]]) -> None:
    """The control-plane call again, its servers without the tool user's spawner (--no-tool-spawner:
    each tool started the long way, through ``native/idegym-as-user``), interleaved with the raw
    subprocess once more."""
    from idegym_env.client import IdeGymClient

    os.environ["IDEGYM_TOOL_SPAWNER"] = "0"  # passed on to the control plane's servers
    try:
        with control_plane(tmp / "cp-long-way", ["--warm-pool", "0"]) as url, IdeGymClient(url, name="bench") as client:
            sandbox = client.start(reuse="NONE")
            for label, cmd in COMMANDS.items():
                samples[label].update(interleaved({
                    "raw subprocess (again)": _raw(cmd),
                    LONG_WAY: lambda c=cmd: sandbox.bash(c),
                }, _n(label), label=f"control plane without the tool spawner: {label}"))
            sandbox.stop()
    finally:
        del os.environ["IDEGYM_TOOL_SPAWNER"]


def _swerex(samples: dict[str, dict[str, list[float]]]) -> None:
    from swerex.runtime.abstract import BashAction, Command, CreateBashSessionRequest
    from swerex.runtime.remote import RemoteRuntime

    with swerex_server() as (port, token):
        async def main() -> None:
            runtime = RemoteRuntime(host="http://127.0.0.1", port=port, auth_token=token)
            await runtime.create_session(CreateBashSessionRequest())
            for label, cmd in COMMANDS.items():
                for mode in ("execute", "session"):
                    async def call(c: str = cmd, m: str = mode) -> None:
                        if m == "execute":
                            await runtime.execute(Command(command=c, shell=True))
                        else:
                            await runtime.run_in_session(BashAction(command=c, timeout=60))
                    for _ in range(5):
                        await call()
                    out = []
                    n = _n(label) if mode == "execute" else min(_n(label), 50)
                    for _ in range(n):
                        t = asyncio.get_running_loop().time()
                        await call()
                        out.append(asyncio.get_running_loop().time() - t)
                    name = "SWE-ReX execute" if mode == "execute" else "SWE-ReX bash session"
                    samples[label][name] = out
            await runtime.close()

        print("  SWE-ReX server and client ...", flush=True)
        asyncio.run(main())


if __name__ == "__main__":
    run().write()
