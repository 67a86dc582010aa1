"""Stand-in for the in-cluster image builder (Kaniko) in the simulator's build Jobs.

It takes Kaniko's own flags, reads the rendered Dockerfile from the (simulated) ConfigMap
volume, prints one line per instruction like Kaniko does, and exits 0 - or exits 1 with
Kaniko's style of error when the base image cannot exist (``FROM`` naming ``does-not-exist``)
or the Dockerfile is malformed. It builds and pushes nothing: what an image build really does
cannot be shown without a registry and a container runtime.
"""

from __future__ import annotations

import argparse
import sys
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
    print(f'INFO Retrieving image manifest {base}', flush=True)
    if "does-not-exist" in base:
        print(f"error building image: unable to complete operation after 0 attempts, last error: "
              f"GET https://registry/v2/{base}/manifests: MANIFEST_UNKNOWN: manifest unknown", file=sys.stderr)
        return 1
    for number, line in enumerate(lines[1:], start=2):
        print(f"INFO [{number}/{len(lines)}] {line}", flush=True)
    for dest in args.destination:
        print(f"INFO Pushing image to {dest}", flush=True)
        print(f"INFO Pushed {dest}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
