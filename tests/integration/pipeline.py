"""All five services as separate processes on the real API server and NATS, for tests."""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import signal
import socket
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import nats
import nats.js.errors
import yaml
from kubernetes_asyncio.client import ApiException

from shared import busauth, kube
from shared.bus import connect
from shared.config import KubernetesConfig, NatsConfig
from tests.helpers import eventually
from tools import realnode
from tools.cli import SERVICES, _ping
from tools.localcluster import free_port, service_kubeconfig, service_settings

REPO = Path(__file__).resolve().parents[2]
HEARTBEAT_S = 2.0
OTHERS_POD = re.compile(r"\bpod ([a-z0-9-]+)/")
"""A log line about a pod, and its namespace."""
LOUD = re.compile(r"^\S+ \S+ \S+ (WARNING|ERROR|CRITICAL) |^Traceback ")
"""A service's log line above INFO (shared/telemetry.py's format), or a traceback."""


async def reset_stream(nats_admin: NatsConfig) -> None:
    """Start from an empty stream, KV buckets and consumers."""
    nc = await connect(nats_admin, "admin")
    js = nc.jetstream()
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await js.delete_stream("TESSERA")
    for bucket in ("tessera-inventory", "tessera-reservations", "tessera-leases"):
        with contextlib.suppress(nats.js.errors.NotFoundError, nats.js.errors.BucketNotFoundError):
            await js.delete_key_value(bucket)
    await nc.close()


