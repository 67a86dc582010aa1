"""The state store's forward-path helpers, on a real SQLite file: operation ids reserved ahead of
their record, and the one-query lookup of a usable server."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from control_plane import store as store_module
from control_plane.models import AsyncOperationStatus, AsyncOperationType, AvailabilityStatus
from control_plane.store import OPERATION_ID_BLOCK, ClientRow, ServerRow, SQLiteStore, StoreError

FORWARD = AsyncOperationType.FORWARD_REQUEST
A = AvailabilityStatus


def _record(store: SQLiteStore, op_id: int | None = None) -> int:
    return store.record_operation(FORWARD, "{}", None, None, None, 0, AsyncOperationStatus.SUCCEEDED, "{}",
                                  op_id=op_id)


def test_reserved_ids_never_collide_across_stores_sharing_a_file_nor_with_new_operations(tmp_path: Path) -> None:
    """Two stores on one file (two replicas) reserve ids in turns while operations are also added
    the ordinary way; every id is distinct, and each record lands under its reserved id.

    Can fail: with ids counted in memory from MAX(id) at start (no reservation in the file) the
    second store handed out the first one's ids and the INSERT failed on the primary key.
    """
    one, two = SQLiteStore(tmp_path / "s.db"), SQLiteStore(tmp_path / "s.db")
    try:
        ids: list[int] = []
        for i in range(OPERATION_ID_BLOCK + 10):
            store = one if i % 3 else two
            op_id = store.reserve_operation_id()
            assert _record(store, op_id) == op_id
            ids.append(op_id)
            ids.append(store.add_operation(FORWARD, None, None, None, AsyncOperationStatus.SCHEDULED, None))
        assert len(set(ids)) == len(ids)
        assert all(one.get_operation(i) is not None for i in ids)
    finally:
        one.close()
        two.close()


def test_a_reopened_store_continues_after_its_last_block(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    first = store.reserve_operation_id()
    _record(store, first)
    store.close()
    store = SQLiteStore(tmp_path / "s.db")
    try:
        again = store.reserve_operation_id()
        assert again == first + OPERATION_ID_BLOCK  # the unused rest of the first block is a gap
        assert _record(store) > again  # plain inserts come after every reserved id
    finally:
        store.close()


def _server(store: SQLiteStore, client_id: str, availability: AvailabilityStatus, handle: str | None) -> int:
    return store.add_server(ServerRow(0, client_id, "c", "s", "g", "ns", "img", None, False, "idegym", 80, 8000,
                                      availability, None, 0, 0, None, 0, 0, "{}", handle))


def test_usable_handle_only_for_the_owner_of_a_usable_server(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    try:
        mine, other, tenants = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
        for cid in (mine, other):
            store.add_client(ClientRow(cid, "c", "ns", 0, A.ALIVE, 0, 0))
        store.add_client(ClientRow(tenants, "c", "ns", 0, A.ALIVE, 0, 0, "alice"))
        alive = _server(store, mine, A.ALIVE, '{"h": 1}')
        reused = _server(store, mine, A.REUSED, '{"h": 2}')
        finished = _server(store, mine, A.FINISHED, '{"h": 3}')
        no_handle = _server(store, mine, A.ALIVE, None)
        orphan = _server(store, str(uuid.uuid4()), A.ALIVE, '{"h": 4}')  # its client is not registered
        alices = _server(store, tenants, A.ALIVE, '{"h": 5}')
        assert store.usable_handle(mine, alive, "") == '{"h": 1}'
        assert store.usable_handle(mine, reused, "") == '{"h": 2}'
        assert store.usable_handle(other, alive, "") is None
        assert [store.usable_handle(mine, s, "") for s in (finished, no_handle, 999)] == [None] * 3
        assert store.usable_handle(store.get_server(orphan).client_id, orphan, "") is None  # type: ignore[union-attr]
        assert store.usable_handle(tenants, alices, "alice") == '{"h": 5}'
        assert store.usable_handle(tenants, alices, "bob") is None  # another tenant's client
        assert store.usable_handle(mine, alive, "alice") is None
    finally:
        store.close()


def test_a_remembered_handle_is_dropped_when_this_or_another_connection_changes_the_server(tmp_path: Path) -> None:
    """Forwards remember handles; a stop made through this store, or by another replica sharing
    the file, is seen by the very next lookup, while a forward's own record keeps the memory.

    Can fail: without the data_version check the stop made by ``other`` went unseen and the
    finished server's handle was still handed out.
    """
    store, other = SQLiteStore(tmp_path / "s.db"), SQLiteStore(tmp_path / "s.db")
    try:
        cid = str(uuid.uuid4())
        store.add_client(ClientRow(cid, "c", "ns", 0, A.ALIVE, 0, 0))
        sid = _server(store, cid, A.ALIVE, '{"h": 1}')
        assert store.usable_handle(cid, sid, "") == '{"h": 1}'
        _record(store, store.reserve_operation_id())
        assert (cid, sid, "") in store._usable  # a forward's own record does not forget it
        other.set_server_status(sid, A.FINISHED)
        assert store.usable_handle(cid, sid, "") is None
        other.set_server_status(sid, A.REUSED)
        assert store.usable_handle(cid, sid, "") == '{"h": 1}'
        store.set_server_status(sid, A.FINISHED)
        assert store.usable_handle(cid, sid, "") is None
    finally:
        store.close()
        other.close()


def test_the_wal_header_changes_with_every_commit_of_any_connection_and_only_then(tmp_path: Path) -> None:
    """What forwards check instead of a statement (``wal_header.py``): another connection's
    commit, even one that leaves the file as large as before, changes the header's bytes; reads
    do not. A database with no WAL-index header falls back to SQLite's data_version."""
    import sqlite3

    from control_plane.wal_header import WalHeader

    path = tmp_path / "w.db"
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("CREATE TABLE t (v INTEGER)")
    writer.execute("INSERT INTO t VALUES (0)")
    header = WalHeader(path)
    try:
        seen = header.read()
        assert seen is not None
        for value in range(1, 4):
            writer.execute("UPDATE t SET v=?", (value,))  # the same pages, rewritten
            now = header.read()
            assert now is not None and now != seen, f"commit {value} went unseen"
            seen = now
        assert writer.execute("SELECT v FROM t").fetchall() == [(3,)]
        assert header.read() == seen
    finally:
        header.close()
        writer.close()
    assert WalHeader(tmp_path / "no.db").read() is None


