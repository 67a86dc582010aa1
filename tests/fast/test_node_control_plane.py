"""``idegym_env.vector.node_control_plane.stop_client``: what a Ray driver does for the client of an
actor that died, so that its sandboxes go at once (against a real control plane's HTTP app)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from control_plane.models import AvailabilityStatus as A
from idegym_env.client import AsyncIdeGymClient
from idegym_env.vector.node_control_plane import stop_client

from .harness import IMAGE, run, served


def test_stop_client_stops_a_dead_actors_client_and_its_sandboxes(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with served(tmp_path, tcp=True) as cp:
            client = AsyncIdeGymClient(cp.url, heartbeat_interval=3600)
            client_id = await client.register()
            await client.start(IMAGE)
            assert len(cp.backend.alive()) == 1
            await asyncio.to_thread(stop_client, cp.url, client_id)  # a blocking call, as the driver makes it
            await cp.backend.wait_for(lambda: not cp.backend.alive())
            status = await client._http.request("POST", "/api/clients/heartbeat", json={"client_id": client_id})
            assert json.loads(status.content)["availability"] == A.STOPPED.value
            await client.close(stop=False)

    run(scenario())
