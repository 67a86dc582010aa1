"""Pass-through mode's client of the model server: one kept-alive HTTP/1.1 connection, JSON in
and out (the client's own HTTP session, ``client/_http.py``: a request in one write and no
``email`` header parsing; ``http.client`` cost ~0.2 ms a call on loopback, httpx ~1.4 ms)."""

from __future__ import annotations

import http.client
import json
import urllib.parse
from typing import Any

from ..client._http import HTTPSession
from ..errors import IdeGymError


class UpstreamError(IdeGymError, RuntimeError):
    """The model server could not be reached or did not answer a chat completion."""


class Upstream:
    def __init__(self, base_url: str, api_key: str | None, timeout: float) -> None:
        url = urllib.parse.urlsplit(base_url.rstrip("/"))
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"model_url must be an http(s) URL, not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._headers = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key or 'none'}"}
        self._timeout = timeout
        self._session = self._new_session()

    def _new_session(self) -> HTTPSession:
        return HTTPSession(self.base_url, default_timeout=self._timeout, max_idle=1)

    def chat(self, payload: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """POST ``<base>/chat/completions``: a completion with ``choices`` and its body as the
        server sent it, else ``UpstreamError``."""
        body = json.dumps(payload).encode()
        for attempt in (1, 2):  # a kept-alive connection the server closed meanwhile: once more, fresh
            try:
                resp = self._session.request("POST", "/chat/completions", data=body, headers=self._headers,
                                             timeout=self._timeout)
                break
            except (OSError, http.client.HTTPException) as exc:
                if attempt == 2 or not isinstance(exc, (http.client.RemoteDisconnected, BrokenPipeError,
                                                        ConnectionResetError)):
                    raise UpstreamError(f"{type(exc).__name__}: {exc}") from exc
        data = resp.content
        try:
            answer = json.loads(data)
        except ValueError:
            answer = None
        if resp.status_code != 200 or not isinstance(answer, dict) or not answer.get("choices"):
            raise UpstreamError(f"HTTP {resp.status_code}: {data[:500].decode('utf-8', 'replace')}")
        return answer, data

    def copy(self) -> Upstream:
        return Upstream(self.base_url, self._api_key, self._timeout)

    def close(self) -> None:
        """Close its connection (a later call opens another)."""
        self._session.close()
        self._session = self._new_session()