def test_every_status_change_follows_the_lifecycle(tmp_path: Path) -> None:
    """The store's own changes (a claim, activity on a REUSED server) are the lifecycle's, and a
    change the state machine never allows is refused loudly instead of silently ignored."""
    import pytest

    from control_plane import lifecycle

    store = SQLiteStore(tmp_path / "s.db")
    try:
        client = str(uuid.uuid4())
        store.add_client(ClientRow(client, "c", "ns", 0, A.ALIVE, 0, 0))
        server = _server(store, client, A.FINISHED, '{"h": 1}')
        row = store.get_server(server)
        assert row is not None
        key = (row.image_tag, row.runtime_class_name, row.run_as_root, row.server_kind, row.server_name,
               None)  # no resources asked
        namesake = str(uuid.uuid4())
        store.add_client(ClientRow(namesake, "c", "ns", 0, A.ALIVE, 0, 0))
        assert store.claim_finished(namesake, key) is None  # another client's, though of the same name
        claimed = store.claim_finished(client, key)
        assert claimed is not None and claimed.availability == lifecycle.CLAIM[1]
        assert store.claim_finished(client, key) is None  # only a FINISHED server is claimed
        store.touch_server(server, 1)
        assert store.get_server(server).availability == lifecycle.ON_ACTIVITY[A.REUSED]  # type: ignore[union-attr]
        with pytest.raises(lifecycle.IllegalTransition):
            store.set_server_status(server, A.REUSED, only_from=[A.STOPPED])
        assert store.set_server_status(server, A.STOPPED)
        assert not store.set_server_status(server, A.ALIVE)  # terminal: never changes again
    finally:
        store.close()


