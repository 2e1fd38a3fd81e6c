"""What the objects a pod claims say about where it may run: its PersistentVolumeClaims
(with their PersistentVolumes and StorageClasses) and its DRA ResourceClaims.

The API objects are read into small records (:func:`pvc_record`, :func:`pv_record`,
:func:`class_record`, :func:`claim_record`: the few fields the filters read), a pod into
what it names (:func:`pod_uses`), and :func:`claims_of` decides, as the pinned release
of kube-scheduler's VolumeBinding, VolumeZone and DynamicResources plugins do (their
PreEnqueue and PreFilter verdicts, then what their Filters read per node; of
VolumeRestrictions, only that a claim exists), with their reason texts
(shared/core/status.py):

- a claim the pod names that is missing, being deleted, lost, or not the pod's own
  (a generic ephemeral volume's, a template's), and a PersistentVolumeClaim that should
  already be bound and is not (``pod has unbound immediate PersistentVolumeClaims``):
  the pod waits, on every node alike (``Claims.wait``);
- a bound claim's volume: its required node affinity (``node(s) didn't match
  PersistentVolume's node affinity``) and zone labels (``node(s) had no available
  volume zone``), checked per node by shared/core/nodefit.py;
- an allocated ResourceClaim: the nodes its allocation's node selector names
  (``resourceclaim not available on the node``).

Where kube-scheduler would act and Tessera does not yet, the pod waits too, with a
reason naming the object and what to do: a claim whose StorageClass binds it only once
a node is chosen (``WaitForFirstConsumer``: VolumeBinding picks the node and writes the
claim's ``volume.kubernetes.io/selected-node`` before binding), and a ResourceClaim
allocated by someone else but not reserved for the pod (DynamicResources writes
``status.reservedFor`` before binding; the kubelet refuses a pod its claim is not
reserved for). A ResourceClaim not allocated is Tessera's to allocate: it is listed in
``Claims.allocate`` with the DeviceClasses it names (services/device_allocator/dra.py).
A pod asking an extended resource that a DeviceClass maps (``extendedResourceName``,
shared/core/dra/extended.py) gets the claim it becomes on a node serving the name
through DRA (``Claims.extended``); the allocator tries it where the device plugin's
path finds no room.
What each claim counts in the pod's queue, asked or held, is ``Claims.counts``
(shared/core/claimed.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec

from shared.core.claimed import asked, held
from shared.core.dra import binding
from shared.core.dra.extended import ContainerAsk, container_asks, extended_claim
from shared.core.hosts import (
    ZONE_LABELS,
    BoundVolume,
    Claims,
    DraClaim,
    NodeTerm,
    VolumeZone,
    node_terms,
)
from shared.core.status import UNRESOLVABLE, Reason

BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
"""Set by the PersistentVolume controller once it has bound a claim (the claim counts as
bound only with it and ``spec.volumeName``)."""
BETA_CLASS = "volume.beta.kubernetes.io/storage-class"
"""The old way to name a claim's class; read before ``spec.storageClassName``."""
ZONE_DELIMITER = "__"
"""Separates the zones of a volume in one zone label."""

Key = tuple[str, str]
"""An object read: ("pvc" | "claim", "namespace/name") or ("pv" | "class" | "dclass",
"name")."""


class PVC(msgspec.Struct, frozen=True, omit_defaults=True):
    """What the filters read of a PersistentVolumeClaim."""

    volume: str = ""
    """``spec.volumeName``: the volume it is (being) bound to."""
    bound: bool = False
    """Bound by the PersistentVolume controller (``pv.kubernetes.io/bind-completed``)."""
    storage_class: str = ""
    lost: bool = False
    """``status.phase: Lost``: its volume is gone."""
    deleting: bool = False
    owner: str = ""
    """The UID of its controller (a pod, for a generic ephemeral volume's claim)."""


class PV(msgspec.Struct, frozen=True, omit_defaults=True):
    """What the filters read of a PersistentVolume."""

    affinity: tuple[NodeTerm, ...] | None = None
    zones: tuple[VolumeZone, ...] = ()


