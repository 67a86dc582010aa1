"""Agents that bring their own loop (``IdeGym-Agent-v0``), in one run:

* the gateway's added latency per model call: a client inside a sandbox calls its episode's
  model endpoint, which the env (pass-through mode) forwards to a local OpenAI-compatible server;
  the same client on the host calls that server directly, in alternating rounds. Each side times
  its own calls; the difference of the medians is what the gateway adds (target <= 1 ms);
* where a call through the gateway goes (``_Hops``): the client and the env stamp each call on
  one clock, so each hop's median is printed and kept (``breakdown: ...`` figures), with the CPU
  the env's thread and the sandbox server spend per call and how often the server sleeps. What
  it showed (load 1.5-2.6): the env's thread spent 0.40-0.45 ms of CPU a call, ``http.client``
  (headers parsed by the ``email`` package; a request's head and body written apart, which woke
  the sandbox server twice: 6 writes for 3 exchanges) on both of its hops; the client's own HTTP
  connection (``client/_http.py``) made it 0.25-0.30 ms and the added median 0.88 -> 0.67 ms.
  The hops now (load ~2): client -> env 0.25 ms, the env's own work 0.05, its model-server round
  trip 0.21 (the direct client's: 0.18), env -> client 0.26. What is left is mostly four wake-ups
  a call the direct path does not have (the sandbox server's and the env's, each way): under
  load each waits for a core, so the added time grows with the load average;
* episodes per minute with 8 agents in parallel: 8 envs (mini-swe-agent, a scripted policy that
  fixes python-roman-numerals and submits), each on a thread of its own, graded.

Writes ``results/agent_gateway.json``.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from idegym_env.agents import Harness, LayerSpec
from idegym_env.agents.env import IdeGymAgentEnv
from idegym_env.embedded import EmbeddedControlPlane
from sandbox_server.models import AgentExchangeRequest, AgentExchangeResponse
from tests import agent_policies as policies

from ._call_breakdown import processes, sleeps
from ._common import Result, Stats, check_target, stats_table, table
from ._cpu import seconds_of

N = int(os.environ.get("BENCH_N", "200"))
AGENTS = int(os.environ.get("BENCH_AGENTS", "8"))
EPISODES = int(os.environ.get("BENCH_EPISODES", "2"))  # per agent
ROUNDS = 3

# The client: N chat-completion calls over one kept-alive connection, each timed; prints the times.
CLIENT = r"""
import http.client, json, os, sys, time, urllib.parse
url = urllib.parse.urlparse(os.environ["OPENAI_BASE_URL"])
conn = http.client.HTTPConnection(url.hostname, url.port)
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
headers = {"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
times, stamps = [], []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter()
    conn.request("POST", url.path + "/chat/completions", body, headers)
    resp = conn.getresponse(); resp.read()
    assert resp.status == 200, resp.status
    times.append(time.perf_counter() - t)
    stamps.append((t, t + times[-1]))
print("TIMES " + json.dumps(times))
print("STAMPS " + json.dumps(stamps))
"""

ANSWER = json.dumps({"id": "c", "object": "chat.completion", "model": "m",
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                  "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()


class _Model(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no 40 ms delayed-ACK stalls

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

    def log_message(self, *args: object) -> None:
        pass


WARM = 20  # the first calls of a round warm up


def _printed(stdout: str, what: str) -> list:
    line = next(x for x in stdout.splitlines() if x.startswith(what + " "))
    return json.loads(line[len(what) + 1:])[WARM:]


def _times(stdout: str) -> list[float]:
    return _printed(stdout, "TIMES")


class _Hops:
    """Where a call through the gateway spends its time, from timestamps the client (in the
    sandbox) and the env take on one clock (``perf_counter`` is ``CLOCK_MONOTONIC`` in every
    process of the host), and the CPU the sandbox server and the env's thread spend per call (user and
    system: a send on loopback runs the receiver's side of TCP too)."""

    PARTS = ("client -> endpoint -> exchange's answer -> env (sandbox server, Unix socket, env's parse)",
             "env: the call's body decoded and parsed, the payload built",
             "env <-> model server (its round trip, as the direct client's)",
             "env: recorded, the answer encoded",
             "env's reply -> sandbox server -> client (Unix socket, the server's parse, the endpoint's answer)")

    def __init__(self, env: IdeGymAgentEnv, n: int) -> None:
        self.n = n  # calls a round times (after the warm-up)
        self.arrived: list[float] = []  # a call's exchange returned
        self.replied: list[float] = []  # an exchange with its reply began
        self.upstream: list[tuple[float, float]] = []
        self.cpu: list[dict[str, float]] = []
        self.pids: dict[str, int] = {}
        exchange, upstream = env._call_exchange, env._upstream
        assert upstream is not None
        chat = upstream.chat

        def timed_exchange(request: AgentExchangeRequest) -> AgentExchangeResponse:
            if request.reply is not None:
                self.replied.append(time.perf_counter())
            answer = exchange(request)
            if answer.call is not None:
                self.arrived.append(time.perf_counter())
                if len(self.arrived) in (WARM, WARM + self.n):
                    self._snapshot()
            return answer

        def timed_chat(payload: dict) -> Any:
            started = time.perf_counter()
            answer = chat(payload)
            self.upstream.append((started, time.perf_counter()))
            return answer

        env._call_exchange = timed_exchange  # type: ignore[method-assign]
        upstream.chat = timed_chat  # type: ignore[method-assign]

    def _snapshot(self) -> None:
        if len(self.cpu) % 2 == 0:  # a round's first: its episode's sandbox server
            self.pids = {k: v for k, v in processes().items() if k == "sandbox server"}
        self.cpu.append({"env's thread": time.thread_time(), **seconds_of(self.pids),
                         **{f"{name} sleeps": sleeps(pid) for name, pid in self.pids.items()}})

    def round(self, stdout: str, calls: int) -> list[list[float]]:
        """Each part's time (seconds) of every call of a round after the warm-up."""
        stamps = _printed(stdout, "STAMPS")
        arrived, replied, upstream = self.arrived[WARM:], self.replied[WARM:], self.upstream[WARM:]
        assert len(stamps) == len(arrived) == len(upstream) == len(replied) == calls - WARM, \
            (len(stamps), len(arrived), len(upstream), len(replied))
        parts = [[a - c0 for (c0, _), a in zip(stamps, arrived, strict=True)],
                 [u0 - a for a, (u0, _) in zip(arrived, upstream, strict=True)],
                 [u1 - u0 for u0, u1 in upstream],
                 [r - u1 for (_, u1), r in zip(upstream, replied, strict=True)],
                 [c1 - r for (_, c1), r in zip(stamps, replied, strict=True)]]
        self.arrived, self.replied, self.upstream = [], [], []
        return parts

    def cpu_per_call(self) -> dict[str, float]:
        """ms (sleeps: count) per call, between the snapshots of each round."""
        out: dict[str, float] = {}
        for before, after in zip(self.cpu[::2], self.cpu[1::2], strict=True):
            for name in before:
                out[name] = out.get(name, 0.0) + after[name] - before[name]
        rounds = len(self.cpu) // 2
        return {name: v / (self.n * rounds) * (1 if "sleeps" in name else 1e3) for name, v in out.items()}


def latency(url: str, result: Result) -> None:
    """Rounds of the direct client and the client in the sandbox, alternated: both see the same
    host load (on a shared 2-core machine it swings from 1 to 15)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Model)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    model_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    per_round = max(N // ROUNDS, 1)
    client = Harness(name="latency-client", layer=LayerSpec("tmux-agent", drivers=("tmux_agent.py",)),
                     command=lambda inside: ["python3", "-c", CLIENT, str(per_round + WARM)], api="chat", version="1")
    env = IdeGymAgentEnv(policies.TASK, harness=client, control_plane_url=url, model_url=model_url,
                         upstream_params={}, max_calls=per_round + 100)
    direct: list[float] = []
    through: list[float] = []
    hops = _Hops(env, per_round)
    parts: list[list[float]] = [[] for _ in _Hops.PARTS]
    try:
        for _ in range(ROUNDS):
            out = subprocess.run(["python3", "-c", CLIENT, str(per_round + WARM)], capture_output=True, text=True,
                                 check=True, env={**os.environ, "OPENAI_BASE_URL": model_url, "OPENAI_API_KEY": "x"})
            direct += _times(out.stdout)
            _, info = env.run_episode()
            through += _times(info["agent"]["stdout"])
            for into, part in zip(parts, hops.round(info["agent"]["stdout"], per_round + WARM), strict=True):
                into += part
            result.figures["exchange"] = info.get("exchange")
    finally:
        env.close()
        server.shutdown()
        server.server_close()
    stats = [Stats.of("direct: host client -> model server", direct),
             Stats.of("through the gateway: sandbox client -> endpoint -> env -> model server", through)]
    result.stats += stats
    added = stats[1].median_ms - stats[0].median_ms
    result.figures["added_latency_ms_per_call"] = round(added, 3)
    result.figures["added_latency_ms_per_call_min"] = round(stats[1].min_ms - stats[0].min_ms, 3)
    result.figures["load_average"] = os.getloadavg()[0]
    result.targets["added_latency"] = check_target("gateway's added latency per model call (median)", added, 1.0)
    print(stats_table(stats, baseline=stats[0].label))
    rows = {name: statistics.median(p) * 1e3 for name, p in zip(_Hops.PARTS, parts, strict=True)}
    rows["(the parts' medians added up)"] = sum(rows.values())
    rows.update({f"{name} (count)" if "sleeps" in name else f"CPU of the {name}": v
                 for name, v in hops.cpu_per_call().items()})
    print(table(["where a call through the gateway goes (per call)", "ms"], [[k, v] for k, v in rows.items()]))
    result.figures.update({f"breakdown: {name}": round(v, 4) for name, v in rows.items()})
    print(f"added per call: median {added:.3f} ms, floor (min - min) "
          f"{result.figures['added_latency_ms_per_call_min']:.3f} ms; model calls went {result.figures['exchange']}; "
          f"load average {result.figures['load_average']:.1f}")


def throughput(url: str, result: Result) -> None:
    done: list[float] = []
    failures: list[str] = []

    def agent() -> None:
        env = IdeGymAgentEnv(policies.TASK, harness="mini-swe-agent", control_plane_url=url)
        try:
            for _ in range(EPISODES):
                env.reset()
                for reply in policies.mini_swe_agent():
                    _, reward, terminated, truncated, info = env.step(reply)
                    if terminated or truncated:
                        break
                (done if reward == 1.0 else failures).append(reward if reward == 1.0 else str(info)[:300])
        except Exception as exc:  # noqa: BLE001 - counted, reported
            failures.append(f"{type(exc).__name__}: {exc}")
        finally:
            env.close()

    threads = [threading.Thread(target=agent) for _ in range(AGENTS)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    minutes = (time.monotonic() - started) / 60
    per_minute = len(done) / minutes if minutes else 0.0
    result.figures.update(agents=AGENTS, episodes=len(done), failed=len(failures),
                          episodes_per_minute=round(per_minute, 2), wall_seconds=round(minutes * 60, 1))
    result.notes += failures[:5]
    print(f"{AGENTS} agents x {EPISODES} episodes (mini-swe-agent, scripted fix + submit): {len(done)} solved, "
          f"{len(failures)} failed, {per_minute:.2f} episodes/minute over {minutes * 60:.1f} s")


def run() -> Result:
    result = Result("agent_gateway", "IdeGym-Agent-v0: the gateway's added latency; episodes/minute, 8 agents")
    with EmbeddedControlPlane(warm_pool=0) as cp:
        latency(cp.url, result)
        if AGENTS:
            throughput(cp.url, result)
    for target in result.targets.values():
        print(target["text"])
    return result


if __name__ == "__main__":
    run().write()
    sys.exit(0)
