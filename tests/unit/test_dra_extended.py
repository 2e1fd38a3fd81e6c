"""Extended resources served through DRA (DeviceClass ``extendedResourceName``):
which class maps a name (shared/core/dra/extended.py), the claim a pod's requests
become and its request mappings, the watcher's verdict (shared/core/claims.py), and the
allocator's other way for a pod (services/device_allocator/extended.py, dra.py), as
kube-scheduler 1.36's DynamicResources plugin decides them."""

from __future__ import annotations

from typing import Any

from services.device_allocator.extended import variant
from services.watcher.claims import ClaimReader
from shared import events as ev
from shared.core import claims as core
from shared.core.dra import extended
from shared.core.dra.extended import ContainerAsk
from shared.core.hosts import NodeSpec, PodSpec, pod_spec
from shared.core.nodefit import Hosts
from shared.core.placement import GangMember
from tests.unit.corekit import ref, request
from tests.unit.test_dra_allocator import DRIVER, GPU_CLASS, World, card, dra, node_slice

GPU = "nvidia.com/gpu"


def dclass(name: str, resource: str | None = None, created: str = "2026-01-01T00:00:00Z") -> Any:
    spec: dict[str, Any] = {"selectors": GPU_CLASS["spec"]["selectors"]}
    if resource:
        spec["extendedResourceName"] = resource
    return {"metadata": {"name": name, "creationTimestamp": created}, "spec": spec}


def test_every_class_maps_its_implicit_name_and_its_extended_resource_name() -> None:
    mapping = extended.class_mapping([dclass("gpu.tessera.io", GPU), dclass("mig.tessera.io")])
    assert mapping == {
        GPU: "gpu.tessera.io",
        "deviceclass.resource.kubernetes.io/gpu.tessera.io": "gpu.tessera.io",
        "deviceclass.resource.kubernetes.io/mig.tessera.io": "mig.tessera.io",
    }


def test_two_classes_mapping_one_name_the_newer_wins_then_the_lower_name() -> None:
    old = dclass("a-old", GPU, "2026-01-01T00:00:00Z")
    new = dclass("z-new", GPU, "2026-02-01T00:00:00Z")
    assert extended.class_mapping([old, new])[GPU] == "z-new"
    assert extended.class_mapping([new, old])[GPU] == "z-new"
    tie = [dclass("b", GPU), dclass("a", GPU), dclass("ab", GPU)]
    assert extended.class_mapping(tie)[GPU] == "a"


def pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-p"},
        "spec": {"initContainers": list(init), "containers": list(containers)},
    }


def container(name: str, **requests: str) -> dict[str, Any]:
    named = {k.replace("__", "/").replace("_", "."): v for k, v in requests.items()}
    return {"name": name, "resources": {"requests": named, "limits": named}}


def test_a_request_becomes_one_device_request_of_the_class_named_by_its_index() -> None:
    asks = extended.container_asks(
        pod(container("main", cpu="1", memory="1Gi", nvidia_com__gpu="2"))
    )
    ext = extended.extended_claim(asks, {GPU: "gpu.tessera.io"})
    assert ext is not None
    # cpu, memory, nvidia.com/gpu sorted: the GPU is request 2 of container 0
    assert ext.devices == {
        "requests": [
            {
                "name": "container-0-request-2",
                "exactly": {
                    "deviceClassName": "gpu.tessera.io",
                    "allocationMode": "ExactCount",
                    "count": 2,
                },
            }
        ]
    }
    assert ext.mappings == (("main", GPU, "container-0-request-2"),)
    assert ext.names == (GPU,)


def test_init_containers_reuse_the_app_containers_requests_and_share_their_largest() -> None:
    asks = extended.container_asks(
        pod(
            container("app", nvidia_com__gpu="1"),
            init=(container("i0", nvidia_com__gpu="3"), container("i1", nvidia_com__gpu="1")),
        )
    )
    requests, mappings = extended.requests_and_mappings(asks, {GPU: "c"}, [GPU])
    counts = {r["name"]: r["exactly"]["count"] for r in requests}
    # i1 is served by the app's request; i0 needs 2 more: its own request serves both
    assert counts == {"container-0-request-0": 2, "container-2-request-0": 1}
    assert mappings == [
        ("app", GPU, "container-2-request-0"),
        ("i0", GPU, "container-2-request-0"),
        ("i0", GPU, "container-0-request-0"),
        ("i1", GPU, "container-2-request-0"),
    ]


