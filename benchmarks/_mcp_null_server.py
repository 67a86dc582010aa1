"""A null MCP server for ``benchmarks/integrations.py``: a hand-written JSON-RPC responder over
stdio, no SDK, whose ``bash`` answers what ``idegym mcp serve`` answers for ``echo hello`` (text
content, ``{"result": ...}`` structured content, an output schema), so the SDK's client does the
same work as against ours.

``python _mcp_null_server.py`` answers at once: what no MCP server can remove (the SDK's client,
the pipes, a process's wake-up). ``python _mcp_null_server.py URL IMAGE`` starts a sandbox of
IMAGE and makes each call's ``Sandbox.bash`` itself, inline, with our synchronous client: the
least any MCP server over stdio can cost, the direct call made from a second process included.
``python _mcp_null_server.py URL IMAGE loop`` makes that call as ``idegym mcp serve`` does: the
lines read by an event loop (uvloop), the call made on it with the async client, so the difference
of the two is what serving from an event loop (non-blocking I/O, its wake-ups) costs over blocking
reads and writes."""

import asyncio
import json
import sys
from pathlib import Path

TEXT = "hello\n[exit code 0]"
BASH = {"name": "bash", "inputSchema": {"type": "object", "properties": {"command": {"type": "string"}},
                                        "required": ["command"]},
        "outputSchema": {"type": "object", "properties": {"result": {"type": "string"}}, "required": ["result"]}}
MODERN = "io.modelcontextprotocol/protocolVersion"  # the 2026-07-28 protocol's per-request envelope


def answer(method: str, params: dict, sandbox) -> dict:
    if method == "initialize":  # a client of the handshake-era protocol
        return {"protocolVersion": params["protocolVersion"], "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": "null", "version": ""}}
    if method == "server/discover":
        result = {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {"listChanged": False}}}
    elif method == "tools/list":
        result = {"tools": [BASH]}
    elif method == "tools/call":
        text = TEXT
        if sandbox is not None:
            done = sandbox.bash(params["arguments"]["command"], timeout=120)
            text = f"{done.stdout}{done.stderr}[exit code {done.exit_code}]"
        result = {"content": [{"type": "text", "text": text}], "structuredContent": {"result": text}, "isError": False}
    else:
        result = {}
    if MODERN in (params.get("_meta") or {}):  # what the SDK's server adds to 2026-07-28 answers
        if method in ("server/discover", "tools/list"):
            result.update(ttlMs=0, cacheScope="private")
        result.update(resultType="complete", _meta={"io.modelcontextprotocol/serverInfo": {"name": "null",
                                                                                            "version": ""}})
    return result


def reply(message: dict, result: dict) -> None:
    sys.stdout.buffer.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode() + b"\n")
    sys.stdout.buffer.flush()


def serve(sandbox) -> None:
    for line in sys.stdin.buffer:
        message = json.loads(line)
        if "id" in message:
            reply(message, answer(message.get("method", ""), message.get("params") or {}, sandbox))


async def serve_on_loop(url: str, image: str) -> None:
    from idegym_env.client import AsyncIdeGymClient

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    async with AsyncIdeGymClient(url, name="bench-null-loop") as client:
        sandbox = await client.start(image, server_name="bench-null-loop", reuse="NONE")
        try:
            while line := await reader.readline():
                message = json.loads(line)
                if "id" not in message:
                    continue
                method, params = message.get("method", ""), message.get("params") or {}
                if method == "tools/call":
                    done = await sandbox.bash(params["arguments"]["command"], timeout=120)
                    text = f"{done.stdout}{done.stderr}[exit code {done.exit_code}]"
                    result = {"content": [{"type": "text", "text": text}], "structuredContent": {"result": text},
                              "isError": False}
                    if MODERN in (params.get("_meta") or {}):
                        result.update(resultType="complete", _meta={"io.modelcontextprotocol/serverInfo": {
                            "name": "null", "version": ""}})
                    reply(message, result)
                else:
                    reply(message, answer(method, params, None))
        finally:
            await sandbox.stop()


def main() -> None:
    if len(sys.argv) < 3:
        serve(None)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    if sys.argv[3:] == ["loop"]:
        import uvloop

        uvloop.run(serve_on_loop(sys.argv[1], sys.argv[2]))
        return
    from idegym_env.client import IdeGymClient

    with IdeGymClient(sys.argv[1], name="bench-null") as client:
        sandbox = client.start(sys.argv[2], server_name="bench-null", reuse="NONE")
        try:
            serve(sandbox)
        finally:
            sandbox.stop()


if __name__ == "__main__":
    main()
