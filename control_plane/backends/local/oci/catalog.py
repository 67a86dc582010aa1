"""The bases built here from distribution archives, and which one a reference stands for.

When no registry is reachable (or a pull fails), ``FROM`` names of these families become a base
built with mmdebstrap from the Debian archive (or the Ubuntu archive, when one is configured or
reachable):

* ``debian:<release>[-slim]`` — the release itself;
* ``ubuntu:<version|codename>`` — that Ubuntu release, else the nearest Debian release;
* ``python:3.X…`` — the Debian release whose ``python3`` is closest (pip allowed system-wide);
* the official toolchain images — ``golang``, ``rust``, ``node``, ``gcc``, ``ruby``, ``php``,
  ``openjdk``, ``eclipse-temurin``, ``maven``, ``gradle`` — the Debian release (Ubuntu for
  ``eclipse-temurin`` when possible, as published) whose packaged toolchain is closest to the
  tag's version, plus the packages the official image has (``buildpack-deps`` for the full
  variants), laid out where the official image keeps it (``/usr/local/go``, ``JAVA_HOME``…);
* derived images whose recipe is published (Terminal-Bench's ``t-bench`` bases).

Every mapping says what it is (``BaseSpec.note``); the build log and the image's labels carry it,
and the versions actually installed.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from .refs import ImageRef, RefError, parse
from .settings import OciError

RECIPE_VERSION = 1
TOOL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Release:
    codename: str
    number: int | str  # 12 (Debian), "24.04" (Ubuntu)
    python: tuple[int, int]  # its python3
    distro: str = "debian"
    nearest_debian: str | None = None  # an Ubuntu release's stand-in when no Ubuntu archive is usable

    @property
    def title(self) -> str:
        return f"{self.distro.capitalize()} {self.codename}"


RELEASES = {"bookworm": Release("bookworm", 12, (3, 11)), "trixie": Release("trixie", 13, (3, 13))}
UBUNTU = {"focal": Release("focal", "20.04", (3, 8), "ubuntu", "bookworm"),
          "jammy": Release("jammy", "22.04", (3, 10), "ubuntu", "bookworm"),
          "noble": Release("noble", "24.04", (3, 12), "ubuntu", "trixie")}
NEWEST = "trixie"
UBUNTU_LATEST = "noble"
DEBIAN_ALIASES = {"12": "bookworm", "13": "trixie", "stable": NEWEST, "latest": NEWEST}
UBUNTU_ALIASES = {"20.04": "focal", "22.04": "jammy", "24.04": "noble", "latest": UBUNTU_LATEST,
                  "rolling": UBUNTU_LATEST, "lts": UBUNTU_LATEST}
OTHER_RELEASES = ("bullseye", "buster", "stretch", "sid", "forky", "bionic", "xenial", "plucky", "oracular",
                  "questing", "mantic", "lunar")
MAX_PYTHON_DISTANCE = 1  # minor versions
PYTHON_PACKAGES = ("python3", "python3-pip", "python3-venv", "python-is-python3", "ca-certificates")
# Docker's buildpack-deps images, which the official toolchain images (not -slim) are built on.
SCM_PACKAGES = ("ca-certificates", "curl", "wget", "gnupg", "dirmngr", "git", "openssh-client", "procps",
                "netbase", "xz-utils", "bzip2", "unzip")
FULL_PACKAGES = SCM_PACKAGES + ("autoconf", "automake", "libtool", "file", "patch", "make", "gcc", "g++", "libc6-dev",
                                "dpkg-dev", "pkg-config", "libssl-dev", "libffi-dev", "zlib1g-dev", "libbz2-dev",
                                "liblzma-dev", "libsqlite3-dev", "libreadline-dev", "libncurses-dev", "libxml2-dev",
                                "libyaml-dev")
SLIM_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/groff/*", "/usr/share/info/*",
                 "/usr/share/lintian/*", "/usr/share/linda/*", "/usr/share/locale/*")
SLIM_INCLUDES = ("/usr/share/doc/*/copyright", "/usr/share/locale/locale.alias")
# What Ubuntu's minimal images have that its Priority: required set (mmdebstrap's minbase) has not.
UBUNTU_PACKAGES = ("apt", "gpgv", "ubuntu-keyring")
UNBUILDABLE = ("alpine", "windowsservercore", "nanoserver", "ubi", "amazonlinux", "oraclelinux", "musl")


@dataclass(frozen=True)
class BaseSpec:
    """A base built here, and the recipe that builds it."""

    name: str  # what the cache store tags it as: docker.io/library/python:3.12-slim
    release: Release
    slim: bool
    python: tuple[int, int] | None  # the version asked for (python bases)
    note: str | None = None
    packages: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # values may name a probe: {go}
    hooks: tuple[str, ...] = ()  # shell run in the new root (chroot) after the packages
    probes: tuple[tuple[str, str], ...] = ()  # (label, command): versions recorded in labels
    suites: tuple[str, ...] = ()  # extra suites of the release (bookworm-backports)

    def recipe(self, mirror: str) -> dict[str, Any]:
        recipe: dict[str, Any] = {
            "v": RECIPE_VERSION, "release": self.release.codename, "variant": "minbase", "slim": self.slim,
            "packages": sorted(self.packages), "python_base": self.python is not None, "mirror": mirror}
        extra = {"distro": self.release.distro if self.release.distro != "debian" else None,
                 "env": list(self.env) or None, "hooks": list(self.hooks) or None,
                 "probes": list(self.probes) or None, "suites": list(self.suites) or None}
        recipe.update({k: v for k, v in extra.items() if v})
        return recipe

    def key(self, mirror: str) -> str:
        return hashlib.sha256(json.dumps(self.recipe(mirror), sort_keys=True).encode()).hexdigest()[:16]


# -- toolchains ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Offer:
    """A toolchain version a release provides, and its packages."""

    release: str
    version: tuple[int, ...]
    packages: tuple[str, ...]
    suite: str | None = None  # e.g. bookworm-backports

    @property
    def text(self) -> str:
        return ".".join(str(p) for p in self.version)


@dataclass(frozen=True)
class Toolchain:
    name: str  # the official image's name
    tool: str  # how the note calls it
    precision: int  # version parts that must match (go 1.22: 2; node 20: 1)
    offers: tuple[Offer, ...]
    probe: str  # prints the installed version
    env: tuple[tuple[str, str], ...] = ()
    hooks: tuple[str, ...] = ()  # may use {v} (the offer's version text)
    slim_packages: tuple[str, ...] = ("ca-certificates",)
    full_packages: tuple[str, ...] = FULL_PACKAGES
    has_slim: bool = True
    ubuntu: bool = False  # published on Ubuntu (eclipse-temurin): built on Ubuntu when an archive is usable
    older: int = 1  # how far behind the tag (in its last compared part) the named release's toolchain may be

    def releases(self) -> list[str]:
        return list(dict.fromkeys(o.release for o in self.offers))


def _java_offers(kind: str) -> tuple[Offer, ...]:
    table = (("bookworm", 17), ("trixie", 21), ("trixie", 25), ("jammy", 8), ("jammy", 11), ("jammy", 17),
             ("noble", 8), ("noble", 11), ("noble", 17), ("noble", 21))
    return tuple(Offer(rel, (v,), (f"openjdk-{v}-{kind}-headless",)) for rel, v in table)


_JAVA_HOOK = ('mkdir -p "$(dirname {home})" && ln -sfn "$(dirname "$(dirname "$(readlink -f /usr/bin/javac '
              '2>/dev/null || readlink -f /usr/bin/java)")")" {home}')
_JAVA_PROBE = "java -version 2>&1 | head -1"
TOOLCHAINS: dict[str, Toolchain] = {t.name: t for t in (
    Toolchain("golang", "go", 2, (
        Offer("bookworm", (1, 19), ("golang-1.19-go",)),
        Offer("bookworm", (1, 21), ("golang-1.21-go",), "bookworm-backports"),
        Offer("bookworm", (1, 22), ("golang-1.22-go",), "bookworm-backports"),
        Offer("bookworm", (1, 23), ("golang-1.23-go",), "bookworm-backports"),
        Offer("trixie", (1, 24), ("golang-1.24-go",))),
        "go version | cut -d' ' -f3 | sed s/^go//",
        env=(("GOLANG_VERSION", "{go}"), ("GOTOOLCHAIN", "local"), ("GOPATH", "/go"),
             ("PATH", "/go/bin:/usr/local/go/bin:" + TOOL_PATH)),
        hooks=("ln -sfn /usr/lib/go-{v} /usr/local/go", "mkdir -p /go/src /go/bin && chmod -R 1777 /go"),
        full_packages=SCM_PACKAGES + ("gcc", "libc6-dev", "make", "pkg-config"), has_slim=False, older=1),
    Toolchain("rust", "rustc", 2, (
        Offer("bookworm", (1, 63), ("rustc", "cargo", "rustfmt", "rust-clippy")),
        Offer("trixie", (1, 85), ("rustc", "cargo", "rustfmt", "rust-clippy"))),
        "rustc --version | cut -d' ' -f2",
        env=(("RUSTUP_HOME", "/usr/local/rustup"), ("CARGO_HOME", "/usr/local/cargo"), ("RUST_VERSION", "{rustc}"),
             ("PATH", "/usr/local/cargo/bin:" + TOOL_PATH)),
        hooks=("mkdir -p /usr/local/cargo/bin /usr/local/rustup && chmod -R a+w /usr/local/cargo /usr/local/rustup",),
        slim_packages=("ca-certificates", "gcc", "libc6-dev"), older=3),
    Toolchain("node", "node", 1, (
        Offer("bookworm", (18,), ("nodejs", "npm", "yarnpkg")), Offer("trixie", (20,), ("nodejs", "npm", "yarnpkg"))),
        "node --version | sed s/^v//",
        env=(("NODE_VERSION", "{node}"),),
        hooks=("ln -sf /usr/bin/yarnpkg /usr/local/bin/yarn",),
        slim_packages=("ca-certificates",), older=2),
    Toolchain("gcc", "gcc", 1, (
        Offer("bookworm", (12,), ("gcc-12", "g++-12", "gfortran-12")),
        Offer("trixie", (12,), ("gcc-12", "g++-12", "gfortran-12")),
        Offer("trixie", (13,), ("gcc-13", "g++-13", "gfortran-13")),
        Offer("trixie", (14,), ("gcc-14", "g++-14", "gfortran-14"))),
        "gcc -dumpfullversion",
        hooks=("for t in gcc g++ gfortran cpp gcc-ar gcc-nm gcc-ranlib; do ln -sf /usr/bin/$t-{v} /usr/local/bin/$t; "
               "done; ln -sf /usr/local/bin/gcc /usr/local/bin/cc; ln -sf /usr/local/bin/g++ /usr/local/bin/c++",),
        has_slim=False),
    Toolchain("ruby", "ruby", 2, (
        Offer("bookworm", (3, 1), ("ruby", "ruby-dev", "ruby-bundler")),
        Offer("trixie", (3, 3), ("ruby", "ruby-dev", "ruby-bundler"))),
        "ruby -e 'print RUBY_VERSION'",
        env=(("GEM_HOME", "/usr/local/bundle"), ("BUNDLE_SILENCE_ROOT_WARNING", "1"),
             ("BUNDLE_APP_CONFIG", "/usr/local/bundle"), ("RUBY_VERSION", "{ruby}"),
             ("PATH", "/usr/local/bundle/bin:" + TOOL_PATH)),
        hooks=("mkdir -p /usr/local/bundle/bin && chmod -R 1777 /usr/local/bundle",),
        slim_packages=("ca-certificates", "gcc", "make", "libc6-dev")),
    Toolchain("php", "php", 2, (
        Offer("bookworm", (8, 2), tuple(f"php8.2-{m}" for m in ("cli", "mbstring", "xml", "curl", "sqlite3",
                                                                  "mysql", "zip"))),
        Offer("trixie", (8, 4), tuple(f"php8.4-{m}" for m in ("cli", "mbstring", "xml", "curl", "sqlite3", "mysql",
                                                                "zip")))),
        "php -r 'echo PHP_VERSION;'",
        env=(("PHP_VERSION", "{php}"),),
        hooks=("ln -sf /usr/bin/php /usr/local/bin/php",),
        full_packages=("ca-certificates", "curl", "xz-utils"), has_slim=False),
    Toolchain("openjdk", "java", 1, _java_offers("jdk"), _JAVA_PROBE, older=0,
              env=(("JAVA_HOME", "/usr/local/openjdk"), ("PATH", "/usr/local/openjdk/bin:" + TOOL_PATH)),
              hooks=(_JAVA_HOOK.format(home="/usr/local/openjdk"),),
              slim_packages=("ca-certificates", "p11-kit"), full_packages=SCM_PACKAGES + ("p11-kit",)),
    Toolchain("eclipse-temurin", "java", 1, _java_offers("jdk"), _JAVA_PROBE, older=0,
              env=(("JAVA_HOME", "/opt/java/openjdk"), ("PATH", "/opt/java/openjdk/bin:" + TOOL_PATH),
                   ("LANG", "C.UTF-8")),
              hooks=(_JAVA_HOOK.format(home="/opt/java/openjdk"),),
              full_packages=("ca-certificates", "curl", "wget", "fontconfig", "locales", "tzdata", "p11-kit",
                             "binutils"), has_slim=False, ubuntu=True),
    Toolchain("maven", "mvn", 2, (
        Offer("bookworm", (3, 8), ("maven",)), Offer("trixie", (3, 9), ("maven",))),
        "mvn -v 2>/dev/null | head -1 | cut -d' ' -f3",
        env=(("MAVEN_HOME", "/usr/share/maven"), ("MAVEN_CONFIG", "/root/.m2"), ("JAVA_HOME", "/opt/java/openjdk"),
             ("PATH", "/opt/java/openjdk/bin:" + TOOL_PATH)),
        full_packages=SCM_PACKAGES, has_slim=False, older=99),
    Toolchain("gradle", "gradle", 1, (
        Offer("bookworm", (4,), ("gradle", "default-jdk-headless")),
        Offer("trixie", (4,), ("gradle", "default-jdk-headless"))),
        "gradle --version 2>/dev/null | sed -n 's/^Gradle //p'",
        env=(("GRADLE_HOME", "/usr/share/gradle"), ("JAVA_HOME", "/opt/java/openjdk"),
             ("PATH", "/opt/java/openjdk/bin:" + TOOL_PATH)),
        hooks=(_JAVA_HOOK.format(home="/opt/java/openjdk"),),
        full_packages=SCM_PACKAGES, has_slim=False),
)}
NODE_CODENAMES = {"hydrogen": 18, "iron": 20, "jod": 22, "krypton": 24, "lts": 22, "current": 24}

# Images derived from an official one whose published recipe is the official image plus packages.
DERIVED = {
    "ghcr.io/laude-institute/t-bench/ubuntu-24-04": ("ubuntu:24.04", ("tmux", "asciinema")),
    "ghcr.io/laude-institute/t-bench/python-3-13": ("python:3.13", ("tmux", "asciinema")),
}


def supported_text() -> str:
    (lo, hi) = python_range()
    rels = ", ".join(f"debian:{r.codename} (debian:{r.number})" for r in RELEASES.values())
    pys = "; ".join(f"{r.codename} has python3 {r.python[0]}.{r.python[1]}" for r in RELEASES.values())
    return (f"{rels}, each also -slim, debian:stable/latest = {NEWEST}; ubuntu:20.04/22.04/24.04 (focal, jammy, "
            f"noble; the nearest Debian release when no Ubuntu archive is usable); python:{lo[0]}.{lo[1]} to "
            f"python:{hi[0]}.{hi[1]} (and -slim, -<release>), mapped to the Debian release with the closest "
            f"python3 ({pys}); the toolchain images {', '.join(TOOLCHAINS)} (their Debian variants), as the "
            "Debian release whose packaged toolchain is closest to the tag's version")


def python_range() -> tuple[tuple[int, int], tuple[int, int]]:
    pys = [r.python for r in RELEASES.values()]
    low, high = min(pys), max(pys)
    return (low[0], low[1] - MAX_PYTHON_DISTANCE), (high[0], high[1] + MAX_PYTHON_DISTANCE)


def _unsupported(ref: str, why: str) -> OciError:
    return OciError(f"base {ref!r} is not supported here ({why}): supported bases are {supported_text()}; other "
                    "images need a registry mirror (--image-registry) or a reachable registry")


@dataclass
class _Tag:
    version: tuple[int, ...] | None = None
    version_text: str | None = None
    release: str | None = None
    flags: list[str] = field(default_factory=list)


def _read_tag(ref: str, tag: str, allowed: tuple[str, ...]) -> _Tag:
    out = _Tag()
    for token in tag.split("-"):
        low = token.lower()
        if low == "latest" or low == "":
            continue
        if any(low.startswith(u) for u in UNBUILDABLE):
            raise _unsupported(ref, f"{token!r} variants are not built locally: use the Debian variant")
        found = re.fullmatch(r"(\d+(?:\.\d+){0,3})(?:[_+][\w.]+)?", token)
        if found and out.version is None and not out.flags:
            out.version = tuple(int(p) for p in found.group(1).split("."))
            out.version_text = token
        elif low in RELEASES or low in UBUNTU:
            out.release = low
        elif low in OTHER_RELEASES:
            raise _unsupported(ref, f"Debian/Ubuntu {token} is not built here (bookworm, trixie; jammy, noble, focal)")
        elif low in allowed:
            out.flags.append(low)
        else:
            raise _unsupported(ref, f"{token!r} variants are not built locally")
    return out


def _distance(have: tuple[int, ...], want: tuple[int, ...], precision: int) -> int:
    h = (list(have) + [0] * precision)[:precision]
    w = (list(want) + [0] * precision)[:precision]
    if precision == 1:
        return abs(h[0] - w[0])
    return abs(h[1] - w[1]) + 100 * abs(h[0] - w[0])


def _pick(chain: Toolchain, tag: _Tag, usable: set[str]) -> tuple[Offer, bool]:
    offers = [o for o in chain.offers if o.release in usable]
    if not offers:
        raise OciError(f"no release that offers {chain.tool} is usable here", 500)
    want = tag.version
    if want is None:
        named = [o for o in offers if o.release == tag.release]
        return max(named or offers, key=lambda o: (o.version, o.release == NEWEST)), True
    want = want[:chain.precision]

    def rank(o: Offer) -> tuple[int, tuple[int, ...]]:
        return _distance(o.version, want, chain.precision), tuple(-p for p in o.version)

    # The release the tag names is kept while its toolchain is at most ``chain.older`` behind: the
    # Dockerfile was written against that archive (its package names, pinned versions), which
    # matters more than a version or two of the toolchain — not more than code it cannot compile.
    named = [o for o in offers if o.release == tag.release]
    if named:
        best = min(named, key=rank)
        if _distance(best.version, want, chain.precision) <= chain.older or best.version[:chain.precision] > want:
            return best, _distance(best.version, want, chain.precision) == 0
    best = min(offers, key=rank)
    return best, _distance(best.version, want, chain.precision) == 0


def _release(name: str) -> Release:
    return RELEASES.get(name) or UBUNTU[name]


def _toolchain(ref: str, image: ImageRef, chain: Toolchain, ubuntu: bool) -> BaseSpec:
    tag_text = image.tag_or_latest
    allowed = ("slim", "jdk", "jre", "cli", "lts", "current", "bookworm", "trixie", *NODE_CODENAMES)
    if chain.name == "maven":
        return _maven(ref, image)
    if chain.name == "gradle":  # gradle:8.5-jdk17: the JDK is the one its Debian package brings
        tag_text = re.sub(r"-?jdk-?\d*", "", tag_text) or "latest"
    tag = _read_tag(ref, tag_text, allowed + (("apache", "fpm", "zts") if chain.name == "php" else ()))
    if chain.name == "node":
        for codename, major in NODE_CODENAMES.items():
            if codename in tag.flags and tag.version is None:
                tag.version, tag.version_text = (major,), str(major)
    if chain.name == "php" and any(f in tag.flags for f in ("apache", "fpm", "zts")):
        raise _unsupported(ref, "only the php -cli variant is built here")
    slim = "slim" in tag.flags
    if slim and not chain.has_slim:
        raise _unsupported(ref, f"{chain.name} has no -slim variant")
    if chain.ubuntu and ubuntu:
        usable = {r for r in chain.releases() if r in UBUNTU}
        if tag.release is None:
            tag.release = UBUNTU_LATEST
    else:
        usable = {r for r in chain.releases() if r in RELEASES}
        if tag.release in UBUNTU:
            tag.release = UBUNTU[tag.release].nearest_debian
    offer, exact = _pick(chain, tag, usable)
    release = _release(offer.release)
    extra = tuple(chain.slim_packages if slim else chain.full_packages)
    if release.distro == "ubuntu":
        extra = UBUNTU_PACKAGES + extra
    parts = [f"{ref} -> {release.title}{' (' + offer.suite + ')' if offer.suite else ''}: {chain.tool} {offer.text} "
             f"from {' '.join(offer.packages)}"]
    if not exact and tag.version is not None:
        parts.append(f"the closest to {chain.tool} {tag.version_text} "
                     + (f"{offer.release} packages (the tag names {offer.release})" if offer.release == tag.release
                        else "a release here has"))
    asked = _asked_release(image.tag_or_latest)
    if asked in UBUNTU and release.distro == "debian":
        parts.append(f"Debian instead of Ubuntu {asked}: no Ubuntu archive is reachable or configured "
                     "(IDEGYM_UBUNTU_MIRROR)")
    elif asked and asked != offer.release:
        parts.append(f"{asked}'s {chain.tool} is further behind")
    if chain.name == "gradle":
        parts.append("Debian packages only Gradle 4")
    hooks = tuple(h.replace("{v}", offer.text) for h in chain.hooks)
    probes = ((chain.tool, chain.probe),)
    return BaseSpec(f"{image.registry}/{image.path}:{image.tag_or_latest}" if image.official is None else
                    f"docker.io/library/{image.official}:{image.tag_or_latest}", release, slim, None,
                    "; ".join(parts), tuple(dict.fromkeys(extra + offer.packages)), chain.env, hooks, probes,
                    (offer.suite,) if offer.suite else ())


def _asked_release(tag: str) -> str | None:
    for token in tag.lower().split("-"):
        if token in RELEASES or token in UBUNTU:
            return token
    return None


def _maven(ref: str, image: ImageRef) -> BaseSpec:
    """``maven:3.9-eclipse-temurin-17`` and kin: Debian's maven on the JDK the tag names."""
    tag = image.tag_or_latest.lower()
    found = re.fullmatch(r"(?:(\d+(?:\.\d+)*)-?)?(?:(?:eclipse-temurin|openjdk|amazoncorretto|sapmachine|ibm-semeru|"
                         r"ibmjava|jdk)-?(\d+))?((?:-(?:slim|noble|jammy|focal|bookworm|trixie))*)", tag)
    if tag == "latest":
        found = re.fullmatch(r"()()()", "")
    if not found:
        raise _unsupported(ref, f"maven tag {image.tag_or_latest!r} is not one this builds "
                                "(<maven version>-<jdk>-<java version>)")
    java = int(found.group(2)) if found.group(2) else 21
    jdk_chain, chain = TOOLCHAINS["openjdk"], TOOLCHAINS["maven"]
    jdk, jdk_exact = _pick(jdk_chain, _Tag((java,), str(java)), set(RELEASES))
    mvn = found.group(1)
    offer, exact = _pick(chain, _Tag(tuple(int(p) for p in mvn.split(".")) if mvn else None, mvn), {jdk.release})
    release = RELEASES[jdk.release]
    note = (f"{ref} -> {release.title}: maven {offer.text} on java {jdk.text} from {' '.join(jdk.packages)}"
            + ("" if jdk_exact else f" (the closest to java {java} a release here has)")
            + ("" if exact or mvn is None else f"; the closest to maven {mvn} here"))
    hooks = (_JAVA_HOOK.format(home="/opt/java/openjdk"),)
    return BaseSpec(f"docker.io/library/maven:{image.tag_or_latest}", release, False, None, note,
                    tuple(dict.fromkeys(chain.full_packages + jdk.packages + offer.packages)), chain.env, hooks,
                    ((chain.tool, chain.probe), ("java", _JAVA_PROBE)))


