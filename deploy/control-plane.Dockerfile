# The control plane for a cluster (docs/kubernetes.md). Build with the repository's root as context:
#   buildah bud -f deploy/control-plane.Dockerfile -t registry.example.com/idegym/control-plane:0.1.0 .
# (or `docker build`, or the build YAML: `dockerfile: deploy/control-plane.Dockerfile`, `context: .`).
# Packages come from PyPI; offline, from a wheelhouse in the context:
#   --build-arg PIP_INSTALL_OPTIONS="--no-index --find-links /context/wheels"
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
ARG PIP_INSTALL_OPTIONS=""

# Its own virtualenv (the control plane's packages never mix with the system's); the sources are
# read from the context for the install only.
RUN --mount=type=bind,target=/context \
    mkdir /tmp/src \
    && cp -r /context/pyproject.toml /context/README.md /context/sandbox_server /context/control_plane \
             /context/idegym_env /tmp/src/ \
    && python3 -m venv /usr/local/idegym \
    && /usr/local/idegym/bin/pip install ${PIP_INSTALL_OPTIONS} "/tmp/src[kubernetes]" \
    && rm -rf /tmp/src \
    && useradd --uid 10001 --user-group --no-create-home --home-dir /var/lib/idegym idegym \
    && mkdir -p /var/lib/idegym && chown idegym:idegym /var/lib/idegym

# Not root: the state (SQLite) lives on the volume at /var/lib/idegym (fsGroup 10001 in the manifest).
USER 10001
ENV PATH=/usr/local/idegym/bin:$PATH
WORKDIR /var/lib/idegym
EXPOSE 8000
ENTRYPOINT ["idegym"]
CMD ["control-plane", "serve", "--backend", "kubernetes", "--host", "0.0.0.0", "--port", "8000", \
     "--state-dir", "/var/lib/idegym"]
