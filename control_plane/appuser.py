"""The unprivileged user every sandbox runs its tools as, and where its project lives.

One definition for every backend and image format: the local image store creates the account,
Kubernetes pods run as its uid, image builds put the project in its home.
"""

from __future__ import annotations

from typing import NamedTuple


class User(NamedTuple):
    name: str
    uid: int
    gid: int
    home: str


APPUSER = User("appuser", 1000, 1000, "/home/appuser")
PROJECT_DIR = f"{APPUSER.home}/work"  # the project inside every sandbox