def test_init_containers_that_run_one_after_another_share_the_largest_request() -> None:
    asks = extended.container_asks(
        pod(
            container("app", cpu="1"),
            init=(container("i0", nvidia_com__gpu="2"), container("i1", nvidia_com__gpu="3")),
        )
    )
    requests, mappings = extended.requests_and_mappings(asks, {GPU: "c"}, [GPU])
    assert [(r["name"], r["exactly"]["count"]) for r in requests] == [("container-1-request-0", 3)]
    assert mappings == [("i0", GPU, "container-1-request-0"), ("i1", GPU, "container-1-request-0")]


def test_a_count_written_as_a_quantity_is_read_whole() -> None:
    [ask] = extended.container_asks(pod(container("main", nvidia_com__gpu="1k")))
    assert ask.count(GPU) == 1000


def test_a_sidecar_keeps_its_own_request() -> None:
    sidecar = {**container("side", nvidia_com__gpu="1"), "restartPolicy": "Always"}
    asks = extended.container_asks(pod(container("app", nvidia_com__gpu="1"), init=(sidecar,)))
    requests, _ = extended.requests_and_mappings(asks, {GPU: "c"}, [GPU])
    assert [r["name"] for r in requests] == ["container-0-request-0", "container-1-request-0"]


def test_a_name_only_the_device_plugin_serves_keeps_the_pod_off_dra() -> None:
    asks = (ContainerAsk("main", asks=((GPU, 1), ("nvidia.com/gpumem", 4000))),)
    assert extended.extended_claim(asks, {GPU: "c"}) is None
    # a plain extended resource (fitted against allocatable) does not
    plain = (ContainerAsk("main", asks=((GPU, 1), ("example.com/nic", 1))),)
    assert extended.extended_claim(plain, {GPU: "c"}, plain=["example.com/nic"]) is not None
    assert extended.extended_claim(asks, {}) is None


def test_the_watchers_verdict_carries_the_claim_and_reads_every_class() -> None:
    uses = core.pod_uses(pod(container("main", nvidia_com__gpu="1")))
    assert uses is not None
    assert uses.kinds == {"claim", "dclass", "slice"}
    cls = core.device_class(dclass(DRIVER, GPU))
    found, reads = core.claims_of(
        uses, lambda key: cls if key == ("dclass", DRIVER) else None, {GPU: DRIVER}
    )
    assert core.EVERY_CLASS in reads
    assert found.mapped == (GPU,)
    assert found.extended is not None
    assert found.extended.mappings == (("main", GPU, "container-0-request-0"),)
    assert found.classes == {DRIVER: cls.obj}
    assert not found.allocate
    unmapped, _ = core.claims_of(uses, lambda key: None, {})
    assert unmapped == core.Claims()


ROOM = {"cpu": 8000, "memory": 2**34, "pods": 10}


def hosts(**allocatable: dict[str, int]) -> Hosts:
    h = Hosts()
    for name, resources in allocatable.items():
        h.set_spec(NodeSpec(name=name, allocatable=resources))
    return h


def gpu_member() -> GangMember:
    uses = core.pod_uses(pod(container("main", nvidia_com__gpu="1")))
    assert uses is not None
    cls = core.device_class(dclass(DRIVER, GPU))
    found, _ = core.claims_of(uses, lambda key: cls, {GPU: DRIVER})
    spec = PodSpec(namespace="ns", requests={"cpu": 100}, claims=found)
    return GangMember(pod=ref("p"), request=request({GPU: 1}), spec=spec)


