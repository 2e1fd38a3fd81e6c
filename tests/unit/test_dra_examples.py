"""The ResourceClaimTemplates of examples/dra, decided by the allocator's DRA shell
(services/device_allocator/dra.py) and the core's DynamicResources filter against the
node agent's own ResourceSlice (services/node_agent/dra/slices.py) and the shipped
DeviceClasses (deploy/kustomize/components/dra): each example is served as its comment
says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import yaml

from services.node_agent.dra.slices import dra_devices, grant_of, resource_slice
from shared.core.hosts import Claims, DraClaim, PodSpec
from shared.core.model import DeviceInfo, DeviceUUID, NodeName
from shared.core.placement import GangMember
from shared.core.status import Status
from tests.unit.corekit import ref, request
from tests.unit.test_dra import A100_MIG, CFG, H100
from tests.unit.test_dra_allocator import dra
from tests.unit.test_topology_nvlink import sim

REPO = Path(__file__).resolve().parents[2]
NODE = NodeName("gpu-0")
SECOND = msgspec.structs.replace(H100, uuid=DeviceUUID("GPU-h100-b"), index=2)
FAR = msgspec.structs.replace(H100, uuid=DeviceUUID("GPU-h100-c"), index=3, numa=0)
CLASSES = {
    c["metadata"]["name"]: c
    for c in yaml.safe_load_all(
        (REPO / "deploy/kustomize/components/dra/deviceclasses.yaml").read_text()
    )
}


def template(name: str) -> dict[str, Any]:
    """The claim spec of the example's ResourceClaimTemplate."""
    docs = list(yaml.safe_load_all((REPO / "examples/dra" / name).read_text()))
    [tmpl] = [d for d in docs if d["kind"] == "ResourceClaimTemplate"]
    [pod] = [d for d in docs if d["kind"] == "Pod"]
    assert pod["spec"]["schedulerName"] == "tessera"
    assert pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == tmpl["metadata"]["name"]
    spec: dict[str, Any] = tmpl["spec"]["spec"]["devices"]
    return spec


def decide(name: str, cards: tuple[DeviceInfo, ...]) -> list[dict[str, Any]] | Status:
    """The example's claim on one node with ``cards``: the allocation's results, or why not."""
    w = dra(resource_slice(CFG, NODE, cards, generation=1), nodes=(str(NODE),))
    claims = Claims(allocate=(DraClaim("ns", name, "uid", template(name)),), classes=CLASSES)
    pod = GangMember(pod=ref("p"), request=request({}), spec=PodSpec(namespace="ns", claims=claims))
    fits = w.fits(pod)
    if isinstance(fits, Status):
        return fits
    assert w.place(pod).ok
    d = w.dra
    results: list[dict[str, Any]] = d.decided(pod.pod.uid)[0].allocation["devices"]["results"]
    return results


def devices(cards: tuple[DeviceInfo, ...]) -> dict[str, Any]:
    return {x.name: x for x in dra_devices(CFG, NODE, cards)}


def test_whole_card_takes_one_h100_whole() -> None:
    cards = (A100_MIG, H100)
    results = decide("whole-card.yaml", cards)
    assert not isinstance(results, Status)
    [r] = results
    grant = grant_of(devices(cards)[r["device"]], r.get("consumedCapacity"))
    assert (grant.uuid, grant.memory_mib, grant.cores) == (H100.uuid, H100.memory_mib, 100)


def test_share_takes_30_percent_and_4_gib_of_a_card() -> None:
    cards = (H100,)
    results = decide("share.yaml", cards)
    assert not isinstance(results, Status)
    [r] = results
    grant = grant_of(devices(cards)[r["device"]], r["consumedCapacity"])
    assert (grant.uuid, grant.memory_mib, grant.cores) == (H100.uuid, 4096, 30)


def test_mig_takes_the_running_instance_of_its_profile() -> None:
    cards = (H100, A100_MIG)
    results = decide("mig.yaml", cards)
    assert not isinstance(results, Status)
    [r] = results
    mig = devices(cards)[r["device"]].mig
    assert mig is not None
    assert (mig.profile, mig.uuid) == ("3g.20gb", "MIG-one")


def test_two_cards_one_numa_pairs_cards_of_one_numa_node_or_waits() -> None:
    cards = (H100, FAR, SECOND)
    results = decide("two-cards-one-numa.yaml", cards)
    assert not isinstance(results, Status)
    chosen = {devices(cards)[r["device"]].card.uuid for r in results}
    assert chosen == {H100.uuid, SECOND.uuid}
    refused = decide("two-cards-one-numa.yaml", (H100, FAR))
    assert isinstance(refused, Status)
    assert "cannot allocate all claims" in refused.message()


def test_two_cards_one_nvlink_island_pairs_linked_cards_or_waits() -> None:
    cards = tuple(
        msgspec.structs.replace(c, index=i, uuid=DeviceUUID(f"GPU-{i}"))
        for i, c in enumerate(sim(4, islands=2))
    )
    # cards 0-1 and 2-3 are the islands: the pair chosen is one island's
    results = decide("two-cards-one-nvlink-island.yaml", cards)
    assert not isinstance(results, Status)
    chosen = sorted(devices(cards)[r["device"]].card.index for r in results)
    assert chosen in ([0, 1], [2, 3])
    # one card of each island: no pair shares an island
    refused = decide("two-cards-one-nvlink-island.yaml", (cards[0], cards[2]))
    assert isinstance(refused, Status)
    assert "cannot allocate all claims" in refused.message()
    # links not read (no NVML topology): no island attribute, never chosen
    unread = tuple(msgspec.structs.replace(c, links={}) for c in cards)
    assert isinstance(decide("two-cards-one-nvlink-island.yaml", unread), Status)
