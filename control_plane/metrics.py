"""Prometheus metrics at ``/metrics``: requests, forwards, servers by availability, warm pool."""

from __future__ import annotations

from typing import TYPE_CHECKING

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

    def forward(self, status: int, seconds: float) -> None:
        self.forwards.labels(str(status)).inc()
        self.forward_latency.observe(seconds)

    def observe(self, request: web.Request, status: int, seconds: float) -> None:
        """One answered request (called by the control plane's error middleware, outermost)."""
        resource = request.match_info.route.resource
        route = resource.canonical if resource else "?"
        self.requests.labels(request.method, route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

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
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
