"""``python -m tests.k8s_sim``: run the Kubernetes API simulator.

Prints one JSON line ``{"url": ..., "port": ...}`` on stdout once it listens; SIGTERM/SIGINT stop
it and every pod process it started. Write a kubeconfig for it with ``--kubeconfig PATH``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from .images import ImageCatalog
from .sim import Simulator, serve


def write_kubeconfig(path: Path, url: str, token: str | None, namespace: str = "idegym") -> None:
    user = {"token": token} if token else {}
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "sim",
        "clusters": [{"name": "sim", "cluster": {"server": url}}],
        "users": [{"name": "sim", "user": user}],
        "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim", "namespace": namespace}}],
    }
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.k8s_sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--token", default=os.environ.get("K8S_SIM_TOKEN"), help="required bearer token")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--node-label", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--namespace", action="append", default=[], help="namespaces that exist at start")
    parser.add_argument("--snapshots", action="store_true", help="serve the GKE pod-snapshot CRDs")
    parser.add_argument("--image", action="append", default=[], metavar="TAG=DIR",
                        help="the image's project directory (sandbox server --project-source)")
    parser.add_argument("--kubeconfig", type=Path, help="write a kubeconfig for the simulator here")
    parser.add_argument("--latency", type=float, default=0.0, metavar="SECONDS",
                        help="added to every API request but a watch, as a remote API server's round trip (default 0)")
    args = parser.parse_args(argv)
    args.state_dir.mkdir(parents=True, exist_ok=True)
    images = ImageCatalog(projects={t: Path(d) for t, _, d in (i.partition("=") for i in args.image)})
    sim = Simulator(args.state_dir, token=args.token, nodes=args.nodes,
                    node_labels=dict(kv.split("=", 1) for kv in args.node_label), snapshots=args.snapshots,
                    namespaces=tuple(args.namespace) or ("default", "idegym"), images=images,
                    latency=args.latency)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        ready: asyncio.Future[int] = loop.create_future()
        server = asyncio.ensure_future(serve(sim, args.host, args.port, ready, stop))
        port = await asyncio.wait_for(asyncio.shield(ready), 30)
        url = f"http://{args.host}:{port}"
        if args.kubeconfig:
            write_kubeconfig(args.kubeconfig, url, args.token)
        sys.stdout.write(json.dumps({"url": url, "port": port}) + "\n")
        sys.stdout.flush()
        await server

    asyncio.run(run())


if __name__ == "__main__":
    main()
