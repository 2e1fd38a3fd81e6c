"""Volumes and DRA resource claims on the pure core (shared/core/claims.py, the
VolumeBinding, VolumeZone and DynamicResources filters of shared/core/nodefit.py): what
each object says, each verdict's text as kube-scheduler's pinned release words it, where
Tessera waits instead of acting; the watcher's reader (services/watcher/claims.py)
holding a pod until the objects are listed and announcing it again when one changes, and
the coordinator trying a pod again once its verdict changes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from kubernetes_asyncio.client import ApiException

from services.watcher import claims as reader_module
from services.watcher.claims import ClaimReader
from shared import events as ev
from shared.core import claims as core
from shared.core.gangs import Gangs, Member
from shared.core.hosts import BoundVolume, Claims, PodSpec, VolumeZone, node_spec, pod_spec
from shared.core.ledger import Ledger
from shared.core.model import GangKey, NodeName
from shared.core.nodefit import Hosts, Prepared
from shared.core.placement import Failure, Placement, Placer
from shared.core.status import Code, Status
from tests.unit.corekit import MANAGED, SPECS, gpus, ref, request
from tests.unit.test_nodefit import why as node_reasons

UID = "uid-1"
ZONE = "topology.kubernetes.io/zone"
BETA_ZONE = "failure-domain.beta.kubernetes.io/zone"


def pvc(
    name: str,
    volume: str = "",
    *,
    bound: bool = True,
    storage_class: str | None = "fast",
    owner: str = "",
    **status: Any,
) -> dict[str, Any]:
    annotations = {core.BIND_COMPLETED: "yes"} if bound and volume else {}
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "annotations": annotations}
    if owner:
        meta["ownerReferences"] = [{"uid": owner, "controller": True, "kind": "Pod"}]
    spec: dict[str, Any] = {"volumeName": volume}
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    return {"metadata": meta, "spec": spec, "status": status}


def pv(name: str, *, hostname: str = "", labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if hostname:
        term = {"key": "kubernetes.io/hostname", "operator": "In", "values": [hostname]}
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{"matchExpressions": [term]}]}}
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def storage_class(name: str, mode: str = "Immediate") -> dict[str, Any]:
    return {"metadata": {"name": name}, "volumeBindingMode": mode}


def claim(
    name: str,
    *,
    node: str | None = None,
    allocated: bool = True,
    reserved: tuple[str, ...] = (UID,),
    owner: str = "",
) -> dict[str, Any]:
    status: dict[str, Any] = {"reservedFor": [{"resource": "pods", "uid": u} for u in reserved]}
    if allocated:
        status["allocation"] = {"devices": {"results": []}}
        if node is not None:
            field = {"key": "metadata.name", "operator": "In", "values": [node]}
            status["allocation"]["nodeSelector"] = {"nodeSelectorTerms": [{"matchFields": [field]}]}
    meta: dict[str, Any] = {"name": name, "namespace": "ns"}
    if owner:
        meta["ownerReferences"] = [{"uid": owner, "controller": True, "kind": "Pod"}]
    return {"metadata": meta, "status": status}


def pod(
    *,
    volumes: list[dict[str, Any]] | None = None,
    claims: list[dict[str, Any]] | None = None,
    made: list[dict[str, Any]] | None = None,
    cpu: str = "1",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "resources": {"requests": {"cpu": cpu}}}],
        "volumes": volumes or [],
        "resourceClaims": claims or [],
    }
    status = {"resourceClaimStatuses": made} if made is not None else {}
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": UID},
        "spec": spec,
        "status": status,
    }


def mount(name: str) -> dict[str, Any]:
    return {"name": f"v-{name}", "persistentVolumeClaim": {"claimName": name}}


class Objects:
    """Records of API objects, as the watcher keeps them."""

    def __init__(self, *objs: tuple[str, dict[str, Any]]) -> None:
        self.records: dict[core.Key, core.Record] = {}
        parse: dict[str, Callable[[dict[str, Any]], core.Record]] = {
            "pvc": core.pvc_record,
            "pv": core.pv_record,
            "class": core.class_record,
            "claim": core.claim_record,
            "dclass": core.api_object,
        }
        for kind, obj in objs:
            meta = obj["metadata"]
            key = f"ns/{meta['name']}" if kind in ("pvc", "claim") else meta["name"]
            self.records[kind, key] = parse[kind](obj)

    def verdict(self, obj: dict[str, Any]) -> Claims:
        uses = core.pod_uses(obj)
        assert uses is not None
        found, _ = core.claims_of(uses, self.records.get)
        return found


def waits(objects: Objects, obj: dict[str, Any]) -> str:
    found = objects.verdict(obj)
    assert found.wait is not None, found
    assert found.wait.code == Code.UNRESOLVABLE
    return found.wait.text()


# --- what a pod and each object say --------------------------------------------------------


def test_a_pod_without_claims_uses_nothing() -> None:
    assert core.pod_uses(pod(volumes=[{"name": "tmp", "emptyDir": {}}])) is None


def test_a_pods_uses_name_its_claims_and_resolve_templates() -> None:
    obj = pod(
        volumes=[mount("data"), {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {}}}],
        claims=[
            {"name": "gpu", "resourceClaimName": "shared-gpu"},
            {"name": "nic", "resourceClaimTemplateName": "nic"},
            {"name": "skipped", "resourceClaimTemplateName": "x"},
        ],
        made=[{"name": "nic", "resourceClaimName": "p-nic-abcde"}, {"name": "skipped"}],
    )
    uses = core.pod_uses(obj)
    assert uses is not None
    assert uses.volumes == (core.VolumeUse("data"), core.VolumeUse("p-scratch", ephemeral=True))
    assert uses.claims == (
        core.ClaimUse("gpu", claim="shared-gpu"),
        core.ClaimUse("nic", claim="p-nic-abcde", template=True),
        core.ClaimUse("skipped", template=True),
    )
    assert uses.kinds == {"pvc", "pv", "class", "claim", "dclass", "slice"}


def test_records_read_what_the_filters_need() -> None:
    beta = pvc("old", "pv-1")
    beta["metadata"]["annotations"][core.BETA_CLASS] = "beta-class"
    assert core.pvc_record(beta) == core.PVC(volume="pv-1", bound=True, storage_class="beta-class")
    assert core.pvc_record(pvc("half", "pv-1", bound=False)).bound is False
    assert core.pvc_record(pvc("gone", "pv-1", phase="Lost")).lost
    zones = core.pv_record(pv("z", labels={BETA_ZONE: "a__ b", ZONE: "c__", "other": "x"}))
    # A label with an empty zone is ignored, as VolumeZone does.
    assert zones.zones == (VolumeZone(BETA_ZONE, ("a", "b")),)
    assert zones.affinity is None
    assert core.pv_record(pv("local", hostname="n1")).affinity is not None
    assert core.class_record(storage_class("late", "WaitForFirstConsumer")).delayed
    allocated = core.claim_record(claim("c", node="n1"))
    assert allocated.allocated
    assert allocated.nodes is not None
    assert allocated.reserved == (UID,)
    assert not core.claim_record(claim("c", allocated=False)).allocated


# --- verdicts: where the pod waits, on every node alike -------------------------------------


def test_an_immediate_claim_not_bound_yet_waits_as_kube_scheduler_says() -> None:
    objects = Objects(("pvc", pvc("data")), ("class", storage_class("fast")))
    assert waits(objects, pod(volumes=[mount("data")])) == (
        "pod has unbound immediate PersistentVolumeClaims"
    )
    # Named but not yet bound by the PersistentVolume controller: unbound too.
    objects = Objects(("pvc", pvc("data", "pv-1", bound=False)), ("pv", pv("pv-1")))
    assert "unbound immediate" in waits(objects, pod(volumes=[mount("data")]))
    # No class, or one that does not exist: immediate.
    objects = Objects(("pvc", pvc("data", storage_class=None)))
    assert "unbound immediate" in waits(objects, pod(volumes=[mount("data")]))


def test_missing_lost_deleted_and_foreign_claims_wait_with_kube_schedulers_words() -> None:
    empty = Objects()
    assert waits(empty, pod(volumes=[mount("data")])) == ('persistentvolumeclaim "data" not found')
    scratch = {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {}}}
    assert waits(empty, pod(volumes=[scratch])) == (
        'waiting for ephemeral volume controller to create the persistentvolumeclaim "p-scratch"'
    )
    lost = Objects(("pvc", pvc("data", "pv-1", phase="Lost")))
    assert waits(lost, pod(volumes=[mount("data")])) == (
        'persistentvolumeclaim "data" bound to non-existent persistentvolume "pv-1"'
    )
    deleting = pvc("data", "pv-1")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert waits(Objects(("pvc", deleting)), pod(volumes=[mount("data")])) == (
        'persistentvolumeclaim "data" is being deleted'
    )
    foreign = Objects(("pvc", pvc("p-scratch", "pv-1", owner="other")), ("pv", pv("pv-1")))
    assert waits(foreign, pod(volumes=[scratch])) == (
        "PVC ns/p-scratch was not created for pod ns/p (pod is not owner)"
    )
    # A bound claim written in the pod whose volume is gone: VolumeZone's PreFilter says so.
    assert waits(Objects(("pvc", pvc("data", "pv-1"))), pod(volumes=[mount("data")])) == (
        'persistentvolume "pv-1" not found'
    )


def test_a_claim_bound_late_waits_with_what_to_do() -> None:
    objects = Objects(
        ("pvc", pvc("data")), ("class", storage_class("fast", "WaitForFirstConsumer"))
    )
    assert waits(objects, pod(volumes=[mount("data")])) == (
        "pod uses PersistentVolumeClaim ns/data, whose StorageClass fast binds it only once a "
        "node is chosen (volumeBindingMode: WaitForFirstConsumer); Tessera does not choose "
        "nodes for volumes yet: use kube-scheduler for this pod"
    )
    # kube-scheduler's own verdicts on the other claims come first.
    objects.records["pvc", "ns/other"] = core.pvc_record(pvc("other", storage_class=None))
    assert "unbound immediate" in waits(objects, pod(volumes=[mount("data"), mount("other")]))


def test_an_unallocated_resource_claim_is_listed_for_the_allocator_with_its_classes() -> None:
    uses = pod(claims=[{"name": "gpu", "resourceClaimName": "gpu"}])
    unallocated = claim("gpu", allocated=False)
    request = {"name": "r", "exactly": {"deviceClassName": "gpu.tessera.io"}}
    unallocated["metadata"]["uid"] = "claim-uid"
    unallocated["spec"] = {"devices": {"requests": [request]}}
    gpu_class = {"metadata": {"name": "gpu.tessera.io"}, "spec": {"selectors": []}}
    found = Objects(("claim", unallocated), ("dclass", gpu_class)).verdict(uses)
    assert found.wait is None
    assert [(c.namespace, c.name, c.uid) for c in found.allocate] == [("ns", "gpu", "claim-uid")]
    assert found.allocate[0].devices == {"requests": [request]}
    assert found.classes == {"gpu.tessera.io": gpu_class}
    # A class that does not exist is left out: the allocator refuses the pod with its name.
    assert Objects(("claim", unallocated)).verdict(uses).classes == {}


def test_resource_claims_wait_until_allocated_and_reserved_for_the_pod() -> None:
    uses = pod(claims=[{"name": "gpu", "resourceClaimName": "gpu"}])
    assert waits(Objects(), uses) == 'could not find ResourceClaim "ns/gpu"'
    # Allocated (by anyone) but not reserved for the pod: the binder reserves it.
    unreserved = Objects(("claim", claim("gpu", node="n1", reserved=()))).verdict(uses)
    assert unreserved.wait is None
    [reserve] = unreserved.reserve
    assert (reserve.name, reserve.allocation) == (
        "gpu",
        claim("gpu", node="n1")["status"]["allocation"],
    )
    assert len(unreserved.devices) == 1  # and it still goes only where the claim was allocated
    template = pod(claims=[{"name": "gpu", "resourceClaimTemplateName": "t"}])
    assert waits(Objects(), template) == 'pod "ns/p": ResourceClaim not created yet'
    made = pod(
        claims=[{"name": "gpu", "resourceClaimTemplateName": "t"}],
        made=[{"name": "gpu", "resourceClaimName": "p-gpu"}],
    )
    assert waits(Objects(("claim", claim("p-gpu", owner="other"))), made) == (
        "ResourceClaim ns/p-gpu was not created for Pod ns/p (Pod is not owner)"
    )
    found = Objects(("claim", claim("p-gpu", node="n1", owner=UID))).verdict(made)
    assert found.wait is None
    assert len(found.devices) == 1
    # Allocated for every node: no node selector to check.
    assert Objects(("claim", claim("gpu"))).verdict(uses) == Claims()
    # Reserved for the pod already, with devices that have binding conditions (a binder
    # stopped while it waited for them): the binder checks them again before the Binding.
    waited = claim("gpu")
    waited["status"]["allocation"]["devices"]["results"] = [
        {"request": "gpu", "driver": "d", "pool": "n1", "device": "gpu-0"}
        | {"bindingConditions": ["attached"], "bindingFailureConditions": ["failed"]}
    ]
    [again] = Objects(("claim", waited)).verdict(uses).reserve
    assert again.allocation == waited["status"]["allocation"]


def test_a_claim_that_does_not_exist_yet_comes_before_the_volumes() -> None:
    obj = pod(volumes=[mount("data")], claims=[{"name": "gpu", "resourceClaimName": "gpu"}])
    assert waits(Objects(), obj) == 'could not find ResourceClaim "ns/gpu"'


def test_the_verdict_names_every_object_it_read() -> None:
    obj = pod(volumes=[mount("data")], claims=[{"name": "gpu", "resourceClaimName": "gpu"}])
    objects = Objects(("pvc", pvc("data", "pv-1")), ("pv", pv("pv-1")), ("claim", claim("gpu")))
    uses = core.pod_uses(obj)
    assert uses is not None
    _, reads = core.claims_of(uses, objects.records.get)
    assert reads == {("claim", "ns/gpu"), ("pvc", "ns/data"), ("pv", "pv-1")}


# --- the filters, node by node -------------------------------------------------------------


def node(name: str, cpu: str = "8", **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "status": {"allocatable": {"cpu": cpu, "memory": "32Gi", "pods": "10"}},
    }


def hosts(*nodes: dict[str, Any]) -> Hosts:
    h = Hosts()
    for n in nodes:
        h.set_spec(node_spec(n))
    return h


def with_claims(obj: dict[str, Any], objects: Objects) -> PodSpec:
    return msgspec.structs.replace(pod_spec(obj, MANAGED), claims=objects.verdict(obj))


def why(h: Hosts, obj: dict[str, Any], objects: Objects) -> dict[str, str | None]:
    """Each node's first failing filter with the pod's claims read from ``objects``;
    every refusal is unresolvable, as kube-scheduler's volume and claim filters say."""
    spec = with_claims(obj, objects)
    prep = h.prepare(spec)
    assert isinstance(prep, Prepared), prep
    assert all(s is None or s.unresolvable for s in map(prep.filter, h.nodes.values()))
    return node_reasons(h, spec)


