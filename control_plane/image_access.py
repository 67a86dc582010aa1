"""Which image a tenant's tag names, and where a tenant's builds go.

Images are one store. A tag nobody built as a tenant is *shared*: the built-in image, images
built on a control plane without tenants, images the operator keeps warm. What a tenant builds
is stored under a tag of its own, ``<tag>--tenant-<name>`` (``stored_tag``), and recorded, so
that the tenant's own tag then names it for that tenant alone: two tenants building ``calc:1``
get two images, neither replaces the other's or a shared one, and neither can start the
other's (a tag only another tenant built does not exist for a tenant; a tag naming another
tenant's stored image is refused the same way). A tenant's build of a shared tag that exists
(without ``rebuild``) takes the shared image, as without tenants.

Without a tenants file (``tenants.SINGLE``) tags are used as they are.
"""

from __future__ import annotations

from .backends.base import ImageBuilder
from .errors import NotFound
from .images import BUILTIN_IMAGE
from .store import SQLiteStore
from .tenants import SINGLE

MARK = "--tenant-"


def stored_tag(tenant: str, tag: str) -> str:
    """Where ``tenant``'s build of ``tag`` is stored: ``repo:version--tenant-<name>``."""
    head, slash, last = tag.rpartition("/")
    name, colon, version = last.partition(":")
    return f"{head}{slash}{name}:{version if colon else 'latest'}{MARK}{tenant}"


def is_stored(tag: str) -> bool:
    """Whether ``tag`` has the form of a tenant's stored tag (never a shared image)."""
    return MARK in tag


class ImageAccess:
    def __init__(self, store: SQLiteStore, builder: ImageBuilder | None = None) -> None:
        self.store = store
        self.builder = builder

    def resolve(self, tenant: str, tag: str) -> str | None:
        """The image ``tag`` names for ``tenant``: its own build, else the shared one; None when
        the tag can only be another tenant's."""
        if tenant == SINGLE:
            return tag
        if self.store.has_tenant_image(tenant, tag):
            return stored_tag(tenant, tag)
        return None if is_stored(tag) else tag

    def shown(self, tenant: str, stored: str) -> bool:
        """Whether an image in the store may be named to ``tenant`` (metrics, listings)."""
        return tenant == SINGLE or not is_stored(stored) or stored.endswith(f"{MARK}{tenant}")

    async def startable(self, tenant: str, tag: str) -> str:
        """The image a start of ``tag`` by ``tenant`` uses. For a tenant, an image it cannot see
        and one that does not exist are the same 404."""
        stored = self.resolve(tenant, tag)
        if tenant == SINGLE:
            assert stored is not None
            return stored
        if stored is None or (self.builder is not None and not await self.builder.exists(stored)):
            raise NotFound(f"image {tag!r} not found: build it (POST /api/build-push-images) or use a shared "
                           f"image such as {BUILTIN_IMAGE!r}")
        return stored

    async def build_target(self, tenant: str, tag: str, rebuild: bool) -> tuple[str, bool]:
        """Where ``tenant``'s build of ``tag`` goes, and whether an image is already there (a
        shared one is taken as it is unless ``rebuild``)."""
        assert self.builder is not None
        if tenant != SINGLE and not self.store.has_tenant_image(tenant, tag):
            if not is_stored(tag) and not rebuild and await self.builder.exists(tag):
                return tag, True  # a shared image: the same as without tenants
            self.store.add_tenant_image(tenant, tag)
        target = self.resolve(tenant, tag)
        assert target is not None
        return target, not rebuild and await self.builder.exists(target)
