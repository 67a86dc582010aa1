"""Facts about URLs that several parts of ``idegym_env`` need."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit, urlunsplit

_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def is_loopback_url(url: str) -> bool:
    """True when only this machine can reach ``url``'s host.

    A loopback address (``127.0.0.0/8``, ``::1``) or name (``localhost``), or the unspecified
    address (``0.0.0.0``, ``::``), which a client on this machine reaches as itself and a client
    anywhere else cannot reach at all.
    """
    host = (urlsplit(url).hostname or "").lower()
    if host in _LOCAL_NAMES or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def without_credentials(url: str) -> str:
    """``url`` without its ``user:password@`` part: for showing and logging."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


__all__ = ["is_loopback_url", "without_credentials"]
