"""WebSocket relay for OpenEnv servers (``/ws`` of ``docs/openenv.md``): frames both ways, activity counted."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from aiohttp import web

from .service import ControlPlane
from .store import ServerRow, now_ms
from .ws_splice import splice

log = logging.getLogger(__name__)


async def relay(request: web.Request, cp: ControlPlane, row: ServerRow) -> web.StreamResponse:
    endpoint = cp.endpoint_of(row)
    connector = aiohttp.UnixConnector(path=endpoint.unix_socket) if endpoint.unix_socket else None
    session = aiohttp.ClientSession(connector=connector)
    url = endpoint.base_url.rstrip("/") + "/ws"
    if request.query_string:
        url += f"?{request.query_string}"
    try:
        upstream = await session.ws_connect(url, max_msg_size=0, autoping=True)
    except Exception as exc:  # noqa: BLE001 - refused before the upgrade: the client gets a status
        await session.close()
        cp.spawn(cp.check_sandbox(row.id))
        raise web.HTTPGone(
            text=f"Failed to forward request: cannot open {url}: {type(exc).__name__} ({exc})") from exc
    downstream = web.WebSocketResponse(max_msg_size=0, autoping=True)
    await downstream.prepare(request)
    cp.store.touch_server(row.id, now_ms())

    def active() -> None:
        cp.store.touch_server(row.id, now_ms())

    async def keep_active() -> None:
        # an open session is activity even while a long step sends no frame
        while True:
            await asyncio.sleep(30)
            active()

    heartbeat = asyncio.ensure_future(keep_active())
    try:
        await splice(upstream, downstream, active)
    finally:
        heartbeat.cancel()
        code = upstream.close_code or aiohttp.WSCloseCode.OK
        if not downstream.closed:
            await downstream.close(code=code if code != aiohttp.WSCloseCode.ABNORMAL_CLOSURE
                                   else aiohttp.WSCloseCode.INTERNAL_ERROR)
        if not upstream.closed:
            await upstream.close()
        await session.close()
    return downstream
