"""The control plane as a target (``docs/security.md`` §4): credentials by default, build sources only from
allowed directories, no git argument injection, nesting and memory limits on request bodies,
slow-header connections closed.

Can fail: each test was run against the code before its fix and failed there — anonymous calls
were answered 200, a root-only directory was built into an image, ``ref:
--pathspec-from-file=<file>`` put the file's content into the job log, a 200,000-deep JSON array
was a 500, a connection that never finished its headers stayed open.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cp_helpers import ControlPlaneProcess

CAN_ISOLATE = os.geteuid() == 0 and shutil.which("bwrap") is not None
DEEP = b"[" * 200_000 + b"]" * 200_000


def _log(cp: ControlPlaneProcess) -> str:
    return cp.log_path.read_text(errors="replace")


# -- credentials ------------------------------------------------------------------------------------


@pytest.mark.security
def test_credentials_are_required_by_default(tmp_path: Path) -> None:
    """With no ``--auth``, a random token is made ``0600`` in the state directory on first start
    and kept across restarts; every route but /health needs it as HTTP Basic credentials."""
    state = tmp_path / "state"
    cp = ControlPlaneProcess(state, ["--warm-pool", "0", "--ephemeral"])
    try:
        token_file = state / "token"
        assert token_file.is_file(), "no token was made in the state directory"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert len(token) >= 32 and cp.auth == ("idegym", token)
        anonymous = httpx.post(f"{cp.address}/api/clients", json={"name": "x", "nodes_count": 0}, timeout=30)
        assert anonymous.status_code == 401, anonymous.text
        assert str(token_file) in anonymous.json()["message"]  # says where the credentials are
        wrong = httpx.get(f"{cp.address}/api/idegym-servers", params={"client_id": "x"}, auth=("idegym", "nope"),
                          timeout=30)
        assert wrong.status_code == 401
        assert httpx.get(f"{cp.address}/health", timeout=30).status_code == 200
        assert cp.register("with-token")  # cp.http sends the token
        assert token not in _log(cp)
    finally:
        cp.stop()
    again = ControlPlaneProcess(state, ["--warm-pool", "0", "--ephemeral"])
    try:
        assert again.auth == ("idegym", token), "a restart on the same state keeps the token"
    finally:
        again.stop()


def test_auth_none_is_explicit_and_loud(tmp_path: Path) -> None:
    cp = ControlPlaneProcess(tmp_path / "state", ["--warm-pool", "0", "--ephemeral", "--auth", "none"])
    try:
        assert cp.auth is None and not (tmp_path / "state" / "token").exists()
        assert httpx.post(f"{cp.address}/api/clients", json={"name": "x", "nodes_count": 0},
                          timeout=30).status_code == 200
        assert "AUTHENTICATION IS OFF" in _log(cp)
    finally:
        cp.stop()


def test_a_token_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "token").write_text("leaked-token-value-0123456789abcdef\n")
    os.chmod(state / "token", 0o644)
    with pytest.raises(RuntimeError, match="readable by others"):
        ControlPlaneProcess(state, ["--warm-pool", "0", "--ephemeral"]).stop()  # stop: reached only if it started


def test_our_client_finds_the_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the URL, in ``$IDEGYM_TOKEN_FILE``, or (loopback only) in the default state directory."""
    from idegym_env.client import Settings

    for name in ("IDEGYM_URL", "IDEGYM_AUTH_USERNAME", "IDEGYM_AUTH_PASSWORD", "IDEGYM_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    state = tmp_path / "state"
    state.mkdir()
    (state / "token").write_text("tok-123\n")
    os.chmod(state / "token", 0o600)
    monkeypatch.setenv("IDEGYM_CONTROL_PLANE_STATE_DIR", str(state))

    in_url = Settings.resolve("http://idegym:abc%2Fdef@127.0.0.1:9")
    assert (in_url.url, in_url.auth) == ("http://127.0.0.1:9", ("idegym", "abc/def"))
    assert "abc" not in repr(in_url)
    assert Settings.resolve("http://127.0.0.1:9").auth == ("idegym", "tok-123")
    assert Settings.resolve("http://localhost:9", auth=("u", "p")).auth == ("u", "p")
    assert Settings.resolve("https://cp.example.org").auth is None, "the local token never goes elsewhere"
    monkeypatch.setenv("IDEGYM_AUTH_USERNAME", "env-user")
    monkeypatch.setenv("IDEGYM_AUTH_PASSWORD", "env-pw")
    assert Settings.resolve("http://127.0.0.1:9").auth == ("env-user", "env-pw")
    monkeypatch.delenv("IDEGYM_AUTH_USERNAME")
    other = tmp_path / "other-token"
    other.write_text("tok-456\n")
    monkeypatch.setenv("IDEGYM_TOKEN_FILE", str(other))
    assert Settings.resolve("https://cp.example.org").auth == ("idegym", "tok-456")


def test_the_embedded_control_plane_hands_out_its_credentials(tmp_path: Path) -> None:
    from idegym_env.client import IdeGymClient
    from idegym_env.embedded import EmbeddedControlPlane

    (tmp_path / "state").mkdir()
    with EmbeddedControlPlane(warm_pool=0, state_dir=tmp_path / "state") as cp:
        assert cp.auth is not None and cp.auth[1] in cp.url and cp.auth[1] not in cp.address
        assert httpx.get(f"{cp.address}/api/idegym-servers", params={"client_id": "x"},
                         timeout=30).status_code == 401
        client = IdeGymClient(cp.url, name="embedded-user")
        try:
            assert client.settings.url == cp.address and client.settings.auth == cp.auth
        finally:
            client.close()


# -- build sources ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("build-sources")
    allowed, secret = base / "allowed", base / "secret"
    (allowed / "project").mkdir(parents=True)
    (allowed / "project" / "hello.txt").write_text("hello\n")
    secret.mkdir(mode=0o700)
    (secret / "id_rsa").write_text("SECRET-MARKER-3b1f\n")
    os.chmod(secret / "id_rsa", 0o600)
    with tarfile.open(secret / "project.tar.gz", "w:gz") as tar:
        tar.add(secret / "id_rsa", arcname="id_rsa")
    os.symlink(secret, allowed / "link-to-secret")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    for repo in (allowed / "repo", secret / "repo"):
        repo.mkdir()
        subprocess.run([*git, "init", "-q", str(repo)], check=True)
        (repo / "a.txt").write_text("a\n")
        subprocess.run([*git, "-C", str(repo), "add", "a.txt"], check=True)
        subprocess.run([*git, "-C", str(repo), "commit", "-q", "-m", "a"], check=True)
    return {"allowed": allowed, "secret": secret}


@pytest.fixture(scope="module")
def builder_cp(tmp_path_factory: pytest.TempPathFactory, dirs: dict[str, Path]) -> Iterator[ControlPlaneProcess]:
    proc = ControlPlaneProcess(tmp_path_factory.mktemp("builder-cp") / "state", ["--warm-pool", "0", "--ephemeral"],
                               build_roots=[dirs["allowed"]])
    yield proc
    proc.stop()


def _build(cp: ControlPlaneProcess, image: dict[str, Any]) -> httpx.Response:
    return cp.http.post("/api/build-push-images", json={"yaml_content": json.dumps({"images": [image]})})


def _job(cp: ControlPlaneProcess, name: str, timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = cp.http.get(f"/api/jobs/status/{name}").json()
        if job["status"] != "in_progress" and not str(job.get("details", "")).startswith("queued"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {name} did not end in {timeout} s")


@pytest.mark.security
def test_builds_read_only_allowed_directories(builder_cp: ControlPlaneProcess, dirs: dict[str, Path]) -> None:
    """A project path, an archive, a ``file://`` or local git repository, a Dockerfile context, a
    symlink out of an allowed directory: outside ``--build-root`` each is 403 before anything is
    read; inside, the build works."""
    secret, allowed = dirs["secret"], dirs["allowed"]
    refused = [{"name": "p", "project": {"path": str(secret)}},
               {"name": "a", "project": {"archive": str(secret / "project.tar.gz")}},
               {"name": "g", "project": {"git": f"file://{secret}/repo"}},
               {"name": "l", "project": {"git": f"{secret}/repo"}},
               {"name": "s", "project": {"path": str(allowed / "link-to-secret")}},
               {"name": "u", "plugins": [{"type": "project", "source": "local", "path": str(secret)}]},
               {"name": "c", "context": str(secret), "commands": ["true"]}]
    for image in refused:
        response = _build(builder_cp, image)
        assert response.status_code == 403, (image, response.status_code, response.text)
        assert "--build-root" in response.json()["message"]
    ok = _build(builder_cp, {"name": "ok", "project": {"path": str(allowed / "project")}})
    assert ok.status_code == 200, ok.text
    job = _job(builder_cp, ok.json()["job_names"][0])
    assert job["status"] == "success", job
    git_ok = _build(builder_cp, {"name": "gitok", "project": {"git": f"file://{allowed}/repo"}})
    assert git_ok.status_code == 200, git_ok.text
    assert _job(builder_cp, git_ok.json()["job_names"][0])["status"] == "success"


@pytest.mark.security
def test_no_build_roots_by_default(tmp_path: Path, dirs: dict[str, Path]) -> None:
    cp = ControlPlaneProcess(tmp_path / "state", ["--warm-pool", "0", "--ephemeral"], build_roots=[])
    try:
        response = _build(cp, {"name": "p", "project": {"path": str(dirs["allowed"] / "project")}})
        assert response.status_code == 403, response.text
        assert "allowed: none" in response.json()["message"]
    finally:
        cp.stop()


@pytest.mark.security
def test_git_refs_and_urls_are_never_options(builder_cp: ControlPlaneProcess, dirs: dict[str, Path]) -> None:
    """``ref: --pathspec-from-file=<host file>`` put the file's content into the job log; a URL
    starting with '-' is an option too (``--upload-pack`` runs a command); ``ext::`` runs one."""
    marker = "SECRET-MARKER-3b1f"
    repo = f"file://{dirs['allowed']}/repo"
    attacks = [{"git": repo, "ref": f"--pathspec-from-file={dirs['secret'] / 'id_rsa'}"},
               {"git": f"--upload-pack=cat {dirs['secret'] / 'id_rsa'}"},
               {"git": f"ext::sh -c cat% {dirs['secret'] / 'id_rsa'}"}]
    for project in attacks:
        response = _build(builder_cp, {"name": "inject", "project": project})
        text = response.text
        if response.status_code == 200:
            text += json.dumps(_job(builder_cp, response.json()["job_names"][0]))
        assert marker not in text, (project, text[-500:])
        assert response.status_code == 400, (project, response.status_code, text[-500:])
        assert "'-'" in text or "transport" in text


# -- input limits -----------------------------------------------------------------------------------


@pytest.mark.security
def test_deep_json_is_a_422_that_says_the_limit(builder_cp: ControlPlaneProcess) -> None:
    """A 200,000-deep array: 422 naming the nesting limit from every JSON route, the forward
    (waited for or not) and the sandbox server behind it; a deep build YAML and a YAML alias
    bomb are refused too."""
    cp = builder_cp
    headers = {"content-type": "application/json"}
    for path in ("/api/clients", "/api/idegym-servers", "/api/build-push-images", "/execute"):
        response = cp.http.post(path, content=DEEP, headers=headers)
        assert response.status_code == 422, (path, response.status_code, response.text[:300])
        assert "deeper than the limit of 100 levels" in response.json()["message"]
    client_id = cp.register("deep")
    server_id = cp.start_server(client_id)["server_id"]
    forward = f"/api/forward/{client_id}/{server_id}/api/tools/bash"
    waited = cp.http.post(forward, content=DEEP, headers={**headers, "Prefer": "wait=60"})
    assert waited.status_code == 422 and "limit of 100 levels" in waited.text, waited.text[:300]
    env_bomb = b'{"command": "true", "env": {"A": ' + DEEP + b"}}"
    recorded = cp.http.post(forward, content=env_bomb, headers=headers)  # the request history parses env
    assert recorded.status_code == 202
    op = cp.wait_op(recorded.json()["async_operation_id"])
    assert op["status"] == "FAILED" and "limit of 100 levels" in op["result"], op["result"][:300]
    assert cp.bash(client_id, server_id, "echo alive")["stdout"] == "alive\n"
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8)) + "images: [{name: bomb, env: {X: *i}}]\n"
    for yaml_text in ("images:\n - project: " + "[" * 100_000 + "]" * 100_000, bomb):
        response = cp.http.post("/api/build-push-images", json={"yaml_content": yaml_text})
        assert response.status_code == 400, (response.status_code, response.text[:300])


def _slow_head(address: tuple[str, int], limit: float) -> float:
    """Send a request head one byte every 0.2 s; seconds until the server has closed the
    connection (a send fails), or ``limit`` if it never does."""
    sock = socket.create_connection(address, timeout=limit)
    started = time.monotonic()
    try:
        for byte in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10_000:
            if time.monotonic() - started > limit:
                return limit
            sock.sendall(bytes([byte]))
            time.sleep(0.2)
    except OSError:  # EPIPE/ECONNRESET once the server closed its end
        return time.monotonic() - started
    finally:
        sock.close()
    return limit


@pytest.mark.security
def test_slow_header_connections_are_closed(tmp_path: Path, project: Path) -> None:
    """A client that trickles its request head is cut off after the header timeout, on the
    control plane and on the sandbox server; a client that idles between requests and then
    sends a whole request is still served.

    Can fail: before the fix both kept such a connection open for as long as bytes came (the
    control plane's keep-alive timer is an hour by default; the sandbox server had none)."""
    from tests.helpers import SandboxProcess

    cp = ControlPlaneProcess(tmp_path / "state", ["--warm-pool", "0", "--ephemeral", "--header-timeout", "2"])
    sandbox = SandboxProcess(project, "tcp", tmp_path, env={**os.environ, "IDEGYM_SERVER_HEADER_TIMEOUT": "2"})
    try:
        for address in (("127.0.0.1", cp.port), ("127.0.0.1", sandbox.port)):
            seconds = _slow_head(address, limit=30)
            assert 1.5 <= seconds < 15, (address, seconds)
        health = cp.http.get("/health")  # a new, normal request is answered
        assert health.status_code == 200
        assert health.headers["keep-alive"] == "timeout=2"  # how long it may idle, for clients to stay within
        assert sandbox.client.get("/api/health").status_code == 200
        time.sleep(3)  # idle past the timeout: the next call reconnects or reuses, never fails
        assert cp.http.get("/health").status_code == 200
        assert sandbox.client.get("/api/health").status_code == 200
    finally:
        sandbox.stop()
        cp.stop()


def test_a_request_that_arrives_as_its_connection_idles_out_is_served_not_reset() -> None:
    """The idle timer and a request's bytes can fall in one turn of a busy event loop, the timer
    first: the request, sent in time, sits unread when the connection's deadline is checked. It is
    served. Can fail: closing then (as before) resets it (``ConnectionResetError`` in the client,
    seen at 128 rollouts in flight in ``benchmarks/grpo.py``)."""
    import asyncio

    from aiohttp import web

    from control_plane.forward_protocol import Forwarding, Sites

    async def main() -> bytes:
        app = web.Application()

        async def health(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        app.router.add_get("/health", health)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        # A HEAD request is never a forward (it goes to aiohttp as it comes), so no control plane is asked.
        forwarding = Forwarding(app, None, None, None, None)  # type: ignore[arg-type]
        sites = Sites(runner, forwarding, header_timeout=0.5)
        port = await sites.tcp("127.0.0.1", 0)
        loop = asyncio.get_running_loop()
        client = socket.create_connection(("127.0.0.1", port))
        try:
            while not forwarding.connections:
                await asyncio.sleep(0.01)
            (conn,) = forwarding.connections
            deadline = conn._deadline

            def busy() -> None:  # the loop stalls through the deadline; nothing is sent yet
                time.sleep(deadline - loop.time() + 0.05)

            def send() -> None:  # due with the idle timer in the next turn, ahead of it
                client.sendall(b"HEAD /health HTTP/1.1\r\nHost: cp\r\n\r\n")
                time.sleep(0.02)  # in the server's socket before the timer runs

            loop.call_at(deadline - 0.2, busy)
            loop.call_at(deadline - 0.01, send)
            client.settimeout(10)
            return await loop.run_in_executor(None, client.recv, 4096)
        finally:
            client.close()
            sites.close()
            await runner.cleanup()

    answer = asyncio.run(main())
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer


def test_a_forwards_answer_says_how_long_its_connection_may_idle() -> None:
    from control_plane.app import Relayed
    from control_plane.forward_protocol import encode_answer

    relayed = Relayed(200, {"X-Exit-Code": "0"}, b"{}", "application/json")
    kept = encode_answer(relayed, 15.0).split(b"\r\n\r\n")[0].split(b"\r\n")
    assert b"Keep-Alive: timeout=15" in kept and b"Connection: close" not in kept
    closed = encode_answer(relayed, None).split(b"\r\n\r\n")[0].split(b"\r\n")
    assert b"Connection: close" in closed and not any(line.startswith(b"Keep-Alive") for line in closed)


# -- the network of a sandbox allowed one -----------------------------------------------------------

PROBE = r'''python3 - <<'EOF'
import socket
for name, fam, addr in %s:
    s = socket.socket(getattr(socket, fam), socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect(tuple(addr) if fam == "AF_INET" else addr)
    except OSError as exc:
        print("blocked", name, exc.errno)
        continue
    try:
        s.settimeout(1)
        banner = s.recv(64).decode(errors="replace").strip()
    except OSError:
        banner = ""
    print("CONNECTED", name, banner)
    s.close()
EOF'''

def _host_interface_address() -> str:
    """An address of the host on a real interface (what a machine next to it would connect to)."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True,
                         check=True).stdout
    addresses = [line.split()[3].split("/")[0] for line in out.splitlines()
                 if not line.split()[3].startswith(OUTSIDE_NET[0])]
    assert addresses, out
    return addresses[0]


OUTSIDE_NET = ("198.18.213.1", "198.18.213.2")  # RFC 2544 benchmarking range: never routed anywhere


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A listener in a network namespace of its own, joined to the host's by a veth pair: what
    "the outside" looks like without sending a packet beyond this machine."""
    if not (shutil.which("ip") and os.geteuid() == 0):
        pytest.skip("needs root and iproute2 to make a namespace for the outside listener")
    name = f"idgo{os.getpid() % 100000}"
    host_end, far_end = f"{name}h", f"{name}o"
    steps = [["ip", "netns", "add", name], ["ip", "link", "add", host_end, "type", "veth", "peer", "name", far_end],
             ["ip", "link", "set", far_end, "netns", name],
             ["ip", "addr", "add", f"{OUTSIDE_NET[0]}/30", "dev", host_end], ["ip", "link", "set", host_end, "up"],
             ["ip", "netns", "exec", name, "ip", "addr", "add", f"{OUTSIDE_NET[1]}/30", "dev", far_end],
             ["ip", "netns", "exec", name, "ip", "link", "set", far_end, "up"]]
    server = None
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        script = (f"import socket\ns = socket.socket()\ns.bind(({OUTSIDE_NET[1]!r}, 0))\ns.listen(16)\n"
                  "print(s.getsockname()[1], flush=True)\n"
                  "while True:\n    c, _ = s.accept()\n    c.sendall(b'hello-from-outside')\n    c.close()\n")
        server = subprocess.Popen(["ip", "netns", "exec", name, "python3", "-c", script], stdout=subprocess.PIPE,
                                  text=True)
        assert server.stdout is not None
        yield OUTSIDE_NET[1], int(server.stdout.readline())
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "netns", "del", name], capture_output=True)  # takes the veth pair along
        subprocess.run(["ip", "link", "del", host_end], capture_output=True)


