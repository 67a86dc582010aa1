"""Relaying WebSocket frames between two connections (OpenEnv sessions, the API-server proxy)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

log = logging.getLogger(__name__)


async def pump(src: Any, dst: Any, on_frame: Callable[[], None] | None = None) -> None:
    """Copy text and binary frames from ``src`` to ``dst`` until ``src`` closes or fails."""
    async for msg in src:
        if msg.type == aiohttp.WSMsgType.TEXT:
            await dst.send_str(msg.data)
        elif msg.type == aiohttp.WSMsgType.BINARY:
            await dst.send_bytes(msg.data)
        else:
            break
        if on_frame is not None:
            on_frame()


async def splice(left: Any, right: Any, on_frame: Callable[[], None] | None = None) -> None:
    """Relay both ways until either side ends; the other direction is then cancelled."""
    tasks = [asyncio.ensure_future(pump(left, right, on_frame)), asyncio.ensure_future(pump(right, left, on_frame))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                log.debug("websocket relay ended with %r", task.exception())
