# The node agent's image: the Tessera node agent plus the isolation library the agent hands to
# containers (nodeAgent.isolation in shared/config.py), and the script its DaemonSet's init
# container runs to put that library on the host (deploy/kustomize/base/node-agent.yaml).
# Build from the repository root: `make images` (tessera-node-agent:dev), or
#   docker build -f deploy/images/node-agent.Dockerfile -t tessera-node-agent:dev .
# docs/deploy.md explains the pinned commit and the choices below.

# ---- isolation: HAMi-core's libvgpu.so, built by HAMi-core's own build.sh at a pinned commit.
# An Ubuntu 20.04 base on purpose: the library is preloaded into users' containers, and a
# library linked against a newer glibc than theirs is skipped by the loader with only a warning,
# so the container would run without limits. Built here it needs glibc 2.31 at most (checked).
FROM nvidia/cuda:12.9.1-devel-ubuntu20.04 AS isolation
ARG HAMI_CORE_REPOSITORY=https://github.com/Project-HAMi/HAMi-core.git
ARG HAMI_CORE_COMMIT=8f3a89c67b037d8fdfe6c4cd4d8c4f0cd6504811
ARG DEBIAN_FRONTEND=noninteractive
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates cmake git make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
RUN git clone --quiet "$HAMI_CORE_REPOSITORY" hami-core \
    && git -C hami-core checkout --quiet --detach "$HAMI_CORE_COMMIT" \
    && test "$(git -C hami-core rev-parse HEAD)" = "$HAMI_CORE_COMMIT"
# The driver libraries (libcuda, libnvidia-ml) are linked against the toolkit's stubs; the
# node's real ones are used at run time. The policy minimum lets a CMake newer than 4.0 accept
# HAMi-core's old cmake_minimum_required (this base's CMake ignores it).
ENV LIBRARY_PATH=/usr/local/cuda/lib64/stubs
# build.sh's own options: a Debug build with the dlsym, NVML and multi-process hooks on.
# Do NOT switch to -DCMAKE_BUILD_TYPE=Release: HAMi-core then compiles with
# -fvisibility=hidden, the hooked CUDA and NVML entry points are no longer exported, and a
# preloaded library enforces nothing. The nm check below fails the build if that happens.
RUN CMAKE_OPTIONS="-DCMAKE_POLICY_VERSION_MINIMUM=3.5" sh hami-core/build.sh \
    && nm -D --defined-only hami-core/build/libvgpu.so >/tmp/exported \
    && grep -qw cuMemAlloc_v2 /tmp/exported \
    && grep -qw nvmlDeviceGetMemoryInfo /tmp/exported \
    && newest="$(objdump -T hami-core/build/libvgpu.so | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1)" \
    && echo "libvgpu.so needs ${newest}" \
    && test "$(printf '%s\nGLIBC_2.31\n' "$newest" | sort -V | tail -n 1)" = GLIBC_2.31 \
    && mkdir -p /out \
    && cp hami-core/build/libvgpu.so /out/libvgpu.so

# ---- python: identical to the stage of the same name in the repository root's Dockerfile.
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

# ---- runtime: the node agent. It runs as root (no USER here, and runAsUser: 0 in the
# DaemonSet): it serves and registers sockets in the kubelet's device-plugin directory
# (/var/lib/kubelet/device-plugins, root-owned) and writes the isolation files on the host.
# Nothing is written outside its mounts and /tmp, so a read-only root filesystem works.
FROM python:3.11.14-slim-bookworm
ENV PATH=/opt/tessera/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN python -m pip uninstall --yes --no-cache-dir pip setuptools wheel
COPY --from=python /opt/tessera/venv /opt/tessera/venv
COPY --from=isolation /out/libvgpu.so /opt/tessera/isolation/libvgpu.so
COPY deploy/images/install-isolation.sh /opt/tessera/isolation/install-isolation.sh
ENTRYPOINT ["/opt/tessera/venv/bin/tessera"]
CMD ["node-agent"]
