"""Stand-in for an OpenEnv environment image: ``GET /health`` (its readiness path) and a
``/ws`` WebSocket that echoes text frames (what the control plane's ws-forward relays)."""

from __future__ import annotations

import argparse

from aiohttp import web


async def health(_request: web.Request) -> web.Response:
    return web.json_response({"status": "healthy"})


async def echo(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    async for msg in ws:
        if msg.type == web.WSMsgType.TEXT:
            await ws.send_str(msg.data)
    return ws


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/ws", echo)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
