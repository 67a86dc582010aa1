"""OCI images on the local backend (``docs/images.md``), in one run:

* the first build of a Debian base (``debian:bookworm`` with mmdebstrap from the Debian archive,
  into an empty cache) — target <= 60 s;
* a cached rebuild: the same base asked for again (a new cache handle, as another state
  directory or control plane would) — target <= 2 s;
* a Dockerfile build on the cached base (``FROM debian:bookworm``, ``RUN``, ``COPY``; no network),
  and a rebuild of the unchanged Dockerfile (buildah's layer cache);
* the cold start of a sandbox (no warm pool: create until the server answers) from that OCI
  image against one from the built-in image, interleaved — target <= 1.2x.

Network: only the base build (Debian's archive). The cache and state are temporary directories.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

from ._common import Progress, Result, Stats, check_target, stats_table, table

N = int(os.environ.get("BENCH_IMAGES_N", "10"))
DOCKERFILE = """FROM debian:bookworm
RUN useradd --uid 2000 --create-home builder && mkdir -p /opt/tools && echo built > /opt/tools/marker
COPY --chown=1000:1000 . /home/appuser/work/
RUN ls -R /home/appuser/work > /opt/tools/listing
"""


def _project(root: Path) -> Path:
    project = root / "context"
    for index in range(50):
        (project / f"pkg{index % 5}").mkdir(parents=True, exist_ok=True)
        (project / f"pkg{index % 5}" / f"mod{index}.py").write_text(f"VALUE = {index}\n" * 20)
    return project


async def _main(root: Path) -> Result:
    from control_plane.backends.base import ImageDefinition, Limits, SandboxSpec
    from control_plane.backends.local import LocalBackend
    from control_plane.backends.local.oci.bases import BaseCache
    from control_plane.backends.local.oci.catalog import resolve
    from control_plane.backends.local.oci.settings import OciSettings
    from control_plane.models import ServerKind

    result = Result("images", "OCI images: base builds, Dockerfile builds, sandbox cold start")
    settings = OciSettings(cache_dir=root / "cache")
    lines: list[str] = []

    started = time.monotonic()
    built = await BaseCache(settings).ensure(resolve("debian:bookworm"), lines.append)
    first = time.monotonic() - started
    assert not built.cached, "the cache was not empty"
    cached = []
    for _ in range(N):
        started = time.monotonic()
        again = await BaseCache(settings).ensure(resolve("debian:bookworm"), lines.append)
        cached.append(time.monotonic() - started)
        assert again.cached and again.image_id == built.image_id

    backend = LocalBackend(root / "state", oci=settings, isolation="bwrap")
    await backend.start()
    try:
        builder = backend.image_builder()
        context = _project(root)
        started = time.monotonic()
        await builder.build(ImageDefinition(tag="bench/oci:1", base="debian:bookworm", dockerfile=DOCKERFILE,
                                            context=str(context)), lines.append)
        dockerfile_build = time.monotonic() - started
        started = time.monotonic()
        await builder.build(ImageDefinition(tag="bench/oci:2", base="debian:bookworm", dockerfile=DOCKERFILE,
                                            context=str(context)), lines.append)
        dockerfile_rebuild = time.monotonic() - started

        def spec(name: str, image: str) -> SandboxSpec:
            return SandboxSpec(server_id=1, generated_name=name, namespace="idegym", image_tag=image,
                               server_kind=ServerKind.IDEGYM, run_as_root=False, runtime_class_name=None,
                               container_port=8000, service_port=80, limits=Limits())

        images = {"built-in image (cold start)": "idegym/builtin:latest", "OCI image (cold start)": "bench/oci:1"}
        samples: dict[str, list[float]] = {label: [] for label in images}
        phases: dict[str, list[dict]] = {label: [] for label in images}
        for label, image in images.items():  # warm-up: the OCI runtime is prepared on first use
            handle = await backend.create(spec(f"warm-{len(phases[label])}-{image[:6].replace('/', '')}", image), 120)
            await backend.delete(handle)
        progress = Progress("cold starts (interleaved)", N * len(images))
        for index in range(N):
            for label, image in images.items():
                name = f"cold-{index}-{'oci' if 'OCI' in label else 'builtin'}"
                started = time.perf_counter()
                handle = await backend.create(spec(name, image), 120)
                samples[label].append(time.perf_counter() - started)
                phases[label].append(handle.data.get("timings_ms", {}))
                await backend.delete(handle)
                progress.step()
    finally:
        await backend.close()

    stats = [Stats.of(label, values) for label, values in samples.items()]
    result.stats = stats
    base_s, oci_s = stats
    ratio = oci_s.median_ms / base_s.median_ms
    result.figures = {
        "first_base_build_s": round(first, 2),
        "cached_base_rebuild_s_median": round(sorted(cached)[len(cached) // 2], 4),
        "dockerfile_build_on_cached_base_s": round(dockerfile_build, 2),
        "dockerfile_rebuild_unchanged_s": round(dockerfile_rebuild, 2),
        "cold_start_ratio_oci_vs_builtin": round(ratio, 3),
        "debian_version": built.debian_version,
        "phases_ms_median": {label: {k: sorted(p[k] for p in ps)[len(ps) // 2] for k in ps[0]}
                             for label, ps in phases.items() if ps},
        "load_average": os.getloadavg(),
    }
    result.targets = {
        "first_base_build": check_target("first build of debian:bookworm", first, 60.0, "s"),
        "cached_base_rebuild": check_target("cached rebuild of the base",
                                            result.figures["cached_base_rebuild_s_median"], 2.0, "s"),
        "cold_start_ratio": check_target("cold start, OCI / built-in", ratio, 1.2, "x"),
    }
    print(table(["measurement", "seconds"], [
        ["first build of debian:bookworm (mmdebstrap, empty cache)", first],
        [f"cached rebuild of the base (median of {N})", result.figures["cached_base_rebuild_s_median"]],
        ["Dockerfile build on the cached base (RUN, COPY)", dockerfile_build],
        ["rebuild of the unchanged Dockerfile (layer cache)", dockerfile_rebuild],
    ]))
    print()
    print(stats_table(stats, baseline=base_s.label))
    for target in result.targets.values():
        print(target["text"])
    print(f"load average during the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return result


def run() -> Result:
    root = Path(tempfile.mkdtemp(prefix="idegym-bench-images-"))
    try:
        return asyncio.run(_main(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
