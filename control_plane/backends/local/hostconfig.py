"""The operator's package sources, for image builds and networked sandboxes.

What this host's own tools use to reach package indexes: the CA bundle (the one pip is told to
use, else ``SSL_CERT_FILE``…, else the system's), pip's index and proxy settings, uv's, npm's,
apt's proxies, and the proxy variables. They are written into one directory
(``<state>/host-config/<content hash>``), bound read-only at ``/run/idegym-host-config`` into the ``RUN`` steps
of builds that have the network and into sandboxes that have it, and named there by the
variables the tools read (:attr:`HostConfig.env`: paths only). A bind is not part of an image
layer, so whatever credentials those files hold never enter an image; a networked sandbox's
tools can read them, as they must to use the index.

Proxy variables travel as buildah's predefined build arguments (whose values buildah keeps out
of the image's history) and as plain variables in sandboxes.
"""

from __future__ import annotations

import configparser
import hashlib
import json
import os
import re
import secrets
import shutil
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

MOUNT = "/run/idegym-host-config"
CA_FILE = "ca-certificates.crt"
SYSTEM_CA = Path("/etc/ssl/certs/ca-certificates.crt")
PROXY_VARS = tuple(v for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "FTP_PROXY")
                   for v in (name, name.lower()))
# The variables each tool reads for a CA bundle (OpenSSL-based tools, Go: SSL_CERT_FILE).
CA_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS",
           "CARGO_HTTP_CAINFO")
PIP_KEYS = ("index-url", "extra-index-url", "trusted-host", "proxy", "timeout", "retries", "find-links")
NPM_DROPPED = ("cafile", "ca", "prefix", "cache", "globalconfig", "userconfig", "init-module", "tmp")
_APT_PROXY = re.compile(r'^\s*(Acquire::(?:https?|ftp)::Proxy(?:::[\w.-]+)?)\s+"([^"]*)"\s*;', re.MULTILINE)
_ENV_REF = re.compile(r"\$\{([A-Za-z_]\w*)\}")


@dataclass(frozen=True)
class HostConfig:
    directory: Path
    env: dict[str, str]  # for RUN steps and sandboxes: paths under MOUNT (no credentials)
    proxies: dict[str, str]  # the host's proxy variables (values may hold credentials)
    sources: tuple[str, ...] = field(default=())  # what came from where, for the build log

    def describe(self) -> str:
        return "; ".join(self.sources) or "nothing configured"


def collect(root: Path, environ: Mapping[str, str] | None = None, home: Path | None = None,
            etc: Path = Path("/etc")) -> HostConfig:
    """Write the host's package configuration into a directory of ``root`` and say what it is."""
    environ = dict(os.environ if environ is None else environ)
    home = home if home is not None else Path(os.path.expanduser("~"))
    sources: list[str] = []
    files: dict[str, str] = {}
    env: dict[str, str] = {}

    pip, pip_from = _pip_settings(environ, home, etc)
    ca_path, ca_from = _ca_bundle(pip, environ)
    if ca_path is not None:
        try:
            text = ca_path.read_text(errors="replace")
        except OSError:
            text = ""
        if "-----BEGIN CERTIFICATE-----" in text:
            files[CA_FILE] = text
            sources.append(f"CA bundle {ca_path} ({ca_from})")
            env.update({name: f"{MOUNT}/{CA_FILE}" for name in CA_VARS})
    pip.pop("cert", None)
    if CA_FILE in files:
        pip["cert"] = f"{MOUNT}/{CA_FILE}"
    if any(k != "cert" for k in pip) or CA_FILE in files:
        parser = configparser.ConfigParser(interpolation=None)
        parser["global"] = pip
        files["pip.conf"] = _ini(parser)
        env["PIP_CONFIG_FILE"] = f"{MOUNT}/pip.conf"
        if pip_from:
            sources.append(f"pip settings from {', '.join(pip_from)}")

    uv_text, uv_from = _uv_settings(environ, home, etc, pip)
    if uv_text is not None:
        files["uv.toml"] = uv_text
        env["UV_CONFIG_FILE"] = f"{MOUNT}/uv.toml"
        sources.append(f"uv settings from {uv_from}")

    npm_text, npm_from = _npm_settings(environ, home, etc, CA_FILE in files)
    if npm_text is not None:
        files["npmrc"] = npm_text
        env["NPM_CONFIG_GLOBALCONFIG"] = f"{MOUNT}/npmrc"
        if npm_from:
            sources.append(f"npm settings from {', '.join(npm_from)}")

    apt_lines, apt_from = _apt_proxies(etc)
    if CA_FILE in files:
        apt_lines.append(f'Acquire::https::CAInfo "{MOUNT}/{CA_FILE}";')
    if apt_lines:
        files["apt.conf"] = "\n".join(apt_lines) + "\n"
        env["APT_CONFIG"] = f"{MOUNT}/apt.conf"
        if apt_from:
            sources.append(f"apt proxies from {', '.join(apt_from)}")

    proxies = {name: environ[name] for name in PROXY_VARS if environ.get(name)}
    if proxies:
        sources.append(f"proxy variables {', '.join(sorted(proxies))}")
    return HostConfig(_write(root, files), env, proxies, tuple(sources))


