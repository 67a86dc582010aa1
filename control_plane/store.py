"""Durable state: clients, servers, operations, jobs, snapshots and the warm pool.

``Store`` is the interface; ``SQLiteStore`` keeps it in one SQLite file in WAL mode (a commit
survives a SIGKILL of the control plane; ``synchronous=NORMAL`` trades the last commits on power
loss for speed). Status changes are compare-and-set against the statuses the lifecycle allows,
so two concurrent claims of one FINISHED server cannot both succeed, even across replicas that
share a database.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any
from uuid import UUID

from . import lifecycle
from .errors import Unavailable
from .models import AsyncOperationStatus, AsyncOperationType, AvailabilityStatus, resources_key
from .records import (  # noqa: F401 - the store's row types, imported from here
    ADDED_COLUMNS,
    SCHEMA,
    ClientRow,
    JobRow,
    OperationRow,
    PoolRow,
    ServerRow,
    SnapshotRow,
    from_db,
    now_ms,
)
from .wal_header import WalHeader

log = logging.getLogger(__name__)


def _in(statuses: Iterable[AvailabilityStatus]) -> str:
    """An SQL ``IN (…)`` list of statuses (enum values: no quoting needed)."""
    return "(" + ",".join(f"'{s.value}'" for s in sorted(statuses)) + ")"


# Activity on a usable server, with the status change the lifecycle makes on it (REUSED → ALIVE).
_TOUCH_SQL = (
    "UPDATE servers SET last_activity_at=MAX(last_activity_at, ?), availability=CASE availability "
    + " ".join(f"WHEN '{src.value}' THEN '{dst.value}'" for src, dst in lifecycle.ON_ACTIVITY.items())
    + f" ELSE availability END WHERE id=? AND availability IN {_in(lifecycle.USABLE)}"
)


def _row_id(cur: sqlite3.Cursor) -> int:
    """The id of the row an INSERT just made."""
    if cur.lastrowid is None:
        raise StoreError("the database gave no id for the row just inserted")
    return cur.lastrowid


def _touch(db: sqlite3.Connection, server_id: int, when: int) -> None:
    """Record activity (``lifecycle.ON_ACTIVITY``)."""
    db.execute(_TOUCH_SQL, (when, server_id))


_RECORD_SQL = ("INSERT INTO operations (id, request_type, status, request, result, client_id, server_id, "
               "orchestrator_pod, scheduled_at, started_at, finished_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)")


def _record_row(request_type: AsyncOperationType, request: str | None, client_id: str | None, server_id: int | None,
                pod: str | None, started: int, status: AsyncOperationStatus, result: str, op_id: int | None,
                finished: int) -> tuple[Any, ...]:
    """The values of ``_RECORD_SQL`` for an operation that has ended."""
    return (op_id, request_type.value, status.value, request, result, client_id, server_id, pod, started, started,
            finished)


class StoreError(Unavailable):
    """The database could not be written (disk full, read-only…); the message says what to do.
    Answered as 503: the control plane cannot keep state until it is fixed."""


OPERATION_ID_BLOCK = 256
# Operation records kept while the database takes no write (a full disk), the oldest dropped beyond.
MAX_DEFERRED = 10_000
# While it takes none, a read tries to write them again at most this often (every write still tries):
# each read (a forward makes one) paid a failing write transaction.
FLUSH_RETRY_S = 1.0


class SQLiteStore:
    """All state in one SQLite database file (WAL)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.RLock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(SCHEMA)
        for table, column, definition in ADDED_COLUMNS:  # a state directory made before the column
            if column not in {r["name"] for r in self._db.execute(f"PRAGMA table_info({table})")}:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
        self._operation_ids: Iterator[int] = iter(())
        # Forwards look up (client, server) → handle; the answers stay good until the database
        # changes: by us (``_generation``, bumped by every write but a forward's own record) or
        # by another connection, e.g. a replica sharing the file (its WAL-index header: any
        # commit, ours too, changes it; SQLite's data_version where there is none).
        self._generation = 0
        self._wal = WalHeader(path)
        self._usable: dict[tuple[str, int, str], str] = {}
        self._usable_seen: tuple[bytes | int, int] | None = None
        # Ended operations not written yet (``defer_record``): each produces record_operation's arguments
        # and ``finished``; ``deferred_bytes`` is what they hold, as their callers count it.
        self._deferred: list[Callable[[], dict[str, Any]]] = []
        self.deferred_bytes = 0
        self._flush_failing = False
        self._flush_failed_at = 0.0  # (monotonic) the last failed flush
        self.on_release: Callable[[], None] | None = None  # called when a server stops counting as live

    def close(self) -> None:
        with self._lock:
            self.flush()
            self._db.close()
            self._wal.close()

    def defer_record(self, produce: Callable[[], dict[str, Any]], held: int = 0) -> None:
        """Record an ended operation later: at the next ``flush`` (the forward path calls it within
        ``forward_calls.RECORD_DELAY``), or before anything else reads or writes the database,
        whichever comes first, so nothing reads a history without it (while the database takes no
        write, a read tries again only every ``FLUSH_RETRY_S``). Calls answered inline are
        then not held up by a transaction each (and the arguments, JSON included, are made only
        then); a control plane killed with SIGKILL loses the records of its last such interval.
        ``held``: the bytes ``produce`` keeps alive until then (``deferred_bytes``)."""
        with self._lock:
            self._deferred.append(produce)
            self.deferred_bytes += held

    def flush(self) -> None:
        """Write the deferred records (one transaction); a failure is logged, never raised: the
        callers had their answers. The records are kept for the next write (a full disk must not
        lose the history of calls answered just before it filled), ``MAX_DEFERRED`` at most."""
        with self._lock:
            if not self._deferred:
                return
            try:
                with self.tx(servers_unchanged=True):
                    pass  # tx writes what is deferred first
            except StoreError as exc:
                if not self._flush_failing:
                    log.error("operation records not written yet (%d kept for the next write): %s",
                              len(self._deferred), exc)
                self._flush_failing = True
                self._flush_failed_at = time.monotonic()
            else:
                if self._flush_failing:
                    log.warning("operation records written again")
                self._flush_failing = False

    def _write_deferred(self, db: sqlite3.Connection) -> None:
        """The deferred records, and one touch a server: its last activity is the latest of its
        records (a touch per record was a third of the flush's database time)."""
        produced, self._deferred = self._deferred, []
        self.deferred_bytes = 0
        touched: dict[int, int] = {}
        for produce in produced:
            try:
                record = dict(produce())  # a copy: a record kept after a failed write is made again
                touch, finished = record.pop("touch_server", None), record.pop("finished", None)
                finished = now_ms() if finished is None else finished
                db.execute(_RECORD_SQL, _record_row(finished=finished, **record))
            except sqlite3.OperationalError:
                raise
            except Exception:  # noqa: BLE001 - one bad record must not lose the others
                log.exception("an operation record could not be made")
                continue
            if touch is not None:
                touched[touch] = max(touched.get(touch, finished), finished)
        for server_id, when in touched.items():
            _touch(db, server_id, when)

    def _keep_deferred(self, records: list[Callable[[], dict[str, Any]]], held: int) -> None:
        """Records a failed transaction did not write go back in front of those deferred since,
        the oldest dropped (and said) beyond ``MAX_DEFERRED``."""
        if not records or records is self._deferred:  # none were taken for this transaction
            return
        kept = records + self._deferred
        if len(kept) > MAX_DEFERRED:
            log.error("%d operation records dropped: the state database took no write while %d waited",
                      len(kept) - MAX_DEFERRED, len(kept))
            kept = kept[-MAX_DEFERRED:]
        self._deferred = kept
        self.deferred_bytes += held

    @contextmanager
    def tx(self, *, servers_unchanged: bool = False) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE: writers queue instead of failing).
        ``servers_unchanged`` promises it changes no client or server's usability."""
        with self._lock:
            if not servers_unchanged:
                self._generation += 1
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise StoreError(f"cannot write the state database {self.path}: {exc}") from exc
            deferred, deferred_bytes = self._deferred, self.deferred_bytes
            try:
                if self._deferred:
                    self._write_deferred(self._db)
                yield self._db
                self._db.execute("COMMIT")
            except BaseException as exc:
                self._keep_deferred(deferred, deferred_bytes)
                # SQLite itself rolls back on some errors (SQLITE_FULL, SQLITE_IOERR): a second
                # ROLLBACK would fail and hide the real error.
                if self._db.in_transaction:
                    try:
                        self._db.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                if isinstance(exc, sqlite3.OperationalError):
                    raise StoreError(
                        f"cannot write the state database {self.path}: {exc}; free disk space and retry"
                    ) from exc
                raise

    def _query(self, sql: str, args: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            if not self._flush_failing or time.monotonic() - self._flush_failed_at >= FLUSH_RETRY_S:
                self.flush()
            return self._db.execute(sql, tuple(args)).fetchall()

    def _write(self, sql: str, args: Iterable[Any] = ()) -> sqlite3.Cursor:
        with self.tx() as db:
            try:
                return db.execute(sql, tuple(args))
            except sqlite3.OperationalError as exc:
                raise StoreError(f"cannot write the state database {self.path}: {exc}") from exc

    # -- clients ------------------------------------------------------------------------------

    def add_client(self, client: ClientRow) -> None:
        self._write(
            "INSERT INTO clients VALUES (?,?,?,?,?,?,?,?)",
            (client.id, client.name, client.namespace, client.nodes_count, client.availability.value,
             client.created_at, client.last_heartbeat_time, client.tenant),
        )

    def get_client(self, client_id: UUID | str) -> ClientRow | None:
        rows = self._query("SELECT * FROM clients WHERE id=?", (str(client_id),))
        return from_db(ClientRow, rows[0]) if rows else None

    def clients(self, availability: Iterable[AvailabilityStatus] | None = None) -> list[ClientRow]:
        if availability is None:
            rows = self._query("SELECT * FROM clients")
        else:
            wanted = [a.value for a in availability]
            rows = self._query(f"SELECT * FROM clients WHERE availability IN ({','.join('?' * len(wanted))})",
                               wanted)
        return [from_db(ClientRow, r) for r in rows]

    def set_client_status(self, client_id: str, target: AvailabilityStatus, heartbeat: int | None = None) -> bool:
        sources = [s.value for s in lifecycle.client_guard(target)]
        sets: list[str] = ["availability=?"]
        args: list[str | int | None] = [target.value]
        if heartbeat is not None:
            sets.append("last_heartbeat_time=?")
            args.append(heartbeat)
        cur = self._write(
            f"UPDATE clients SET {', '.join(sets)} WHERE id=? AND availability IN ({','.join('?' * len(sources))})",
            [*args, client_id, *sources],
        )
        return cur.rowcount == 1

    # -- servers ------------------------------------------------------------------------------

    def add_server(self, server: ServerRow) -> int:
        return self.add_servers(server, 1)[0].id

    def add_servers(self, server: ServerRow, count: int) -> list[ServerRow]:
        """``count`` new servers like ``server`` (its id and generated name aside) in one transaction
        (a fork's children: one commit, not one each); each row as stored, with its id and name."""
        ids = []
        with self.tx() as db:
            for _ in range(count):
                ids.append(_row_id(db.execute(
                    "INSERT INTO servers (client_id, client_name, server_name, generated_name, namespace, image_tag, "
                    "runtime_class_name, run_as_root, server_kind, service_port, container_port, availability, "
                    "details, created_at, last_activity_at, keepalive_until, max_restarts, restarts, request, handle) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (server.client_id, server.client_name, server.server_name, "", server.namespace,
                     server.image_tag, server.runtime_class_name, int(server.run_as_root), server.server_kind,
                     server.service_port, server.container_port, server.availability.value, server.details,
                     server.created_at, server.last_activity_at, server.keepalive_until, server.max_restarts,
                     server.restarts, server.request, server.handle))))
            db.executemany("UPDATE servers SET generated_name=? WHERE id=?",
                           [(f"{server.server_name}-{i}", i) for i in ids])
        return [replace(server, id=i, generated_name=f"{server.server_name}-{i}") for i in ids]

    def get_server(self, server_id: int) -> ServerRow | None:
        rows = self._query("SELECT * FROM servers WHERE id=?", (server_id,))
        return from_db(ServerRow, rows[0]) if rows else None

    def usable_handle(self, client_id: str, server_id: int, tenant: str) -> str | None:
        """The handle of a server the client (of ``tenant``) owns while it is usable (ALIVE or
        REUSED), as a forward needs it: remembered until the database changes. None says only
        that something is wrong, not what."""
        with self._lock:
            changes = self._wal.read()
            if changes is None:
                changes = self._db.execute("PRAGMA data_version").fetchall()[0][0]
            seen = (changes, self._generation)
            if seen != self._usable_seen:
                self._usable.clear()
                self._usable_seen = seen
            handle = self._usable.get((client_id, server_id, tenant))
            if handle is None:
                rows = self._db.execute(
                    "SELECT s.handle FROM servers s JOIN clients c ON c.id = s.client_id WHERE s.id=? AND "
                    f"s.client_id=? AND c.tenant=? AND s.availability IN {_in(lifecycle.USABLE)} "
                    "AND s.handle IS NOT NULL", (server_id, client_id, tenant)).fetchall()
                if rows:
                    handle = self._usable[(client_id, server_id, tenant)] = rows[0][0]
            return handle

    def servers(self, *, client_id: str | None = None, tenant: str | None = None,
                availability: Iterable[AvailabilityStatus] | None = None) -> list[ServerRow]:
        sql, args = "SELECT * FROM servers WHERE 1=1", []
        if client_id is not None:
            sql += " AND client_id=?"
            args.append(client_id)
        if tenant is not None:
            sql += " AND client_id IN (SELECT id FROM clients WHERE tenant=?)"
            args.append(tenant)
        if availability is not None:
            wanted = [a.value for a in availability]
            sql += f" AND availability IN ({','.join('?' * len(wanted))})"
            args += wanted
        return [from_db(ServerRow, r) for r in self._query(sql + " ORDER BY id DESC", args)]

    def live_counts(self) -> dict[tuple[str, str], int]:
        """Servers with a sandbox behind them (``lifecycle.LIVE``) by (tenant, client id)."""
        rows = self._query(
            "SELECT c.tenant AS tenant, s.client_id AS client, COUNT(*) AS n FROM servers s JOIN clients c "
            f"ON c.id = s.client_id WHERE s.availability IN {_in(lifecycle.LIVE)} GROUP BY c.tenant, s.client_id")
        return {(r["tenant"], r["client"]): int(r["n"]) for r in rows}

    def set_server_status(self, server_id: int, target: AvailabilityStatus, details: str | None = None,
                          *, only_from: Iterable[AvailabilityStatus] | None = None, **extra: Any) -> bool:
        """Move a server to ``target`` if the lifecycle allows it from its current status (CAS).

        Returns False, changing nothing, when it does not (e.g. the server is already terminal)."""
        return self.set_servers_status({server_id: extra}, target, details, only_from=only_from)[server_id]

    def set_servers_status(self, changes: Mapping[int, Mapping[str, Any]], target: AvailabilityStatus,
                           details: str | None = None, *,
                           only_from: Iterable[AvailabilityStatus] | None = None) -> dict[int, bool]:
        """``set_server_status`` of each server in ``changes`` (its id -> its other columns to set)
        in one transaction; whether each one moved."""
        sources = lifecycle.server_guard(target, only_from)
        if not sources:
            return dict.fromkeys(changes, False)
        src = [s.value for s in sources]
        moved = {}
        with self.tx() as db:
            for server_id, extra in changes.items():
                values = {"availability": target.value, **({"details": details} if details is not None else {}),
                          **extra}
                cur = db.execute(f"UPDATE servers SET {', '.join(f'{c}=?' for c in values)} WHERE id=? AND "
                                 f"availability IN ({','.join('?' * len(src))})", [*values.values(), server_id, *src])
                moved[server_id] = cur.rowcount == 1
        if any(moved.values()) and target not in lifecycle.LIVE and self.on_release is not None:
            self.on_release()
        return moved

    def claim_finished(self, client_id: str, key: tuple) -> ServerRow | None:
        """Atomically take the newest FINISHED server of ``client_id`` matching ``key``: → REUSED
        (``lifecycle.CLAIM``). Never another client's: what a sandbox keeps across a RESET (its
        ``/tmp``, its user's site-packages) is its client's own."""
        image_tag, runtime, root, kind, server_name, resources = key
        source, target = lifecycle.CLAIM
        with self.tx() as db:
            rows = db.execute(
                "SELECT id, request FROM servers WHERE availability=? AND client_id=? AND image_tag=? "
                "AND runtime_class_name IS ? AND run_as_root=? AND server_kind=? AND server_name=? "
                "ORDER BY last_activity_at DESC, id DESC",
                (source.value, client_id, image_tag, runtime, int(root), kind, server_name),
            ).fetchall()
            row = next((r for r in rows if resources_key(json.loads(r["request"]).get("resources")) == resources),
                       None)
            if row is None:
                return None
            cur = db.execute(
                "UPDATE servers SET availability=?, last_activity_at=?, keepalive_until=NULL, details=NULL "
                "WHERE id=? AND availability=?",
                (target.value, now_ms(), row["id"], source.value),
            )
            if cur.rowcount != 1:
                return None
        return self.get_server(int(row["id"]))

    def update_server(self, server_id: int, **values: Any) -> None:
        sets = ", ".join(f"{k}=?" for k in values)
        self._write(f"UPDATE servers SET {sets} WHERE id=?", [*values.values(), server_id])

    def touch_server(self, server_id: int, when: int) -> None:
        with self.tx() as db:
            _touch(db, server_id, when)

    def extend_keepalive(self, server_id: int, until: int) -> int:
        with self.tx() as db:
            db.execute("UPDATE servers SET keepalive_until=MAX(COALESCE(keepalive_until, 0), ?) WHERE id=?",
                       (until, server_id))
            return int(db.execute("SELECT keepalive_until FROM servers WHERE id=?", (server_id,)).fetchone()[0])

    # -- operations ---------------------------------------------------------------------------

    def add_operation(self, request_type: AsyncOperationType, request: str | None, client_id: str | None,
                      server_id: int | None, status: AsyncOperationStatus, pod: str | None) -> int:
        now = now_ms()
        started = now if status == AsyncOperationStatus.IN_PROGRESS else None
        cur = self._write(
            "INSERT INTO operations (request_type, status, request, client_id, server_id, orchestrator_pod, "
            "scheduled_at, started_at) VALUES (?,?,?,?,?,?,?,?)",
            (request_type.value, status.value, request, client_id, server_id, pod, now, started),
        )
        return _row_id(cur)

    def reserve_operation_id(self) -> int:
        """An id for an operation recorded later with ``record_operation(op_id=…)``, so an answer can
        name its record before the record is written. Ids are reserved in the database a block at
        a time: replicas sharing it never collide, and a restart only leaves a gap."""
        with self._lock:
            op_id = next(self._operation_ids, None)
            if op_id is None:
                with self.tx(servers_unchanged=True) as db:
                    seq = db.execute("SELECT seq FROM sqlite_sequence WHERE name='operations'").fetchall()
                    top = db.execute("SELECT MAX(id) FROM operations").fetchall()[0][0] or 0
                    start = max(top, seq[0][0] if seq else 0) + 1
                    end = start + OPERATION_ID_BLOCK
                    if seq:
                        db.execute("UPDATE sqlite_sequence SET seq=? WHERE name='operations'", (end - 1,))
                    else:
                        db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('operations', ?)", (end - 1,))
                self._operation_ids = iter(range(start, end))
                op_id = next(self._operation_ids)
            return op_id

    def record_operation(self, request_type: AsyncOperationType, request: str | None, client_id: str | None,
                         server_id: int | None, pod: str | None, started: int, status: AsyncOperationStatus,
                         result: str, touch_server: int | None = None, op_id: int | None = None) -> int:
        """Insert an operation that has already ended (a forward answered inline): one transaction.
        Its touch may turn REUSED into ALIVE, which leaves the server usable."""
        now = now_ms()
        with self.tx(servers_unchanged=True) as db:
            cur = db.execute(_RECORD_SQL, _record_row(request_type, request, client_id, server_id, pod, started,
                                                      status, result, op_id, now))
            if touch_server is not None:
                _touch(db, touch_server, now)
            return _row_id(cur)

    def finish_operation(self, op_id: int, status: AsyncOperationStatus, result: str,
                         touch_server: int | None = None) -> None:
        now = now_ms()
        with self.tx() as db:
            db.execute(
                "UPDATE operations SET status=?, result=?, finished_at=?, started_at=COALESCE(started_at, ?) "
                "WHERE id=? AND status IN ('SCHEDULED','IN_PROGRESS')",
                (status.value, result, now, now, op_id),
            )
            if touch_server is not None:
                _touch(db, touch_server, now)

    def get_operation(self, op_id: int) -> OperationRow | None:
        rows = self._query("SELECT * FROM operations WHERE id=?", (op_id,))
        return from_db(OperationRow, rows[0]) if rows else None

    def tenant_operation(self, op_id: int, tenant: str) -> OperationRow | None:
        """Operation ``op_id`` if one of ``tenant``'s clients made it (else None, as for no such id)."""
        rows = self._query("SELECT o.* FROM operations o JOIN clients c ON c.id = o.client_id "
                           "WHERE o.id=? AND c.tenant=?", (op_id, tenant))
        return from_db(OperationRow, rows[0]) if rows else None

    def unfinished_operations(self) -> list[OperationRow]:
        rows = self._query("SELECT * FROM operations WHERE status IN ('SCHEDULED','IN_PROGRESS')")
        return [from_db(OperationRow, r) for r in rows]

    def purge_operations(self, older_than_ms: int) -> int:
        cur = self._write(
            "DELETE FROM operations WHERE scheduled_at < ? AND status NOT IN ('SCHEDULED','IN_PROGRESS')",
            (older_than_ms,),
        )
        return cur.rowcount

    # -- jobs -----------------------------------------------------------------------------------

    def add_job(self, job_name: str, request_id: str | None, details: str, tenant: str) -> None:
        now = now_ms()
        self._write("INSERT INTO jobs (job_name, status, created_at, updated_at, details, request_id, tenant) "
                    "VALUES (?,?,?,?,?,?,?)", (job_name, "in_progress", now, now, details, request_id, tenant))

    def update_job(self, job_name: str, status: str, details: str | None = None, tag: str | None = None) -> None:
        self._write("UPDATE jobs SET status=?, updated_at=?, details=COALESCE(?, details), tag=COALESCE(?, tag) "
                    "WHERE job_name=?", (status, now_ms(), details, tag, job_name))

    def get_job(self, job_name: str, tenant: str) -> JobRow | None:
        rows = self._query("SELECT * FROM jobs WHERE job_name=? AND tenant=?", (job_name, tenant))
        return from_db(JobRow, rows[0]) if rows else None

    def jobs(self, status: str | None = None) -> list[JobRow]:
        rows = self._query("SELECT * FROM jobs" + (" WHERE status=?" if status else ""), (status,) if status else ())
        return [from_db(JobRow, r) for r in rows]

    # -- snapshots ------------------------------------------------------------------------------

    def add_snapshot(self, snap: SnapshotRow) -> None:
        self._write("INSERT INTO snapshots VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    (snap.id, snap.group_id, snap.server_id, snap.namespace, snap.image_tag, snap.server_name,
                     snap.runtime_class_name, int(snap.run_as_root), snap.server_kind, snap.tag, snap.created_at,
                     snap.tenant))

    def snapshots(self, group_id: str, tenant: str) -> list[SnapshotRow]:
        """The snapshots ``tenant`` took under ``group_id``, newest first."""
        rows = self._query("SELECT * FROM snapshots WHERE group_id=? AND tenant=? ORDER BY created_at DESC",
                           (group_id, tenant))
        return [from_db(SnapshotRow, r) for r in rows]

    def count_snapshots(self) -> int:
        """How many snapshots there are, every tenant's (what ``--max-snapshots`` bounds)."""
        return int(self._query("SELECT COUNT(*) FROM snapshots")[0][0])

    def find_snapshot(self, namespace: str, image_tag: str, server_name: str, runtime: str | None, root: bool,
                      kind: str, tenant: str) -> SnapshotRow | None:
        rows = self._query(
            "SELECT * FROM snapshots WHERE namespace=? AND image_tag=? AND server_name=? AND runtime_class_name IS ? "
            "AND run_as_root=? AND server_kind=? AND tenant=? ORDER BY created_at DESC LIMIT 1",
            (namespace, image_tag, server_name, runtime, int(root), kind, tenant),
        )
        return from_db(SnapshotRow, rows[0]) if rows else None

    def add_batch(self, request_id: str, total: int, tenant: str) -> None:
        self._write("INSERT INTO snapshot_batches VALUES (?,?,?,?,?)", (request_id, now_ms(), total, "[]", tenant))

    def batch_add_result(self, request_id: str, result: dict[str, Any]) -> None:
        with self.tx() as db:
            row = db.execute("SELECT results FROM snapshot_batches WHERE request_id=?", (request_id,)).fetchone()
            results = json.loads(row["results"]) + [result]
            db.execute("UPDATE snapshot_batches SET results=? WHERE request_id=?", (json.dumps(results), request_id))

    def get_batch(self, request_id: str, tenant: str) -> tuple[int, list[dict[str, Any]]] | None:
        rows = self._query("SELECT total, results FROM snapshot_batches WHERE request_id=? AND tenant=?",
                           (request_id, tenant))
        return (int(rows[0]["total"]), json.loads(rows[0]["results"])) if rows else None

    # -- images ---------------------------------------------------------------------------------

    def add_tenant_image(self, tenant: str, tag: str) -> None:
        """Record that ``tenant`` builds images tagged ``tag`` (``image_access``)."""
        self._write("INSERT OR IGNORE INTO tenant_images VALUES (?,?)", (tenant, tag))

    def has_tenant_image(self, tenant: str, tag: str) -> bool:
        return bool(self._query("SELECT 1 FROM tenant_images WHERE tenant=? AND tag=?", (tenant, tag)))

    # -- uploads (uploads.py) -------------------------------------------------------------------

    def add_upload(self, tenant: str, digest: str, size: int, files: int) -> None:
        """Record that ``tenant`` holds the upload ``digest`` (again: its use time is renewed)."""
        now = now_ms()
        with self.tx(servers_unchanged=True) as db:
            db.execute("INSERT INTO uploads VALUES (?,?,?,?,?,?) ON CONFLICT (tenant, digest) DO UPDATE SET used_at=?",
                       (tenant, digest, size, files, now, now, now))

    def held_uploads(self, tenant: str, digests: Iterable[str]) -> set[str]:
        wanted = list(digests)
        held: set[str] = set()
        for start in range(0, len(wanted), 500):
            part = wanted[start:start + 500]
            rows = self._query(f"SELECT digest FROM uploads WHERE tenant=? AND digest IN ({','.join('?' * len(part))})",
                               (tenant, *part))
            held.update(r["digest"] for r in rows)
        return held

    def touch_upload(self, tenant: str, digest: str) -> bool:
        """Renew the use time of ``tenant``'s upload; False when it holds none of that name."""
        with self.tx(servers_unchanged=True) as db:
            return db.execute("UPDATE uploads SET used_at=? WHERE tenant=? AND digest=?",
                              (now_ms(), tenant, digest)).rowcount == 1

    def upload_bytes(self, tenant: str) -> int:
        """Bytes of the uploads ``tenant`` holds."""
        return int(self._query("SELECT COALESCE(SUM(bytes), 0) AS n FROM uploads WHERE tenant=?", (tenant,))[0]["n"])

    def remove_uploads(self, pairs: Iterable[tuple[str, str]]) -> list[str]:
        """Drop ``(tenant, digest)`` references; the digests no tenant holds any more."""
        pairs = list(pairs)
        with self.tx(servers_unchanged=True) as db:
            for tenant, digest in pairs:
                db.execute("DELETE FROM uploads WHERE tenant=? AND digest=?", (tenant, digest))
            return [d for d in {d for _, d in pairs}
                    if db.execute("SELECT 1 FROM uploads WHERE digest=?", (d,)).fetchone() is None]

    def unused_uploads(self, before: int) -> list[tuple[str, str]]:
        """``(tenant, digest)`` of the uploads not used since ``before`` (ms)."""
        return [(r["tenant"], r["digest"]) for r in self._query("SELECT tenant, digest FROM uploads WHERE used_at<?",
                                                                (before,))]

    # -- warm pool ----------------------------------------------------------------------------

    def add_pool_member(self, name: str, key: str, handle: str) -> None:
        self._write("INSERT OR REPLACE INTO pool VALUES (?,?,?,?)", (name, key, handle, now_ms()))

    def remove_pool_member(self, name: str) -> bool:
        return self.remove_pool_members([name]) == 1

    def remove_pool_members(self, names: Iterable[str]) -> int:
        """Drop the members ``names`` in one transaction (a fork takes several); how many were there."""
        with self.tx() as db:
            return sum(db.execute("DELETE FROM pool WHERE name=?", (name,)).rowcount for name in names)

    def pool_members(self) -> list[PoolRow]:
        return [from_db(PoolRow, r) for r in self._query("SELECT * FROM pool ORDER BY created_at")]
