"""The local backend: sandboxes as bubblewrap-isolated processes on this host.

See ``backend.py`` for how a sandbox is put together, ``images.py`` for the image store,
``builder.py`` for image builds and what of the build YAML applies locally.
"""

from ...images import BUILTIN_IMAGE
from ...images import parse_build_yaml as parse_images_yaml
from .backend import LocalBackend
from .builder import LocalImageBuilder, local_notes
from .images import ImageStore

__all__ = ["BUILTIN_IMAGE", "ImageStore", "LocalBackend", "LocalImageBuilder", "local_notes", "parse_images_yaml"]
