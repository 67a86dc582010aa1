"""The venvs `make test` installs in the background while the suite runs (the Makefile's
SIDE_VENVS: the published client's, and the frameworks' whose pins clash with the main venv's).

pytest starts once the main venv is there, instead of after them all (they ended 60-130 s after it
in four fresh clones); a test that needs one calls ``side_venv`` before it uses it. Under
`make test` that waits for the venv's install to end, and fails naming its log and its make target
if the install failed or had not ended in time; outside `make test` (venvs made by hand, or not) it
fails, as the tests did before, if the venv is not installed.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, wait_until

CLIENT_VENV, HARBOR_VENV, NEMO_VENV, VERL_VENV, VERIFIERS_VENV = (
    REPO / f".venv-{name}" for name in ("client", "harbor", "nemo-gym", "verl", "verifiers"))

# Set by `make test`: the directory of the background installs' logs and outcomes (`<target>.log`,
# then `<target>.ok` or `<target>.failed`; `done` once they have all ended; `started`).
INSTALLS = "IDEGYM_BACKGROUND_INSTALLS"
# A wait ends within WAIT seconds (below the suite's 300 s per-test timeout, so that the failure
# shown is this one, naming the log) and by BOUND seconds after the installs began (an install that
# hangs then fails each later test at once rather than after a wait of its own).
WAIT = 240.0
BOUND = 600.0
# Where `make test` notes which tests waited, and how long, to print them at its end.
WAITS = "waits"


def side_venv(venv: Path) -> Path:
    """``venv`` (e.g. ``REPO / ".venv-harbor"``) once installed: under `make test`, once its
    background install ended well."""
    target = f"{venv.name.removeprefix('.venv-')}-venv"  # the Makefile's name: .venv-harbor, harbor-venv
    installs = os.environ.get(INSTALLS)
    if installs:
        _wait(Path(installs), target)
    if not (venv / ".stamp").exists():
        pytest.fail(f"{venv} is not installed: run `make {target}`", pytrace=False)
    return venv


def _wait(installs: Path, target: str) -> None:
    log, ok, failed, done = (installs / name for name in (f"{target}.log", f"{target}.ok", f"{target}.failed", "done"))
    since = (installs / "started").stat().st_mtime
    began = time.monotonic()

    def ended() -> bool:
        return ok.exists() or failed.exists() or done.exists()

    if not ended():
        print(f"waiting for {target}, which `make test` installs in the background (log: {log})", file=sys.stderr,
              flush=True)
        wait_until(ended, timeout=min(WAIT, since + BOUND - time.time()), interval=0.2)
        waited = time.monotonic() - began
        with open(installs / WAITS, "a") as record:
            record.write(f"{target} {waited:5.1f} s  {os.environ.get('PYTEST_CURRENT_TEST', '?')}\n")
    run = f"run `make {target}` to install it (or see why it fails), then the test again"
    if ok.exists():  # before `done`, which is written after every outcome
        return
    if failed.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        pytest.fail(f"{target} failed to install in the background of `make test` (log: {log}); {run}.\n"
                    f"The log ends:\n{tail}", pytrace=False)
    if done.exists():
        pytest.fail(f"the background installs of `make test` ended without {target} "
                    f"(see {installs / 'make.log'}); {run}", pytrace=False)
    pytest.fail(f"{target} was not installed after {time.monotonic() - began:.0f} s of waiting, "
                f"{time.time() - since:.0f} s after `make test` began installing it in the background "
                f"(log: {log}); {run}", pytrace=False)
