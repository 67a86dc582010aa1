"""The remover: a process of its own, at the lowest CPU priority, that removes what retired
sandboxes leave (``teardown.remove_files``: cgroups, mounts, directories) for ``removals.py``.

A process, not a thread of the control plane at nice 19: such a thread holds the GIL the event
loop needs between its system calls, and one preempted while holding it stalls the loop
(``priority.py``). It reads one request a line on stdin (JSON: the directory, run directory and
cgroups) and answers each with a line: the problems found (JSON). It exits at the end of its
input: with the control plane that started it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from . import teardown
from .priority import BACKGROUND_NICE

_ROOT = Path(__file__).resolve().parents[3]  # where this control_plane package is imported from
_MAIN = "import sys; sys.path.insert(0, sys.argv[1]); from control_plane.backends.local.remover import main; main()"


class Remover:
    """The control plane's side: one remover, started on first use (from a thread in the host's
    mount namespace: the mounts it removes are there); one request at a time."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def remove_files(self, sb: Path, run: Path, cgroups: dict[str, str]) -> list[str]:
        """``teardown.remove_files`` in the remover; in this process when it cannot answer."""
        request = json.dumps({"sb": str(sb), "run": str(run), "cgroups": cgroups}) + "\n"
        with self._lock:
            for _ in range(2):  # a remover that died: once more with a new one
                proc = self._started()
                assert proc.stdin is not None and proc.stdout is not None
                try:
                    proc.stdin.write(request)
                    proc.stdin.flush()
                    answer = proc.stdout.readline()
                except OSError:
                    answer = ""
                if answer:
                    return json.loads(answer)
                self._stop()
        return teardown.remove_files(sb, run, cgroups)

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _started(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen([sys.executable, "-c", _MAIN, str(_ROOT)], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, text=True, cwd="/",
                                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"})
            try:
                os.setpriority(os.PRIO_PROCESS, self._proc.pid, BACKGROUND_NICE)
            except ProcessLookupError:
                pass
        return self._proc

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.close()
            except OSError:
                pass
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        try:
            problems = teardown.remove_files(Path(request["sb"]), Path(request["run"]), request["cgroups"])
        except Exception as exc:  # noqa: BLE001 - answered: the caller names what was left
            problems = [f"{type(exc).__name__}: {exc}"]
        sys.stdout.write(json.dumps(problems) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
