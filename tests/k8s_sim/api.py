"""The simulator's REST front: the Kubernetes API paths the backend uses, spoken as a real API
server speaks them (JSON objects with kind/apiVersion, ``*List`` kinds with a resourceVersion,
``Status`` objects for errors, chunked ``watch=true`` streams, the service/pod ``proxy`` and pod
``log`` subresources, discovery under ``/api`` and ``/apis``).

Request validation: built-in kinds are checked against the published schemas of Kubernetes
1.30 (``kubernetes-validate``, non-strict like a server's default field validation) plus the
few semantic rules the backend could get wrong (selector/template label match, restartPolicy of
a Deployment, port ranges, DNS names) → 422 ``Invalid``.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import aiohttp
from aiohttp import web

from .store import ApiError, Event, Resource, Store, field_matcher, label_matcher, match_label_selector_obj

CORE = [
    Resource("", "v1", "pods", "Pod"),
    Resource("", "v1", "services", "Service"),
    Resource("", "v1", "configmaps", "ConfigMap"),
    Resource("", "v1", "secrets", "Secret"),
    Resource("", "v1", "events", "Event"),
    Resource("", "v1", "serviceaccounts", "ServiceAccount"),
    Resource("", "v1", "namespaces", "Namespace", namespaced=False),
    Resource("", "v1", "nodes", "Node", namespaced=False),
    Resource("apps", "v1", "deployments", "Deployment"),
    Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget"),
    Resource("batch", "v1", "jobs", "Job"),
]
SNAPSHOT_GROUP = "podsnapshot.gke.io"
SNAPSHOT_RESOURCES = [
    Resource(SNAPSHOT_GROUP, "v1", "podsnapshots", "PodSnapshot"),
    Resource(SNAPSHOT_GROUP, "v1", "podsnapshotmanualtriggers", "PodSnapshotManualTrigger"),
    Resource(SNAPSHOT_GROUP, "v1", "podsnapshotpolicies", "PodSnapshotPolicy"),
    Resource(SNAPSHOT_GROUP, "v1", "podsnapshotstorageconfigs", "PodSnapshotStorageConfig", namespaced=False),
]
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
              "transfer-encoding", "upgrade", "host", "authorization", "content-length"}
VALIDATE_VERSION = "1.30"


def _validate_schema(obj: dict[str, Any]) -> None:
    try:
        import kubernetes_validate
    except ImportError:  # pragma: no cover - the dev extra installs it
        return
    try:
        kubernetes_validate.validate(obj, VALIDATE_VERSION, strict=False)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path) or "<root>"
        raise ApiError(422, "Invalid", f'{obj.get("kind")} "{obj["metadata"].get("name")}" is invalid: '
                       f"{path}: {exc.message}") from None


class ApiServer:
    def __init__(self, sim: Any) -> None:
        self.sim = sim
        self.store: Store = sim.store
        self.session: aiohttp.ClientSession | None = None
        self.audit: set[tuple[str, str, str, str]] = set()

    # -- resource table --

    def resources(self) -> list[Resource]:
        return CORE + (SNAPSHOT_RESOURCES if self.sim.snapshots_enabled else [])

    def resource(self, group: str, version: str, plural: str) -> Resource:
        for res in self.resources():
            if (res.group, res.version, res.plural) == (group, version, plural):
                return res
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    # -- app --

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20, middlewares=[self.errors])
        app.router.add_route("*", "/_sim/{tail:.*}", self.sim.admin)
        app.router.add_get("/version", self.version)
        app.router.add_get("/healthz", self.ok)
        app.router.add_get("/readyz", self.ok)
        app.router.add_route("*", "/{tail:.*}", self.dispatch)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, _app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    @web.middleware
    async def errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        token = self.sim.token
        if token and not request.path.startswith("/_sim/") and \
                request.headers.get("Authorization") != f"Bearer {token}":
            return self.status(ApiError(401, "Unauthorized", "Unauthorized"))
        if self.sim.latency and not request.path.startswith("/_sim/") and \
                request.query.get("watch") not in ("true", "1"):
            await asyncio.sleep(self.sim.latency)
        try:
            return await handler(request)
        except ApiError as exc:
            return self.status(exc)
        except json.JSONDecodeError as exc:
            return self.status(ApiError(400, "BadRequest", f"the request body is not JSON: {exc}"))

    @staticmethod
    def status(exc: ApiError) -> web.Response:
        return web.json_response(exc.status(), status=exc.code)

    async def ok(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def version(self, _request: web.Request) -> web.Response:
        return web.json_response({"major": "1", "minor": "30", "gitVersion": "v1.30.0-idegym-sim",
                                  "platform": "linux/amd64"})

    # -- routing --

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if parts[:1] == ["api"]:
            if len(parts) == 1:
                return web.json_response({"kind": "APIVersions", "versions": ["v1"],
                                          "serverAddressByClientCIDRs": []})
            if parts[1] != "v1":
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            group, version, rest = "", "v1", parts[2:]
        elif parts[:1] == ["apis"]:
            if len(parts) == 1:
                return web.json_response(self.group_list())
            if len(parts) == 2:
                return web.json_response(self.group(parts[1]))
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if not rest:
            return web.json_response(self.resource_list(group, version))
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
            namespace, rest = rest[1], rest[2:]
        res = self.resource(group, version, rest[0])
        self.record(request, res, rest)
        if namespace is not None and not res.namespaced:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if namespace is None and res.namespaced and len(rest) > 1:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        ns = namespace or ""
        if len(rest) == 1:
            return await self.collection(request, res, namespace)
        name = rest[1]
        sub = rest[2] if len(rest) > 2 else None
        if sub == "proxy" and res.plural in ("services", "pods"):
            return await self.proxy(request, res, ns, name, "/".join(rest[3:]))
        if ":" in name:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if sub == "log" and res.plural == "pods":
            return self.pod_log(request, ns, name)
        if sub not in (None, "status"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return await self.item(request, res, ns, name, sub)

    def record(self, request: web.Request, res: Resource, rest: list[str]) -> None:
        """Remember (client, verb, group, resource) as RBAC would see it, for the RBAC test."""
        if rest[0] == "namespaces" and len(rest) >= 3:
            rest = rest[2:]
        sub = rest[2] if len(rest) > 2 else None
        resource = f"{res.plural}/{sub}" if sub else res.plural
        method = request.method
        if method == "GET":
            verb = "get" if len(rest) > 1 else ("watch" if request.query.get("watch") in ("true", "1") else "list")
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, "get")
        agent = request.headers.get("User-Agent", "").split("/")[0]
        self.audit.add((agent, verb, res.group, resource))

    def group_list(self) -> dict[str, Any]:
        groups: dict[str, str] = {}
        for res in self.resources():
            if res.group:
                groups[res.group] = res.version
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [self.group(g) for g in groups]}

    def group(self, name: str) -> dict[str, Any]:
        versions = {r.version for r in self.resources() if r.group == name}
        if not versions:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        gv = [{"groupVersion": f"{name}/{v}", "version": v} for v in sorted(versions)]
        return {"kind": "APIGroup", "apiVersion": "v1", "name": name, "versions": gv, "preferredVersion": gv[0]}

    def resource_list(self, group: str, version: str) -> dict[str, Any]:
        found = [r for r in self.resources() if (r.group, r.version) == (group, version)]
        if not found:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": found[0].api_version,
                "resources": [{"name": r.plural, "singularName": r.kind.lower(), "namespaced": r.namespaced,
                               "kind": r.kind, "verbs": verbs} for r in found]}

    # -- collections --

    async def collection(self, request: web.Request, res: Resource, namespace: str | None) -> web.StreamResponse:
        q = request.query
        if request.method == "GET":
            if q.get("watch") in ("true", "1"):
                return await self.watch(request, res, namespace)
            items = self.store.list(res.key, namespace if res.namespaced else None,
                                    q.get("labelSelector"), q.get("fieldSelector"))
            return web.json_response({"kind": f"{res.kind}List", "apiVersion": res.api_version,
                                      "metadata": {"resourceVersion": str(self.store.rv)}, "items": items})
        if request.method == "POST":
            if res.namespaced and namespace is None:
                raise ApiError(405, "MethodNotAllowed", "create needs a namespace in the path")
            body = await request.json()
            obj = self.admit(res, namespace or "", body, create=True)
            if q.get("dryRun"):
                return web.json_response(obj, status=201)
            return web.json_response(self.store.create(res.key, namespace or "", obj), status=201)
        raise ApiError(405, "MethodNotAllowed", f"{request.method} is not supported on a collection")

    def admit(self, res: Resource, namespace: str, body: Any, create: bool) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the request body must be a JSON object")
        obj = dict(body)
        if obj.get("kind", res.kind) != res.kind or obj.get("apiVersion", res.api_version) != res.api_version:
            raise ApiError(400, "BadRequest", f"the body is a {obj.get('apiVersion')}/{obj.get('kind')}, "
                           f"not a {res.api_version}/{res.kind}")
        obj["kind"], obj["apiVersion"] = res.kind, res.api_version
        meta = obj.setdefault("metadata", {})
        if namespace and res.namespaced:
            if meta.get("namespace", namespace) != namespace:
                raise ApiError(400, "BadRequest", "the namespace of the object does not match the namespace "
                               "of the request")
            meta["namespace"] = namespace
            if res.plural != "events" and self.store.find("namespaces", "", namespace) is None:
                raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found',
                               {"name": namespace, "kind": "namespaces"})
        if create:
            obj.pop("status", None)  # status is written through /status, never by a create
        name = meta.get("name") or ""
        pattern = DNS1035_LABEL if res.plural == "services" else DNS1123_SUBDOMAIN
        if name and (not pattern.match(name) or len(name) > (63 if res.plural == "services" else 253)):
            raise ApiError(422, "Invalid", f'{res.kind} "{name}" is invalid: metadata.name: Invalid value: '
                           f'"{name}": must be a valid DNS name')
        if not res.group or res.group in ("apps", "policy", "batch"):
            _validate_schema(obj)
        self.semantic_checks(res, obj)
        return obj

    @staticmethod
    def semantic_checks(res: Resource, obj: dict[str, Any]) -> None:
        name = obj["metadata"].get("name")

        def invalid(path: str, why: str) -> ApiError:
            return ApiError(422, "Invalid", f'{res.kind} "{name}" is invalid: {path}: {why}')

        spec = obj.get("spec") or {}
        if res.kind == "Deployment":
            labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
            if not match_label_selector_obj(spec.get("selector"), labels) or not spec.get("selector"):
                raise invalid("spec.template.metadata.labels", "`selector` does not match template `labels`")
            if (spec["template"].get("spec") or {}).get("restartPolicy", "Always") != "Always":
                raise invalid("spec.template.spec.restartPolicy", 'Unsupported value: only "Always" is supported')
        pod_spec = (spec.get("template") or {}).get("spec") if res.kind in ("Deployment", "Job") else \
            spec if res.kind == "Pod" else None
        if pod_spec is not None:
            containers = pod_spec.get("containers") or []
            if not containers:
                raise invalid("spec.containers", "Required value")
            names = [c.get("name") for c in containers]
            if len(set(names)) != len(names):
                raise invalid("spec.containers", "Duplicate value: container names must be unique")
            for c in containers:
                for p in c.get("ports") or []:
                    if not 1 <= int(p.get("containerPort", 0)) <= 65535:
                        raise invalid("containerPort", "must be between 1 and 65535, inclusive")
        if res.kind == "Service":
            for p in spec.get("ports") or []:
                if not 1 <= int(p.get("port", 0)) <= 65535:
                    raise invalid("spec.ports[0].port", "must be between 1 and 65535, inclusive")

    # -- single objects --

    async def item(self, request: web.Request, res: Resource, ns: str, name: str,
                   sub: str | None) -> web.StreamResponse:
        key = res.key
        if request.method == "GET":
            return web.json_response(self.store.get(key, ns, name))
        if request.method == "DELETE":
            return self.delete(request, res, ns, name, await self._body_or_none(request))
        if request.method == "PUT":
            body = await request.json()
            if sub == "status":
                current = self.store.get(key, ns, name)
                return web.json_response(self.store.update(key, ns, name, {**current, "status": body.get("status")}))
            obj = self.admit(res, ns, body, create=False)
            obj.pop("status", None)
            return web.json_response(self.store.update(key, ns, name, obj))
        if request.method == "PATCH":
            content_type = request.headers.get("Content-Type", "")
            body = await request.json()
            if sub == "status":
                patched = self.store.patch(key, ns, name, body, content_type)
                return web.json_response(patched)
            current = self.store.get(key, ns, name)

            def admit(obj: dict[str, Any]) -> dict[str, Any]:
                checked = self.admit(res, ns, {k: v for k, v in obj.items() if k != "status"}, create=False)
                if "status" in current:  # status changes only through /status
                    checked["status"] = current["status"]
                return checked

            return web.json_response(self.store.patch(key, ns, name, body, content_type, admit))
        raise ApiError(405, "MethodNotAllowed", f"{request.method} is not supported")

    @staticmethod
    async def _body_or_none(request: web.Request) -> dict[str, Any]:
        if not request.can_read_body:
            return {}
        text = await request.text()
        return json.loads(text) if text.strip() else {}

    def delete(self, request: web.Request, res: Resource, ns: str, name: str, options: dict[str, Any]) -> web.Response:
        grace = options.get("gracePeriodSeconds", request.query.get("gracePeriodSeconds"))
        obj = self.store.get(res.key, ns, name)
        if res.plural == "pods":
            grace_s = int(grace) if grace is not None else int(obj["spec"].get("terminationGracePeriodSeconds", 30))
            return web.json_response(self.store.mark_deleting("pods", ns, name, grace_s))
        removed = self.store.remove(res.key, ns, name)
        if res.plural == "services":  # the Service registry answers with the deleted object
            return web.json_response(removed)
        return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                  "details": {"name": name, "group": res.group, "kind": res.plural,
                                              "uid": removed["metadata"]["uid"]}})

    # -- watch --

    async def watch(self, request: web.Request, res: Resource, namespace: str | None) -> web.StreamResponse:
        q = request.query
        lm, fm = label_matcher(q.get("labelSelector")), field_matcher(q.get("fieldSelector"))
        timeout = float(q.get("timeoutSeconds") or 1800)
        rv = q.get("resourceVersion")
        ns = namespace if res.namespaced else None
        w = self.store.open_watch(res.key, ns)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)

        async def send(kind: str, obj: dict[str, Any]) -> None:
            await resp.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        def matches(obj: dict[str, Any]) -> bool:
            return lm(obj["metadata"].get("labels") or {}) and fm(obj)

        try:
            if rv in (None, "", "0"):
                last = self.store.rv
                for obj in self.store.list(res.key, ns):
                    if matches(obj):
                        await send("ADDED", obj)
            else:
                last = int(rv)
                history = self.store.history
                if len(history) == history.maxlen and last < history[0].rv - 1:
                    status = ApiError(410, "Expired", f"too old resource version: {last} ({history[0].rv})").status()
                    await send("ERROR", status)
                    return resp
                for event in self.store.history_since(res.key, ns, last):
                    last = event.rv
                    if matches(event.obj):
                        await send(event.type, event.obj)
            deadline = asyncio.get_running_loop().time() + timeout
            while True:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                try:
                    event: Event | None = await asyncio.wait_for(w.queue.get(), remaining)
                except TimeoutError:
                    break
                if event is None:
                    break
                if event.rv <= last:
                    continue
                last = event.rv
                if matches(event.obj):
                    await send(event.type, event.obj)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.store.close_watch(w)
        with_eof = resp
        try:
            await with_eof.write_eof()
        except (ConnectionResetError, RuntimeError):
            pass
        return resp

    # -- subresources --

    def pod_log(self, request: web.Request, ns: str, name: str) -> web.Response:
        pod = self.store.get("pods", ns, name)
        runtime = self.sim.kubelet.runtimes.get(pod["metadata"]["uid"])
        container = request.query.get("container") or pod["spec"]["containers"][0]["name"]
        path = runtime.dir / "logs" / f"{container}.log" if runtime else None
        text = path.read_text(errors="replace") if path and path.is_file() else ""
        if request.query.get("tailLines"):
            text = "\n".join(text.splitlines()[-int(request.query["tailLines"]):]) + "\n"
        return web.Response(text=text, content_type="text/plain")

    async def proxy(self, request: web.Request, res: Resource, ns: str, ref: str, path: str) -> web.StreamResponse:
        """``services/{name}[:{port}]/proxy/...`` and ``pods/{name}[:{port}]/proxy/...``."""
        pieces = ref.split(":")
        if len(pieces) == 3:  # scheme:name:port
            pieces = pieces[1:]
        name, port_ref = pieces[0], (pieces[1] if len(pieces) > 1 else "")
        if res.plural == "services":
            svc = self.store.get("services", ns, name)
            ports = svc["spec"].get("ports") or []
            port = next((p for p in ports if port_ref in (p.get("name", ""), str(p["port"]))), None) \
                if port_ref else (ports[0] if ports else None)
            if port is None:
                raise ApiError(503, "ServiceUnavailable", f'no service port "{port_ref}" found for service "{name}"')
            selector = svc["spec"].get("selector") or {}
            pods = [p for p in self.store.list("pods", ns)
                    if selector and all((p["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())
                    and not p["metadata"].get("deletionTimestamp")
                    and any(c.get("type") == "Ready" and c.get("status") == "True"
                            for c in (p.get("status") or {}).get("conditions") or [])]
            if not pods:
                raise ApiError(503, "ServiceUnavailable", f'no endpoints available for service "{name}"')
            pod, target = pods[0], port.get("targetPort", port["port"])
        else:
            pod = self.store.get("pods", ns, name)
            target = port_ref or next((p["containerPort"] for c in pod["spec"]["containers"]
                                       for p in c.get("ports") or []), 80)
        if isinstance(target, str) and not target.isdigit():
            target = next((p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports") or []
                           if p.get("name") == target), None)
        ip = (pod.get("status") or {}).get("podIP")
        if not ip or target is None:
            raise ApiError(503, "ServiceUnavailable", f'pod "{pod["metadata"]["name"]}" has no address yet')
        url = f"http://{ip}:{target}/{path}"
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
                                                 auto_decompress=False)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await self._proxy_ws(request, url)
        body = await request.read() if request.can_read_body else None
        try:
            async with self.session.request(request.method, url, params=request.query, headers=headers,
                                            data=body, allow_redirects=False) as upstream:
                payload = await upstream.read()
                out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
                return web.Response(status=upstream.status, body=payload, headers=out_headers)
        except aiohttp.ClientConnectionError as exc:
            raise ApiError(503, "ServiceUnavailable", f"error trying to reach service: dial tcp {ip}:{target}: "
                           f"{exc}") from None

    async def _proxy_ws(self, request: web.Request, url: str) -> web.StreamResponse:
        assert self.session is not None
        downstream = web.WebSocketResponse()
        await downstream.prepare(request)
        async with self.session.ws_connect(url.replace("http://", "ws://", 1)) as upstream:
            async def pump(src: Any, dst: Any) -> None:
                async for msg in src:
                    if msg.type == aiohttp.WSMsgType.TEXT:
                        await dst.send_str(msg.data)
                    elif msg.type == aiohttp.WSMsgType.BINARY:
                        await dst.send_bytes(msg.data)
                    else:
                        break
            tasks = [asyncio.ensure_future(pump(downstream, upstream)),
                     asyncio.ensure_future(pump(upstream, downstream))]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in tasks:
                t.cancel()
        await downstream.close()
        return downstream