def _ini(parser: configparser.ConfigParser) -> str:
    from io import StringIO

    out = StringIO()
    parser.write(out)
    return out.getvalue()


def _pip_settings(environ: dict[str, str], home: Path, etc: Path) -> tuple[dict[str, str], list[str]]:
    """pip's files in pip's order (site, user, $PIP_CONFIG_FILE), then $PIP_* variables; only
    the settings that say where packages come from, URLs only when they are http(s)."""
    candidates = [etc / "xdg" / "pip" / "pip.conf", etc / "pip.conf", home / ".pip" / "pip.conf",
                  home / ".config" / "pip" / "pip.conf"]
    if environ.get("PIP_CONFIG_FILE") and environ["PIP_CONFIG_FILE"] != os.devnull:
        candidates.append(Path(environ["PIP_CONFIG_FILE"]))
    settings: dict[str, str] = {}
    used: list[str] = []
    for path in candidates:
        parser = configparser.ConfigParser(interpolation=None)
        try:
            if not parser.read(path):
                continue
        except (configparser.Error, UnicodeDecodeError):
            continue
        found = False
        for section in ("global", "install", "download"):
            if parser.has_section(section):
                for key in (*PIP_KEYS, "cert"):
                    if parser.has_option(section, key):
                        settings[key] = parser.get(section, key)
                        found = True
        if found:
            used.append(str(path))
    for key in (*PIP_KEYS, "cert"):
        value = environ.get("PIP_" + key.upper().replace("-", "_"))
        if value:
            settings[key] = value
            used.append("$PIP_" + key.upper().replace("-", "_"))
    for key in ("index-url", "extra-index-url", "find-links"):
        if key in settings:
            urls = [u for u in settings[key].split() if u.startswith(("http://", "https://"))]
            if urls:
                settings[key] = "\n".join(urls) if key != "index-url" else urls[0]
            else:
                settings.pop(key)
    return settings, used


def _ca_bundle(pip: dict[str, str], environ: dict[str, str]) -> tuple[Path | None, str]:
    for value, where in ((pip.get("cert"), "pip's cert"), (environ.get("PIP_CERT"), "$PIP_CERT"),
                         (environ.get("SSL_CERT_FILE"), "$SSL_CERT_FILE"),
                         (environ.get("REQUESTS_CA_BUNDLE"), "$REQUESTS_CA_BUNDLE"),
                         (environ.get("CURL_CA_BUNDLE"), "$CURL_CA_BUNDLE")):
        if value and Path(value).is_file():
            return Path(value), where
    if SYSTEM_CA.is_file():
        return SYSTEM_CA, "the system's trust store"
    return None, ""


