# The base of sandbox images for a cluster: what a sandbox pod needs (docs/kubernetes.md,
# "Sandbox images"). A task image starts `FROM` it and adds its toolchain and its project.
# Build with the repository's root as context:
#   buildah bud -f deploy/sandbox-base.Dockerfile -t registry.example.com/idegym/sandbox-base:0.1.0 .
# Offline: --build-arg PIP_INSTALL_OPTIONS="--no-index --find-links /context/wheels"
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
ARG PIP_INSTALL_OPTIONS=""

# The sandbox server in a virtualenv of its own (aiohttp, pydantic, diff-match-patch): the task's
# Python and its packages stay the task's. Its code is the repository's sandbox_server package.
RUN --mount=type=bind,target=/context \
    mkdir -p /usr/local/lib/idegym/src \
    && cp -r /context/sandbox_server /usr/local/lib/idegym/src/ \
    && python3 -m venv /usr/local/lib/idegym/venv \
    && /usr/local/lib/idegym/venv/bin/pip install ${PIP_INSTALL_OPTIONS} "aiohttp>=3.9,<4" "pydantic>=2.6,<3" \
           "diff-match-patch==20241021" \
    && echo /usr/local/lib/idegym/src > "$(/usr/local/lib/idegym/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/idegym.pth" \
    && /usr/local/lib/idegym/venv/bin/python -m compileall -q /usr/local/lib/idegym/src

# appuser (uid 1000) owns the project at /home/appuser/work; the pod runs the server as uid 1000
# (root only for run_as_root servers).
RUN (getent passwd 1000 >/dev/null || useradd --uid 1000 --user-group --create-home --shell /bin/bash appuser) \
    && mkdir -p /home/appuser/work && chown -R 1000:1000 /home/appuser

ENV IDEGYM_PROJECT_PATH=/home/appuser/work IDEGYM_SERVER_HOST=0.0.0.0 IDEGYM_SERVER_PORT=8000
WORKDIR /home/appuser/work
USER 1000
EXPOSE 8000
CMD ["/usr/local/lib/idegym/venv/bin/python", "-m", "sandbox_server", "serve"]
