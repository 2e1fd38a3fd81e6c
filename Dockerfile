# One image for all Tessera services: `tessera <service>` picks which (tools/cli.py).
# `make images` builds it as tessera:dev; docs/deploy.md says what it expects of a cluster.
# The node agent has its own image, with the same `python` stage:
# deploy/images/node-agent.Dockerfile (tests/unit/test_dockerfiles.py keeps them identical).

# ---- python: the tessera wheel and exactly the runtime dependencies pyproject.toml names,
# in a virtual environment without pip (no build tools reach the runtime stage).
FROM python:3.11.14-slim-bookworm AS python
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
COPY tools ./tools
RUN pip wheel --no-deps --wheel-dir /wheels . \
    && python -m venv --without-pip /opt/tessera/venv \
    && pip --python /opt/tessera/venv/bin/python install /wheels/tessera-*.whl

# ---- runtime: non-root, and nothing written outside /tmp, so it runs with a read-only root
# filesystem (the manifests mount an emptyDir at /tmp; the webhook keeps its certificates there).
FROM python:3.11.14-slim-bookworm AS runtime
ENV PATH=/opt/tessera/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
RUN python -m pip uninstall --yes --no-cache-dir pip setuptools wheel \
    && groupadd --system --gid 10001 tessera \
    && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
        --shell /usr/sbin/nologin tessera
COPY --from=python /opt/tessera/venv /opt/tessera/venv
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT ["/opt/tessera/venv/bin/tessera"]

# ---- dev: what `tilt up` runs (Tiltfile): the sources also under /opt/tessera/src, owned by
# the service's user and first on PYTHONPATH, so files Tilt syncs there are the code that
# runs when it restarts the process. Never the default: the last stage below is.
FROM runtime AS dev
COPY --chown=10001:10001 shared /opt/tessera/src/shared
COPY --chown=10001:10001 services /opt/tessera/src/services
COPY --chown=10001:10001 tools /opt/tessera/src/tools
ENV PYTHONPATH=/opt/tessera/src

# ---- the image `make images` builds and the manifests run.
FROM runtime
