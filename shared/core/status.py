"""Outcomes of filters and placements: one ``Status`` type, reasons as data, text once.

Every filter (a device family on one node, a node-fit plugin) and every placement (one
pod, a gang) answers with a :class:`Status`. Its :class:`Code` says what happens next,
as kube-scheduler's framework does:

- ``SUCCESS``: it fits;
- ``UNSCHEDULABLE``: not now; retry when the cluster changes (a pod leaves, a node comes);
- ``UNRESOLVABLE``: unschedulable and unresolvable: no change of load can help, only a
  new or changed node or a changed pod (preemption never helps either);
- ``ERROR``: an internal failure; back off and retry.

A :class:`Reason` is structured (what kind, which resource, requested, free, capacity)
so tools can say what would make a pod fit; people read its :meth:`Reason.text`,
rendered here and nowhere else. A placement's Status counts its reasons over the nodes
it looked at and renders them as kube-scheduler does (``0/1000 nodes are available:
600 Insufficient cpu, 400 node(s) didn't match Pod's node affinity/selector.``): each
distinct text with its node count, sorted as strings, joined by ``, ``.

Statuses ride on the bus inside ``AllocationFailed``: msgspec Structs, frozen, with
defaults for every field but the code (see the evolution rule in shared/events.py).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence

import msgspec

from shared.core.model import NonNegInt


class Code(enum.IntEnum):
    """What the caller does next (see the module docstring)."""

    SUCCESS = 0
    UNSCHEDULABLE = 1
    UNRESOLVABLE = 2
    ERROR = 3


UNSCHEDULABLE = Code.UNSCHEDULABLE
UNRESOLVABLE = Code.UNRESOLVABLE


# Reason kinds. The texts of kube-scheduler's own plugins are its own, character for
# character (a user greps Events for them); Tessera's device reasons read the same way.
_TEXT: dict[str, str] = {
    # --- node fit (kube-scheduler's plugins) -------------------------------------------
    "insufficient": "Insufficient {resource}",
    "too-many-pods": "Too many pods",
    "node-unschedulable": "node(s) were unschedulable",
    "node-name": "node(s) didn't match the requested node name",
    "node-set": "node(s) didn't satisfy plugin(s) [NodeAffinity]",
    "affinity-conflict": "pod affinity terms conflict",
    "node-affinity": "node(s) didn't match Pod's node affinity/selector",
    "taint": "node(s) had untolerated taint(s)",
    "node-ports": "node(s) didn't have free ports for the requested pod ports",
    "pod-affinity": "node(s) didn't match pod affinity rules",
    "pod-anti-affinity": "node(s) didn't match pod anti-affinity rules",
    "existing-anti-affinity": "node(s) didn't satisfy existing pods anti-affinity rules",
    "spread": "node(s) didn't match pod topology spread constraints",
    "spread-label": "node(s) didn't match pod topology spread constraints (missing required label)",
    # volumes and resource claims (VolumeBinding, VolumeZone, DynamicResources): the
    # claim's name is ``detail``, a second name ``resource`` (shared/core/claims.py)
    "volume-node": "node(s) didn't match PersistentVolume's node affinity",
    "volume-missing": "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)",
    "volume-zone": "node(s) had no available volume zone",
    "pvc-missing": 'persistentvolumeclaim "{detail}" not found',
    "pvc-ephemeral": "waiting for ephemeral volume controller to create the "
    'persistentvolumeclaim "{detail}"',
    "pvc-lost": 'persistentvolumeclaim "{detail}" bound to non-existent persistentvolume '
    '"{resource}"',
    "pvc-deleting": 'persistentvolumeclaim "{detail}" is being deleted',
    "pvc-not-owned": "PVC {detail} was not created for pod {resource} (pod is not owner)",
    "pvc-unbound": "pod has unbound immediate PersistentVolumeClaims",
    "pv-missing": 'persistentvolume "{detail}" not found',
    "claim-not-created": 'pod "{detail}": ResourceClaim not created yet',
    "claim-unsupported": 'pod "{detail}", spec.resourceClaim "{resource}": none of the '
    "supported fields are set",
    "claim-missing": 'could not find ResourceClaim "{detail}"',
    "claim-deleting": 'resourceclaim "{detail}" is being deleted',
    "claim-not-owned": "ResourceClaim {detail} was not created for Pod {resource} (Pod is not "
    "owner)",
    "claim-node": "resourceclaim not available on the node",
    "claim-allocate": "{detail}",
    "claim-class": "{detail}",
    # ... where Tessera waits instead of doing what kube-scheduler does
    "pvc-delayed": "pod uses PersistentVolumeClaim {detail}, whose StorageClass {resource} "
    "binds it only once a node is chosen (volumeBindingMode: WaitForFirstConsumer); Tessera "
    "does not choose nodes for volumes yet: use kube-scheduler for this pod",
    # --- devices ---------------------------------------------------------------------
    "device-insufficient": "insufficient {resource}",
    "type-excluded": "gpu type excluded",
    "uuid-excluded": "gpu uuid excluded",
    "index-excluded": "gpu index excluded",
    "unhealthy": "device unhealthy or cordoned",
    "split-reached": "device split count reached",
    "busy": "no idle device for an exclusive request",
    "group-spread": "card already used by the PodGroup (vgpu-podgroup-policy: spread)",
    "mps-unavailable": "device(s) in MPS mode have no MPS daemon running",
    "mps-user-unset": "device(s) in MPS mode serve only pods that set runAsUser",
    "mps-other-user": "device(s) serve another user's MPS clients",
    "mps-multi-card": "device(s) in MPS mode serve one card per container",
    "numa": "not enough devices on one NUMA node",
    "larger-than-card": "{resource} larger than the card",
    "too-few-devices": "{resource}: {requested} devices asked, {free} eligible on the node{detail}",
    "too-few-npus": "{resource}: {requested} NPUs asked, {free} on the node",
    "no-pool": "no {resource} devices in mode {detail}",
    "mode-mismatch": "{resource}: vgpu-mode {detail} cannot serve it",
    "not-enabled": "{resource}: plugin {detail} is not enabled in scheduler.plugins",
    "no-mig-geometry": "no MIG geometry known for {detail}",
    "mig-too-small": "no MIG instance large enough",
    "mig-none-free": "no free MIG instance large enough",
    "no-template": "no free {detail} vNPU template",
    "no-template-for": "no vNPU template for {detail}",
    "admitting": "another pod asking {requested} {resource} device(s) is being admitted by its "
    "kubelet",
    "held": "node held for gang {detail}, which has waited longest",
    # --- whole-pod and whole-gang outcomes ----------------------------------------------
    "no-devices": "the pod asks for no devices",
    "invalid": "{resource}: {detail}",
    "queue": "{detail}",
    "waiting": "{detail}",
    "error": "internal error: {detail}",
}


# What would make a node take the pod, per reason kind (``tessera explain``); the
# amounts are filled in by ``Reason.hint``.
_HINT: dict[str, str] = {
    "insufficient": "{short} more {resource} free on the node ({free} of {capacity} free)",
    "device-insufficient": "{short} more {resource} free on one device (best: {free} of "
    "{capacity} free)",
    "too-many-pods": "one of the node's pods must end (it runs its most pods)",
    "node-unschedulable": "uncordon the node (kubectl uncordon)",
    "node-name": "the pod names another node (spec.nodeName)",
    "node-set": "the pod's node affinity names other nodes",
    "affinity-conflict": "the pod's affinity terms contradict each other: fix the pod",
    "node-affinity": "label the node to match the pod's nodeSelector/affinity, or change the pod",
    "taint": "add a toleration for the node's taint to the pod, or remove the taint",
    "node-ports": "a pod on the node holds the same hostPort",
    "pod-affinity": "a pod the affinity asks for must run in the node's topology domain",
    "pod-anti-affinity": "a pod the anti-affinity excludes runs in the node's topology domain",
    "existing-anti-affinity": "a pod on the node excludes this one (its anti-affinity)",
    "spread": "placing it here would pass the topology spread's maxSkew",
    "spread-label": "label the node with the spread's topology key",
    "volume-node": "the pod's PersistentVolume may be used only from nodes matching its "
    "spec.nodeAffinity",
    "volume-missing": "recreate the PersistentVolume the pod's claim is bound to",
    "volume-zone": "the pod's PersistentVolume is in another zone or region (its labels)",
    "pvc-missing": "create the PersistentVolumeClaim",
    "pvc-unbound": "the PersistentVolumeClaim must be bound to a volume (its StorageClass "
    "binds at once: see the claim's events)",
    "pvc-delayed": "schedule the pod with kube-scheduler, or bind the claim to a volume first",
    "claim-missing": "create the ResourceClaim",
    "claim-node": "the pod's ResourceClaim is allocated on devices this node cannot reach",
    "claim-class": "create the DeviceClass, or name one that exists",
    "claim-allocate": "change the claim's request (class, selectors, capacity), or wait for "
    "devices to be freed or published",
    "type-excluded": "the pod's gpu type annotations exclude this model",
    "uuid-excluded": "the pod's gpu uuid annotations exclude these cards",
    "index-excluded": "the pod's gpu index selection excludes these cards",
    "unhealthy": "the devices must be healthy and not cordoned",
    "split-reached": "one of the pods sharing the device must end (its share count is reached)",
    "busy": "an idle card: all pods on one card must end",
    "group-spread": "another card, not used by the PodGroup",
    "mps-unavailable": "the card's MPS daemon must run (the node's tessera-mps-control pod "
    "starts it; see its log and the node agent's)",
    "mps-user-unset": "set runAsUser on the pod (MPS serves one user per card)",
    "mps-other-user": "the other user's MPS pods on the card must end, or run as their user",
    "mps-multi-card": "ask for one card per container (an MPS client reaches one card's "
    "daemon), or for another mode",
    "numa": "enough free devices on one NUMA node",
    "larger-than-card": "ask for at most {capacity} {resource}",
    "too-few-devices": "ask for at most {free} devices, or a node with more",
    "too-few-npus": "ask for at most {free} NPUs, or a node with more",
    "no-pool": "a node with devices in that mode",
    "mode-mismatch": "a card in a mode that serves the request",
    "not-enabled": "a profile that enables the plugin, or a pod that does not need it",
    "mig-none-free": "a free MIG instance: one of its pods must end",
    "mig-too-small": "a smaller request, or a card with a larger MIG profile",
    "no-template": "a free vNPU template: one of its pods must end",
    "admitting": "wait: the kubelet is admitting another pod there",
    "held": "wait: the node is held for a gang that has waited longer",
}


def _amount(resource: str, value: int | None) -> str:
    """An amount in the unit :class:`Reason` keeps it in, as people read it."""
    if value is None:
        return "?"
    if resource == "cpu":
        return f"{value}m"
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        return f"{value / 2**20:.0f}Mi"
    if "core" in resource or resource.endswith("percentage"):
        return f"{value}%"
    if "mem" in resource:
        return f"{value}MiB"
    return str(value)


class Reason(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Why a node (or the cluster) cannot take a pod: structured, rendered by ``text``.

    ``requested``, ``free`` and ``capacity`` are in the resource's unit (millicores for
    cpu, bytes for memory, MiB for device memory, percent for device cores, devices for
    counts) and never appear in ``text``: nodes rejecting for the same reason must count
    as one line of the message whatever their free amounts. In a counted Status,
    ``nodes`` says on how many nodes the reason was found, and ``free``/``capacity``
    are the largest seen (what the best node offers).
    """

    kind: str
    code: Code = Code.UNSCHEDULABLE
    resource: str = ""
    requested: int | None = None
    free: int | None = None
    capacity: int | None = None
    detail: str = ""
    nodes: NonNegInt = 1
    plugin: str = ""
    """The plugin that found it (kube-scheduler's name for its own filters, e.g.
    ``NodeResourcesFit``; a device family's or Tessera's own for the rest): set by the
    plugin, read by ``tessera explain``, metrics and the differential test."""

    def text(self) -> str:
        """The reason as people read it (the one place texts are made)."""
        template = _TEXT.get(self.kind)
        if template is None:
            return self.detail or self.kind
        return template.format(
            resource=self.resource,
            requested="" if self.requested is None else self.requested,
            free="" if self.free is None else self.free,
            detail=self.detail,
        )

    def hint(self) -> str:
        """What would make the node take the pod, or "" when there is nothing to say."""
        template = _HINT.get(self.kind)
        if template is None:
            return ""
        short = None
        if self.requested is not None and self.free is not None:
            short = max(self.requested - self.free, 0)
        return template.format(
            resource=self.resource,
            short=_amount(self.resource, short),
            free=_amount(self.resource, self.free) if "{free} of" in template else self.free,
            capacity=_amount(self.resource, self.capacity)
            if self.kind != "larger-than-card"
            else self.capacity,
        )

    @property
    def unresolvable(self) -> bool:
        """Whether no change of load can remove this reason (only a changed node or pod)."""
        return self.code == Code.UNRESOLVABLE


