"""The allocator's answers to ``tessera.ctl.view.ledger`` and ``tessera.ctl.view.explain``
(shared/views.py): its ledger as people read it, and every node's verdict on a pod."""

from __future__ import annotations

import time
from collections.abc import Container, Mapping

from shared import views
from shared.core.ledger import Dev, Ledger, NodeState
from shared.core.model import DeviceGrant, GangKey, NodeName, PodUID
from shared.core.placement import GangMember, Placer
from shared.core.status import Status


def ledger_view(
    ledger: Ledger,
    reserved: Container[PodUID],
    refused: Mapping[NodeName, str],
    query: views.LedgerQuery,
    instance: str,
) -> views.LedgerView:
    """Every node of ``query`` (all when it names none) with its devices and grants;
    ``reserved``: pods decided and not yet bound."""
    on: dict[str, list[views.GrantView]] = {}
    for uid, pod in ledger.pods.items():
        bound = uid not in reserved
        group = str(pod.group) if pod.group is not None else None
        for c in pod.containers:
            if c.reuses:
                continue
            for d in c.devices:
                on.setdefault(d.uuid, []).append(
                    _grant(pod.pod.namespace, pod.pod.name, uid, c.container, d, bound, group)
                )
    wanted = set(query.nodes)
    nodes = [
        _node(node, on)
        for name, node in sorted(ledger.nodes.items())
        if not wanted or name in wanted
    ]
    nodes += [
        views.NodeView(name=name, refused=f"runs config {digest}, not this allocator's")
        for name, digest in sorted(refused.items())
        if not wanted or name in wanted
    ]
    return views.LedgerView(nodes=tuple(nodes), instance=instance, taken_at=time.time())


def _grant(
    namespace: str,
    pod: str,
    uid: str,
    container: str,
    d: DeviceGrant,
    bound: bool,
    group: str | None,
) -> views.GrantView:
    return views.GrantView(
        namespace=namespace,
        pod=pod,
        uid=uid,
        container=container,
        memory_mib=d.memory_mib,
        cores=d.cores,
        exclusive=d.exclusive,
        mig_profile=d.mig_profile,
        vnpu_template=d.vnpu_template,
        bound=bound,
        group=group,
    )


def _node(node: NodeState, on: Mapping[str, list[views.GrantView]]) -> views.NodeView:
    spec = node.host.spec
    return views.NodeView(
        name=node.name,
        devices=tuple(_device(d, on.get(d.uuid, [])) for d in node.devices),
        pods=len(node.host.pods),
        unschedulable=spec.unschedulable if spec is not None else False,
    )


def _device(d: Dev, grants: list[views.GrantView]) -> views.DeviceView:
    return views.DeviceView(
        uuid=d.uuid,
        index=d.index,
        vendor=d.vendor,
        model=d.model,
        mode=d.mode,
        memory_mib=d.total_mem,
        cores=d.total_cores,
        slots=d.slots,
        used_memory_mib=d.used_mem,
        used_cores=d.used_cores,
        used_slots=d.used_slots,
        healthy=d.healthy,
        cordoned=d.cordoned,
        mps=d.info.mps or "",
        grants=tuple(sorted(grants, key=lambda g: (g.namespace, g.pod, g.container))),
    )


def explain_view(placer: Placer, query: views.ExplainQuery) -> views.ExplainView:
    """Every node's verdict on the pod now, those that would take it first (its
    ResourceClaims allocated on each by the DynamicResources filter, dra.py)."""
    group = GangKey(namespace=query.pod.namespace, name=query.group) if query.group else None
    member = GangMember(pod=query.pod, request=query.request, group=group, spec=query.spec)
    outcome, answers = placer.verdicts(member)
    verdicts = [_verdict(node, status) for node, status in answers]
    return views.ExplainView.of(query.pod, verdicts, None if outcome.ok else outcome)


def _verdict(node: str, status: Status | None) -> views.NodeVerdict:
    if status is None:
        return views.NodeVerdict(node=node, fits=True)
    return views.NodeVerdict(
        node=node,
        reasons=status.reasons,
        texts=tuple(r.text() for r in status.reasons),
        hints=tuple(r.hint() for r in status.reasons),
    )
