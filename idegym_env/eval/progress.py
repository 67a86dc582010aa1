"""A progress line on stderr: done / running / failed, and the running pass rate.

On a terminal the line is redrawn in place (and refreshed every second for the clock); otherwise
one plain line is printed per finished episode, which reads well in CI logs.
``failed`` counts episodes that errored (agent crash, timeout, broken environment), not episodes
that merely did not pass.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO


class Progress:
    def __init__(self, total: int, *, skipped: int = 0, passed: int = 0, failed: int = 0,
                 stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total = total
        self.done = skipped
        self.passed = passed
        self.failed = failed
        self.running = 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if self.enabled:
            if skipped:
                self._print(f"resuming: {skipped} of {total} episodes already done")
            if self.tty:
                self._ticker = threading.Thread(target=self._tick, name="eval-progress", daemon=True)
                self._ticker.start()
            self._draw()

    def line(self) -> str:
        rate = f"{100 * self.passed / self.done:.1f}% ({self.passed}/{self.done})" if self.done else "–"
        elapsed = int(time.monotonic() - self._started)
        return (f"[eval] {self.done}/{self.total} done | {self.running} running | {self.failed} failed | "
                f"pass {rate} | {elapsed // 60}:{elapsed % 60:02d}")

    def started(self) -> None:
        with self._lock:
            self.running += 1
            if self.tty:
                self._draw()

    def finished(self, record: dict[str, Any], *, counted: bool = True) -> None:
        with self._lock:
            self.running = max(self.running - 1, 0)
            if not counted:
                return
            self.done += 1
            self.passed += bool(record.get("passed"))
            self.failed += bool(record.get("error"))
            if self.tty:
                self._draw()
            elif self.enabled:
                reward = record.get("reward")
                what = (f"error ({record.get('error_kind')}): {_shortened(str(record.get('error')), 240)}"
                        if record.get("error") else
                        f"reward {reward:.3f}{' passed' if record.get('passed') else ''}")
                wall = record.get("wall_seconds") or 0.0
                self._print(f"{self.line()} | {record['id']} {what} in {wall:.1f} s")

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(2)
        with self._lock:
            if self.enabled and self.tty:
                self.stream.write("\r\x1b[2K" + self.line() + "\n")
                self.stream.flush()

    def _draw(self) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.line())
            self.stream.flush()
        elif self.done == 0 and self.running == 0:
            self._print(self.line())

    def _print(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\x1b[2K")
        self.stream.write(text + "\n")
        self.stream.flush()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                self._draw()


def _shortened(text: str, limit: int) -> str:
    """``text`` up to ``limit`` characters; a cut one ends with an ellipsis, so it does not read as whole."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


__all__ = ["Progress"]