def test_a_local_volume_takes_only_its_node() -> None:
    objects = Objects(("pvc", pvc("data", "pv-1")), ("pv", pv("pv-1", hostname="a")))
    h = hosts(node("a"), node("b"))
    assert why(h, pod(volumes=[mount("data")]), objects) == {
        "a": None,
        "b": "node(s) didn't match PersistentVolume's node affinity",
    }
    # NodeResourcesFit comes first, as in kube-scheduler's order.
    assert why(h, pod(volumes=[mount("data")], cpu="9"), objects)["b"] == "Insufficient cpu"


def test_an_ephemeral_volume_whose_pv_is_gone_fails_every_node() -> None:
    scratch = {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {}}}
    objects = Objects(("pvc", pvc("p-scratch", "pv-1", owner=UID)))
    assert set(why(hosts(node("a")), pod(volumes=[scratch]), objects).values()) == {
        "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)"
    }


def test_zone_labels_of_a_volume_keep_it_to_its_zone() -> None:
    objects = Objects(
        ("pvc", pvc("data", "pv-1")), ("pv", pv("pv-1", labels={BETA_ZONE: "z1__z2"}))
    )
    h = hosts(
        node("beta-in", **{BETA_ZONE: "z2"}),
        node("ga-in", **{ZONE: "z1"}),  # a beta volume label matches the GA node label
        node("out", **{ZONE: "z3"}),
        node("unzoned"),  # a node without zone labels takes any volume (one-zone clusters)
    )
    assert why(h, pod(volumes=[mount("data")]), objects) == {
        "beta-in": None,
        "ga-in": None,
        "out": "node(s) had no available volume zone",
        "unzoned": None,
    }
    ga = Objects(("pvc", pvc("data", "pv-1")), ("pv", pv("pv-1", labels={ZONE: "z2"})))
    # ... but a GA volume label does not match a node's beta label.
    assert why(h, pod(volumes=[mount("data")]), ga)["beta-in"] == (
        "node(s) had no available volume zone"
    )