@dataclass
class Pipeline:
    workdir: Path
    config: Path
    simulator: Path
    """The simulated nodes' config: their own ServiceAccount (it creates Nodes)."""
    inventory: Path
    nats_admin: NatsConfig
    api: kube.Client
    procs: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    keepers: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    restarts: list[str] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    """Each process's HTTP port (``--http-port``), kept across its restarts."""
    namespaces: list[str] = field(default_factory=list)
    """Made by ``namespace()``: a fixture may clear what its tests left there."""

    async def start(self, service: str) -> None:
        """Start a service and keep it running: like the kubelet, restart it if it exits
        unasked (a lost lease, a crash), and note it in ``restarts``."""
        await self._spawn(service)
        self.keepers[service] = asyncio.create_task(self._keep(service), name=f"keep:{service}")

    async def _spawn(self, service: str) -> None:
        """``service``: a name, ``name#2`` (a second replica), ``node-agent@node``, or
        ``device-allocator:SHARD``."""
        named, _, shard = service.partition("#")[0].partition(":")
        module, _, node = named.partition("@")
        port = self.ports.get(service)
        if port is None or not _bindable(port):  # another process took it meanwhile
            port = free_port()
        self.ports[service] = port
        config = self.simulator if service == "node-agent" else self.config
        args = [sys.executable, "-m", SERVICES[module], "--config", str(config)]
        args.append(f"--http-port={self.ports[service]}")  # /healthz, /readyz, /metrics
        if service == "node-agent":  # as the dev overlay runs it, with its own account
            args += ["--simulate", str(self.inventory)]
        elif node:  # "node-agent@gpu-0": a real node's agent, its devices from gpu-0.yaml
            args += ["--node", node, "--source", f"file:{self.workdir / node}.yaml"]
        if shard:
            args += ["--shard", shard]
        log = (self.workdir / f"{service}.log").open("ab")
        self.procs[service] = await asyncio.create_subprocess_exec(
            *args, stdout=log, stderr=asyncio.subprocess.STDOUT
        )

    async def _keep(self, service: str) -> None:
        while True:
            code = await self.procs[service].wait()
            self.restarts.append(f"{service} exited with {code}")
            await asyncio.sleep(0.5)
            await self._spawn(service)

    def kill(self, service: str) -> None:
        """SIGKILL a service (no clean-up at all); its keeper starts it again."""
        with contextlib.suppress(ProcessLookupError):
            self.procs[service].send_signal(signal.SIGKILL)

    async def stop(self, service: str, sig: int = signal.SIGTERM) -> None:
        keeper = self.keepers.pop(service)
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        proc = self.procs.pop(service)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        async with asyncio.timeout(30):
            await proc.wait()

    async def holder(self, service: str) -> str:
        """The identity (``host-pid``) holding ``service``'s lease."""
        nc = await connect(self.nats_admin, "admin")
        try:
            kv = await nc.jetstream().key_value(busauth.LEASE_BUCKET)
            return ((await kv.get(service)).value or b"").decode()
        finally:
            await nc.close()

    async def active(self, service: str) -> str:
        """Which replica holds ``service``'s lease (``name`` or ``name#2``...)."""
        pid = int((await self.holder(service)).rsplit("-", 1)[-1])
        return next(name for name, proc in self.procs.items() if proc.pid == pid)

    async def alive(self) -> set[str]:
        return {str(h["service"]) for h in await _ping(self.nats_admin, 0.3)}

    def log(self, service: str) -> str:
        return (self.workdir / f"{service}.log").read_text(errors="replace")

    def loud(self) -> list[str]:
        """Every line above INFO that any service has logged so far (WARNING, ERROR,
        CRITICAL, an uncaught traceback), prefixed with its log file's name: none on a
        healthy run (shared/telemetry.py writes ``time service LEVEL logger: message``)."""
        return [
            f"{path.name}: {line}"
            for path in sorted(self.workdir.glob("*.log"))
            for line in path.read_text(errors="replace").splitlines()
            if LOUD.search(line) and not self._others(line)
        ]

    def _others(self, line: str) -> bool:
        """The line is about a pod another test left in the session's API server (an
        earlier pipeline signed its grants with a key of its own, so this one's
        allocator rightly warns that it reserves nothing for them)."""
        found = OTHERS_POD.search(line)
        return found is not None and found[1] not in self.namespaces

    async def namespace(self) -> str:
        name = f"t-{uuid.uuid4().hex[:8]}"
        self.namespaces.append(name)
        await kube.request(
            self.api,
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
        return name

    async def create(self, ns: str, pod: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await kube.request(
            self.api, "POST", f"/api/v1/namespaces/{ns}/pods", pod
        )
        return result

    async def metrics(self, service: str) -> str:
        """``service``'s ``/metrics`` text."""
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{self.ports[service]}/metrics") as answer,
        ):
            assert answer.status == 200, await answer.text()
            return await answer.text()

    async def get(self, ns: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await kube.request(
            self.api, "GET", f"/api/v1/namespaces/{ns}/pods/{name}"
        )
        return result

    async def delete(self, ns: str, name: str) -> None:
        """Delete at once: no kubelet would ever confirm a graceful deletion."""
        await kube.delete_pod(self.api, ns, name, grace_s=0)

    async def bound(self, ns: str, name: str, timeout_s: float = 30) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            try:
                pod = await self.get(ns, name)
            except ApiException as exc:
                if exc.status == 404:
                    return None  # not created yet (a controller makes it)
                raise
            return pod if pod["spec"].get("nodeName") else None

        return await eventually(probe, timeout_s=timeout_s, what=f"{ns}/{name} bound")

    async def node_of(self, ns: str, name: str) -> str:
        """The node the pod is bound to (waiting until it is)."""
        return str((await self.bound(ns, name))["spec"]["nodeName"])

    async def refused(self, ns: str, name: str) -> str:
        """The FailedScheduling message of a pod that must stay pending."""

        async def told() -> str | None:
            for e in await self.events(ns, name):
                if e["reason"] == "FailedScheduling":
                    return str(e["message"])
            return None

        message = await eventually(told, what=f"FailedScheduling on {name}")
        assert not (await self.get(ns, name))["spec"].get("nodeName")
        return message

    async def events(self, ns: str, name: str) -> list[dict[str, Any]]:
        found = await kube.request(
            self.api,
            "GET",
            f"/api/v1/namespaces/{ns}/events",
            query={"fieldSelector": f"involvedObject.name={name}"},
        )
        items: list[dict[str, Any]] = found["items"]
        return items

    async def close(self) -> None:
        for service in list(self.procs):
            await self.stop(service)
        await self.api.close()


async def register_node(
    api: kube.Client,
    name: str,
    *,
    labels: dict[str, str] | None = None,
    allocatable: dict[str, str] | None = None,
) -> None:
    """A Node as a kubelet registers it and the node lifecycle controller leaves it once
    Ready: allocatable cpu, memory and pods, and no ``not-ready`` taint."""
    await kube.request(
        api,
        "POST",
        "/api/v1/nodes",
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}}},
    )
    await kube.request(
        api,
        "PATCH",
        f"/api/v1/nodes/{name}",
        {"spec": {"taints": []}},
        content_type="application/merge-patch+json",
    )
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110", **(allocatable or {})}
    await kube.request(
        api,
        "PATCH",
        f"/api/v1/nodes/{name}/status",
        {"status": {"capacity": resources, "allocatable": resources}},
        content_type="application/strategic-merge-patch+json",
    )


