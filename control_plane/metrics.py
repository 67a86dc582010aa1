"""Prometheus metrics at ``/metrics``: requests, forwards, servers by availability, warm pool."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from .service import ControlPlane


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("idegym_http_requests_total", "HTTP requests answered",
                                ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("idegym_http_request_seconds", "HTTP request latency", ["route"],
                                 registry=self.registry,
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60))
        self.forwards = Counter("idegym_forwards_total", "Calls forwarded to sandboxes", ["status"],
                                registry=self.registry)
        self.forward_latency = Histogram("idegym_forward_seconds", "Sandbox round trip of a forwarded call",
                                         registry=self.registry,
                                         buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5, 30, 300))
        self.servers = Gauge("idegym_servers", "Servers by availability", ["availability"], registry=self.registry)
        self.pool = Gauge("idegym_warm_pool_ready", "Ready sandboxes in the warm pool", ["image"],
                          registry=self.registry)
        # Each label set's child, looked up once: ``labels()`` takes a lock and builds its key on
        # every call (a tenth of the control plane's CPU a forward). Counters and histograms are
        # never cleared, so a child stays the one the registry renders.
        self._children: dict[tuple, Any] = {}

    def _child(self, metric: Counter | Histogram, *labels: str) -> Any:
        key = (metric, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def forward(self, status: int, seconds: float) -> None:
        self._child(self.forwards, str(status)).inc()
        self.forward_latency.observe(seconds)

    def observe(self, request: web.Request, status: int, seconds: float) -> None:
        """One answered request (called by the control plane's middleware)."""
        resource = request.match_info.route.resource
        self.observe_route(request.method, resource.canonical if resource else "?", status, seconds)

    def observe_route(self, method: str, route: str, status: int, seconds: float) -> None:
        """One answered request of ``route`` (its template, no ids)."""
        self._child(self.requests, method, route, str(status)).inc()
        self._child(self.latency, route).observe(seconds)

    def render(self, cp: ControlPlane, tenant: str) -> web.Response:
        """The metrics as ``tenant`` may see them: its own servers; images it can name. Request
        and forward counts are the control plane's (by route template and status, no ids)."""
        counts: dict[str, int] = {}
        for row in cp.store.servers(tenant=tenant):
            counts[row.availability.value] = counts.get(row.availability.value, 0) + 1
        self.servers.clear()
        for availability, n in counts.items():
            self.servers.labels(availability).set(n)
        self.pool.clear()
        for image, n in cp.pool.sizes().items():
            if cp.images.shown(tenant, image):
                self.pool.labels(image).set(n)
        served = ["# HELP idegym_warm_pool_starts_total Starts the warm pool served, by how: a member was ready, "
                  "it waited for a fill, or a sandbox was made for it",
                  "# TYPE idegym_warm_pool_starts_total counter"]
        served += [f'idegym_warm_pool_starts_total{{image="{_escape(image)}",how="{how}"}} {n}'
                   for (image, how), n in sorted(cp.pool.served.items()) if cp.images.shown(tenant, image)]
        body = generate_latest(self.registry) + ("\n".join(served) + "\n" + sharing_metrics(cp, tenant)).encode()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


_SHARING = (
    # name, type, help
    ("idegym_client_servers", "gauge", "Live servers of a client (a sandbox behind each)"),
    ("idegym_client_starts_waiting", "gauge", "Sandboxes a client waits for in the creation queue"),
    ("idegym_client_starts_total", "counter", "Sandboxes a client was given a turn for"),
    ("idegym_client_start_wait_seconds_total", "counter", "Seconds a client's starts waited for their turn"),
    ("idegym_client_starts_refused_total", "counter", "Starts that waited past the queue timeout (429)"),
    ("idegym_client_builds_running", "gauge", "Image builds of a client running"),
    ("idegym_client_builds_waiting", "gauge", "Image builds of a client waiting for their turn"),
    ("idegym_client_upload_bytes_total", "counter", "Bytes a client sent as uploads"),
    ("idegym_uploads_total", "counter", "Upload requests of the tenant by outcome (sent, held, failed)"),
    ("idegym_upload_bytes_held", "gauge", "Bytes of the uploads the tenant holds"),
)


def sharing_metrics(cp: ControlPlane, tenant: str) -> str:
    """The tenant's share of the control plane, per client (``admission.py``, ``uploads.py``):
    Prometheus text for its own clients only."""
    sandboxes, builds, meter = cp.admission.sandboxes, cp.admission.builds, cp.uploads.meter
    live = {k: n for k, n in cp.store.live_counts().items() if k[0] == tenant}
    series: dict[str, dict[str, float]] = {name: {} for name, _, _ in _SHARING}
    names: dict[str, str] = {}

    def label(client: str) -> str:
        if client not in names:
            row = cp.store.get_client(client) if client else None
            names[client] = _escape(row.name if row is not None else "")
        return f'client_id="{client}",client_name="{names[client]}"'

    for metric, source in (("idegym_client_servers", live), ("idegym_client_starts_waiting", sandboxes.queued()),
                           ("idegym_client_starts_total", sandboxes.granted),
                           ("idegym_client_start_wait_seconds_total", sandboxes.waited),
                           ("idegym_client_starts_refused_total", sandboxes.refused),
                           ("idegym_client_builds_running", builds.usage()),
                           ("idegym_client_builds_waiting", builds.queued()),
                           ("idegym_client_upload_bytes_total", meter.bytes)):
        for (owner, client), value in source.items():
            if owner == tenant:
                series[metric][label(client)] = value
    for (owner, _client, outcome), n in meter.count.items():
        if owner == tenant:
            key = f'outcome="{outcome}"'
            series["idegym_uploads_total"][key] = series["idegym_uploads_total"].get(key, 0) + n
    series["idegym_upload_bytes_held"][""] = cp.store.upload_bytes(tenant)
    lines = []
    for name, kind, text in _SHARING:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{{{labels}}} {value!r}" if labels else f"{name} {value!r}"
                  for labels, value in sorted(series[name].items())]
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