@pytest.mark.security
@pytest.mark.skipif(not CAN_ISOLATE or shutil.which("slirp4netns") is None,
                    reason="needs root, bubblewrap and slirp4netns")
def test_a_networked_sandbox_reaches_out_but_not_the_host_or_its_neighbours(
        tmp_path: Path, outside: tuple[str, int]) -> None:
    """With network, a sandbox has a namespace of its own behind user-mode networking: it
    reaches a listener outside the host's namespace, but not the host's loopback (directly or
    through the gateway), the host's abstract Unix sockets, nor a listener of another networked
    sandbox; and its slirp4netns ends with it.

    Can fail: before, such a sandbox shared the host's network namespace — the probe connected
    to the host's loopback listener and saw the host's sockets in /proc/net/tcp."""
    from control_plane.backends.local import LocalBackend
    from sandbox_server import procfs
    from tests.local_helpers import LoopThread, bash, leftovers, spec

    loopback = socket.socket()
    loopback.bind(("127.0.0.1", 0))
    loopback.listen(16)
    abstract = socket.socket(socket.AF_UNIX)
    abstract_name = f"\0idegym-net-{os.getpid()}"
    abstract.bind(abstract_name)
    abstract.listen(16)
    port = loopback.getsockname()[1]
    wide = socket.socket()  # a host service on every address, as a trainer's Ray GCS listens
    wide.bind(("0.0.0.0", 0))
    wide.listen(16)
    wide_port = wide.getsockname()[1]
    interface = _host_interface_address()
    # The port b listens on in its sandbox, held on the host without a listener: bound, so no other
    # process here takes it (another test's server did, once), and refusing connections.
    held = socket.socket()
    held.bind(("0.0.0.0", 0))
    neighbour_port = held.getsockname()[1]
    targets = [("outside", "AF_INET", list(outside)), ("host-loopback", "AF_INET", ["127.0.0.1", port]),
               ("host-veth-address", "AF_INET", [OUTSIDE_NET[0], wide_port]),
               ("host-interface-address", "AF_INET", [interface, wide_port]),
               ("gateway-to-host-loopback", "AF_INET", ["10.0.2.2", port]),
               ("abstract", "AF_UNIX", abstract_name), ("neighbour", "AF_INET", ["10.0.2.100", neighbour_port])]
    probe = PROBE % json.dumps(targets)
    control = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60).stdout
    assert "CONNECTED outside hello-from-outside" in control and "CONNECTED host-loopback" in control, control
    assert "CONNECTED host-veth-address" in control and "CONNECTED host-interface-address" in control, control

    loop = LoopThread()
    backend = LocalBackend(tmp_path / "state", isolation="bwrap", network=True)
    loop.run(backend.start())
    handles = []
    slirps: list = []
    try:
        for name in ("net-a", "net-b"):
            handles.append(loop.run(backend.create(spec(name), 120)))
        a, b = handles
        neighbour = ("setsid python3 -c \"import socket; s = socket.socket(); "
                     f"s.bind(('0.0.0.0', {neighbour_port})); "
                     "s.listen(8)\nwhile True: s.accept()[0].close()\" >/dev/null 2>&1 & "
                     f"for i in $(seq 600); do (: > /dev/tcp/127.0.0.1/{neighbour_port}) 2>/dev/null && break; "
                     "sleep 0.05; done")  # until it listens
        assert bash(b, neighbour)["exit_code"] == 0
        itself = [("self", "AF_INET", ["127.0.0.1", neighbour_port])]
        assert "CONNECTED" in bash(b, PROBE % json.dumps(itself))["stdout"]
        seen = bash(a, probe + f"\ngrep -ci ':{port:04X} ' /proc/net/tcp || true")["stdout"]
        assert "CONNECTED outside hello-from-outside" in seen, seen
        for target in ("host-loopback", "gateway-to-host-loopback", "abstract", "neighbour", "host-veth-address",
                       "host-interface-address"):
            assert f"blocked {target}" in seen, (target, seen)
        assert seen.split()[-1] == "0", "the host's sockets are not in the sandbox's /proc/net/tcp"
        with pytest.raises(OSError):
            # nor is b's listener on the host
            socket.create_connection(("127.0.0.1", neighbour_port), timeout=2).close()
        slirps = [h.data["net"] for h in handles]
        assert all(procfs.recorded_alive(rec) and b"slirp4netns" in Path(f"/proc/{rec[0]}/cmdline").read_bytes()
                   for rec in slirps), slirps
        if a.data.get("cgroups"):  # with the server, out of the tools' OOM killer's reach
            for h, rec in zip(handles, slirps, strict=True):
                memory = next(line.split(":", 2)[2] for line in Path(f"/proc/{rec[0]}/cgroup").read_text().split()
                              if "memory" in line.split(":", 2)[1].split(","))
                assert memory.endswith(f"/{h.name}/server"), memory
    finally:
        for h in handles:
            loop.run(backend.delete(h))
        loop.run(backend.close())
        loop.close()
        loopback.close()
        wide.close()
        held.close()
        abstract.close()
    assert all(leftovers(h) == [] for h in handles)
    assert not any(procfs.recorded_alive(rec) for rec in slirps), "slirp4netns outlived its sandbox"


