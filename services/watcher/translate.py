"""How the watcher reads the API server's objects as Tessera's events.

Pure functions of one object each: a pod on a node as ``PodUpdated``, a pod waiting for
Tessera as ``PodPending``, a PodGroup, Queue or Volcano Job as its ``*Updated`` event.
What one of them raises on an object that is not shaped as its schema says is
:data:`UNREADABLE`: the caller logs the object and skips it (service.py, mirrors.py).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec

from shared import events as ev
from shared.core import annotations as ann
from shared.core import network, subgroups
from shared.core.consolidation import PREEMPTABLE
from shared.core.hosts import PodSpec
from shared.core.model import NodeName, PodRef, PodRequest
from shared.core.request import GROUP_NAME, TASK_SPEC
from shared.core.vcjob import duration_s

TERMINAL = ("Succeeded", "Failed")
"""The phases of a finished pod: it holds nothing on its node any more."""
UNREADABLE = (
    KeyError,
    TypeError,
    ValueError,
    AttributeError,
    msgspec.ValidationError,
    msgspec.EncodeError,
)
"""What reading one object of the API server may raise when the object is not as its
schema says: the object is logged (and told, where there is someone to tell) and
skipped, never fatal (any user who can create it could otherwise stop scheduling for
everyone)."""
MAX_DEPTH = 100
"""How deep lists and mappings may nest in a Job's spec, which the bus carries as is (a
real one nests about 15 deep; one nested close to Python's recursion limit could be
decoded by no consumer)."""
VOLCANO_JOBS = "batch.volcano.sh/"


def _timestamp(text: str | None) -> float:
    if not text:
        return 0.0
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def volcano_job(meta: dict[str, Any]) -> str:
    """The Volcano Job that controls a pod (its controller ``ownerReference``), or ''."""
    for owner in meta.get("ownerReferences") or ():
        if (
            owner.get("controller")
            and owner.get("kind") == "Job"
            and str(owner.get("apiVersion", "")).startswith(VOLCANO_JOBS)
        ):
            return str(owner.get("name", ""))
    return ""


def updated_event(
    obj: dict[str, Any], ref: PodRef, node: NodeName, phase: str, host: PodSpec
) -> ev.PodUpdated:
    """A pod on a node, as the watcher announces it (its grants and their signature)."""
    meta, spec = obj["metadata"], obj.get("spec") or {}
    annotations = meta.get("annotations") or {}
    return ev.PodUpdated(
        pod=ref,
        node=node,
        phase=phase,
        grants=ann.read_grants(annotations) or (),
        resource_version=meta.get("resourceVersion", ""),
        spec=host,
        scheduler_name=spec.get("schedulerName", ""),
        signature=annotations.get(ann.SIGNATURE, ""),
        job=volcano_job(meta),
        started_at=_scheduled_at(obj),
        cooldown_s=_cooldown_s(meta),
    )


COOLDOWN = "volcano.sh/cooldown-time"
"""Volcano's ``cdp`` plugin: a pod label (or annotation) holding a Go duration."""


def _scheduled_at(obj: dict[str, Any]) -> float:
    """When the pod was scheduled (its ``PodScheduled`` condition), 0 if not known."""
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            try:
                return _timestamp(condition.get("lastTransitionTime"))
            except ValueError:
                return 0.0
    return 0.0


def _cooldown_s(meta: dict[str, Any]) -> float:
    """``volcano.sh/cooldown-time`` in seconds (the label wins, as in Volcano); 0 when
    absent or not a duration."""
    text = (meta.get("labels") or {}).get(COOLDOWN) or (meta.get("annotations") or {}).get(COOLDOWN)
    found = duration_s(str(text)) if text else None
    return max(found or 0.0, 0.0)


def pending_event(
    obj: dict[str, Any], ref: PodRef, request: PodRequest, host: PodSpec
) -> ev.PodPending:
    """A pod waiting for Tessera, as the watcher announces it."""
    meta, spec = obj["metadata"], obj.get("spec") or {}
    annotations = meta.get("annotations") or {}
    return ev.PodPending(
        pod=ref,
        request=request,
        scheduler_name=spec.get("schedulerName", ""),
        group=annotations.get(GROUP_NAME) or None,
        task=annotations.get(TASK_SPEC) or None,
        priority=int(spec.get("priority") or 0),
        created_at=_timestamp(meta.get("creationTimestamp")),
        resource_version=meta.get("resourceVersion", ""),
        spec=host,
        preemption_policy=str(spec.get("preemptionPolicy") or ""),
        owner=controller(meta),
        preemptable=_marked(meta, PREEMPTABLE),
    )


def controller(meta: dict[str, Any]) -> str:
    """A pod's controller ``ownerReference`` as ``Kind/name`` ("" for a bare pod)."""
    for owner in meta.get("ownerReferences") or ():
        if owner.get("controller") and owner.get("kind") and owner.get("name"):
            return f"{owner['kind']}/{owner['name']}"
    return ""