def test_an_allocated_claim_takes_only_the_nodes_its_allocation_names() -> None:
    obj = pod(claims=[{"name": "gpu", "resourceClaimName": "gpu"}])
    objects = Objects(("claim", claim("gpu", node="a")))
    h = hosts(node("a"), node("b"))
    assert why(h, obj, objects) == {"a": None, "b": "resourceclaim not available on the node"}


def test_a_waiting_pod_is_refused_by_every_node_at_once() -> None:
    objects = Objects(("pvc", pvc("data")))
    prep = hosts(node("a"), node("b")).prepare(with_claims(pod(volumes=[mount("data")]), objects))
    assert isinstance(prep, Status)
    assert prep.unresolvable
    assert prep.message() == (
        "0/2 nodes are available: pod has unbound immediate PersistentVolumeClaims."
    )


def test_a_node_without_its_node_object_is_judged_without_labels() -> None:
    objects = Objects(("pvc", pvc("data", "pv-1")), ("pv", pv("pv-1", hostname="a")))
    h = hosts(node("b"))
    h.node(NodeName("a"))  # known only by its devices so far
    assert why(h, pod(volumes=[mount("data")]), objects)["a"] == (
        "node(s) didn't match PersistentVolume's node affinity"
    )


def test_placement_puts_a_device_pod_where_its_volume_is() -> None:
    led = Ledger(SPECS)
    for name in ("n1", "n2"):
        led.set_spec(node_spec(node(name)))
        led.set_node(NodeName(name), gpus(1))
    objects = Objects(("pvc", pvc("data", "pv-1")), ("pv", pv("pv-1", hostname="n2")))
    spec = with_claims(pod(volumes=[mount("data")]), objects)
    placed = Placer(led).place(ref("p"), request({"nvidia.com/gpu": 1}), spec=spec)
    assert isinstance(placed, Placement)
    assert placed.node == "n2"
    waiting = with_claims(pod(volumes=[mount("data")]), Objects(("pvc", pvc("data"))))
    failed = Placer(led).place(ref("q"), request({"nvidia.com/gpu": 1}), spec=waiting)
    assert isinstance(failed, Failure)
    assert failed.status.unresolvable
    assert "pod has unbound immediate PersistentVolumeClaims" in failed.status.message()


