from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.helpers import SandboxProcess

if TYPE_CHECKING:
    from tests.cp_helpers import ControlPlaneProcess


@pytest.fixture(params=["tcp", "unix"])
def transport(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "README.md").write_text("hello\n")
    return root


@pytest.fixture
def server(project: Path, tmp_path: Path) -> Iterator[SandboxProcess]:
    """A sandbox server over TCP (see ``any_server`` for both transports)."""
    proc = SandboxProcess(project, "tcp", tmp_path)
    yield proc
    proc.stop()


@pytest.fixture
def any_server(project: Path, tmp_path: Path, transport: str) -> Iterator[SandboxProcess]:
    proc = SandboxProcess(project, transport, tmp_path)
    yield proc
    proc.stop()


_STARTED = time.time()


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Tests that fail builds on purpose leave the embedded control planes' kept logs (what a user
    is shown after a real failure): remove those this run made."""
    import shutil

    from control_plane import ephemeral_state
    from idegym_env.embedded import STATE_PREFIX, state_root

    for path in state_root().glob(f"{STATE_PREFIX}*"):  # this run's (nothing_left_behind)
        try:
            if path.stat().st_mtime >= _STARTED and ephemeral_state.only_logs_left(path):
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue


# `make test` runs on TEST_WORKERS pytest-xdist workers. A module's tests stay on one worker (its module
# fixtures start once); every test that starts Ray runs on one worker, one at a time (two Rays
# on a host would share its ports and /tmp/ray); every test on the Kubernetes simulator runs on
# one worker (one session simulator, started once). xdist's own `xdist_group` marks do not
# reach its scheduler under pytest 9.2 (a node id no longer follows `_nodeid`), so the scheduler
# groups by node id, and each worker checks that the markers agree with it.
RAY_FILES = ("tests/test_ray_vector.py", "tests/test_fork_vector.py", "tests/test_ray_cluster.py",
             "tests/test_agent_ray.py", "tests/test_remote_ray.py")


# The red-team suite is one module; its targets of different task sources may run on both
# workers (each worker starts the module's control plane): by source, e.g. `[swe:…]`.
SPLIT_BY_SOURCE = ("tests/test_reward_integrity.py",)

# The tests whose tasks build the default SWE environment (an apt-get build of about a minute, once
# per run in the run's build cache): one scope, so that one worker builds it and the others run other
# tests meanwhile, instead of two of three workers waiting on the build cache's lock for that minute.
SWE_IMAGE = ("tests/test_swe_family.py", "tests/test_task_sources.py")

# Modules of a few long, independent tests (each ~15-30 s): a scope each, so that the workers
# share them instead of one running them all at the end.
SPLIT_BY_TEST = ("tests/test_doc_snippets.py",)
# ... except tests whose documented servers listen on the same host port: one scope, one at a time.
SAME_PORT = {"test_openenv_blocks": "port-8000", "test_verifiers_blocks": "port-8000"}


def xdist_group(nodeid: str) -> str:
    path, _, name = nodeid.partition("::")
    if path in RAY_FILES or re.search(r"(^|_)ray(_|$)", name.split("[", 1)[0]):
        return "ray"
    if path.startswith("tests/test_k8s_") or "[kubernetes" in name:
        return "kubernetes"
    if path in SWE_IMAGE:
        return "swe-image"
    if path in SPLIT_BY_SOURCE and "[" in name and ":" in name.split("[", 1)[1]:
        source = name.split("[", 1)[1].split(":", 1)[0]
        return "swe-image" if source == "swe" else f"{path}::{source}"
    if path in SPLIT_BY_TEST:
        test = name.split("[", 1)[0]
        return f"{path}::{SAME_PORT.get(test, test)}"
    return path


# Longest scope first, so that the run does not end with one worker on a long scope while the
# other idles (xdist's own order is by number of tests, which sends the long single tests of the
# split modules last). A test's seconds are those of its last run here (pytest's cache), else
# those in tests/durations.json (tests of 5 s and more, medians of `make test` runs on 2 cores;
# it only orders the run, so a stale entry costs time, never a result), else one second, or
# LONG_TEST in a split module.
SECONDS_KEY = "idegym/test-seconds"
DURATIONS = Path(__file__).with_name("durations.json")
LONG_TEST = 20.0


def _estimate(nodeid: str, seconds: dict[str, float]) -> float:
    if nodeid in seconds:
        return seconds[nodeid]
    path = nodeid.partition("::")[0]
    return LONG_TEST if path in SPLIT_BY_TEST or path in SPLIT_BY_SOURCE else 1.0


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    import json
    from collections import OrderedDict

    from xdist.scheduler import LoadScopeScheduling

    cache = getattr(config, "cache", None)  # None under -p no:cacheprovider
    seconds: dict[str, float] = {**json.loads(DURATIONS.read_text()),
                                 **(cache.get(SECONDS_KEY, {}) if cache is not None else {})}

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

        def schedule(self) -> None:
            if self.collection is None:  # the first call: reorder the queue before any is assigned
                self.workqueue = _LongestFirst(seconds)
            super().schedule()

    class _LongestFirst(OrderedDict):
        """The work queue, sorted by estimated seconds once filled (on the first pop)."""

        def __init__(self, seconds: dict[str, float]) -> None:
            super().__init__()
            self.seconds, self.ordered = seconds, False

        def popitem(self, last: bool = True) -> tuple[str, dict[str, bool]]:
            if not self.ordered:
                ranked = sorted(self.items(), key=lambda kv: -sum(_estimate(n, self.seconds) for n in kv[1]))
                self.clear()
                self.update(ranked)
                self.ordered = True
            return super().popitem(last)

    return ByGroup(config, log)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _TIMED[report.nodeid] = _TIMED.get(report.nodeid, 0.0) + report.duration


_TIMED: dict[str, float] = {}


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Keep this run's test seconds (the controller's, or a run without xdist) for the next schedule."""
    cache = getattr(config, "cache", None)  # None under -p no:cacheprovider
    if _TIMED and cache is not None and not hasattr(config, "workerinput"):
        cache.set(SECONDS_KEY, {**cache.get(SECONDS_KEY, {}), **_TIMED})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = xdist_group(item.nodeid)
        needs = "ray" if item.get_closest_marker("ray") else (
            "kubernetes" if item.get_closest_marker("kubernetes") or "k8s_sim" in item.fixturenames else None)
        if needs and group != needs:
            raise pytest.UsageError(f"{item.nodeid} needs the {needs!r} worker group but its node id maps to "
                                    f"{group!r}: extend tests/conftest.py:xdist_group")


