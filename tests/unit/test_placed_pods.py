"""A pod on a node read as ``kube.PlacedPod`` (shared/kube.py ``read_pod``: only what is
read of it decoded) or ``kube.BoundPod`` reads the same as the whole pod, for every
reader of pods on nodes: node fit (``pod_spec``), the allocator's rebuild
(``bound_grant``, with its specs read once per shape), the watcher's announcement and
the disruption budgets; a pod on no node is read whole."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from services.device_allocator.reservations import bound_grant
from services.watcher.translate import updated_event, volcano_job
from shared import kube
from shared.core import annotations as ann
from shared.core.disruption import counted
from shared.core.hosts import pod_spec
from shared.core.model import NodeName
from tests import strategies as s
from tests.unit.corekit import MANAGED

KEY = b"k" * 32
BOUND = msgspec.json.Decoder(kube.BoundPod)

UNREAD: dict[str, Any] = {
    "metadata": {
        "generation": 1,
        "managedFields": [
            {"manager": "kubelet", "operation": "Update", "fieldsV1": {"f:status": {}}}
        ],
        "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "controller": True}
        ],
    },
    "spec": {
        "restartPolicy": "Always",
        "volumes": [{"name": "token", "projected": {"sources": []}}],
        "serviceAccountName": "default",
    },
    "status": {
        "hostIP": "10.0.0.1",
        "conditions": [{"type": "Ready", "status": "True", "lastProbeTime": None}],
        "containerStatuses": [{"name": "main", "ready": True, "state": {"running": {}}}],
    },
}
"""What a real pod carries beside what is read of it (most of its JSON)."""


def realistic(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` with the parts a real pod has that no reader of pods on nodes reads."""
    out = copy.deepcopy(pod)
    for part, fields in UNREAD.items():
        section = out.setdefault(part, {})
        for k, v in fields.items():
            section.setdefault(k, copy.deepcopy(v))
    for c in out["spec"].get("containers") or ():
        c.setdefault("env", [{"name": "A", "value": "1"}])
        c.setdefault("volumeMounts", [{"name": "token", "mountPath": "/var/run"}])
        c.setdefault("terminationMessagePath", "/dev/termination-log")
    return out


@settings(max_examples=300, deadline=None)
@given(s.api_pods, st.booleans(), st.booleans())
def test_a_pod_on_a_node_reads_the_same_placed_as_whole(
    pod: dict[str, Any], on_node: bool, extras: bool
) -> None:
    pod = realistic(pod) if extras else pod
    if on_node:
        pod["spec"]["nodeName"] = "node-1"
    else:
        pod["spec"].pop("nodeName", None)
    raw = msgspec.json.encode(pod)
    read = kube.read_pod(msgspec.Raw(raw))
    if not on_node:
        assert read == pod  # read whole: the parser and the claims read it all
        return
    assert len(msgspec.json.encode(read)) <= len(raw)
    assert pod_spec(read, MANAGED) == pod_spec(pod, MANAGED)
    assert bound_grant(read, MANAGED, KEY) == bound_grant(pod, MANAGED, KEY)
    for as_bound in BOUND.decode(raw), read:  # the allocator's rebuild, by shape or not
        assert bound_grant(as_bound, MANAGED, KEY, {}) == bound_grant(pod, MANAGED, KEY)
    assert counted(read) == counted(pod)
    assert volcano_job(read["metadata"]) == volcano_job(pod["metadata"])
    assert ann.read_grants(read["metadata"].get("annotations") or {}) == ann.read_grants(
        pod["metadata"].get("annotations") or {}
    )
    ref = kube.pod_ref(pod)
    node, phase = NodeName("node-1"), (pod.get("status") or {}).get("phase", "Pending")
    host = pod_spec(pod, MANAGED)
    whole = updated_event(pod, ref, node, phase, host)
    placed = updated_event(read, ref, node, phase, host)
    assert msgspec.structs.replace(placed, event_id=whole.event_id, emitted_at=0.0) == (
        msgspec.structs.replace(whole, emitted_at=0.0)
    )
    if extras:
        assert "managedFields" not in read["metadata"]
        assert "containerStatuses" not in read.get("status", {})


def test_a_pod_whose_fields_are_not_of_their_types_is_read_whole() -> None:
    """Never expected of the API server; read whole, as before (its readers skip it)."""
    pod = {"metadata": {"name": "p", "uid": "u", "labels": {"a": 1}}, "spec": {"nodeName": "n"}}
    assert kube.read_pod(msgspec.json.encode(pod)) == pod


def test_pods_of_one_shape_share_one_spec_but_each_its_node() -> None:
    """The rebuild's shapes (``bound_grant`` with ``shapes``): one ``pod_spec`` per shape,
    each pod on its own node; another label is another shape."""
    shapes: dict[bytes, Any] = {}
    base = {
        "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "labels": {"app": "x"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {}}]},
    }
    other = copy.deepcopy(base)
    other["metadata"].update(name="b", uid="u2")
    other["spec"]["nodeName"] = "n2"
    third = copy.deepcopy(other)
    third["metadata"]["labels"] = {"app": "y"}
    grants = [bound_grant(p, MANAGED, KEY, shapes) for p in (base, other, third)]
    assert len(shapes) == 2
    for pod, found in zip((base, other, third), grants, strict=True):
        assert found is not None
        assert found[0].spec == pod_spec(pod, MANAGED)
