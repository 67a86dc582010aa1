"""Operator settings for OCI images: the shared caches (bases, builds), a registry mirror, the Debian and Ubuntu
mirrors."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ....settings import ControlPlaneSettings
from ...base import BackendError
from ..user_cache import user_cache_dir

DEBIAN_SUITES = ("bookworm", "trixie", "forky", "bullseye", "sid", "stable", "testing", "unstable", "oldstable")


class OciError(BackendError):
    """A reason an OCI build cannot run (a bad definition by default: 400)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message, status)


def default_cache_dir() -> Path:
    return user_cache_dir("images")


@dataclass(frozen=True)
class OciSettings:
    """``cache_dir``: shared by every state directory (bases, their buildah store);
    ``registry``: a registry mirror buildah may pull unknown bases from (``host[:port][/prefix]``,
    Docker Hub names resolve under it); ``insecure_registry``: plain HTTP / no TLS check for it;
    ``debian_mirror``: the Debian archive mmdebstrap uses (default: the one apt uses here);
    ``ubuntu_mirror``: the Ubuntu archive for ``ubuntu:*`` bases (default: Ubuntu's own when it
    answers; ``none``: never, the nearest Debian release stands in); ``share_builds``: a build's
    result is published to the host's build cache and taken from it by any control plane of the
    host that builds the same inputs (``build_cache``); ``build_cache_dir``: where (default
    ``<cache_dir>/builds``)."""

    cache_dir: Path
    registry: str | None = None
    insecure_registry: bool = False
    debian_mirror: str | None = None
    ubuntu_mirror: str | None = None
    share_builds: bool = True
    build_cache_dir: Path | None = None

    @property
    def builds_dir(self) -> Path:
        return self.build_cache_dir or self.cache_dir / "builds"

    @classmethod
    def from_env(cls, **overrides: object) -> OciSettings:
        """The control plane's settings (``control_plane/settings.py``), then ``overrides``."""
        env = ControlPlaneSettings.from_env()
        registry = env.image_registry
        values: dict = {
            "cache_dir": env.image_cache or default_cache_dir(),
            "registry": registry,
            "insecure_registry": env.image_registry_insecure,
            "debian_mirror": env.debian_mirror,
            "ubuntu_mirror": env.ubuntu_mirror,
            "share_builds": env.build_cache is not False,
            "build_cache_dir": env.build_cache_dir,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**values)
        if settings.registry:
            reg = settings.registry
            if reg.startswith("http://"):
                settings = cls(**{**values, "registry": reg.removeprefix("http://"), "insecure_registry": True})
            elif reg.startswith("https://"):
                settings = cls(**{**values, "registry": reg.removeprefix("https://")})
            if not re.match(r"^[A-Za-z0-9.-]+(:\d+)?(/[a-z0-9._/-]+)?$", settings.registry or ""):
                raise OciError(f"image registry {registry!r} is not a registry address (host[:port][/prefix])")
        return settings


@dataclass(frozen=True)
class DebianMirror:
    archive: str  # e.g. http://deb.debian.org/debian
    security: str | None  # e.g. http://deb.debian.org/debian-security
    source: str  # where it was found (for messages)


def find_debian_mirror(override: str | None = None, root: Path = Path("/etc/apt")) -> DebianMirror:
    """The Debian archive apt uses on this host (``sources.list`` and ``sources.list.d``).

    Only entries serving Debian suites count (third-party repositories are skipped). An
    ``override`` (``IDEGYM_DEBIAN_MIRROR``) wins; its security archive is ``<override>-security``.
    """
    if override:
        given = override.rstrip("/")
        return DebianMirror(given, given + "-security", "IDEGYM_DEBIAN_MIRROR")
    archive: str | None = None
    security: str | None = None
    where: str | None = None
    for path, uris, suites in _apt_sources(root):
        for suite in suites:
            codename, _, kind = suite.partition("-")
            if codename not in DEBIAN_SUITES:
                continue
            for uri in uris:
                if kind == "security" and security is None:
                    security = uri.rstrip("/")
                elif not kind and archive is None:
                    archive, where = uri.rstrip("/"), str(path)
    if archive is None:
        raise OciError(f"no Debian archive found in {root}/sources.list*: mmdebstrap needs one to build Debian "
                       "bases; set IDEGYM_DEBIAN_MIRROR (e.g. http://deb.debian.org/debian)", 500)
    return DebianMirror(archive, security, where or str(root))


def _apt_sources(root: Path) -> list[tuple[Path, list[str], list[str]]]:
    files = [root / "sources.list"] if (root / "sources.list").is_file() else []
    if (root / "sources.list.d").is_dir():
        files += sorted(p for p in (root / "sources.list.d").iterdir() if p.suffix in (".list", ".sources"))
    out = []
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        if path.suffix == ".sources":  # deb822 stanzas
            for stanza in re.split(r"\n\s*\n", text):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line or line[:1].isspace():
                        continue
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
                if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes") != "no":
                    out.append((path, fields.get("uris", "").split(), fields.get("suites", "").split()))
        else:
            for line in text.splitlines():
                parts = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
                if len(parts) >= 3 and parts[0] == "deb":
                    out.append((path, [parts[1]], [parts[2]]))
    return out