pytest_plugins = ["tests.k8s_sim.fixtures", "tests.oci_fixtures"]


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every sandbox this run's local backends made, however it ended, took its cgroups and its
    mounts with it: the groups of the state directories below this run's (this worker's)
    temporary directory — embedded control planes make theirs there too — and the mounts below
    it are counted before and after the run; what is left is named, then ended and removed."""
    import sys

    from tests import cgroup_leaks, mount_leaks

    base = tmp_path_factory.getbasetemp()
    os.environ["IDEGYM_EMBEDDED_STATE_ROOT"] = str(base / "embedded")
    before = cgroup_leaks.run_groups(base)
    mounted = mount_leaks.below(base)
    yield
    if "idegym_env.embedded" in sys.modules:  # the shared one outlives its last env by a grace period
        sys.modules["idegym_env.embedded"].shutdown()
    left = cgroup_leaks.left_after(base, timeout=20.0)
    new = {key: groups for key, groups in left.items() if set(groups) - set(before.get(key, []))}
    message = "; ".join(f"{key}: {', '.join(cgroup_leaks.describe(groups))}" for key, groups in new.items())
    cgroup_leaks.clear(list(new))
    points = mount_leaks.left_after(base, mounted, timeout=20.0)
    mount_leaks.clear(points)
    assert not new, f"cgroups left behind by this run: {message}"
    assert not points, f"mounts left behind by this run: {', '.join(points)}"


def _control_plane(tmp_path: Path, backend: str, request: pytest.FixtureRequest):
    from tests.cp_helpers import ControlPlaneProcess

    if backend == "local":
        return ControlPlaneProcess(tmp_path / "state", ["--warm-pool", "0", "--ephemeral"], backend="local")
    sim = request.getfixturevalue("k8s_sim")
    config = sim.backend_config()
    env = dict(os.environ, IDEGYM_CONTROL_PLANE_BACKEND="kubernetes")
    for key, value in (("KUBECONFIG", config.kubeconfig), ("IN_CLUSTER", "false"),
                       ("ADDRESSING", config.addressing), ("NAMESPACE", config.namespace),
                       ("INSTANCE", config.instance), ("READINESS_PERIOD_SECONDS", "1")):
        env[f"IDEGYM_K8S_{key}"] = str(value)
    return ControlPlaneProcess(tmp_path / "state", ["--backend", "kubernetes", "--ephemeral"], env=env,
                               backend="kubernetes")


@pytest.fixture(params=["local", pytest.param("kubernetes", marks=pytest.mark.kubernetes)])
def cp(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ControlPlaneProcess]:
    """A control plane with a fast watcher, on each backend (Kubernetes: the API simulator)."""
    proc = _control_plane(tmp_path, request.param, request)
    yield proc
    proc.stop()


@pytest.fixture
def cp_local(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ControlPlaneProcess]:
    """A control plane on the local backend, for what only real isolation can show."""
    proc = _control_plane(tmp_path, "local", request)
    yield proc
    proc.stop()