# -- large bodies -----------------------------------------------------------------------------------


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} in /proc/{pid}/status")


@pytest.mark.security
def test_large_bodies_are_bounded_in_memory(tmp_path: Path) -> None:
    """Four concurrent 48 MB forwards with a 192 MiB body budget (3 copies of each counted): the
    control plane's memory grows by about one body's worth, not four, all four are answered,
    and the memory comes back; a body that could never fit is a 413 that says so.

    Can fail: before the budget each forward held its body about four times over at once (its
    read, its decoded copy for the request history, the encoded request, the socket buffer):
    4 × 200 MB took the control plane from 61 MB to 1662 MB."""
    import threading

    mib = 1 << 20
    cp = ControlPlaneProcess(tmp_path / "state", ["--warm-pool", "0", "--ephemeral", "--body-budget", str(192 * mib)])
    try:
        client_id = cp.register("big")
        server_id = cp.start_server(client_id)["server_id"]
        target = f"/api/forward/{client_id}/{server_id}/api/no-such-route"
        headers = {"content-type": "application/json", "Prefer": "wait=600"}
        body = b'{"content": "' + b"x" * (48 * mib) + b'"}'
        base = _status_kib(cp.proc.pid, "VmRSS")
        statuses: list[int] = []

        def send() -> None:
            with httpx.Client(base_url=cp.address, auth=cp.auth, timeout=600) as http:
                statuses.append(http.post(target, content=body, headers=headers).status_code)

        threads = [threading.Thread(target=send) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(600)
        assert statuses == [404] * 4, statuses  # the sandbox's own answer, for each
        grown_mib = (_status_kib(cp.proc.pid, "VmHWM") - base) / 1024
        assert grown_mib < 250, f"the control plane grew by {grown_mib:.0f} MiB for 4 × 48 MB bodies"
        assert wait_for_rss(cp.proc.pid, base + 64 * 1024), "the memory did not come back"
        too_big = cp.http.post(target, content=b"x" * (65 * mib), headers=headers)
        assert too_big.status_code == 413 and "--body-budget" in too_big.json()["message"], too_big.text[:300]
        assert cp.bash(client_id, server_id, "echo fine")["stdout"] == "fine\n"
    finally:
        cp.stop()


def wait_for_rss(pid: int, kib: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _status_kib(pid, "VmRSS") <= kib:
            return True
        time.sleep(0.2)
    return False


def test_the_body_budget_queues_refuses_and_times_out() -> None:
    """First come, first served; what could never fit is a 413; what waits too long a 503."""
    import asyncio

    from control_plane.body_budget import COPIES, BodyBudget
    from control_plane.errors import PayloadTooLarge, Unavailable

    async def scenario() -> None:
        budget = BodyBudget(limit=100 * COPIES, wait=0.3)
        first = await budget.reserve(60)
        second = asyncio.ensure_future(budget.reserve(60))
        await asyncio.sleep(0.05)
        assert not second.done()  # waits, unread, for room
        first.release()
        granted = await asyncio.wait_for(second, 1)
        with pytest.raises(PayloadTooLarge):
            await budget.reserve(101)
        with pytest.raises(Unavailable, match="waited"):
            await budget.reserve(60)
        granted.release()
        granted.release()  # idempotent
        assert budget.used == 0
        cancelled = asyncio.ensure_future(budget.reserve(10))
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert budget.used == 0 and not budget._queue

    asyncio.run(scenario())
