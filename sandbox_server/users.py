"""Who a tool runs as: a user of the sandbox's own passwd database, and its groups."""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass


@dataclass(frozen=True)
class UserSpec:
    name: str
    uid: int
    gid: int
    home: str
    shell: str

    @classmethod
    def lookup(cls, name_or_uid: str) -> UserSpec:
        """Raises ``KeyError`` when the user does not exist in this (sandbox's) passwd database."""
        entry = pwd.getpwuid(int(name_or_uid)) if name_or_uid.isdigit() else pwd.getpwnam(name_or_uid)
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir, entry.pw_shell or "/bin/bash")

    @classmethod
    def current(cls) -> UserSpec:
        try:
            return cls.lookup(str(os.getuid()))
        except KeyError:
            uid = os.getuid()
            return cls(str(uid), uid, os.getgid(), os.environ.get("HOME", "/"), "/bin/bash")


def groups_of(user: UserSpec) -> list[int]:
    """The user's supplementary groups, read again only when /etc/group changes."""
    try:
        stamp = os.stat("/etc/group").st_mtime_ns
    except OSError:
        stamp = None
    key = (user.name, user.gid, stamp)
    if key not in _GROUPS:
        import grp

        if any(k[2] != stamp for k in _GROUPS):  # /etc/group changed: forget what it said before
            _GROUPS.clear()
        try:
            _GROUPS[key] = [g.gr_gid for g in grp.getgrall() if user.name in g.gr_mem and g.gr_gid != user.gid]
        except OSError:
            _GROUPS[key] = []
    return _GROUPS[key]


_GROUPS: dict[tuple[str, int, int | None], list[int]] = {}