def _python(ref: str, image: ImageRef) -> BaseSpec:
    tag = image.tag_or_latest
    tokens = tag.split("-")
    version: str | None = None
    flags: list[str] = []
    for token in tokens:
        low = token.lower()
        if low == "latest":
            continue
        if any(low.startswith(u) for u in UNBUILDABLE):
            raise _unsupported(ref, f"{token!r} variants are not built locally")
        if re.fullmatch(r"\d+(\.\d+){0,2}", token) and version is None and not flags:
            version = token
        elif low in ("slim", *RELEASES):
            flags.append(low)
        elif low in OTHER_RELEASES:
            raise _unsupported(ref, f"Debian/Ubuntu {token} is not built here (bookworm, trixie)")
        else:
            raise _unsupported(ref, f"{token!r} variants are not built locally")
    slim = "slim" in flags
    asked_release = next((f for f in flags if f in RELEASES), None)
    wanted: tuple[int, int] | None = None
    if version is not None:
        parts = [int(p) for p in version.split(".")]
        if parts[0] != 3:
            raise OciError(f"base {ref!r}: no Debian release here has Python {version} (supported: {supported_text()})")
        if len(parts) > 1:
            wanted = (3, parts[1])
    if asked_release:
        release = RELEASES[asked_release]
        if wanted and wanted != release.python:
            note = (f"{ref} -> Debian {release.codename} as named; its python3 is "
                    f"{release.python[0]}.{release.python[1]}, not {wanted[0]}.{wanted[1]}")
        else:
            note = f"{ref} -> Debian {release.codename} (python3 {release.python[0]}.{release.python[1]})"
    elif wanted is None:
        release = RELEASES[NEWEST]
        note = f"{ref} -> Debian {release.codename} (python3 {release.python[0]}.{release.python[1]}, the newest here)"
    else:
        def distance(r: Release) -> tuple[int, int]:
            return abs(r.python[1] - wanted[1]), -r.python[1]  # ties go to the newer python3

        release = min(RELEASES.values(), key=distance)
        gap = abs(release.python[1] - wanted[1])
        if gap > MAX_PYTHON_DISTANCE:
            raise OciError(f"base {ref!r}: no Debian release here has a python3 close to {wanted[0]}.{wanted[1]} "
                           f"(supported: {supported_text()})")
        have = f"{release.python[0]}.{release.python[1]}"
        note = (f"{ref} -> Debian {release.codename} (python3 {have})" if gap == 0 else
                f"{ref} -> Debian {release.codename}: its python3 {have} is the closest to {wanted[0]}.{wanted[1]} "
                "a Debian release here has")
    packages = PYTHON_PACKAGES if slim else tuple(dict.fromkeys(PYTHON_PACKAGES + FULL_PACKAGES + ("python3-dev",)))
    return BaseSpec(f"docker.io/library/python:{tag}", release, slim, wanted or release.python, note, packages)