# --- the coordinator tries a pod again when its verdict changes ------------------------------


def test_a_parked_pod_whose_spec_changed_is_tried_again() -> None:
    gangs = Gangs()
    pod_ref = ref("p")
    member = Member(pod=pod_ref, key=GangKey.of(pod_ref, None), request=request({}))
    gangs.pending(member)
    ready = gangs.dispatch(now=0.0).ready
    assert [m.pod for g in ready for m in g.members] == [pod_ref]
    gangs.failed([pod_ref.uid], ready[0].attempt, unresolvable=True, now=0.0)
    assert gangs.pods[pod_ref.uid].state == "parked"
    same = Member(pod=pod_ref, key=member.key, request=member.request)
    assert not gangs.pending(same)  # a plain re-announcement changes nothing
    assert gangs.pods[pod_ref.uid].state == "parked"
    assert gangs.pending(same, respec=True)
    assert gangs.pods[pod_ref.uid].state == "pending"
    # In flight when it changed: a failure then is retried at once.
    ready = gangs.dispatch(now=1.0).ready
    gangs.pending(same, respec=True)
    gangs.failed([pod_ref.uid], ready[0].attempt, unresolvable=True, now=1.0)
    assert not gangs.pods[pod_ref.uid].unresolvable


# --- the watcher's reader: held until listed, announced again when an object changes --------