class StorageClass(msgspec.Struct, frozen=True, omit_defaults=True):
    """What the filters read of a StorageClass: whether it binds claims late."""

    delayed: bool = False
    """``volumeBindingMode: WaitForFirstConsumer``."""


class ResourceClaim(msgspec.Struct, frozen=True, omit_defaults=True):
    """What the filters read of a DRA ResourceClaim."""

    uid: str = ""
    devices: dict[str, Any] = msgspec.field(default_factory=dict)
    """``spec.devices``: what Tessera allocates when the claim is not allocated."""
    allocation: dict[str, Any] | None = None
    """``status.allocation`` as written (the binder reserves an allocated claim)."""
    deleting: bool = False
    owner: str = ""
    allocated: bool = False
    nodes: tuple[NodeTerm, ...] | None = None
    """Its allocation's node selector; None: every node (or not allocated)."""
    reserved: tuple[str, ...] = ()
    """The UIDs of its consumers (``status.reservedFor``)."""

    def classes(self) -> tuple[str, ...]:
        """The DeviceClasses its requests name (``exactly`` and ``firstAvailable``)."""
        names: list[str] = []
        for request in self.devices.get("requests") or ():
            for sub in (request.get("exactly"), *(request.get("firstAvailable") or ())):
                if sub and sub.get("deviceClassName") and sub["deviceClassName"] not in names:
                    names.append(str(sub["deviceClassName"]))
        return tuple(names)


class ApiObject(msgspec.Struct, frozen=True):
    """An object kept as the API server holds it: a DRA DeviceClass (shared/core/dra/read.py
    reads it when allocating), a ResourceSlice (the watcher forwards it)."""

    obj: dict[str, Any]


Record = PVC | PV | StorageClass | ResourceClaim | ApiObject


class VolumeUse(msgspec.Struct, frozen=True):
    """A pod volume backed by a claim: a ``persistentVolumeClaim`` or a generic
    ``ephemeral`` one (whose claim is ``<pod>-<volume>``, made for the pod)."""

    claim: str
    ephemeral: bool = False


class ClaimUse(msgspec.Struct, frozen=True, omit_defaults=True):
    """One entry of a pod's ``spec.resourceClaims``, resolved to its ResourceClaim's name."""

    name: str
    claim: str = ""
    """The ResourceClaim's name; '' when none was made for it on purpose (skipped)."""
    template: bool = False
    """Made from a template: the claim must be the pod's own."""
    pending: bool = False
    """Made from a template not yet made (``status.resourceClaimStatuses`` lacks it)."""
    unsupported: bool = False
    """Names neither a claim nor a template."""


class Uses(msgspec.Struct, frozen=True):
    """The claims one pod names (see :func:`pod_uses`)."""

    namespace: str
    pod: str
    uid: str
    volumes: tuple[VolumeUse, ...] = ()
    claims: tuple[ClaimUse, ...] = ()
    asks: tuple[ContainerAsk, ...] = ()
    """Its containers' extended-resource requests (a DeviceClass may map them)."""

    @property
    def kinds(self) -> frozenset[str]:
        """The kinds of objects the verdict reads."""
        kinds: set[str] = set()
        if self.volumes:
            kinds |= {"pvc", "pv", "class"}
        if self.claims or self.asks:
            kinds |= {"claim", "dclass", "slice"}
        return frozenset(kinds)


# --- reading the API objects ------------------------------------------------------------


def _owner(meta: Mapping[str, Any]) -> str:
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller"):
            return str(ref.get("uid", ""))
    return ""


def pvc_record(obj: Mapping[str, Any]) -> PVC:
    """A PersistentVolumeClaim's record."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    annotations = meta.get("annotations") or {}
    if BETA_CLASS in annotations:
        storage_class = str(annotations[BETA_CLASS])
    else:
        storage_class = str(spec.get("storageClassName") or "")
    return PVC(
        volume=str(spec.get("volumeName") or ""),
        bound=BIND_COMPLETED in annotations,
        storage_class=storage_class,
        lost=(obj.get("status") or {}).get("phase") == "Lost",
        deleting=bool(meta.get("deletionTimestamp")),
        owner=_owner(meta),
    )


def _zones(value: str) -> tuple[str, ...] | None:
    """A zone label's zones; None when one is empty (VolumeZone ignores the label)."""
    zones = [z.strip() for z in value.split(ZONE_DELIMITER)]
    return None if "" in zones else tuple(sorted(set(zones)))