def test_the_other_way_asks_a_claim_and_no_device_off_the_device_plugins_nodes() -> None:
    h = hosts(plugin={GPU: 4, **ROOM}, dra=ROOM)
    m = gpu_member()
    assert m.request.wants_devices
    other = variant(m, h)
    assert other is not None
    assert other.spec is not None
    assert other.spec.claims is not None
    assert not other.request.wants_devices
    [claim] = other.spec.claims.allocate
    assert claim.mappings
    assert claim.name == ""
    assert other.spec.claims.extended is None
    [terms] = other.spec.claims.devices
    assert [n for n in ("plugin", "dra") if any(t.matches(n, {}) for t in terms)] == ["dra"]
    plain = GangMember(pod=ref("q"), request=request({GPU: 1}), spec=PodSpec(namespace="ns"))
    assert variant(plain, h) is None


def world(**allocatable: dict[str, int]) -> World:
    """The allocator's DRA shell and the core's placer on nodes without devices in the
    ledger, each with ``allocatable``."""
    w = dra(nodes=tuple(allocatable))
    for name, resources in allocatable.items():
        w.placer.ledger.hosts.set_spec(NodeSpec(name=name, allocatable=resources))
    return w


def test_the_claim_is_allocated_on_the_dra_node_and_held_once_when_seen_made() -> None:
    w = world(plugin={GPU: 4, **ROOM}, dra=ROOM)
    d = w.dra
    d.seen("slice", "s", node_slice("dra", card("gpu-0")))
    d.seen("slice", "s2", node_slice("plugin", card("gpu-0")))  # another driver's, say
    other = variant(gpu_member(), w.placer.ledger.hosts)
    assert other is not None
    assert w.fits(other) == ["dra"]
    assert w.place(other).ok
    assert w.node_of(other) == "dra"
    [made] = d.decided(other.pod.uid)
    assert made.name == ""
    assert made.mappings == (("main", GPU, "container-0-request-0"),)
    assert made.devices["requests"][0]["exactly"]["deviceClassName"] == DRIVER
    assert made.allocation["devices"]["results"][0]["pool"] == "dra"
    held = d.in_use()
    # the binder created it: seen allocated, it is held once (not also as assumed)
    written = {
        "metadata": {
            "name": "p-extended-resources-x",
            "namespace": "ns",
            "uid": "u",
            "annotations": {extended.ANNOTATION: "true"},
            "ownerReferences": [{"kind": "Pod", "uid": other.pod.uid, "controller": True}],
        },
        "status": {"allocation": made.allocation},
    }
    d.seen("claim", "ns/p-extended-resources-x", written)
    assert d.decided(other.pod.uid) == ()
    assert d.in_use() == held
    d.restore({other.pod.uid: (made,)})
    assert d.decided(other.pod.uid) == ()


def test_a_pod_asking_no_extended_resource_claims_nothing() -> None:
    assert extended.container_asks(pod(container("main", cpu="1"))) == ()
    assert core.pod_uses(pod(container("main", cpu="1"))) is None


async def test_the_watcher_announces_a_gpu_pod_again_when_a_class_comes_to_map_it() -> None:
    announced: list[ev.PodPending] = []
    pending: dict[Any, ev.PodPending] = {}

    async def announce(event: ev.PodPending) -> None:
        announced.append(event)

    async def publish(event: ev.Event) -> None:
        pass

    reader = ClaimReader(object(), lambda coro, name, **_: coro.close(), pending, announce, publish)
    obj = pod(container("main", cpu="1", nvidia_com__gpu="1"))
    base = ev.PodPending(
        pod=ref("p"), request=request({GPU: 1}), scheduler_name="tessera", spec=pod_spec(obj)
    )
    pending[base.pod.uid] = base
    assert reader.attach(base, obj) is None  # held until claims, classes and slices are listed
    for kind in ("claim", "dclass", "slice"):
        await reader.on_relist(kind, [])
    [first] = announced
    assert first.spec is not None
    assert first.spec.claims is None  # no class maps nvidia.com/gpu: nothing claimed
    await reader.on_event("dclass", "ADDED", dclass(DRIVER, GPU))
    [_, again] = announced
    assert again.spec is not None
    assert again.spec.claims is not None
    assert again.spec.claims.mapped == (GPU,)
    assert again.spec.claims.extended is not None
    await reader.on_event("dclass", "DELETED", dclass(DRIVER, GPU))
    assert announced[-1].spec is not None
    assert announced[-1].spec.claims is None
