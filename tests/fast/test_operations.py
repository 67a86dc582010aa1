"""Asynchronous operations (``control_plane/operations.py``) over the control plane's HTTP."""

from __future__ import annotations

from pathlib import Path

import httpx

from control_plane.app import CP

from .harness import IMAGE, run, served


def test_an_operation_answered_inline_writes_its_record_twice_and_reads_nothing_back(tmp_path: Path) -> None:
    """An operation (a start here; a fork the same) is recorded running when it is submitted and
    ended when its work returns; its ``Prefer: wait`` answer is the outcome just recorded, not
    read back from the store: on the event loop, every commit and query of a fork's call counts.

    Can fail: it did: an operation was recorded SCHEDULED, then IN_PROGRESS in a commit of its
    own as its work began, and its answer was read back from the store."""

    async def scenario() -> None:
        async with served(tmp_path) as s:
            transport = httpx.AsyncHTTPTransport(uds=s.unix_socket)
            async with httpx.AsyncClient(transport=transport, base_url=s.url, timeout=30) as http:
                client = (await http.post("/api/clients", json={"name": "t", "nodes_count": 0})).json()["id"]
                statements: list[str] = []
                s.app[CP].store._db.set_trace_callback(statements.append)
                try:
                    start = await http.post("/api/idegym-servers", json={"client_id": client, "image_tag": IMAGE},
                                            headers={"Prefer": "wait=20"})
                finally:
                    s.app[CP].store._db.set_trace_callback(None)
                assert start.status_code == 200, start.text
                on_operations = [s.split()[0] for s in statements if " operations " in f"{s} "]
                assert on_operations == ["INSERT", "UPDATE"], statements
                status = await http.get(f"/api/operations/status/{start.headers['x-idegym-operation-id']}")
                assert status.json()["status"] == "SUCCEEDED" and status.json()["result"] == start.text

    run(scenario())
