# Every target installs what it needs: a fresh machine with Python 3.11+ and Go 1.26+
# runs `make demo` or `make test` and nothing else.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: all install controlplane realnode browser lint typecheck test test-fast demo down schema proto bench chaos clean images

all: test

$(STAMP): pyproject.toml
	@command -v openssl >/dev/null || (apt-get update -qq && apt-get install -y -qq openssl)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

# etcd, kube-apiserver, kube-scheduler and kubectl at the release pinned in tools/go.mod,
# built once into .cache/ (several minutes the first time, instant afterwards).
controlplane: install
	$(BIN)/tessera dev build

# What a real node needs besides the binaries `tessera dev build` makes (kubelet,
# kube-controller-manager, containerd): Debian's runc, a static busybox for the pods'
# image, the CNI plugins and iproute2 (tools/realnode.py). Root only; elsewhere the
# real-node tests skip, unless CI is set.
realnode:
	@command -v runc >/dev/null && command -v busybox >/dev/null && test -x /usr/lib/cni/loopback \
		&& command -v ip >/dev/null \
		|| (apt-get update -qq && apt-get install -y -qq runc busybox-static containernetworking-plugins iproute2) \
		|| echo "cannot install runc/busybox-static/containernetworking-plugins: real-node tests will skip"

# Debian's chromium for the dashboard's browser test (tests/integration/test_dashboard.py);
# where it cannot be installed (no root) that test skips, unless CI is set.
browser:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium) \
		|| echo "chromium not installed: the dashboard's browser test will skip"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

# The whole suite: lint, types, import contracts, unit, service (real NATS) and
# integration (real kube-apiserver) tests.
test: realnode controlplane browser lint typecheck
	$(BIN)/python -m pytest

# Unit tests of the pure core only: no servers.
test-fast: install
	$(BIN)/python -m pytest tests/unit

demo: controlplane
	$(BIN)/tessera demo

down: install
	$(BIN)/tessera dev down

# Benchmarks; figures go to bench/RESULTS.md with the command that printed them.
bench: controlplane
	$(BIN)/python bench/core.py
	$(BIN)/python bench/bus.py
	$(BIN)/python bench/apiclient.py
	$(BIN)/python bench/packing.py
	$(BIN)/python bench/e2e.py
	$(BIN)/python bench/gangs.py

# Chaos (not part of `make test`): a burst of 2,000 mixed pods while every service's active
# replica is SIGKILLed twice, NATS and the API server restart and one NATS server is lost;
# then an audit from the API server (bench/chaos.py says what; about 7 min on 2 cores).
chaos: controlplane
	$(BIN)/python bench/chaos.py

schema: install
	$(BIN)/tessera schema

# The kubelet's device-plugin, DRA and plugin-registration messages, from our .proto files
# (the generated files are committed).
proto: install
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. \
		services/node_agent/deviceplugin/api.proto \
		services/node_agent/dra/api.proto services/node_agent/dra/registration.proto

# The two images (docs/deploy.md): tessera:dev (the services, Dockerfile) and
# tessera-node-agent:dev (deploy/images/node-agent.Dockerfile), with the first of docker,
# podman, nerdctl and buildah that is installed and answers `info`, or the one named:
# `make images ENGINE=podman`.
ENGINE ?=

images:
	@engine="$(ENGINE)"; \
	if [ -z "$$engine" ]; then \
		for e in docker podman nerdctl buildah; do \
			if command -v $$e >/dev/null 2>&1 && $$e info >/dev/null 2>&1; then \
				engine=$$e; break; \
			fi; \
		done; \
	fi; \
	if [ -z "$$engine" ]; then \
		echo "make images: no working container engine: docker, podman, nerdctl and buildah" \
			"are missing or cannot reach their daemon; install one or set ENGINE=" >&2; \
		exit 1; \
	fi; \
	case "$$(basename "$$engine")" in buildah) build="$$engine bud" ;; *) build="$$engine build" ;; esac; \
	set -x; \
	$$build -f Dockerfile -t tessera:dev . && \
	$$build -f deploy/images/node-agent.Dockerfile -t tessera-node-agent:dev .

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
