"""What an image tag may look like (the OCI rule of ``specs/control-plane-api.yaml``), checked in one place."""

from __future__ import annotations

import re

IMAGE_TAG = re.compile(r"^[a-z0-9._/:@-]+$")
MAX_TAG_LENGTH = 383


def check_image_tag(tag: str) -> str:
    """``tag`` itself when valid; else ``ValueError`` saying the rule."""
    if not tag or len(tag) > MAX_TAG_LENGTH or not IMAGE_TAG.match(tag):
        raise ValueError(f"invalid image tag {tag!r}: tags must match {IMAGE_TAG.pattern} (lowercase, "
                         f"at most {MAX_TAG_LENGTH} characters)")
    return tag