def _debian(ref: str, image: ImageRef) -> BaseSpec:
    tag = image.tag_or_latest
    tokens = tag.split("-")
    codename = DEBIAN_ALIASES.get(tokens[0], tokens[0])
    if re.fullmatch(r"\d+\.\d+", tokens[0]):  # a point release: 12.8
        codename = DEBIAN_ALIASES.get(tokens[0].split(".")[0], tokens[0])
    rest = tokens[1:]
    if re.fullmatch(r"\d{8}", rest[-1] if rest else ""):  # a dated tag: bookworm-20240812
        rest = rest[:-1]
    if codename not in RELEASES or rest not in ([], ["slim"]):
        raise _unsupported(ref, f"debian:{tag} is not built here")
    return BaseSpec(f"docker.io/library/debian:{tag}", RELEASES[codename], rest == ["slim"], None)


UBUNTU_USER_HOOK = ("getent passwd ubuntu >/dev/null || { groupadd -g 1000 ubuntu && "
                    "useradd -m -u 1000 -g 1000 -s /bin/bash -c Ubuntu ubuntu; }")


def _ubuntu(ref: str, image: ImageRef, ubuntu: bool, packages: tuple[str, ...] = ()) -> BaseSpec:
    tag = image.tag_or_latest.lower()
    found = re.fullmatch(r"(\d+\.\d+|[a-z]+)(?:-(\d{8}(?:\.\d+)?))?", tag)
    codename = UBUNTU_ALIASES.get(found.group(1), found.group(1)) if found else None
    if codename not in UBUNTU:
        if found and (codename in OTHER_RELEASES or re.fullmatch(r"\d+\.\d+", found.group(1))):
            raise _unsupported(ref, f"ubuntu:{tag} is not built here (20.04 focal, 22.04 jammy, 24.04 noble)")
        raise _unsupported(ref, f"ubuntu:{tag} is not a tag this builds")
    release = UBUNTU[codename]
    dated = f"; the dated snapshot {found.group(2)} is not reproduced (current {codename} packages)" \
        if found and found.group(2) else ""
    name = f"docker.io/library/ubuntu:{image.tag_or_latest}"
    if ubuntu:
        hooks = (UBUNTU_USER_HOOK,) if release.codename not in ("focal", "jammy") else ()
        return BaseSpec(name, release, True, None, f"{ref} -> Ubuntu {codename} from the Ubuntu archive{dated}",
                        tuple(dict.fromkeys(UBUNTU_PACKAGES + packages)), hooks=hooks)
    debian = RELEASES[release.nearest_debian or NEWEST]
    note = (f"{ref} -> Debian {debian.codename}, the nearest Debian release to Ubuntu {release.number} ({codename}): "
            "no Ubuntu archive is reachable or configured (IDEGYM_UBUNTU_MIRROR)" + dated)
    return BaseSpec(name, debian, True, None, note, packages)


