"""The simulated scheduler and kubelet: every pod's main container is a local process.

* Scheduling: nodeSelector, required node affinity (In/NotIn/Exists), NoSchedule taints vs
  tolerations, required pod anti-affinity on ``kubernetes.io/hostname``. No fit → PodScheduled
  False/Unschedulable with the scheduler's style of message, retried when nodes or pods change.
* Each scheduled pod gets its own loopback address (127.77.x.y, or the next free
  127.N block while another simulator runs), checked to be bindable on the
  container port, as its podIP. The ``server`` container (else the first one) runs the program
  ``images.ImageCatalog`` maps its image to; other containers are reported running without a
  process (sidecars are not simulated).
* Readiness: the container's httpGet readiness probe is polled every ``probe_period`` seconds
  (faster than the manifest asks, to keep tests quick); Ready/ContainersReady follow it.
* restartPolicy Always: when the process exits, restartCount goes up, lastState.terminated
  records exit code and (FallbackToLogsOnError) the log tail, the container waits in
  CrashLoopBackOff with a short doubling back-off, then restarts. Never/OnFailure end the pod
  Succeeded/Failed (Jobs).
* Deleting a pod: SIGTERM to the process group, SIGKILL after the grace period (capped), then
  the pod object is removed. Processes also get PDEATHSIG, so a killed simulator leaks none.
* Pod snapshots: ``checkpoint`` copies the project directory; a pod annotated
  ``podsnapshot.gke.io/ps-name`` starts with that copy (memory is not restored).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ctypes
import fcntl
import os
import shutil
import signal
import socket
from pathlib import Path
from typing import Any

import aiohttp

from .images import REPO, ImageCatalog, Program, PullError
from .store import Event, Store, match_label_selector_obj, now_rfc3339

RESTORE_ANNOTATION = "podsnapshot.gke.io/ps-name"
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Scheduler:
    def __init__(self, store: Store) -> None:
        self.store = store

    def place(self, pod: dict[str, Any]) -> tuple[str | None, str]:
        nodes = self.store.list("nodes")
        if not nodes:
            return None, "0/0 nodes are available: no nodes registered."
        spec = pod["spec"]
        reasons: dict[str, int] = {}
        for node in nodes:
            why = self._misfit(pod, spec, node)
            if why is None:
                return node["metadata"]["name"], ""
            reasons[why] = reasons.get(why, 0) + 1
        detail = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
        n = len(nodes)
        return None, (f"0/{n} nodes are available: {detail}. preemption: 0/{n} nodes are available: "
                      f"{n} Preemption is not helpful for scheduling.")

    def _misfit(self, pod: dict[str, Any], spec: dict[str, Any], node: dict[str, Any]) -> str | None:
        labels = node["metadata"].get("labels") or {}
        for key, value in (spec.get("nodeSelector") or {}).items():
            if labels.get(key) != value:
                return "node(s) didn't match Pod's node affinity/selector"
        affinity = spec.get("affinity") or {}
        required = ((affinity.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
                    or {}).get("nodeSelectorTerms")
        if required and not any(match_label_selector_obj(
                {"matchExpressions": term.get("matchExpressions") or []}, labels) for term in required):
            return "node(s) didn't match Pod's node affinity/selector"
        tolerations = spec.get("tolerations") or []
        for taint in (node.get("spec") or {}).get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(
                    _tolerates(t, taint) for t in tolerations):
                return f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
        for term in ((affinity.get("podAntiAffinity") or {})
                     .get("requiredDuringSchedulingIgnoredDuringExecution") or []):
            if term.get("topologyKey") != "kubernetes.io/hostname":
                continue
            for other in self.store.list("pods", pod["metadata"]["namespace"]):
                if other["metadata"]["uid"] == pod["metadata"]["uid"] or other["metadata"].get("deletionTimestamp"):
                    continue
                if (other["spec"].get("nodeName") == node["metadata"]["name"]
                        and match_label_selector_obj(term.get("labelSelector"),
                                                     other["metadata"].get("labels") or {})):
                    return "node(s) didn't match pod anti-affinity rules"
        return None


def _tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint["key"]
    return toleration.get("key") == taint["key"] and toleration.get("value", "") == taint.get("value", "")


class IpPool:
    """Loopback addresses for pods, one per live pod, never reused while the simulator runs.

    They lie in a /16 of 127/8 (``127.77.x.y`` first) that this simulator holds by a lock file:
    a pod that never listens leaves its address bindable, and a second simulator on the host (a
    parallel test worker) must not hand it out to a pod that does."""

    def __init__(self) -> None:
        self.next = 1
        self.prefix, self._lock_fd = _claim_block()

    def take(self, port: int | None) -> str:
        while True:
            n = self.next
            self.next += 1
            ip = f"{self.prefix}.{(n // 250) % 250}.{n % 250 + 1}"
            if port is None or _bindable(ip, port):
                return ip


def _claim_block() -> tuple[str, int]:
    """The first ``127.N`` (N from 77) no other simulator holds; held until this process ends."""
    for second in range(77, 127):
        fd = os.open(f"/tmp/idegym-k8s-sim-127.{second}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return f"127.{second}", fd
    raise RuntimeError("every 127.77-126 address block is held by another simulator")


def _bindable(ip: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((ip, port))
        except OSError:
            return False
    return True


class PodRuntime:
    """One pod's life on its node."""

    def __init__(self, kubelet: Kubelet, pod: dict[str, Any]) -> None:
        self.k = kubelet
        meta = pod["metadata"]
        self.ns, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.dir = kubelet.state_dir / "pods" / f"{self.ns}_{self.name}_{self.uid[:8]}"
        self.deleting = asyncio.Event()
        self.wake = asyncio.Event()
        self.proc: asyncio.subprocess.Process | None = None
        self.ip: str | None = None
        self.node: str | None = None
        self.start_time: str | None = None
        self.restarts = 0
        self.state: dict[str, Any] = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: dict[str, Any] = {}
        self.ready = False
        self.phase = "Pending"
        self.sched_msg: str | None = None
        self.restored: tuple[str, str, str] | None = None  # (status, reason, message)
        self.task = asyncio.get_running_loop().create_task(self.run())

    # -- helpers --

    def pod(self) -> dict[str, Any] | None:
        return self.k.store.find("pods", self.ns, self.name)

    def main_container(self, pod: dict[str, Any]) -> dict[str, Any]:
        containers = pod["spec"]["containers"]
        return next((c for c in containers if c["name"] == "server"), containers[0])

    def event(self, kind: str, reason: str, message: str, component: str = "kubelet") -> None:
        self.k.record_event(self.ns, self.name, self.uid, kind, reason, message, component)

    async def pause(self, seconds: float) -> None:
        """Sleep until woken, deleted or ``seconds`` passed."""
        self.wake.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._either(), seconds)

    async def _either(self) -> None:
        waits = [asyncio.ensure_future(self.deleting.wait()), asyncio.ensure_future(self.wake.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    def publish(self) -> None:
        pod = self.pod()
        if pod is None:
            return
        main = self.main_container(pod)
        scheduled = self.node is not None
        conditions = [{"type": "PodScheduled", "status": "True" if scheduled else "False",
                       "lastTransitionTime": now_rfc3339()}]
        if not scheduled and self.sched_msg:
            conditions[0].update(reason="Unschedulable", message=self.sched_msg)
        if scheduled:
            ready = "True" if self.ready else "False"
            conditions += [{"type": "Initialized", "status": "True"},
                           {"type": "ContainersReady", "status": ready},
                           {"type": "Ready", "status": ready}]
            if not self.ready:
                for c in conditions[2:]:
                    c.update(reason="ContainersNotReady", message=f"containers with unready status: [{main['name']}]")
            if self.restored:
                conditions.append({"type": "PodRestored", "status": self.restored[0], "reason": self.restored[1],
                                   "message": self.restored[2]})
        statuses = []
        for c in pod["spec"]["containers"]:
            if c is main:
                st = {"name": c["name"], "image": c["image"], "imageID": "", "ready": self.ready,
                      "restartCount": self.restarts, "started": "running" in self.state, "state": self.state}
                if self.last_state:
                    st["lastState"] = self.last_state
            else:  # a sidecar: reported running, never executed
                st = {"name": c["name"], "image": c["image"], "imageID": "", "ready": scheduled,
                      "restartCount": 0, "started": scheduled,
                      "state": {"running": {"startedAt": self.start_time}} if scheduled else
                      {"waiting": {"reason": "ContainerCreating"}}}
            statuses.append(st)
        status: dict[str, Any] = {"phase": self.phase, "conditions": conditions, "qosClass": "BestEffort"}
        if scheduled:
            status.update(hostIP="127.0.0.1", hostIPs=[{"ip": "127.0.0.1"}], startTime=self.start_time,
                          containerStatuses=statuses)
        if self.ip:
            status.update(podIP=self.ip, podIPs=[{"ip": self.ip}])
        self.k.store.set_status("pods", self.ns, self.name, status)

    # -- lifecycle --

    async def run(self) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a simulator bug: make it visible on the pod
            self.event("Warning", "SimulatorError", repr(exc))
        finally:
            await self._kill()
            if self.deleting.is_set() and self.pod() is not None:
                self.k.store.remove("pods", self.ns, self.name)
            self.k.runtimes.pop(self.uid, None)
            self.k.wake_pending()
            shutil.rmtree(self.dir, ignore_errors=True)

    async def _run(self) -> None:
        # 1. scheduling
        while not self.deleting.is_set():
            pod = self.pod()
            if pod is None:
                return
            node, why = self.k.scheduler.place(pod)
            if node:
                self.node = node
                break
            if why != self.sched_msg:
                self.sched_msg = why
                self.event("Warning", "FailedScheduling", why, "default-scheduler")
                self.publish()
            await self.pause(1.0)
        if self.deleting.is_set():
            return
        patched = dict(self.pod() or {})
        if not patched:
            return
        patched = {**patched, "spec": {**patched["spec"], "nodeName": self.node}}
        self.k.store.update("pods", self.ns, self.name, patched, check_rv=False)
        self.event("Normal", "Scheduled", f"Successfully assigned {self.ns}/{self.name} to {self.node}",
                   "default-scheduler")
        self.start_time = now_rfc3339()
        pod = self.pod()
        if pod is None:
            return
        main = self.main_container(pod)
        port = next((p["containerPort"] for p in main.get("ports") or []), None)
        self.ip = self.k.ips.take(port)
        self.publish()
        policy = pod["spec"].get("restartPolicy", "Always")
        pull_failures = 0
        backoff = self.k.backoff_start
        while not self.deleting.is_set():
            pod = self.pod()
            if pod is None:
                return
            program = self.k.images.resolve(
                main["image"], ip=self.ip, port=port, pod_dir=self.dir,
                args=self._remap(pod, main.get("args") or []), command=self._remap(pod, main.get("command") or []))
            if isinstance(program, PullError):
                pull_failures += 1
                reason = "ErrImagePull" if pull_failures % 2 else "ImagePullBackOff"
                message = program.message if reason == "ErrImagePull" else \
                    f'Back-off pulling image "{main["image"]}"'
                self.state = {"waiting": {"reason": reason, "message": message}}
                self.event("Warning", "Failed", message if reason == "ErrImagePull" else
                           f"Error: {reason}")
                self.publish()
                await self.pause(self.k.backoff_start)
                continue
            problem = self._prepare(pod, main)
            if problem:
                self.state = {"waiting": {"reason": problem[0], "message": problem[1]}}
                self.publish()
                await self.pause(0.5)
                continue
            exit_code = await self._run_once(pod, main, program)
            if exit_code is None:  # deleted while running
                return
            finished = now_rfc3339()
            terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                          "startedAt": self.state.get("running", {}).get("startedAt"), "finishedAt": finished}
            tail = self._log_tail()
            if exit_code != 0 and tail and main.get("terminationMessagePolicy") == "FallbackToLogsOnError":
                terminated["message"] = tail
            self.ready = False
            if policy == "Never" or (policy == "OnFailure" and exit_code == 0):
                self.state = {"terminated": terminated}
                self.phase = "Succeeded" if exit_code == 0 else "Failed"
                self.publish()
                await self.deleting.wait()
                return
            self.restarts += 1
            self.last_state = {"terminated": terminated}
            self.state = {"waiting": {"reason": "CrashLoopBackOff",
                                      "message": f"back-off {backoff:g}s restarting failed container="
                                                 f"{main['name']} pod={self.name}_{self.ns}({self.uid})"}}
            self.event("Warning", "BackOff", "Back-off restarting failed container")
            self.publish()
            await self.pause(backoff)
            backoff = min(backoff * 2, self.k.backoff_max)

    def _remap(self, pod: dict[str, Any], args: list[str]) -> list[str]:
        """Container paths under a volume mount → the volume's directory on this host."""
        main = self.main_container(pod)
        mounts = sorted(main.get("volumeMounts") or [], key=lambda m: -len(m["mountPath"]))
        out = []
        for arg in args:
            for m in mounts:
                arg = arg.replace(m["mountPath"].rstrip("/"), str(self.dir / "volumes" / m["name"]))
            out.append(arg)
        return out

    def _prepare(self, pod: dict[str, Any], main: dict[str, Any]) -> tuple[str, str] | None:
        """Materialize volumes; a missing ConfigMap/Secret keeps the container creating."""
        store = self.k.store
        for vol in pod["spec"].get("volumes") or []:
            target = self.dir / "volumes" / vol["name"]
            for kind, ref_key, name_key in (("configMap", "configmaps", "name"), ("secret", "secrets", "secretName")):
                if kind in vol:
                    src = store.find(ref_key, self.ns, vol[kind].get(name_key, ""))
                    if src is None:
                        if vol[kind].get("optional"):
                            continue
                        msg = f'MountVolume.SetUp failed for volume "{vol["name"]}" : {kind.lower()} ' \
                              f'"{vol[kind].get(name_key)}" not found'
                        self.event("Warning", "FailedMount", msg)
                        return "ContainerCreating", msg
                    target.mkdir(parents=True, exist_ok=True)
                    for key, value in (src.get("data") or {}).items():
                        (target / key).write_text(value)
                    for key, value in (src.get("binaryData") or {}).items():
                        (target / key).write_bytes(base64.b64decode(value))
            target.mkdir(parents=True, exist_ok=True)
        for source in main.get("envFrom") or []:
            for kind, ref_key in (("configMapRef", "configmaps"), ("secretRef", "secrets")):
                ref = source.get(kind)
                if ref and not ref.get("optional") and store.find(ref_key, self.ns, ref.get("name", "")) is None:
                    return "CreateContainerConfigError", f'{ref_key[:-1]} "{ref.get("name")}" not found'
        return None

    def _env(self, pod: dict[str, Any], main: dict[str, Any], program: Program) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ", "VIRTUAL_ENV")}
        env.update(HOME=str(self.dir), PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1",
                   HOSTNAME=self.name)
        store = self.k.store
        for source in main.get("envFrom") or []:
            prefix = source.get("prefix", "")
            for kind, ref_key in (("configMapRef", "configmaps"), ("secretRef", "secrets")):
                if source.get(kind):
                    obj = store.find(ref_key, self.ns, source[kind].get("name", "")) or {}
                    env.update({prefix + k: v for k, v in (obj.get("data") or {}).items()})
        fields = {"metadata.name": self.name, "metadata.namespace": self.ns, "metadata.uid": self.uid,
                  "status.podIP": self.ip or "", "spec.nodeName": self.node or "",
                  "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default")}
        for item in main.get("env") or []:
            if "value" in item:
                env[item["name"]] = item["value"]
            elif "fieldRef" in (item.get("valueFrom") or {}):
                env[item["name"]] = fields.get(item["valueFrom"]["fieldRef"]["fieldPath"], "")
        env.update(program.extra_env)
        return env

    def _restore(self, pod: dict[str, Any]) -> None:
        name = (pod["metadata"].get("annotations") or {}).get(RESTORE_ANNOTATION)
        if not name or not self.k.snapshots_enabled:
            return
        source = self.k.snapshot_dir(self.ns, name)
        if not source.is_dir():
            self.restored = ("False", "SnapshotNotFound", f"pod snapshot {name!r} not found; started fresh")
            return
        project = self.dir / "project"
        shutil.rmtree(project, ignore_errors=True)
        shutil.copytree(source, project, symlinks=True)
        self.restored = ("True", "Restored", f"restored from pod snapshot {name}")

    async def _run_once(self, pod: dict[str, Any], main: dict[str, Any], program: Program) -> int | None:
        """Start the process, probe it, return its exit code (``None`` when the pod is deleted)."""
        for sub in ("project", "sandbox-state", "logs"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        if self.restarts == 0 and self.restored is None:
            self._restore(pod)
        log = open(self.dir / "logs" / f"{main['name']}.log", "ab")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *program.argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT,
                env=self._env(pod, main, program), cwd=str(self.dir), start_new_session=True,
                preexec_fn=_die_with_parent)
        except OSError as exc:
            log.close()
            self.state = {"waiting": {"reason": "RunContainerError", "message": str(exc)}}
            self.publish()
            await self.pause(1.0)
            return 128
        log.close()
        self.k.pids[self.uid] = self.proc.pid
        self.state = {"running": {"startedAt": now_rfc3339()}}
        self.phase = "Running"
        self.event("Normal", "Started", f"Started container {main['name']}")
        self.publish()
        probe = asyncio.ensure_future(self._probe(main))
        waiter = asyncio.ensure_future(self.proc.wait())
        deleted = asyncio.ensure_future(self.deleting.wait())
        try:
            await asyncio.wait([waiter, deleted], return_when=asyncio.FIRST_COMPLETED)
        finally:
            probe.cancel()
            deleted.cancel()
        if self.deleting.is_set():
            return None
        self.k.pids.pop(self.uid, None)
        return self.proc.returncode

    async def _probe(self, main: dict[str, Any]) -> None:
        probe = (main.get("readinessProbe") or {}).get("httpGet")
        if probe is None:
            self.ready = True
            self.publish()
            return
        port = probe.get("port")
        if isinstance(port, str):
            port = next((p["containerPort"] for p in main.get("ports") or [] if p.get("name") == port), None)
        url = f"http://{self.ip}:{port}{probe.get('path', '/')}"
        threshold = int((main.get("readinessProbe") or {}).get("failureThreshold", 3))
        failures = 0
        timeout = aiohttp.ClientTimeout(total=1)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                try:
                    async with session.get(url) as resp:
                        ok = 200 <= resp.status < 400
                        detail = f"HTTP probe failed with statuscode: {resp.status}"
                except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                    ok, detail = False, f'Get "{url}": {exc.__class__.__name__}'
                if ok:
                    failures = 0
                    if not self.ready:
                        self.ready = True
                        self.publish()
                else:
                    failures += 1
                    if failures == threshold:
                        self.event("Warning", "Unhealthy", f"Readiness probe failed: {detail}")
                    if self.ready and failures >= threshold:
                        self.ready = False
                        self.publish()
                await asyncio.sleep(self.k.probe_period)

    def _log_tail(self, limit: int = 2048) -> str:
        path = self.dir / "logs"
        logs = sorted(path.glob("*.log")) if path.is_dir() else []
        if not logs:
            return ""
        data = logs[0].read_bytes()[-limit:]
        return data.decode("utf-8", "replace").strip()

    async def _kill(self) -> None:
        proc, self.proc = self.proc, None
        self.k.pids.pop(self.uid, None)
        if proc is None or proc.returncode is not None:
            return
        pod = self.pod() or {}
        grace = min(float(pod.get("spec", {}).get("terminationGracePeriodSeconds", 30)), self.k.grace_cap)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except TimeoutError:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


