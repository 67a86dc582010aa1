"""``idegym images``: the local image store from the command line (list, push, logs), and the host's
build cache (prune-builds)."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from pathlib import Path

from ..images import ImageStore
from .buildah import Buildah, available
from .settings import OciError, OciSettings

TRANSPORTS = {"docker", "oci", "oci-archive", "docker-archive", "dir"}
DESCRIPTION = ("The local backend's image store: list the images, push an OCI image to a registry, "
               "print a failed build's whole log, prune the host's build cache.")
PRUNE_EPILOG = """\
Removes the images of the host's build cache ($IDEGYM_BUILD_CACHE_DIR, default <image cache>/builds)
that no control plane built or took for --unused-days, and those a killed publication left
without a record. Never one an image store of a state directory a local backend has run on
since boot uses (every live sandbox's is among them); an image of an older state directory whose
layers were removed says so at its next start: build it again.
"""
PUSH_EPILOG = """\
The image goes with `buildah push` (its layers as they are in the store, compressed for the
registry). DEST is REGISTRY/REPOSITORY:TAG (or any buildah destination such as oci:/dir:tag).
Credentials: --creds USER[:PASSWORD], or --authfile (a Docker config.json / auth.json).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from control_plane.settings import ControlPlaneSettings

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--state-dir", type=Path, default=ControlPlaneSettings.from_env().default_state_dir(),
                        help="the control plane's state directory [$IDEGYM_CONTROL_PLANE_STATE_DIR] "
                             "(default: %(default)s)")
    sub = parser.add_subparsers(dest="images_command", required=True, metavar="COMMAND")
    sub.add_parser("list", help="the images of the store (tag, kind, id)", parents=[common])
    push = sub.add_parser("push", help="push an OCI image of the store to a registry (buildah push)",
                          epilog=PUSH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter, parents=[common])
    push.add_argument("tag", help="the image's tag in the local store")
    push.add_argument("dest", help="REGISTRY/REPOSITORY:TAG")
    push.add_argument("--creds", help="USER[:PASSWORD] for the registry")
    push.add_argument("--authfile", type=Path, help="credentials file (Docker config.json format)")
    push.add_argument("--tls-verify", default="true", choices=("true", "false"),
                      help="verify the registry's TLS certificate; false also allows plain HTTP (default: true)")
    prune = sub.add_parser("prune-builds", help="remove unused images of the host's build cache",
                           epilog=PRUNE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    prune.add_argument("--unused-days", type=float, default=14.0,
                       help="remove images no control plane built or took for this long (default: %(default)g)")
    prune.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    logs = sub.add_parser("logs", help="a failed build's whole log (its job name: build-…)", parents=[common])
    logs.add_argument("job", help="the build job's name, as its error names it (build-1a2b3c4d)")


def run(args: argparse.Namespace) -> int:
    if args.images_command == "logs":
        from control_plane.jobs import build_log_path

        if not re.fullmatch(r"build-[0-9a-f]+", args.job):
            print(f"idegym images logs: {args.job!r} is not a build job's name (build-<hex>)", file=sys.stderr)
            return 2
        path = build_log_path(Path(args.state_dir), args.job)
        try:
            sys.stdout.write(path.read_text(errors="replace"))
        except FileNotFoundError:
            print(f"idegym images logs: no log of {args.job} in {path.parent} (only failed builds keep one; "
                  "is --state-dir the control plane's?)", file=sys.stderr)
            return 2
        return 0
    if args.images_command == "prune-builds":
        return prune_builds(args.unused_days, args.dry_run)
    store = ImageStore(Path(args.state_dir) / "images")
    if args.images_command == "list":
        for tag in store.tags():
            meta = store.meta(tag) or {}
            print(json.dumps({"tag": tag, "kind": meta.get("kind", "tree"), "id": meta.get("id")}))
        return 0
    try:
        return asyncio.run(push(store, Path(args.state_dir), args.tag, args.dest, creds=args.creds,
                                authfile=args.authfile, tls_verify=args.tls_verify == "true"))
    except OciError as exc:
        print(f"idegym images push: {exc.message}", file=sys.stderr)
        return 2


async def push(store: ImageStore, state_dir: Path, tag: str, dest: str, *, creds: str | None = None,
               authfile: Path | None = None, tls_verify: bool = True) -> int:
    reason = available()
    if reason:
        raise OciError(reason)
    meta = store.meta(tag)
    if meta is None:
        raise OciError(f"no image {tag!r} in {store.root} (known: {', '.join(store.tags())})")
    if meta.get("kind") != "oci":
        raise OciError(f"{tag!r} is not an OCI image (it is the host's userland with layers on top): build it from a "
                       "Dockerfile or on a Debian base (`base: debian:bookworm`) to push it")
    settings = OciSettings.from_env()
    from .bases import BaseCache

    buildah = Buildah(state_dir / "images" / "buildah", settings, additional=(BaseCache(settings).store_home,))
    buildah.ensure()
    transport = dest.split(":", 1)[0]
    target = dest if transport in TRANSPORTS and ":" in dest else f"docker://{dest}"
    args = ["push", "--signature-policy", buildah.policy, f"--tls-verify={'true' if tls_verify else 'false'}"]
    if creds:
        args += ["--creds", creds]
    if authfile:
        args += ["--authfile", str(authfile)]
    args += [meta["oci"]["image_id"], target]
    result = await buildah.run(args, network=True, emit=print, timeout=3600)
    if result.returncode != 0:
        raise OciError(f"buildah push failed:\n{result.message(10)}")
    print(f"pushed {tag} to {dest}")
    return 0


def prune_builds(unused_days: float, dry_run: bool) -> int:
    from ..layout import registered_states
    from .build_cache import BuildCache

    reason = available()
    if reason:
        print(f"idegym images prune-builds: {reason}", file=sys.stderr)
        return 2
    keep: set[str] = set()
    for state in registered_states().values():
        store = ImageStore(state / "images")
        for tag in store.tags() if store.refs.is_dir() else ():
            meta = store.meta(tag) or {}
            if meta.get("kind") == "oci":
                keep.update(meta["oci"]["layers"])
    from .bases import BaseCache

    settings = OciSettings.from_env()
    cache = BuildCache(settings, BaseCache(settings).store_home)
    removed = cache.prune(unused_days * 86400, keep, dry_run)
    if not dry_run and cache.root.is_dir():
        left = cache.remove_leftovers()
        print(f"removed {left} working container(s) of builds that were killed" if left else
              "no working container of a killed build (or a build is running: the next one removes them)",
              file=sys.stderr)
    for entry in removed:
        print(json.dumps({"removed" if not dry_run else "would_remove": entry}))
    print(f"{'would remove' if dry_run else 'removed'} {len(removed)} image(s) of {cache.root}; "
          "those a state directory's images read kept", file=sys.stderr)
    return 0
