"""``LocalHandleData``: what the local backend records of one sandbox.

The same JSON is its ``SandboxHandle.data`` (the control plane's database) and its
``sandbox.json`` (its directory, for the orphan sweep and a teardown without a record): ``dump()``
writes both, ``of()`` reads both, old records included (every field has a default; a key this
version does not know is kept).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..base import BackendError

Record = list[int]  # [pid, start time] (sandbox_server.procfs.record): a reused pid is never mistaken for it


def required(record: Record | None, what: str) -> Record:
    """A process the sandbox has by now (``what``: its name in the message); ``BackendError``
    when it ended before it could be recorded."""
    if record is None:
        raise BackendError(f"the sandbox's {what} ended before it could be recorded", 500)
    return record


class LocalHandleData(BaseModel):
    model_config = ConfigDict(extra="allow")

    v: int = 1
    isolation: str = ""  # bwrap | none, as the sandbox was made ("": unknown, an old or partial record)
    space: Literal["sandboxes", "builds"] = "sandboxes"
    dir: str = ""  # the sandbox's directory (layers, sandbox.json)
    run_dir: str = ""  # its host-side /run/idegym
    socket: str = ""  # the server's socket: in run_dir while it starts, then hard-linked beside it
    log: str = ""
    image: str | None = None
    image_id: str | None = None
    run_as_root: bool = False
    network: bool = False
    network_peer: str | None = None  # the directory of the sandbox whose network namespace it joined
    snapshot: str | None = None  # the snapshot it was restored from
    forks: list[str] = Field(default_factory=list)  # the fork layers it stands on, top first
    adopted: bool = False  # a warm sandbox remounted onto a fork's layers (adopt.py)
    cgroups: dict[str, str] = Field(default_factory=dict)  # controller -> its group
    # Made ahead of demand with the least CPU weight: the weight its claim gives it (priority.py).
    cpu_shares: int | None = None
    layers_fs: str | None = None  # ext4 (bounded storage) or tmpfs
    owned: bool = False  # this launch made its directory: a failed launch may remove it
    forked: bool = False  # its server was forked by a zygote, which put it into its groups
    # Its processes: the process it was made as by this launcher (while it is being made), bwrap's
    # monitor, the namespace's init, the server, slirp4netns, the lease monitor.
    creator: Record | None = None
    monitor: Record | None = None
    init: Record | None = None
    server: Record | None = None
    net: Record | None = None
    lease_monitor: Record | None = None
    timings_ms: dict[str, float] = Field(default_factory=dict)
    fork_frozen_ms: float | None = None
    # Where the fork that made it spent its time (fork.py): the phases, and this child's own part.
    fork_ms: dict[str, float] = Field(default_factory=dict)

    def processes(self) -> dict[str, Record]:
        """The recorded processes a teardown and the lease monitor end: bwrap's monitor, the
        namespace's init, the server, slirp4netns (those recorded so far)."""
        found = {"monitor": self.monitor, "init": self.init, "server": self.server, "net": self.net}
        return {key: record for key, record in found.items() if record}

    @classmethod
    def of(cls, raw: dict[str, Any] | None) -> LocalHandleData:
        """A record as stored (``SandboxHandle.data``, ``sandbox.json``; None: nothing known)."""
        return cls.model_validate({k: v for k, v in (raw or {}).items() if k != "name"})

    def dump(self) -> dict[str, Any]:
        """The JSON stored in the database and in ``sandbox.json``."""
        return self.model_dump(mode="json", exclude_none=True)
