"""Image references as people write them, and whether their registry answers.

``ubuntu:24.04``, ``docker.io/library/ubuntu:24.04``, ``python:3.13-slim@sha256:…``,
``public.ecr.aws/docker/library/rust:1.85-slim@sha256:…``, ``mirror.gcr.io/library/node:20``,
``ghcr.io/owner/image:tag``: a registry, a repository path, a tag and a digest. Docker Hub's
official images are published under several names (Amazon's ECR Public gallery and Google's
mirror copy them as they are); ``official`` names the image they all stand for.
"""

from __future__ import annotations

import re
import ssl
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

HUB = "docker.io"
_HUB_ALIASES = ("docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com")
# Registries that serve Docker Hub's official images under a prefix of their own.
_OFFICIAL_MIRRORS = {"public.ecr.aws": "docker/library/", "mirror.gcr.io": "library/"}
_API_HOST = {HUB: "registry-1.docker.io"}
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_PATH = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")


class RefError(ValueError):
    """Not an image reference."""


@dataclass(frozen=True)
class ImageRef:
    registry: str  # docker.io for Docker Hub (whichever alias was written)
    path: str  # library/ubuntu, owner/image
    tag: str | None
    digest: str | None
    written: str

    @property
    def official(self) -> str | None:
        """The Docker Hub official image this names (``ubuntu``), or None."""
        if self.registry == HUB and self.path.startswith("library/") and self.path.count("/") == 1:
            return self.path.removeprefix("library/")
        prefix = _OFFICIAL_MIRRORS.get(self.registry)
        if prefix and self.path.startswith(prefix) and "/" not in self.path[len(prefix):]:
            return self.path[len(prefix):]
        if self.registry == "mirror.gcr.io" and "/" not in self.path:
            return self.path
        return None

    @property
    def tag_or_latest(self) -> str:
        return self.tag or "latest"

    @property
    def name(self) -> str:
        """Fully qualified, without the digest: ``docker.io/library/ubuntu:24.04``."""
        return f"{self.registry}/{self.path}:{self.tag_or_latest}"

    @property
    def pull_name(self) -> str:
        """What to pull: the digest when one is given (the tag is then only informative)."""
        base = f"{self.registry}/{self.path}"
        return f"{base}@{self.digest}" if self.digest else f"{base}:{self.tag_or_latest}"

    @property
    def api_host(self) -> str:
        return _API_HOST.get(self.registry, self.registry)


def parse(ref: str) -> ImageRef:
    """``ref`` as Docker reads it (a registry is a first component with a dot, a colon, or
    ``localhost``); raises ``RefError`` for what is not a reference."""
    text = ref.strip()
    if not text or any(c.isspace() for c in text):
        raise RefError(f"{ref!r} is not an image reference")
    rest, _, digest = text.partition("@")
    if digest and not _DIGEST.match(digest):
        raise RefError(f"{ref!r}: {digest!r} is not a sha256 digest")
    first, slash, remainder = rest.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        registry, rest = first.lower(), remainder
    else:
        registry = HUB
    if registry in _HUB_ALIASES:
        registry = HUB
    path, tag = rest, None
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        path, _, tag = rest.rpartition(":")
        if not _TAG.match(tag):
            raise RefError(f"{ref!r}: {tag!r} is not a tag")
    if registry == HUB and "/" not in path:
        path = f"library/{path}"
    if not _PATH.match(path):
        raise RefError(f"{ref!r}: {path!r} is not a repository name (lower case letters, digits, . _ - and /)")
    return ImageRef(registry, path, tag, digest or None, text)


# -- reachability ------------------------------------------------------------------------------------

_reach_lock = threading.Lock()
_reach: dict[str, tuple[float, bool]] = {}
REACH_TTL = 300.0


def reachable(url: str, statuses: tuple[int, ...] = (200,), timeout: float = 4.0) -> bool:
    """Whether ``url`` answers with one of ``statuses`` (a proxy's refusal page does not count),
    remembered for a few minutes. Uses the host's trust store, as buildah and apt do."""
    now = time.monotonic()
    with _reach_lock:
        known = _reach.get(url)
        if known and now - known[0] < REACH_TTL:
            return known[1]
    ok = _status(url, timeout) in statuses
    with _reach_lock:
        _reach[url] = (time.monotonic(), ok)
    return ok


def _status(url: str, timeout: float) -> int | None:
    request = urllib.request.Request(url, method="GET", headers={"User-Agent": "idegym"})
    context = ssl.create_default_context()
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:  # noqa: S310 (http/https only)
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError, ssl.SSLError, ValueError):
        return None


def registry_reachable(ref: ImageRef) -> bool:
    """A registry's API root answers 200 or 401 (it wants a token)."""
    return reachable(f"https://{ref.api_host}/v2/", (200, 401))


__all__ = ["ImageRef", "RefError", "parse", "reachable", "registry_reachable", "HUB"]
