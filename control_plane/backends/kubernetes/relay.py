"""An in-process ``kubectl proxy`` for the ``api-proxy`` addressing mode.

From outside a cluster a sandbox is reachable through the API server's service proxy
(``/api/v1/namespaces/{ns}/services/{name}:{port}/proxy/...``), but only with the kubeconfig's
credentials (bearer token, exec plugin token, client certificate). Rather than teaching every
caller about them, the backend listens on a loopback port and relays *only* proxy subresources
in its own namespaces to the API server, adding the credentials; endpoints are plain
``http://127.0.0.1:<port>/api/v1/.../proxy`` URLs. HTTP bodies stream both ways; WebSocket
upgrades (OpenEnv servers) are relayed frame by frame.
"""

from __future__ import annotations

import re
import ssl

import aiohttp
from aiohttp import web
from kubernetes import client

from ...errors import ApiError, Forbidden
from ...http import error_response
from ...ws_splice import splice

HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
              "transfer-encoding", "upgrade", "host", "authorization", "content-length"}
PROXY_PATH = re.compile(r"^/api/v1/namespaces/(?P<ns>[a-z0-9-]+)/(services|pods)/[a-z0-9.:-]+/proxy(/.*)?$")


def ssl_context(cfg: client.Configuration) -> ssl.SSLContext | bool:
    if not cfg.host.startswith("https"):
        return False
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert) if cfg.ssl_ca_cert else ssl.create_default_context()
    if not cfg.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    return ctx


class ApiProxyRelay:
    def __init__(self, cfg: client.Configuration, namespaces: set[str], user_agent: str = "idegym-relay") -> None:
        self.cfg = cfg
        self.user_agent = user_agent
        self.namespaces = namespaces
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> str:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ssl_context(self.cfg), limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), auto_decompress=False)
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def _auth_headers(self) -> dict[str, str]:
        # evaluated per request: exec plugins / in-cluster tokens refresh through this hook
        auth = self.cfg.auth_settings().get("BearerToken")
        value = auth.get("value") if auth else None
        return {"Authorization": value} if value else {}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        match = PROXY_PATH.match(request.path)
        if match is None or match.group("ns") not in self.namespaces:
            return error_response(Forbidden("only sandbox proxy paths are relayed"))
        assert self._session is not None
        url = self.cfg.host.rstrip("/") + request.raw_path
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        headers.update(self._auth_headers())
        headers["User-Agent"] = self.user_agent
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await self._websocket(request, url, headers)
        data = request.content if request.body_exists else None
        try:
            async with self._session.request(request.method, url, headers=headers, data=data,
                                             allow_redirects=False) as upstream:
                response = web.StreamResponse(status=upstream.status, headers={
                    k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP})
                if upstream.content_length is not None:
                    response.content_length = upstream.content_length
                await response.prepare(request)
                async for chunk in upstream.content.iter_chunked(1 << 16):
                    await response.write(chunk)
                await response.write_eof()
                return response
        except aiohttp.ClientConnectionError as exc:
            return error_response(ApiError.for_status(502, f"API server unreachable: {exc}"))

    async def _websocket(self, request: web.Request, url: str, headers: dict[str, str]) -> web.StreamResponse:
        assert self._session is not None
        ws_headers = {k: v for k, v in headers.items() if not k.lower().startswith("sec-websocket")}
        async with self._session.ws_connect(url.replace("http", "ws", 1), headers=ws_headers) as upstream:
            downstream = web.WebSocketResponse()
            await downstream.prepare(request)

            await splice(downstream, upstream)
            await downstream.close()
            return downstream