def test_a_deferred_record_is_there_for_the_next_read_and_written_once_for_all(tmp_path: Path) -> None:
    """Records of calls answered inline wait (``defer_record``) but never where a reader could
    miss them: any query, any write and ``close`` write them first, all in one transaction.

    Can fail: with the flush left out of ``_query``, the first lookup finds nothing; without it in
    ``close``, the reopened store misses the last records.
    """
    store = SQLiteStore(tmp_path / "s.db")
    made: list[int] = []

    def deferred(op_id: int):
        def produce() -> dict:
            made.append(op_id)
            return dict(request_type=FORWARD, request="{}", client_id=None, server_id=None, pod=None, started=1,
                        status=AsyncOperationStatus.SUCCEEDED, result="{}", op_id=op_id, finished=2)
        return produce

    first, second = store.reserve_operation_id(), store.reserve_operation_id()
    store.defer_record(deferred(first))
    store.defer_record(deferred(second))
    assert made == []  # nothing made (no JSON, no transaction) until something reads or writes
    op = store.get_operation(first)
    assert op is not None and op.finished_at == 2 and made == [first, second]
    assert store.get_operation(second) is not None
    third = store.reserve_operation_id()
    store.defer_record(deferred(third))
    store.close()
    reopened = SQLiteStore(tmp_path / "s.db")
    try:
        assert reopened.get_operation(third) is not None
    finally:
        reopened.close()


def test_deferred_records_touch_each_server_once_with_its_latest_activity(tmp_path: Path) -> None:
    """A flush writes every deferred record and touches each server once, with the latest finish
    of its records: a REUSED server becomes ALIVE, one no longer usable is left as it is.

    Can fail: with a touch per record (as on main) the flush ran six UPDATEs of the servers table
    for six records of three servers (seen); a touch with a server's last record's time instead of
    its latest would leave the REUSED server's activity at 25.
    """
    store = SQLiteStore(tmp_path / "s.db")
    try:
        client = str(uuid.uuid4())
        store.add_client(ClientRow(client, "c", "ns", 0, A.ALIVE, 0, 0))
        reused, alive = _server(store, client, A.REUSED, '{"h": 1}'), _server(store, client, A.ALIVE, '{"h": 2}')
        finished = _server(store, client, A.FINISHED, '{"h": 3}')
        ids = []
        for server, when in ((reused, 20), (alive, 40), (reused, 30), (finished, 50), (alive, 35), (reused, 25)):
            op_id = store.reserve_operation_id()
            ids.append(op_id)
            store.defer_record(lambda op_id=op_id, server=server, when=when: dict(
                request_type=FORWARD, request="{}", client_id=client, server_id=server, pod=None, started=1,
                status=AsyncOperationStatus.SUCCEEDED, result="{}", touch_server=server, op_id=op_id, finished=when))
        statements: list[str] = []
        store._db.set_trace_callback(statements.append)
        store.flush()
        store._db.set_trace_callback(None)
        assert sum(s.startswith("INSERT INTO operations") for s in statements) == 6
        assert sum(s.startswith("UPDATE servers") for s in statements) == 3  # one a server
        after = {server: store.get_server(server) for server in (reused, alive, finished)}
        assert after[reused].availability == A.ALIVE and after[reused].last_activity_at == 30  # type: ignore[union-attr]
        assert after[alive].availability == A.ALIVE and after[alive].last_activity_at == 40  # type: ignore[union-attr]
        assert after[finished].availability == A.FINISHED and after[finished].last_activity_at == 0  # type: ignore[union-attr]
        assert [store.get_operation(op_id).finished_at for op_id in ids] == [20, 40, 30, 50, 35, 25]  # type: ignore[union-attr]
    finally:
        store.close()