async def no_publish(event: ev.Event) -> None:
    raise AssertionError(f"nothing is forwarded here: {event}")


async def test_the_watcher_forwards_slices_and_claim_allocations_and_announces_claims() -> None:
    announced: list[ev.PodPending] = []
    sent: list[ev.Event] = []

    async def announce(event: ev.PodPending) -> None:
        announced.append(event)

    async def publish(event: ev.Event) -> None:
        sent.append(event)

    reader = ClaimReader(object(), lambda coro, name, **_: coro.close(), {}, announce, publish)
    obj = pod(claims=[{"name": "gpu", "resourceClaimName": "gpu"}])
    base = ev.PodPending(
        pod=msgspec.structs.replace(ref("p"), uid=UID),
        request=request({}),
        scheduler_name="tessera",
        spec=pod_spec(obj),
    )
    assert reader.attach(base, obj) is None
    unallocated = claim("gpu", allocated=False)
    other = claim("other")
    await reader.on_relist("claim", [unallocated, other])
    assert [(e.kind, e.key) for e in sent if isinstance(e, ev.DraObject)] == [("claim", "ns/other")]
    await reader.on_relist("dclass", [])
    slice_obj = {"metadata": {"name": "s1"}, "spec": {"driver": "d", "nodeName": "n1"}}
    await reader.on_relist("slice", [slice_obj])
    assert isinstance(sent[-1], ev.DraObject)
    assert (sent[-1].kind, sent[-1].key, sent[-1].obj) == ("slice", "s1", slice_obj)
    [event] = announced  # every kind listed: announced, its claim for the allocator
    assert event.spec is not None
    assert event.spec.claims is not None
    assert [c.name for c in event.spec.claims.allocate] == ["gpu"]
    # The same slice again is no news; deleted, it is forwarded as gone.
    await reader.on_event("slice", "MODIFIED", slice_obj)
    assert len(sent) == 2
    await reader.on_event("slice", "DELETED", slice_obj)
    assert isinstance(sent[-1], ev.DraObject)
    assert (sent[-1].key, sent[-1].obj) == ("s1", None)
    # A claim deallocated is forwarded as gone (its devices are free again).
    other["status"].pop("allocation")
    await reader.on_event("claim", "MODIFIED", other)
    assert isinstance(sent[-1], ev.DraObject)
    assert (sent[-1].kind, sent[-1].key, sent[-1].obj) == ("claim", "ns/other", None)


