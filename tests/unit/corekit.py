"""Small builders for the pure core's tests: devices, nodes, pods as the API server has them."""

from __future__ import annotations

import itertools
from typing import Any

from shared.core.ledger import Ledger
from shared.core.model import (
    DeviceInfo,
    DeviceUUID,
    GangKey,
    MigInstance,
    MpsState,
    NodeName,
    PodRef,
    PodRequest,
    PodUID,
    SharingMode,
    Vendor,
)
from shared.core.placement import Placement, PlacementConfig, Placer
from shared.core.request import RequestParser
from shared.core.spec import DeviceSpecs, NodeOverride

SPECS = DeviceSpecs()
PARSER = RequestParser(SPECS)
MANAGED = frozenset(PARSER.table.by_name)
"""Tessera's device names: node fit leaves them to the device families."""
_ids = itertools.count()


def gpu(
    index: int = 0,
    *,
    model: str = "NVIDIA-A100-SXM4-80GB",
    memory: int = 81920,
    mode: SharingMode = "hami-core",
    numa: int = 0,
    healthy: bool = True,
    vendor: Vendor = "nvidia",
    cores: int = 100,
    chip: str | None = None,
    uuid: str | None = None,
    mig: tuple[MigInstance, ...] = (),
    mps: MpsState | None = None,
) -> DeviceInfo:
    """A device as its agent reports it: a card in ``mps`` mode with its MPS daemon
    ``running`` unless ``mps`` says otherwise."""
    return DeviceInfo(
        uuid=DeviceUUID(uuid or f"{vendor}-{next(_ids)}"),
        index=index,
        vendor=vendor,
        model=model,
        memory_mib=memory,
        mode=mode,
        numa=numa,
        healthy=healthy,
        cores=cores,
        chip=chip,
        mig_geometry=mig,
        mps=("running" if mode == "mps" else "") if mps is None else mps,
    )


def gpus(n: int, **kw: Any) -> list[DeviceInfo]:
    return [gpu(i, **kw) for i in range(n)]


def npu(index: int = 0, chip: str = "910B3", memory: int = 65536) -> DeviceInfo:
    return gpu(index, vendor="ascend", model=f"Ascend{chip}", memory=memory, chip=chip)


def ledger(
    nodes: dict[str, list[DeviceInfo]],
    overrides: dict[str, NodeOverride] | None = None,
    specs: DeviceSpecs = SPECS,
) -> Ledger:
    result = Ledger(specs, overrides)
    for name, devices in nodes.items():
        result.set_node(NodeName(name), devices)
    return result


def pod_json(
    limits: dict[str, Any] | None = None,
    *,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    run_as: int | None = None,
) -> dict[str, Any]:
    if containers is None:
        containers = [{"name": "main", "resources": {"limits": limits or {}}}]
    spec: dict[str, Any] = {"containers": containers}
    if run_as is not None:
        spec["securityContext"] = {"runAsUser": run_as}
    if init:
        spec["initContainers"] = init
    return {
        "metadata": {"name": "p", "annotations": annotations or {}, "labels": labels or {}},
        "spec": spec,
    }


def request(limits: dict[str, Any], parser: RequestParser = PARSER, **kw: Any) -> PodRequest:
    parsed = parser.parse(pod_json(limits, **kw))
    assert isinstance(parsed, PodRequest), parsed
    return parsed


def ref(name: str | None = None) -> PodRef:
    n = name or f"pod-{next(_ids)}"
    return PodRef(namespace="ns", name=n, uid=PodUID(f"uid-{n}"))


def group(name: str) -> GangKey:
    """A PodGroup of the test namespace."""
    return GangKey(namespace="ns", name=name)


def place(
    placer: Placer,
    limits: dict[str, Any],
    name: str | None = None,
    group: str | None = None,
    **kw: Any,
) -> Placement:
    gang = GangKey(namespace="ns", name=group) if group else None
    result = placer.place(ref(name), request(limits, **kw), gang)
    assert isinstance(result, Placement), result
    return result


def placer(
    nodes: dict[str, list[DeviceInfo]],
    config: PlacementConfig | None = None,
    overrides: dict[str, NodeOverride] | None = None,
) -> Placer:
    return Placer(ledger(nodes, overrides), config)
