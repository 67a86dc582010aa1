"""The rows of the control plane's database: one dataclass per table, and the schema."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, fields
from typing import Any

from .models import AsyncOperationStatus, AsyncOperationType, AvailabilityStatus


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class ClientRow:
    id: str
    name: str
    namespace: str
    nodes_count: int
    availability: AvailabilityStatus
    created_at: int
    last_heartbeat_time: int
    tenant: str = ""  # whose client it is (tenants.py); everything of the client is the tenant's


@dataclass
class ServerRow:
    id: int
    client_id: str
    client_name: str
    server_name: str
    generated_name: str
    namespace: str
    image_tag: str
    runtime_class_name: str | None
    run_as_root: bool
    server_kind: str
    service_port: int
    container_port: int
    availability: AvailabilityStatus
    details: str | None
    created_at: int
    last_activity_at: int
    keepalive_until: int | None
    max_restarts: int
    restarts: int
    request: str
    handle: str | None


@dataclass
class OperationRow:
    id: int
    request_type: AsyncOperationType
    status: AsyncOperationStatus
    request: str | None
    result: str | None
    client_id: str | None
    server_id: int | None
    orchestrator_pod: str | None
    scheduled_at: int
    started_at: int | None
    finished_at: int | None


@dataclass
class JobRow:
    id: int
    job_name: str
    status: str
    created_at: int
    updated_at: int
    details: str | None
    tag: str | None
    request_id: str | None
    tenant: str = ""


@dataclass
class SnapshotRow:
    id: str
    group_id: str
    server_id: int | None
    namespace: str
    image_tag: str
    server_name: str
    runtime_class_name: str | None
    run_as_root: bool
    server_kind: str
    tag: str | None
    created_at: int
    tenant: str = ""


@dataclass
class PoolRow:
    name: str
    pool_key: str
    handle: str
    created_at: int


SCHEMA = """
CREATE TABLE IF NOT EXISTS clients (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, namespace TEXT NOT NULL, nodes_count INTEGER NOT NULL,
    availability TEXT NOT NULL, created_at INTEGER NOT NULL, last_heartbeat_time INTEGER NOT NULL,
    tenant TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS clients_name ON clients(name);
CREATE TABLE IF NOT EXISTS servers (
    id INTEGER PRIMARY KEY AUTOINCREMENT, client_id TEXT NOT NULL, client_name TEXT NOT NULL,
    server_name TEXT NOT NULL, generated_name TEXT NOT NULL, namespace TEXT NOT NULL, image_tag TEXT NOT NULL,
    runtime_class_name TEXT, run_as_root INTEGER NOT NULL, server_kind TEXT NOT NULL,
    service_port INTEGER NOT NULL, container_port INTEGER NOT NULL, availability TEXT NOT NULL,
    details TEXT, created_at INTEGER NOT NULL, last_activity_at INTEGER NOT NULL, keepalive_until INTEGER,
    max_restarts INTEGER NOT NULL, restarts INTEGER NOT NULL DEFAULT 0, request TEXT NOT NULL, handle TEXT);
CREATE INDEX IF NOT EXISTS servers_client ON servers(client_id);
CREATE INDEX IF NOT EXISTS servers_reuse ON servers(availability, client_name, image_tag);
CREATE TABLE IF NOT EXISTS operations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, request_type TEXT NOT NULL, status TEXT NOT NULL, request TEXT,
    result TEXT, client_id TEXT, server_id INTEGER, orchestrator_pod TEXT, scheduled_at INTEGER NOT NULL,
    started_at INTEGER, finished_at INTEGER);
CREATE INDEX IF NOT EXISTS operations_status ON operations(status);
CREATE INDEX IF NOT EXISTS operations_scheduled ON operations(scheduled_at);
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, job_name TEXT UNIQUE NOT NULL, status TEXT NOT NULL,
    created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, details TEXT, tag TEXT, request_id TEXT,
    tenant TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS snapshots (
    id TEXT PRIMARY KEY, group_id TEXT NOT NULL, server_id INTEGER, namespace TEXT NOT NULL,
    image_tag TEXT NOT NULL, server_name TEXT NOT NULL, runtime_class_name TEXT, run_as_root INTEGER NOT NULL,
    server_kind TEXT NOT NULL, tag TEXT, created_at INTEGER NOT NULL, tenant TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS snapshots_group ON snapshots(group_id);
CREATE TABLE IF NOT EXISTS snapshot_batches (
    request_id TEXT PRIMARY KEY, created_at INTEGER NOT NULL, total INTEGER NOT NULL, results TEXT NOT NULL,
    tenant TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS tenant_images (tenant TEXT NOT NULL, tag TEXT NOT NULL, PRIMARY KEY (tenant, tag));
CREATE TABLE IF NOT EXISTS pool (
    name TEXT PRIMARY KEY, pool_key TEXT NOT NULL, handle TEXT NOT NULL, created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS uploads (
    tenant TEXT NOT NULL, digest TEXT NOT NULL, bytes INTEGER NOT NULL, files INTEGER NOT NULL,
    created_at INTEGER NOT NULL, used_at INTEGER NOT NULL, PRIMARY KEY (tenant, digest));
"""

# Columns added since a state directory may have been made: (table, column, its definition).
ADDED_COLUMNS = tuple((table, "tenant", "TEXT NOT NULL DEFAULT ''")
                      for table in ("clients", "jobs", "snapshots", "snapshot_batches"))


def from_db(cls: type, row: sqlite3.Row) -> Any:
    values = {f.name: row[f.name] for f in fields(cls)}
    if "availability" in values:
        values["availability"] = AvailabilityStatus(values["availability"])
    if "run_as_root" in values:
        values["run_as_root"] = bool(values["run_as_root"])
    if cls is OperationRow:
        values["request_type"] = AsyncOperationType(values["request_type"])
        values["status"] = AsyncOperationStatus(values["status"])
    return cls(**values)