def pv_record(obj: Mapping[str, Any]) -> PV:
    """A PersistentVolume's record: required node affinity and zone labels."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    labels = meta.get("labels") or {}
    required = (spec.get("nodeAffinity") or {}).get("required")
    zones = []
    for key in ZONE_LABELS:
        if key in labels and (values := _zones(str(labels[key]))) is not None:
            zones.append(VolumeZone(key, values))
    return PV(affinity=None if required is None else node_terms(required), zones=tuple(zones))


def class_record(obj: Mapping[str, Any]) -> StorageClass:
    """A StorageClass's record."""
    return StorageClass(delayed=obj.get("volumeBindingMode") == "WaitForFirstConsumer")


def claim_record(obj: Mapping[str, Any]) -> ResourceClaim:
    """A ResourceClaim's record (``resource.k8s.io/v1``)."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    allocation = status.get("allocation")
    selector = (allocation or {}).get("nodeSelector")
    return ResourceClaim(
        uid=str(meta.get("uid", "")),
        devices=dict((obj.get("spec") or {}).get("devices") or {}),
        deleting=bool(meta.get("deletionTimestamp")),
        owner=_owner(meta),
        allocated=allocation is not None,
        allocation=allocation,
        nodes=None if selector is None else node_terms(selector),
        reserved=tuple(str(r.get("uid", "")) for r in status.get("reservedFor") or ()),
    )


def api_object(obj: Mapping[str, Any]) -> ApiObject:
    """A DeviceClass or ResourceSlice kept whole, but for its metadata (its name only)."""
    meta = {"name": obj["metadata"]["name"]}
    return ApiObject({"metadata": meta, "spec": obj.get("spec") or {}})


def device_class(obj: Mapping[str, Any]) -> ApiObject:
    """A DeviceClass kept whole, but for its metadata (its name and creation time: the
    newer of two classes mapping one extended resource serves it)."""
    meta = obj["metadata"]
    kept = {k: meta[k] for k in ("name", "creationTimestamp") if k in meta}
    return ApiObject({"metadata": kept, "spec": obj.get("spec") or {}})


def pod_uses(obj: Mapping[str, Any]) -> Uses | None:
    """The claims a pod names (None: none), its template claims resolved through
    ``status.resourceClaimStatuses`` (the resourceclaim controller's names)."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    name = str(meta.get("name", ""))
    volumes = []
    for v in spec.get("volumes") or ():
        if (pvc := v.get("persistentVolumeClaim")) is not None:
            volumes.append(VolumeUse(str(pvc.get("claimName", ""))))
        elif v.get("ephemeral") is not None:
            volumes.append(VolumeUse(f"{name}-{v.get('name', '')}", ephemeral=True))
    made = {
        str(s.get("name", "")): str(s.get("resourceClaimName") or "")
        for s in (obj.get("status") or {}).get("resourceClaimStatuses") or ()
    }
    claims = []
    for c in spec.get("resourceClaims") or ():
        entry = str(c.get("name", ""))
        if c.get("resourceClaimName"):
            claims.append(ClaimUse(entry, claim=str(c["resourceClaimName"])))
        elif c.get("resourceClaimTemplateName"):
            claims.append(
                ClaimUse(entry, claim=made.get(entry, ""), template=True, pending=entry not in made)
            )
        else:
            claims.append(ClaimUse(entry, unsupported=True))
    asks = container_asks(obj)
    if not volumes and not claims and not asks:
        return None
    return Uses(
        namespace=str(meta.get("namespace") or "default"),
        pod=name,
        uid=str(meta.get("uid", "")),
        volumes=tuple(volumes),
        claims=tuple(claims),
        asks=asks,
    )


# --- the verdict ----------------------------------------------------------------------------

Lookup = Callable[[Key], Record | None]
"""The record of an object (None: it does not exist)."""


def _wait(plugin: str, kind: str, detail: str, resource: str = "") -> Claims:
    """The pod waits on every node: ``plugin``'s PreFilter said why."""
    reason = Reason(
        kind=kind, code=UNRESOLVABLE, detail=detail, resource=resource, nodes=0, plugin=plugin
    )
    return Claims(wait=reason)


EVERY_CLASS: Key = ("dclass", "*")
"""Read by a verdict that maps extended resources: any DeviceClass may change it."""


def claims_of(
    uses: Uses,
    lookup: Lookup,
    mapping: Mapping[str, str] | None = None,
    plain: Iterable[str] = (),
) -> tuple[Claims, frozenset[Key]]:
    """What ``uses`` allow (see the module docstring), and every object it read (a
    change to one may change the verdict). ``mapping``: resource name → DeviceClass
    (shared/core/dra/extended.py ``class_mapping``); ``plain``: the extended names the
    pod's node-fit request carries (``PodSpec.requests``), the others being Tessera's
    device names."""
    reads: set[Key] = set()

    def read(kind: str, name: str) -> Record | None:
        key = (kind, f"{uses.namespace}/{name}" if kind in ("pvc", "claim") else name)
        reads.add(key)
        return lookup(key)

    found = _claims(uses, read)
    if uses.asks and found.wait is None:
        reads.add(EVERY_CLASS)
        found = _extended(uses, found, mapping or {}, plain, read)
    return found, frozenset(reads)


def _extended(
    uses: Uses, found: Claims, mapping: Mapping[str, str], plain: Iterable[str], read: Read
) -> Claims:
    """``found`` with the claim the pod's mapped extended resources become."""
    ext = extended_claim(uses.asks, mapping, plain)
    if ext is None:
        return found
    classes = dict(found.classes)
    for name in ext.classes:
        obj = read("dclass", name)
        if isinstance(obj, ApiObject):
            classes[name] = obj.obj
    claim = DraClaim(uses.namespace, "", "", dict(ext.devices), mappings=ext.mappings)
    return msgspec.structs.replace(found, extended=claim, mapped=ext.names, classes=classes)


Read = Callable[[str, str], Record | None]


def _claims(uses: Uses, read: Read) -> Claims:
    """kube-scheduler's plugins in its order (DynamicResources' PreEnqueue runs before
    any of them): the first wait, or what the nodes must offer."""
    claims = _resource_claims(uses, read)
    if isinstance(claims, Claims):
        return claims
    volumes = _volumes(uses, read)
    if isinstance(volumes, Claims):
        return volumes
    devices = []
    counts: dict[str, dict[str, float]] = {}
    allocate: list[DraClaim] = []
    reserve: list[DraClaim] = []
    classes: dict[str, dict[str, Any]] = {}
    # DynamicResources' PreFilter: each claim allocated and reserved for the pod, or
    # not allocated: the allocator allocates it (services/device_allocator/dra.py).
    for use, claim in zip((u for u in uses.claims if u.claim), claims, strict=True):
        if claim.allocation is not None:  # what it counts in the pod's queue
            counted = held(claim.devices, claim.allocation)
        else:
            counted = asked(claim.devices)
        if counted:
            counts[claim.uid] = counted
        if not claim.allocated:
            allocate.append(DraClaim(uses.namespace, use.claim, claim.uid, claim.devices))
            for name in claim.classes():
                found = read("dclass", name)
                if isinstance(found, ApiObject):
                    classes[name] = found.obj
            continue
        # The binder reserves it for the pod, and checks its devices' binding conditions
        # again if it has any (a binder that stopped while waiting left it reserved).
        if uses.uid not in claim.reserved or binding.conditioned(claim.allocation):
            reserve.append(
                DraClaim(uses.namespace, use.claim, claim.uid, allocation=claim.allocation)
            )
        if claim.nodes is not None:
            devices.append(claim.nodes)
    return Claims(
        volumes=volumes[0],
        zones=volumes[1],
        devices=tuple(devices),
        allocate=tuple(allocate),
        reserve=tuple(reserve),
        classes=classes,
        counts=counts,
    )


def _resource_claims(uses: Uses, read: Read) -> list[ResourceClaim] | Claims:
    """DynamicResources' PreEnqueue: every ResourceClaim exists and is the pod's own."""
    pod = f"{uses.namespace}/{uses.pod}"
    claims: list[ResourceClaim] = []
    for use in uses.claims:
        if use.unsupported:
            return _wait("DynamicResources", "claim-unsupported", pod, use.name)
        if use.pending:
            return _wait("DynamicResources", "claim-not-created", pod)
        if not use.claim:
            continue
        claim = read("claim", use.claim)
        if not isinstance(claim, ResourceClaim):
            return _wait("DynamicResources", "claim-missing", f"{uses.namespace}/{use.claim}")
        if claim.deleting:
            return _wait("DynamicResources", "claim-deleting", use.claim)
        if use.template and claim.owner != uses.uid:
            return _wait(
                "DynamicResources", "claim-not-owned", f"{uses.namespace}/{use.claim}", pod
            )
        claims.append(claim)
    return claims


def _volumes(
    uses: Uses, read: Read
) -> tuple[tuple[BoundVolume, ...], tuple[VolumeZone, ...]] | Claims:
    """VolumeRestrictions', VolumeBinding's and VolumeZone's PreFilters, then Tessera's
    wait for a claim that binds late; else each bound claim's volume, and their zones."""
    pod = f"{uses.namespace}/{uses.pod}"
    for volume in uses.volumes:  # VolumeRestrictions: claims written in the pod exist
        if not volume.ephemeral and not isinstance(read("pvc", volume.claim), PVC):
            return _wait("VolumeRestrictions", "pvc-missing", volume.claim)
    pvcs: list[PVC] = []
    for volume in uses.volumes:  # VolumeBinding: every claim usable ...
        pvc = read("pvc", volume.claim)
        if not isinstance(pvc, PVC):
            return _wait(
                "VolumeBinding",
                "pvc-ephemeral" if volume.ephemeral else "pvc-missing",
                volume.claim,
            )
        if pvc.lost:
            return _wait("VolumeBinding", "pvc-lost", volume.claim, pvc.volume)
        if pvc.deleting:
            return _wait("VolumeBinding", "pvc-deleting", volume.claim)
        if volume.ephemeral and pvc.owner != uses.uid:
            return _wait("VolumeBinding", "pvc-not-owned", f"{uses.namespace}/{volume.claim}", pod)
        pvcs.append(pvc)
    delayed: list[tuple[VolumeUse, PVC]] = []
    for volume, pvc in zip(uses.volumes, pvcs, strict=True):  # ... and bound, or late
        if pvc.bound and pvc.volume:
            continue
        storage_class = read("class", pvc.storage_class) if pvc.storage_class else None
        late = isinstance(storage_class, StorageClass) and storage_class.delayed
        if not late or pvc.volume:
            return _wait("VolumeBinding", "pvc-unbound", "")
        delayed.append((volume, pvc))
    # VolumeZone (claims written in the pod, not ephemeral ones): each bound one's volume
    # exists; its zone labels. VolumeBinding's filter reads every bound one's volume.
    found: dict[str, PV | None] = {}
    zones: list[VolumeZone] = []
    for volume, pvc in zip(uses.volumes, pvcs, strict=True):
        if not pvc.volume:
            continue  # binds late
        pv = read("pv", pvc.volume)
        found[pvc.volume] = pv if isinstance(pv, PV) else None
        if volume.ephemeral:
            continue
        if not isinstance(pv, PV):
            return _wait("VolumeZone", "pv-missing", pvc.volume)
        zones.extend(pv.zones)
    if delayed:
        volume, pvc = delayed[0]
        return _wait(
            "VolumeBinding", "pvc-delayed", f"{uses.namespace}/{volume.claim}", pvc.storage_class
        )
    bound = tuple(
        BoundVolume(missing=True) if (pv := found[p.volume]) is None else BoundVolume(pv.affinity)
        for p in pvcs
    )
    return bound, tuple(zones)