def test_deferred_records_outlive_a_failed_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A transaction that fails (a full disk: SQLITE_FULL) takes the deferred records it was to
    write with it only until the next write: they are kept, made again as they were (a record
    made at once, ``lambda: made``, keeps its server's touch), and the oldest are dropped only
    beyond ``MAX_DEFERRED``.

    Can fail: when a failed write dropped its records (as on main), the calls answered just before
    a disk filled were missing from the history after it was freed (``test_faults.py``'s
    ``test_state_disk_full`` with the history written every 0.25 s); without the copy in
    ``_write_deferred`` the record made again had lost its touch.
    """
    monkeypatch.setattr(store_module, "MAX_DEFERRED", 3)
    store = SQLiteStore(tmp_path / "s.db")
    try:
        client = str(uuid.uuid4())
        store.add_client(ClientRow(client, "c", "ns", 0, A.ALIVE, 0, 0))
        server = _server(store, client, A.REUSED, '{"h": 1}')
        ids = [store.reserve_operation_id() for _ in range(4)]
        for op_id in ids[:2]:
            made = dict(request_type=FORWARD, request="{}", client_id=client, server_id=server, pod=None, started=1,
                        status=AsyncOperationStatus.SUCCEEDED, result="{}", touch_server=server, op_id=op_id,
                        finished=10 + op_id % 1000)
            store.defer_record(lambda made=made: made)
        with pytest.raises(StoreError, match="free disk space"):
            with store.tx() as db:
                db.execute("INSERT INTO no_such_table VALUES (1)")  # any failure of the transaction
        assert store.get_operation(ids[0]) is not None and store.get_operation(ids[1]) is not None
        assert store.get_server(server).availability == A.ALIVE  # type: ignore[union-attr]
        for op_id in ids:  # four waiting where three are kept: the oldest goes
            store.defer_record(lambda op_id=op_id: dict(
                request_type=FORWARD, request="{}", client_id=None, server_id=None, pod=None, started=1,
                status=AsyncOperationStatus.SUCCEEDED, result="{}", op_id=op_id + 10_000, finished=2))
        with pytest.raises(StoreError):
            with store.tx() as db:
                db.execute("INSERT INTO no_such_table VALUES (1)")
        store.flush()
        assert [store.get_operation(op_id + 10_000) is not None for op_id in ids] == [False, True, True, True]
    finally:
        store.close()


def test_reads_while_writes_fail_try_the_deferred_records_again_only_now_and_then(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the database takes no write (a full disk), a read does not try the deferred records'
    write again each time (every forward reads): once per ``FLUSH_RETRY_S``; once it takes writes
    again, the next try writes them.

    Can fail: with every read flushing (as on main), 50 reads made 50 failing write transactions.
    """
    import sqlite3

    store = SQLiteStore(tmp_path / "s.db")
    try:
        client = str(uuid.uuid4())
        store.add_client(ClientRow(client, "c", "ns", 0, A.ALIVE, 0, 0))
        server = _server(store, client, A.REUSED, '{"h": 1}')
        op_id = store.reserve_operation_id()
        store.defer_record(lambda: dict(request_type=FORWARD, request="{}", client_id=client, server_id=server,
                                        pod=None, started=1, status=AsyncOperationStatus.SUCCEEDED, result="{}",
                                        op_id=op_id, finished=10))
        tries = []
        write = store._write_deferred

        def full(db: sqlite3.Connection) -> None:
            tries.append(1)
            raise sqlite3.OperationalError("database or disk is full")

        monkeypatch.setattr(store, "_write_deferred", full)
        for _ in range(50):
            assert store.get_server(server) is not None
        assert len(tries) == 1
        monkeypatch.setattr(store_module, "FLUSH_RETRY_S", 0.0)
        store.get_server(server)  # the first read after the retry interval tries again
        assert len(tries) == 2
        monkeypatch.setattr(store, "_write_deferred", write)  # the disk has room again
        assert store.get_operation(op_id) is not None
    finally:
        store.close()


def test_a_state_directory_made_before_tenants_is_migrated(tmp_path: Path) -> None:
    """A database made before the tenant columns gets them (its rows belong to the single
    tenant), and a tenant's operation is found only for that tenant."""
    import sqlite3

    from control_plane import records

    old = records.SCHEMA.replace(",\n    tenant TEXT NOT NULL DEFAULT ''", "").replace(
        ", tenant TEXT NOT NULL DEFAULT ''", "")
    db = sqlite3.connect(tmp_path / "s.db")
    db.executescript(old)
    for table, column, _ in records.ADDED_COLUMNS:
        assert column not in {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
    cid = str(uuid.uuid4())
    db.execute("INSERT INTO clients VALUES (?,?,?,?,?,?,?)", (cid, "c", "ns", 0, "ALIVE", 0, 0))
    db.commit()
    db.close()
    store = SQLiteStore(tmp_path / "s.db")
    try:
        assert store.get_client(cid).tenant == ""  # type: ignore[union-attr]
        alice = str(uuid.uuid4())
        store.add_client(ClientRow(alice, "c", "ns", 0, A.ALIVE, 0, 0, "alice"))
        op = store.add_operation(FORWARD, None, alice, None, AsyncOperationStatus.SCHEDULED, None)
        assert store.tenant_operation(op, "alice") is not None
        assert store.tenant_operation(op, "bob") is None and store.tenant_operation(op, "") is None
        store.add_job("build-1", None, "queued", "alice")
        assert store.get_job("build-1", "alice") is not None and store.get_job("build-1", "bob") is None
    finally:
        store.close()


def test_a_fork_s_children_are_added_and_made_alive_in_one_transaction_each(tmp_path: Path) -> None:
    """A fork into 8 writes its children's rows in one transaction and their handles in one more
    (``control_plane/fork.py``), each row as ``get_server`` reads it; the status change is still
    a compare-and-set per row: a child stopped meanwhile stays stopped.

    Can fail: on main each child was a transaction of its own, twice (add, then its handle): 16
    commits where 2 do (each a lock of the database beside every forward's lookups)."""
    store = SQLiteStore(tmp_path / "s.db")
    try:
        client = str(uuid.uuid4())
        store.add_client(ClientRow(client, "c", "ns", 0, A.ALIVE, 0, 0))
        like = ServerRow(0, client, "c", "child", "", "ns", "img", None, False, "idegym", 80, 8000, A.ALIVE,
                         "forking", 5, 5, None, 0, 0, "{}", None)
        statements: list[str] = []
        store._db.set_trace_callback(statements.append)
        rows = store.add_servers(like, 8)
        assert statements.count("BEGIN IMMEDIATE") == 1
        assert len({row.id for row in rows}) == 8
        assert rows == [store.get_server(row.id) for row in rows]
        assert [row.generated_name for row in rows] == [f"child-{row.id}" for row in rows]
        assert store.set_server_status(rows[3].id, A.STOPPED)
        statements.clear()
        moved = store.set_servers_status({row.id: {"handle": f'{{"h": {row.id}}}', "last_activity_at": 9}
                                          for row in rows}, A.ALIVE, "")
        store._db.set_trace_callback(None)
        assert statements.count("BEGIN IMMEDIATE") == 1
        assert moved == {row.id: row is not rows[3] for row in rows}
        after = [store.get_server(row.id) for row in rows]
        assert [(r.availability, r.handle, r.details) for r in after if r is not None] == [
            (A.STOPPED, None, "forking") if row is rows[3] else (A.ALIVE, f'{{"h": {row.id}}}', "") for row in rows]
    finally:
        store.close()