class Status(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The outcome of a filter on one node, or of placing a pod or a gang.

    ``nodes`` is how many nodes were looked at (the N of ``0/N nodes are available``);
    zero for a per-node status. ``context`` comes before the counted reasons in the
    message (``2/4 tasks in gang unschedulable``; a queue's refusal).
    """

    code: Code = Code.SUCCESS
    reasons: tuple[Reason, ...] = ()
    nodes: NonNegInt = 0
    context: str = ""
    note: str = ""
    """What is being done about it (a preemption, a hold), after the reasons, as
    kube-scheduler appends its preemption message."""

    @property
    def ok(self) -> bool:
        """``Code.SUCCESS``: it fits, or it was placed."""
        return self.code == Code.SUCCESS

    @property
    def unresolvable(self) -> bool:
        """Not now and not after any change of load: preemption cannot help."""
        return self.code == Code.UNRESOLVABLE

    @property
    def plugin(self) -> str:
        """The plugin that decided a per-node status (its first reason's), or ""."""
        return self.reasons[0].plugin if self.reasons else ""

    def message(self) -> str:
        """What the pod's Event and condition say (kube-scheduler's shape)."""
        if self.nodes > 0:
            # A reason on no node in particular (a PreFilter's) is said without a count.
            lines = sorted(f"{r.nodes} {r.text()}" if r.nodes else r.text() for r in self.reasons)
            body = f"0/{self.nodes} nodes are available"
            body += f": {', '.join(lines)}." if lines else "."
        else:
            body = "; ".join(r.text() for r in self.reasons)
        if self.context:
            body = f"{self.context}: {body}" if body else self.context
        if self.note:
            body = f"{body} {self.note}" if body else self.note
        return body

    def with_context(self, context: str) -> Status:
        """This status with ``context`` said before its reasons (``2/4 tasks in gang
        unschedulable``)."""
        return msgspec.structs.replace(self, context=context)

    def with_note(self, note: str) -> Status:
        """This status with ``note`` (a sentence) added to the end of its message."""
        if not note:
            return self
        return msgspec.structs.replace(self, note=f"{self.note} {note}".strip())


SUCCESS = Status()


def fail(*reasons: Reason) -> Status:
    """A per-node status for ``reasons``: unresolvable only if every reason is."""
    unresolvable = bool(reasons) and all(r.unresolvable for r in reasons)
    return Status(code=Code.UNRESOLVABLE if unresolvable else Code.UNSCHEDULABLE, reasons=reasons)


def error(detail: str) -> Status:
    """An internal failure (``Code.ERROR``): the caller backs off and retries."""
    return Status(code=Code.ERROR, reasons=(Reason(kind="error", code=Code.ERROR, detail=detail),))


def counted(per_node: Iterable[Status], nodes: int) -> Status:
    """The placement outcome over ``nodes`` nodes from each rejecting node's status.

    Reasons with the same text are merged: their node counts add up and the largest
    free and capacity are kept. Unresolvable when every node's status is (and there was
    at least one node); else unschedulable.
    """
    merged: dict[str, Reason] = {}
    every_unresolvable = nodes > 0
    for status in per_node:
        every_unresolvable = every_unresolvable and status.unresolvable
        for r in status.reasons:
            _merge(merged, r, 1)
    code = Code.UNRESOLVABLE if every_unresolvable else Code.UNSCHEDULABLE
    return Status(code=code, reasons=tuple(merged.values()), nodes=nodes)


def combined(statuses: Sequence[Status]) -> Status:
    """One placement outcome over the nodes of several allocator shards (counted each
    over its own nodes), as one allocator looking at them all would have said it: node
    counts add up, reasons merge as in :func:`counted`, unresolvable only if each is;
    the first context and every note are kept."""
    if len(statuses) == 1:
        return statuses[0]
    merged: dict[str, Reason] = {}
    for status in statuses:
        for r in status.reasons:
            _merge(merged, r, r.nodes)
    unresolvable = bool(statuses) and all(s.unresolvable for s in statuses)
    return Status(
        code=Code.UNRESOLVABLE if unresolvable else Code.UNSCHEDULABLE,
        reasons=tuple(merged.values()),
        nodes=sum(s.nodes for s in statuses),
        context=next((s.context for s in statuses if s.context), ""),
        note=" ".join(s.note for s in statuses if s.note),
    )


def _merge(merged: dict[str, Reason], r: Reason, nodes: int) -> None:
    """Count ``r`` on ``nodes`` more nodes among ``merged`` (by text)."""
    text = r.text()
    seen = merged.get(text)
    if seen is None:
        merged[text] = msgspec.structs.replace(r, nodes=nodes)
    else:
        merged[text] = msgspec.structs.replace(
            seen,
            nodes=seen.nodes + nodes,
            free=_larger(seen.free, r.free),
            capacity=_larger(seen.capacity, r.capacity),
        )


def _larger(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)
