"""Real OCI images for the local backend, built with buildah and mmdebstrap.

* ``settings``: where the shared cache lives, the registry mirror, the Debian mirror.
* ``bases``: ``debian:<release>[-slim]`` and ``python:3.X[-slim]`` built once with mmdebstrap
  into a shared, content-addressed buildah store (the cache), which every state directory's own
  store reads as an *additional image store*: nothing is copied per state directory.
* (``control_plane.dockerfile``: the bases a Dockerfile names, read without buildah.)
* ``buildah``: one place that runs buildah (our storage and registries configuration, a private
  mount namespace, no network unless allowed) and reads its image store.
* ``build``: a Dockerfile (or a YAML definition on an OCI base, rendered as one) built into the
  local image store.
* ``build_cache``: the host's build cache: a build's result published under a key of its inputs,
  taken (not built again) by every control plane of the host, its layers read from the cache's
  store as the bases' are.
* ``rootfs``: what a sandbox of an OCI image runs on: the image's layer directories as shared
  read-only lowers, plus a small layer of ours (``appuser``, mount points, hostname...).
* ``hostrt``: the sandbox server's interpreter and the host libraries it needs, so it runs on
  any image (nothing of ours is installed in it).
"""