def _uv_settings(environ: dict[str, str], home: Path, etc: Path, pip: dict[str, str]) -> tuple[str | None, str]:
    """uv's own configuration (its file, as it is), else pip's index settings said the way uv reads them."""
    for path in (Path(environ["UV_CONFIG_FILE"]) if environ.get("UV_CONFIG_FILE") else None,
                 home / ".config" / "uv" / "uv.toml", etc / "uv" / "uv.toml"):
        if path is None or not path.is_file():
            continue
        try:
            text = path.read_text()
            tomllib.loads(text)
        except (OSError, tomllib.TOMLDecodeError):
            continue
        return text, str(path)
    lines = []
    index = environ.get("UV_DEFAULT_INDEX") or environ.get("UV_INDEX_URL") or pip.get("index-url")
    extra = (environ.get("UV_INDEX") or environ.get("UV_EXTRA_INDEX_URL") or "").split() \
        or pip.get("extra-index-url", "").split()
    if index:
        lines.append(f"index-url = {_toml(index)}")
    if extra:
        lines.append("extra-index-url = [" + ", ".join(_toml(u) for u in extra) + "]")
    if not lines:
        return None, ""
    return "\n".join(lines) + "\n", "pip's index settings"


def _toml(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _npm_settings(environ: dict[str, str], home: Path, etc: Path, with_ca: bool) -> tuple[str | None, list[str]]:
    """npm's global and user files and $NPM_CONFIG_* variables, host paths dropped, ``${VAR}``
    references filled from this environment (the sandbox has not got them), the CA bundle ours."""
    entries: dict[str, str] = {}
    used: list[str] = []
    paths = [etc / "npmrc", Path("/usr/local/etc/npmrc"), home / ".npmrc"]
    if environ.get("NPM_CONFIG_USERCONFIG"):
        paths.append(Path(environ["NPM_CONFIG_USERCONFIG"]))
    for path in paths:
        try:
            text = path.read_text()
        except OSError:
            continue
        found = False
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith((";", "#")) or "=" not in line:
                continue
            key, _, value = (p.strip() for p in line.partition("="))
            if key.lower() in NPM_DROPPED:
                continue
            entries[key] = _ENV_REF.sub(lambda m: environ.get(m.group(1), ""), value)
            found = True
        if found:
            used.append(str(path))
    for name, value in environ.items():
        low = name.lower()
        if low.startswith("npm_config_") and value:
            key = low.removeprefix("npm_config_").replace("_", "-")
            if key not in NPM_DROPPED:
                entries[key] = value
                used.append(f"${name}")
    if with_ca:
        entries["cafile"] = f"{MOUNT}/{CA_FILE}"
    if not entries:
        return None, []
    return "".join(f"{k}={v}\n" for k, v in entries.items()), used


def _apt_proxies(etc: Path) -> tuple[list[str], list[str]]:
    files = [etc / "apt" / "apt.conf"]
    parts = etc / "apt" / "apt.conf.d"
    if parts.is_dir():
        files += sorted(p for p in parts.iterdir() if p.is_file())
    lines: list[str] = []
    used: list[str] = []
    for path in files:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        found = [f'{key} "{value}";' for key, value in _APT_PROXY.findall(text)]
        if found:
            lines += found
            used.append(str(path))
    return lines, used


def _write(root: Path, files: dict[str, str]) -> Path:
    """``files`` in a directory of ``root`` named by their content, made once: sandboxes bind it,
    so it never changes under them (a changed host configuration is a new directory)."""
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
    dest = root / digest
    if dest.is_dir():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{digest}.{secrets.token_hex(3)}"
    tmp.mkdir(mode=0o755)
    os.chmod(tmp, 0o755)  # readable by the sandboxes' users: it is bound in
    for name, text in files.items():
        (tmp / name).write_text(text)
        os.chmod(tmp / name, 0o644)
    try:
        tmp.rename(dest)
    except OSError:  # made meanwhile by another process: the same content
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


__all__ = ["HostConfig", "collect", "MOUNT"]
