"""The local backend: sandboxes as bubblewrap-isolated processes on this host.

See ``backend.py`` for how a sandbox is put together, ``images.py`` for the image store and
the build YAML, ``builder.py`` for image builds.
"""

from .backend import LocalBackend
from .builder import LocalImageBuilder
from .images import BUILTIN_IMAGE, ImageStore, local_notes, parse_images_yaml

__all__ = ["BUILTIN_IMAGE", "ImageStore", "LocalBackend", "LocalImageBuilder", "local_notes", "parse_images_yaml"]