class Kubelet:
    def __init__(self, store: Store, state_dir: Path, images: ImageCatalog, *, probe_period: float = 0.1,
                 backoff_start: float = 0.3, backoff_max: float = 3.0, grace_cap: float = 3.0) -> None:
        self.store = store
        self.state_dir = state_dir
        self.images = images
        self.scheduler = Scheduler(store)
        self.ips = IpPool()
        self.runtimes: dict[str, PodRuntime] = {}
        self.pids: dict[str, int] = {}
        self.probe_period = probe_period
        self.backoff_start = backoff_start
        self.backoff_max = backoff_max
        self.grace_cap = grace_cap
        self.snapshots_enabled = False
        self._event_seq = 0
        store.listeners.append(self.on_event)

    def snapshot_dir(self, namespace: str, name: str) -> Path:
        return self.state_dir / "snapshots" / namespace / name

    def on_event(self, event: Event) -> None:
        if event.resource == "nodes":
            self.wake_pending()
        if event.resource != "pods":
            return
        meta = event.obj["metadata"]
        runtime = self.runtimes.get(meta["uid"])
        if event.type == "ADDED" and runtime is None:
            self.runtimes[meta["uid"]] = PodRuntime(self, event.obj)
        elif runtime is not None and (event.type == "MODIFIED" and meta.get("deletionTimestamp")
                                      or event.type == "DELETED"):
            runtime.deleting.set()

    def wake_pending(self) -> None:
        for runtime in self.runtimes.values():
            if runtime.node is None:
                runtime.wake.set()

    def record_event(self, namespace: str, name: str, uid: str, kind: str, reason: str, message: str,
                     component: str) -> None:
        """A core/v1 Event about a pod; repeats of the same reason bump ``count``."""
        key = f"{name}.{abs(hash((uid, reason))) % 10**12:012x}"
        now = now_rfc3339()
        existing = self.store.find("events", namespace, key)
        if existing is not None:
            updated = {**existing, "count": existing.get("count", 1) + 1, "lastTimestamp": now, "message": message}
            self.store.update("events", namespace, key, updated, check_rv=False)
            return
        self.store.create("events", namespace, {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": key, "namespace": namespace},
            "involvedObject": {"kind": "Pod", "name": name, "namespace": namespace, "uid": uid, "apiVersion": "v1"},
            "reason": reason, "message": message, "type": kind, "count": 1,
            "firstTimestamp": now, "lastTimestamp": now, "source": {"component": component},
        })

    def checkpoint(self, namespace: str, pod_name: str, snapshot: str) -> str | None:
        """Copy a running pod's project as snapshot ``snapshot``; returns an error or None."""
        pod = self.store.find("pods", namespace, pod_name)
        if pod is None:
            return f'pod "{pod_name}" not found'
        runtime = self.runtimes.get(pod["metadata"]["uid"])
        if runtime is None or runtime.proc is None or runtime.proc.returncode is not None:
            return f'pod "{pod_name}" is not running'
        target = self.snapshot_dir(namespace, snapshot)
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(runtime.dir / "project", target, symlinks=True)
        return None

    async def shutdown(self) -> None:
        for runtime in list(self.runtimes.values()):
            runtime.deleting.set()
        await asyncio.gather(*(r.task for r in list(self.runtimes.values())), return_exceptions=True)