def resolve(ref: str, *, ubuntu: bool = False) -> BaseSpec | None:
    """The base ``ref`` stands for, or None when it is not one built here (``ubuntu``: an Ubuntu
    archive is usable). Raises ``OciError`` for a tag of these families that cannot be built here."""
    try:
        image = parse(ref)
    except RefError as exc:
        raise OciError(str(exc)) from None
    derived = DERIVED.get(f"{image.registry}/{image.path}")
    if derived is not None:
        official, extra = derived
        spec = resolve(official, ubuntu=ubuntu)
        assert spec is not None
        note = (f"{ref} -> {official} + {' '.join(extra)} (its published recipe); "
                + (spec.note or spec.release.title))
        return BaseSpec(image.name, spec.release, spec.slim, spec.python, note,
                        tuple(dict.fromkeys(spec.packages + extra)), spec.env, spec.hooks, spec.probes, spec.suites)
    family = image.official
    if family is None:
        return None
    if family == "debian":
        return _debian(ref, image)
    if family == "python":
        return _python(ref, image)
    if family == "ubuntu":
        return _ubuntu(ref, image, ubuntu)
    chain = TOOLCHAINS.get(family)
    return _toolchain(ref, image, chain, ubuntu) if chain else None


__all__ = ["BaseSpec", "Release", "RELEASES", "UBUNTU", "TOOLCHAINS", "resolve", "supported_text", "python_range",
           "TOOL_PATH", "SLIM_EXCLUDES", "SLIM_INCLUDES"]
