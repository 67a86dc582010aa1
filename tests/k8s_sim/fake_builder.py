"""Stand-in for the in-cluster image builder (Kaniko) in the simulator's build Jobs.

It takes Kaniko's own flags, reads the rendered Dockerfile from the (simulated) ConfigMap
volume, unpacks a ``tar://`` build context as Kaniko does, prints one line per instruction like
Kaniko does (a ``COPY``/``ADD`` lists the context files it takes), and exits 0 - or exits 1 with
Kaniko's style of error when the base image cannot exist (``FROM`` naming ``does-not-exist``),
the Dockerfile is malformed, or a ``COPY`` source is not in the context. It builds and pushes
nothing: what an image build really does cannot be shown without a registry and a container
runtime.
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fake-kaniko")
    parser.add_argument("--dockerfile", required=True)
    parser.add_argument("--context", default="dir:///workspace")
    parser.add_argument("--destination", action="append", required=True)
    args, _unknown = parser.parse_known_args(argv)  # --cache, --insecure, ... are accepted and ignored
    path = Path(args.dockerfile)
    if not path.is_file():
        print(f"error resolving dockerfile path: {path} does not exist", file=sys.stderr)
        return 1
    lines = [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines or not lines[0].upper().startswith("FROM "):
        print("error building image: parsing dockerfile: first instruction must be FROM", file=sys.stderr)
        return 1
    base = lines[0].split()[1]
    context = _context(args.context)
    if context is None:
        return 1
    print(f'INFO Retrieving image manifest {base}', flush=True)
    if "does-not-exist" in base:
        print(f"error building image: unable to complete operation after 0 attempts, last error: "
              f"GET https://registry/v2/{base}/manifests: MANIFEST_UNKNOWN: manifest unknown", file=sys.stderr)
        return 1
    for number, line in enumerate(lines[1:], start=2):
        print(f"INFO [{number}/{len(lines)}] {line}", flush=True)
        words = line.split()
        if words[0].upper() in ("COPY", "ADD") and not any(w.startswith("--from") for w in words):
            sources = [w for w in words[1:-1] if not w.startswith("--") and "://" not in w]
            for source in sources:
                found = sorted(str(p.relative_to(context)) for p in context.glob(source.strip("/") or ".")
                               if p != context) if source not in (".", "./") else ["."]
                if not found:
                    print(f"error building image: error building stage: failed to get files used from context: "
                          f"failed to get fileinfo for /kaniko/buildcontext/{source}: lstat "
                          f"/kaniko/buildcontext/{source}: no such file or directory", file=sys.stderr)
                    return 1
            files = sorted(str(p.relative_to(context)) for p in context.rglob("*") if p.is_file())
            print(f"INFO Taking files from the build context: {' '.join(files)}", flush=True)
    for dest in args.destination:
        print(f"INFO Pushing image to {dest}", flush=True)
        print(f"INFO Pushed {dest}", flush=True)
    return 0


def _context(spec: str) -> Path | None:
    """The build context directory: ``dir://`` as is, ``tar://`` unpacked into a temporary one."""
    if spec.startswith("dir://"):
        return Path(spec[len("dir://"):])
    if spec.startswith("tar://"):
        archive = Path(spec[len("tar://"):])
        if not archive.is_file():
            print(f"error building image: getting build context: {archive} does not exist", file=sys.stderr)
            return None
        target = Path(tempfile.mkdtemp(prefix="buildcontext-"))
        atexit.register(shutil.rmtree, target, True)
        with tarfile.open(archive) as tar:
            tar.extractall(target, filter="data")
        print(f"INFO Unpacked the build context ({sum(1 for _ in target.rglob('*'))} entries)", flush=True)
        return target
    print(f"error building image: unsupported context {spec!r}", file=sys.stderr)
    return None


if __name__ == "__main__":
    sys.exit(main())
