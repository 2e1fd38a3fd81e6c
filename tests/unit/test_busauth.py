"""The bus's permission table and the manifests that carry it (shared/busauth.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from shared import busauth
from shared import events as ev
from shared.config import MAX_SHARDS
from tools.cli import SERVICES
from tools.deploy import nats_conf

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy/kustomize"


def test_every_event_has_exactly_one_publisher() -> None:
    owners: dict[type[ev.Event], list[str]] = {t: [] for t in ev.EVENT_TYPES}
    for user, role in busauth.ROLES.items():
        for event_type in role.publishes:
            owners[event_type].append(user)
    shared = {t.__name__: users for t, users in owners.items() if len(users) != 1}
    # The one exception: an allocator shard passes on a gang it cannot place.
    assert shared == {"GangReady": ["gang-coordinator", "device-allocator"]}
    assert owners[ev.AllocationDecided] == ["device-allocator"]
    assert owners[ev.AllocationBound] == ["binder"]


def test_every_service_has_a_role() -> None:
    assert set(busauth.ROLES) == set(SERVICES)


def test_the_reader_may_only_ask_for_views_and_read_allocations() -> None:
    perms = busauth.permissions(busauth.READER, stream="S", inventory_bucket="I")
    conf = perms.as_conf()
    assert conf["publish"] == {"allow": ["tessera.ctl.view.>"]}
    # Its own inbox prefix: ``_INBOX.>`` would show it every event the services fetch.
    assert conf["subscribe"] == {"allow": ["tessera.v1.allocation.>", "_INBOX_reader.>"]}


def test_node_agents_never_reach_the_services_consumers() -> None:
    perms = busauth.permissions(busauth.NODE_AGENT, stream="S", inventory_bucket="I")
    for service in set(busauth.ROLES) - {busauth.NODE_AGENT}:
        assert f"$JS.API.CONSUMER.MSG.NEXT.S.{service}" in perms.deny_publish
        assert f"$JS.ACK.S.{service}.>" in perms.deny_publish


def test_allocator_shards_have_their_own_consumers_and_leases_out_of_others_reach() -> None:
    allocator = busauth.permissions("device-allocator", stream="S", inventory_bucket="I")
    agent = busauth.permissions(busauth.NODE_AGENT, stream="S", inventory_bucket="I")
    binder = busauth.permissions("binder", stream="S", inventory_bucket="I")
    for i in range(MAX_SHARDS):
        durable = busauth.shard_consumer("device-allocator", i)
        assert f"$JS.API.CONSUMER.MSG.NEXT.S.{durable}" in allocator.publish
        assert f"$JS.API.CONSUMER.MSG.NEXT.S.{durable}" in agent.deny_publish
        assert f"$JS.API.CONSUMER.MSG.NEXT.S.{durable}" not in binder.publish
    assert f"$KV.{busauth.LEASE_BUCKET}.device-allocator.*" in allocator.publish
    assert not any(".binder.*" in s or s.endswith("binder.*") for s in binder.publish)
    assert "tessera.v1.gang.ready.>" in allocator.publish
    assert "tessera.v1.gang.span" in allocator.publish


def test_passwords_survive_nats_servers_parsing_of_environment_values() -> None:
    for _ in range(100):
        password = busauth.new_password()
        assert password[0].isalpha()
        assert password.isalnum()
        assert len(password) >= 40


def test_the_manifests_nats_conf_is_generated_from_the_table() -> None:
    assert (DEPLOY / "base/nats.conf").read_text() == nats_conf(), (
        "stale: run `tessera nats-conf --out deploy/kustomize/base/nats.conf`"
    )


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_nats_gets_every_users_password_from_the_secret() -> None:
    [sts] = [d for d in _docs(DEPLOY / "base/nats.yaml") if d["kind"] == "StatefulSet"]
    env = sts["spec"]["template"]["spec"]["containers"][0]["env"]
    secrets = {e["name"]: e["valueFrom"].get("secretKeyRef") for e in env}
    assert {name: ref["key"] for name, ref in secrets.items() if ref} == {
        busauth.password_env(u): u for u in busauth.USERS
    }
    assert sts["spec"]["replicas"] == 3
    config = yaml.safe_load((DEPLOY / "base/tessera.yaml").read_text())["nats"]
    assert config["replicas"] == 3  # every stream and bucket on all three servers


def test_every_workload_mounts_only_its_own_users_password() -> None:
    workloads = [
        d
        for path in (
            DEPLOY / "base/services.yaml",
            DEPLOY / "base/node-agent.yaml",
            DEPLOY / "overlays/dev/simulated-nodes.yaml",
        )
        for d in _docs(path)
        if d["kind"] in ("Deployment", "DaemonSet")
    ]
    seen = set()
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        service = pod["containers"][0]["args"][0]
        [bus] = [v for v in pod["volumes"] if v["name"] == "bus"]
        items = {s["secret"]["name"]: s["secret"]["items"] for s in bus["projected"]["sources"]}
        assert items["tessera-bus"] == [{"key": service, "path": "password"}]
        assert items["tessera-nats-tls"] == [{"key": "ca.crt", "path": "ca.crt"}]
        mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert mounts["bus"] == "/etc/tessera-bus"
        seen.add(service)
    assert seen == set(SERVICES)
    config = yaml.safe_load((DEPLOY / "base/tessera.yaml").read_text())["nats"]
    assert config["url"].startswith("tls://")
    assert config["passwordFile"] == "/etc/tessera-bus/password"
    assert config["caFile"] == "/etc/tessera-bus/ca.crt"