def _marked(meta: dict[str, Any], key: str) -> bool:
    """The label (which wins, as for the cooldown) or annotation ``key`` is "true"."""
    text = (meta.get("labels") or {}).get(key) or (meta.get("annotations") or {}).get(key)
    return str(text).lower() == "true"


def object_name(obj: Any) -> str:
    """``namespace/name`` (or ``name``) of an object, for a log line, whatever its shape."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    return "/".join(str(meta[k]) for k in ("namespace", "name") if meta.get(k)) or "?"


def namespaced(obj: dict[str, Any]) -> tuple[str, str]:
    """A namespaced object's key: (namespace, name)."""
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def namespace_event(obj: dict[str, Any]) -> ev.NamespaceUpdated:
    """A Namespace's event: its name and labels."""
    return ev.NamespaceUpdated(
        name=str(obj["metadata"]["name"]),
        labels={str(k): str(v) for k, v in (obj["metadata"].get("labels") or {}).items()},
    )


def podgroup_event(obj: dict[str, Any]) -> ev.PodGroupUpdated:
    """A Volcano PodGroup's event: its members, queue, priority, minimum resources and
    subgroup policies (a broken policy is passed on with why, for its pods to be told)."""
    namespace, name = namespaced(obj)
    spec = obj.get("spec") or {}
    policies, errors = subgroups.read_policies(spec.get("subGroupPolicy"))
    annotations = obj["metadata"].get("annotations") or {}
    topology, wrong = network.read_topology(spec.get("networkTopology"), annotations)
    errors += wrong
    return ev.PodGroupUpdated(
        namespace=namespace,
        name=name,
        uid=obj["metadata"].get("uid", ""),
        min_member=max(int(spec.get("minMember") or 1), 1),
        min_task_member={
            str(k): max(int(v), 0) for k, v in (spec.get("minTaskMember") or {}).items()
        },
        queue=spec.get("queue") or "default",
        priority_class=spec.get("priorityClassName") or "",
        min_resources={str(k): str(v) for k, v in (spec.get("minResources") or {}).items()},
        sub_group_policy=policies,
        invalid=subgroups.refusal(errors) if errors else "",
        network_topology=topology,
    )


def hypernode_event(obj: dict[str, Any]) -> ev.HyperNodeUpdated:
    """A Volcano HyperNode's event: its tier and members (what breaks a rule is read as
    best it can be, and said)."""
    hypernode, errors = network.read_hypernode(obj)
    if not hypernode.name:
        raise KeyError("metadata.name")
    return ev.HyperNodeUpdated(
        hypernode=hypernode,
        invalid=network.refusal("HyperNode", errors) if errors else "",
    )


def _duration_field(spec: dict[str, Any], key: str) -> float | None:
    """A Queue's duration field (``"30s"``, ``"10m"``) in seconds; None if unset or not a
    duration (the webhook refuses that)."""
    text = spec.get(key)
    found = duration_s(str(text)) if text not in (None, "") else None
    return max(found, 0.0) if found is not None else None


def queue_event(obj: dict[str, Any]) -> ev.QueueUpdated:
    """A Volcano Queue's event: its weight, capability, guarantee, state, parent and
    deserved share."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    guarantee = (spec.get("guarantee") or {}).get("resource") or {}
    return ev.QueueUpdated(
        name=obj["metadata"]["name"],
        weight=max(int(spec.get("weight") or 1), 0),
        capability={str(k): str(v) for k, v in (spec.get("capability") or {}).items()},
        guarantee={str(k): str(v) for k, v in guarantee.items()},
        reclaimable=bool(spec.get("reclaimable", True)),
        priority=int(spec.get("priority") or 0),
        state=str(status.get("state") or spec.get("state") or "Open"),
        parent=str(spec.get("parent") or ""),
        uid=str(obj["metadata"].get("uid") or ""),
        preempt_min_runtime_s=_duration_field(spec, "preemptMinRuntime"),
        reclaim_min_runtime_s=_duration_field(spec, "reclaimMinRuntime"),
        deserved={str(k): str(v) for k, v in (spec.get("deserved") or {}).items()},
    )


def _depth(value: Any) -> int:
    """How deep lists and mappings nest in ``value``, up to just past :data:`MAX_DEPTH`
    (walked without recursion: the value may nest deeper than the stack allows)."""
    deepest = 0
    todo = [(value, 0)]
    while todo and deepest <= MAX_DEPTH:
        item, depth = todo.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            todo += [(v, depth + 1) for v in item.values()]
        elif isinstance(item, list):
            todo += [(v, depth + 1) for v in item]
    return deepest


def job_event(obj: dict[str, Any]) -> ev.JobUpdated:
    """A Job's event; ValueError when its spec nests deeper than :data:`MAX_DEPTH`."""
    namespace, name = namespaced(obj)
    spec = obj.get("spec") or {}
    if _depth(spec) > MAX_DEPTH:
        raise ValueError(f"its spec nests more than {MAX_DEPTH} levels deep")
    return ev.JobUpdated(
        namespace=namespace,
        name=name,
        uid=obj["metadata"].get("uid", ""),
        spec=spec,
    )
