"""Harness layers: a harness's packages installed once, in a directory named by what it holds.

A layer is ``<harness root>/<name>-<hash>/`` (the root is bound read-only at
``/opt/idegym/harness`` in every local sandbox: ``control_plane/backends/local/harness_layers.py``)
holding ``site/`` (pip packages, ``pip install --target``), ``node_modules/`` (npm packages),
IdeGym's driver scripts and ``manifest.json`` (what was asked for and what was installed, with
versions). The hash covers the pinned packages, the driver scripts and, for pip, the
interpreter's version: the same spec is built once per host, concurrent builders wait for the
first (a file lock), and a half-built layer is never used (``.complete`` is written last).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from control_plane.backends.local.harness_layers import HARNESS_INSIDE, harness_root

from ..errors import IdeGymError

DRIVERS = Path(__file__).parent / "drivers"
BUILD_TIMEOUT = 1800.0


class LayerError(IdeGymError, RuntimeError):
    """A harness layer could not be built (the installer's error is in the message)."""


@dataclass(frozen=True)
class LayerSpec:
    name: str
    pip: tuple[str, ...] = ()  # pinned requirements: "mini-swe-agent==2.4.6"
    npm: tuple[str, ...] = ()  # pinned packages: "@openai/codex@0.169.0"
    drivers: tuple[str, ...] = ()  # files of ``drivers/`` copied into the layer

    def digest(self) -> str:
        h = hashlib.sha256(json.dumps({"name": self.name, "pip": self.pip, "npm": self.npm}).encode())
        if self.pip:
            h.update(f"python {sys.version_info.major}.{sys.version_info.minor}".encode())
        for name in self.drivers:
            h.update(name.encode() + b"\0" + (DRIVERS / name).read_bytes())
        return h.hexdigest()[:16]

    @property
    def dirname(self) -> str:
        return f"{self.name}-{self.digest()}"


@dataclass
class Layer:
    spec: LayerSpec
    host: Path
    manifest: dict = field(default_factory=dict)

    @property
    def inside(self) -> str:
        """Where a sandbox sees it."""
        return f"{HARNESS_INSIDE}/{self.host.name}"


def ensure(spec: LayerSpec, root: Path | None = None) -> Layer:
    """The layer of ``spec``, built now if this host does not have it yet."""
    root = harness_root() if root is None else root
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    dest = root / spec.dirname
    if not (dest / ".complete").exists():
        with open(root / f".lock-{spec.name}", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (dest / ".complete").exists():
                _build(spec, dest)
    return Layer(spec, dest, json.loads((dest / "manifest.json").read_text()))


def _run(argv: list[str], what: str, env: dict[str, str] | None = None) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LayerError(f"{what}: {exc}") from exc
    if proc.returncode != 0:
        raise LayerError(f"{what} failed (exit {proc.returncode}): {(proc.stderr or proc.stdout)[-3000:]}")
    return proc.stdout


def _build(spec: LayerSpec, dest: Path) -> None:
    tmp = dest.parent / f".tmp-{dest.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    started = time.monotonic()
    installed: dict[str, str] = {}
    try:
        if spec.pip:
            _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-input", "--disable-pip-version-check",
                  "--target", str(tmp / "site"), *spec.pip], f"pip install {' '.join(spec.pip)}")
            for meta in (tmp / "site").glob("*.dist-info/METADATA"):
                fields = dict(line.split(": ", 1) for line in meta.read_text(errors="replace").splitlines()[:10]
                              if ": " in line)
                installed[fields.get("Name", meta.parent.name)] = fields.get("Version", "?")
        if spec.npm:
            env = {**os.environ, "npm_config_update_notifier": "false", "npm_config_fund": "false",
                   "npm_config_audit": "false"}
            _run(["npm", "install", "--prefix", str(tmp), "--omit=dev", "--no-save", *spec.npm],
                 f"npm install {' '.join(spec.npm)}", env)
            for pkg in (tmp / "node_modules").glob("**/package.json"):
                if pkg.parent.parent.name == "node_modules" or pkg.parent.parent.parent.name == "node_modules":
                    try:
                        data = json.loads(pkg.read_text())
                    except ValueError:
                        continue
                    if isinstance(data, dict) and "name" in data and "version" in data:
                        installed.setdefault(str(data["name"]), str(data["version"]))
        for name in spec.drivers:
            shutil.copy2(DRIVERS / name, tmp / name)
        manifest = {"name": spec.name, "pip": list(spec.pip), "npm": list(spec.npm), "drivers": list(spec.drivers),
                    "python": f"{sys.version_info.major}.{sys.version_info.minor}" if spec.pip else None,
                    "installed": dict(sorted(installed.items())), "digest": spec.digest(),
                    "build_seconds": round(time.monotonic() - started, 1)}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
        for path in [tmp, *tmp.rglob("*")]:  # readable by the sandbox's users
            if path.is_symlink():
                continue
            mode = path.stat().st_mode
            os.chmod(path, (mode | 0o444 | (0o111 if path.is_dir() or mode & 0o100 else 0)) & ~0o022)
        (tmp / ".complete").write_text(spec.digest())
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