async def podgroup(
    p: Pipeline,
    ns: str,
    name: str,
    min_member: int,
    queue: str = "default",
    min_task_member: dict[str, int] | None = None,
    min_resources: dict[str, Any] | None = None,
    **fields: Any,
) -> None:
    """A Volcano PodGroup; ``fields`` go into its spec as written (``subGroupPolicy``,
    ``networkTopology``...)."""
    spec: dict[str, Any] = {"minMember": min_member, "queue": queue, **fields}
    if min_task_member:
        spec["minTaskMember"] = min_task_member
    if min_resources:
        spec["minResources"] = min_resources
    await kube.request(
        p.api,
        "POST",
        f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{ns}/podgroups",
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": name},
            "spec": spec,
        },
    )


async def told(p: Pipeline, ns: str, name: str, text: str) -> str:
    """The FailedScheduling message naming ``text`` (waiting for it), checked against
    the pod's ``PodScheduled`` condition; the pod is not bound."""

    async def event() -> str | None:
        for e in await p.events(ns, name):
            if e["reason"] == "FailedScheduling" and text in e["message"]:
                return str(e["message"])
        return None

    message = await eventually(event, what=f"FailedScheduling on {name} saying {text!r}")
    obj = await p.get(ns, name)
    assert not obj["spec"].get("nodeName")
    [cond] = [c for c in obj["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
    assert text in cond["message"]
    return message


def pod(
    name: str,
    limits: dict[str, Any],
    *,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    scheduler: str = "tessera",
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}, "labels": labels or {}},
        "spec": {
            "schedulerName": scheduler,
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
        },
    }