async def test_the_watcher_holds_a_pod_until_its_objects_are_listed_then_follows_them() -> None:
    announced: list[ev.PodPending] = []
    pending: dict[Any, ev.PodPending] = {}

    async def announce(event: ev.PodPending) -> None:
        announced.append(event)

    reader = ClaimReader(
        object(), lambda coro, name, **_: coro.close(), pending, announce, no_publish
    )
    obj = pod(volumes=[mount("data")])
    base = ev.PodPending(
        pod=ref("p"), request=request({}), scheduler_name="tessera", spec=pod_spec(obj)
    )
    base = msgspec.structs.replace(base, pod=msgspec.structs.replace(base.pod, uid=UID))
    assert reader.attach(base, obj) is None  # nothing listed yet: held
    await reader.on_relist("pvc", [pvc("data")])
    await reader.on_relist("pv", [])
    assert announced == []  # StorageClasses not listed yet
    await reader.on_relist("class", [])
    [first] = announced
    assert first.spec is not None
    assert first.spec.claims is not None
    assert first.spec.claims.wait is not None
    assert first.spec.claims.wait.kind == "pvc-unbound"
    assert pending[base.pod.uid] is first
    # A status heartbeat of the claim changes nothing it reads: nothing is announced.
    await reader.on_event("pvc", "MODIFIED", pvc("data", phase="Pending"))
    assert len(announced) == 1
    # Bound to a local volume: announced again, with where that volume is.
    await reader.on_event("pv", "ADDED", pv("pv-1", hostname="a"))
    await reader.on_event("pvc", "MODIFIED", pvc("data", "pv-1"))
    second = announced[-1]
    assert second.event_id != first.event_id
    assert second.spec is not None
    local = core.pv_record(pv("pv-1", hostname="a")).affinity
    assert second.spec.claims == Claims(volumes=(BoundVolume(local),))
    # Bound by then (or gone): a change is no news.
    reader.forget(base.pod.uid)
    await reader.on_event("pv", "DELETED", pv("pv-1"))
    assert len(announced) == 2


async def test_where_resource_claims_are_not_served_a_pod_naming_one_waits_for_it(
    monkeypatch: Any,
) -> None:
    async def not_served(*_: Any, **__: Any) -> Any:
        raise ApiException(status=404)

    monkeypatch.setattr(reader_module.kube, "request", not_served)
    announced: list[ev.PodPending] = []

    async def announce(event: ev.PodPending) -> None:
        announced.append(event)

    started: list[Any] = []
    reader = ClaimReader(
        object(), lambda coro, name, **_: started.append(coro), {}, announce, no_publish
    )
    obj = pod(claims=[{"name": "gpu", "resourceClaimName": "gpu"}])
    base = ev.PodPending(
        pod=msgspec.structs.replace(ref("p"), uid=UID),
        request=request({}),
        scheduler_name="tessera",
        spec=pod_spec(obj),
    )
    assert reader.attach(base, obj) is None
    assert len(started) == 3  # claims, DeviceClasses, ResourceSlices
    for watch in started:
        await watch  # ends: nothing to watch
    [event] = announced
    assert event.spec is not None
    assert event.spec.claims is not None
    assert event.spec.claims.wait is not None
    assert event.spec.claims.wait.text() == 'could not find ResourceClaim "ns/gpu"'
