"""The output directory of a run and the record of one episode.

::

    <out>/manifest.json           the run (see manifest.py)
    <out>/episodes.jsonl          one JSON object per finished episode, appended and fsync'ed
    <out>/transcripts/<task>-<attempt>.txt
    <out>/summary.md, summary.json

A line is appended only once the episode is over (graded, or recorded as an error), so an
interrupted run loses at most the episodes that were running. A line cut short by a crash is
dropped when the directory is opened again.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

EPISODES = "episodes.jsonl"
MANIFEST = "manifest.json"
TRANSCRIPTS = "transcripts"
SUMMARY_MD = "summary.md"
SUMMARY_JSON = "summary.json"

# Every record has these keys (None where not applicable).
RECORD_KEYS = (
    "id", "task", "attempt", "agent", "seed", "reward", "passed", "solved", "reward_components", "checks",
    "steps", "tool_calls", "invalid_actions", "submitted", "truncated", "tokens", "wall_seconds",
    "setup_seconds", "started_at", "error", "error_kind", "transcript", "image", "sandbox", "worker",
    "node", "reruns",  # Ray: the node the episode ran on, and how often it was run again after losing one
)


def episode_id(task_id: str, attempt: int) -> str:
    return f"{task_id}#{attempt}"


def new_record(task_id: str, attempt: int, **fields: Any) -> dict[str, Any]:
    record: dict[str, Any] = dict.fromkeys(RECORD_KEYS)
    record.update(id=episode_id(task_id, attempt), task=task_id, attempt=attempt, steps=0, tool_calls={},
                  invalid_actions=0, passed=False, solved=False)
    record.update(fields)
    return record


class ResultsDir:
    """The files of one run; safe to append to from several threads."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.episodes = self.root / EPISODES
        self.manifest_path = self.root / MANIFEST
        self.transcripts = self.root / TRANSCRIPTS
        self._lock = threading.Lock()

    # -- manifest ---------------------------------------------------------------------------------------

    def read_manifest(self) -> dict[str, Any] | None:
        if not self.manifest_path.is_file():
            return None
        return json.loads(self.manifest_path.read_text(encoding="utf-8"))

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.manifest_path, json.dumps(manifest, indent=2) + "\n")

    def clear(self) -> None:
        """Remove what a previous run left here (only the files a run writes)."""
        for name in (EPISODES, MANIFEST, SUMMARY_MD, SUMMARY_JSON):
            (self.root / name).unlink(missing_ok=True)
        shutil.rmtree(self.transcripts, ignore_errors=True)

    # -- episodes ---------------------------------------------------------------------------------------

    def load(self) -> list[dict[str, Any]]:
        """Every complete record, in file order; a torn last line (a crash mid-write) is cut off."""
        if not self.episodes.is_file():
            return []
        data = self.episodes.read_bytes()
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            with open(self.episodes, "r+b") as f:
                f.truncate(keep)
                f.flush()
                os.fsync(f.fileno())
            data = data[:keep]
        out = []
        for line in data.decode("utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and "task" in record and "attempt" in record:
                out.append(record)
        return out

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, ensure_ascii=False, default=str) + "\n"
        with self._lock:
            self.root.mkdir(parents=True, exist_ok=True)
            with open(self.episodes, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())

    def write_transcript(self, task_id: str, attempt: int, text: str) -> str:
        """Write the transcript; returns its path relative to the output directory."""
        self.transcripts.mkdir(parents=True, exist_ok=True)
        path = self.transcripts / f"{task_id}-{attempt}.txt"
        _write_atomic(path, text)
        return path.relative_to(self.root).as_posix()

    def write_text(self, name: str, text: str) -> Path:
        path = self.root / name
        _write_atomic(path, text)
        return path


def latest(records: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """The last record of each (task, attempt): a retried episode replaces its earlier error."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for record in records:
        out[(record["task"], int(record["attempt"]))] = record
    return out


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


__all__ = ["ResultsDir", "new_record", "episode_id", "latest", "RECORD_KEYS", "EPISODES", "MANIFEST",
           "TRANSCRIPTS", "SUMMARY_MD", "SUMMARY_JSON"]