def _bindable(port: int) -> bool:
    """No process listens on ``port`` now, on any address, as a service binds it (a port
    found free can be taken before the service binds it: once a watcher never started,
    "address already in use", and its keeper restarted it on the same port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


async def start_pipeline(
    workdir: Path,
    kubeconfig: Path,
    nats_admin: NatsConfig,
    inventory: dict[str, Any],
    settings: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    replicas: int = 1,
) -> Pipeline:
    """``settings`` go under ``scheduler:``, ``config`` at the top of tessera.yaml;
    ``replicas`` of each central service (``name``, ``name#2``...: one active, the
    others standby). With ``shards`` in ``settings``, one allocator per shard
    (``device-allocator:NAME``)."""
    await reset_stream(nats_admin)
    key = workdir / "grant.key"  # as a Secret would hold it: grants are signed in tests too
    key.write_text(secrets.token_hex(32))
    path = workdir / "tessera.yaml"
    # Each service with its own ServiceAccount's token (tools/localcluster.py), never the
    # admin's: a verb missing from deploy/kustomize fails the test that needs it.
    accounts = service_kubeconfig(kubeconfig)
    document = {
        "security": {"grantKeyFile": str(key)},
        "scheduler": {
            "names": ["tessera", "volcano"],
            "leaderLeaseS": 3.0,
            "heartbeatS": HEARTBEAT_S,
            "resyncS": 5.0,
            "evictionGraceS": 0,  # no kubelet here would confirm a graceful deletion
            **(settings or {}),
        },
        "nats": service_settings(nats_admin),
        "kubernetes": {"kubeconfig": accounts},
        "telemetry": {"logLevel": "DEBUG"},
        **(config or {}),
    }
    path.write_text(yaml.safe_dump(document))
    simulator = workdir / "tessera-simulated-nodes.yaml"
    document["kubernetes"] = {"kubeconfig": accounts.replace("{service}", "simulated-nodes")}
    simulator.write_text(yaml.safe_dump(document))
    inv = workdir / "inventory.yaml"
    inv.write_text(yaml.safe_dump(inventory))
    api = await kube.connect(KubernetesConfig(kubeconfig=str(kubeconfig)))
    # Nodes an earlier module simulated are still in the (session's) API server: each
    # pipeline starts with its own inventory's only, so what it counts is its own. A real
    # node's kubelet registers its Node once: it stays.
    await kube.request(
        api, "DELETE", "/api/v1/nodes", query={"labelSelector": f"!{realnode.NODE_LABEL}"}
    )
    p = Pipeline(workdir, path, simulator, inv, nats_admin, api)
    try:
        await _start_services(p, inventory, settings, replicas)
    except BaseException:  # nothing started here outlives the failure (later modules
        await p.close()  # met a failed module's services placing their pods)
        raise
    return p


async def _start_services(
    p: Pipeline, inventory: dict[str, Any], settings: dict[str, Any] | None, replicas: int
) -> None:
    """Start the services and wait until they answer and every node's inventory is in."""
    shards = [str(s["name"]) for s in (settings or {}).get("shards", [])]
    for service in SERVICES:
        if service == "device-allocator" and shards:
            for shard in shards:
                await p.start(f"{service}:{shard}")
            continue
        await p.start(service)
        if service != "node-agent":
            for i in range(2, replicas + 1):
                await p.start(f"{service}#{i}")

    async def all_alive() -> bool:
        return await p.alive() >= set(SERVICES)

    await eventually(all_alive, timeout_s=60, what="all five services answering pings")
    expected = sum(int(n.get("replicas", 1)) for n in inventory.get("nodes", []))

    async def inventories_stored() -> bool:
        return len(await _inventory_keys(p.nats_admin)) >= expected

    await eventually(inventories_stored, timeout_s=30, what="every node's inventory stored")
    # The allocator applies an inventory from its event, or from the KV within one
    # heartbeat; placing before that could fill the few nodes it knows so far.
    await asyncio.sleep(2 * HEARTBEAT_S)


async def _inventory_keys(nats_admin: NatsConfig) -> list[str]:
    nc = await connect(nats_admin, "admin")
    try:
        kv = await nc.jetstream().key_value("tessera-inventory")
        return list(await kv.keys())
    except (nats.js.errors.BucketNotFoundError, nats.js.errors.NoKeysError):
        return []
    finally:
        await nc.close()


async def claims_released(p: Pipeline, ns: str) -> None:
    """Delete ``ns``'s pods and ResourceClaims, and wait until the claims are gone:
    kube-controller-manager (``LocalCluster(with_controllers=True)``) deallocates each
    claim once its pods are gone and drops its finalizer, so the next test finds the
    devices free."""
    pods = await kube.request(p.api, "GET", f"/api/v1/namespaces/{ns}/pods")
    for item in pods["items"]:
        await p.delete(ns, item["metadata"]["name"])
    path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
    await kube.request(p.api, "DELETE", path)

    async def gone() -> bool:
        return not (await kube.request(p.api, "GET", path))["items"]

    await eventually(gone, timeout_s=60, what=f"the ResourceClaims of {ns} deleted")
