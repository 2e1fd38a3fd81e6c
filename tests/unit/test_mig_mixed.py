"""``nvidia.com/mig-<profile>``: NVIDIA's MIG names of ``migStrategy: mixed``.

NVIDIA's device plugin in ``migStrategy: mixed`` (HAMi's fork too:
pkg/device-plugin/nvidiadevice/nvinternal/rm/rm.go, ``AddDefaultResourcesToConfig``)
registers one resource per MIG profile, ``nvidia.com/mig-<profile>``, whose devices are
the MIG instances that exist on the node's cards; the kubelet hands a container that
many existing instances of that profile. HAMi's scheduler does not read these names
(no pkg/device type claims them): kube-scheduler counts them against the Node's
allocatable. Tessera books each as one existing instance of exactly that profile.
"""

from __future__ import annotations

from typing import Any

from services.node_agent.isolation import handout
from shared.config import Config
from shared.core.admission import keys_of_grants
from shared.core.hosts import pod_spec
from shared.core.model import DeviceGrant, DeviceInfo, MigInstance, NodeName
from shared.core.placement import Failure, Placer
from tests.unit.corekit import MANAGED, PARSER, gpu, place, placer, pod_json, ref, request

A100 = {"model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "mode": "mig"}


def running(*profiles: tuple[str, int]) -> tuple[MigInstance, ...]:
    """A geometry a card runs now: each profile with its MiB, in placement order."""
    return tuple(
        MigInstance(profile=p, memory_mib=m, placement=i, uuid=f"MIG-{i}")
        for i, (p, m) in enumerate(profiles)
    )


MIXED = running(("2g.20gb", 19968), ("2g.20gb", 19968), ("2g.20gb", 19968), ("1g.10gb", 9856))


def grants_of(pl: Placer, limits: dict[str, Any], **kw: Any) -> list[DeviceGrant]:
    return [g for c in place(pl, limits, **kw).grants for g in c.devices]


def refused(pl: Placer, limits: dict[str, Any]) -> Failure:
    result = pl.place(ref(), request(limits), None)
    assert isinstance(result, Failure), result
    return result


def test_a_mig_profile_name_is_a_request_for_instances_of_that_profile() -> None:
    """The name is a device count of its own: N instances, no count name beside it."""
    [c] = request({"nvidia.com/mig-1g.10gb": 2}).containers
    [d] = c.devices
    assert (d.vendor, d.resource, d.count, d.mig_profile) == (
        "nvidia",
        "nvidia.com/mig-1g.10gb",
        2,
        "1g.10gb",
    )
    assert PARSER.wants_devices(pod_json({"nvidia.com/mig-3g.40gb": 1}))
    assert PARSER.missing_counts(pod_json({"nvidia.com/mig-3g.40gb": 1})) == []
    assert request({"nvidia.com/mig-1g.10gb": 0}).containers[0].devices == ()


def test_each_profile_is_its_own_request_beside_the_ordinary_names() -> None:
    [c] = request(
        {"nvidia.com/mig-1g.10gb": 1, "nvidia.com/mig-2g.20gb": 1, "nvidia.com/gpu": 1}
    ).containers
    assert sorted((d.mig_profile or "", d.count) for d in c.devices) == [
        ("", 1),
        ("1g.10gb", 1),
        ("2g.20gb", 1),
    ]


def test_instances_of_exactly_that_profile_are_taken_until_none_is_free() -> None:
    pl = placer({"n": [gpu(0, mig=MIXED, **A100)]})
    [small] = grants_of(pl, {"nvidia.com/mig-1g.10gb": 1})
    assert (small.mig_profile, small.mig_placement, small.memory_mib) == ("1g.10gb", 3, 9856)
    assert "no free MIG 1g.10gb instance" in refused(pl, {"nvidia.com/mig-1g.10gb": 1}).message
    larger = grants_of(pl, {"nvidia.com/mig-2g.20gb": 3})
    assert [g.mig_placement for g in larger] == [0, 1, 2]
    assert {g.mig_geometry for g in larger} == {"2g.20gb,2g.20gb,2g.20gb,1g.10gb"}


def test_a_card_is_never_recut_for_a_profile_name() -> None:
    """The plugin serves the instances that exist: an idle card running another geometry,
    or none, does not take the request (Tessera's own MIG requests may recut it)."""
    whole = running(("7g.80gb", 80384))
    for card in (gpu(0, mig=whole, **A100), gpu(0, **A100)):
        assert (
            "no free MIG 1g.10gb instance"
            in refused(placer({"n": [card]}), {"nvidia.com/mig-1g.10gb": 1}).message
        )


def test_only_mig_cards_serve_a_profile_name() -> None:
    nodes: dict[str, list[DeviceInfo]] = {"sliced": [gpu(0)], "mig": [gpu(0, mig=MIXED, **A100)]}
    assert place(placer(nodes), {"nvidia.com/mig-1g.10gb": 1}).node == "mig"
    assert "MIG 1g.10gb" in refused(placer({"n": [gpu(0)]}), {"nvidia.com/mig-1g.10gb": 1}).message


def test_profile_names_share_the_card_with_tessera_mig_requests() -> None:
    """A card cut by Tessera for its own MIG requests serves the profile names from the
    instances left."""
    pl = placer({"n": [gpu(0, **A100)]})
    [own] = grants_of(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 5000})
    assert own.mig_profile == "1g.10gb"
    mixed = grants_of(pl, {"nvidia.com/mig-1g.10gb": 6})
    assert sorted(g.mig_placement for g in mixed) == [1, 2, 3, 4, 5, 6]
    assert "no free MIG 1g.10gb" in refused(pl, {"nvidia.com/mig-1g.10gb": 1}).message


def test_the_node_must_advertise_the_profile_as_kube_scheduler_checks() -> None:
    """Tessera does not register these names: NodeResourcesFit counts them against the
    Node's allocatable (kube-scheduler's check, the only one upstream makes)."""
    spec = pod_spec(pod_json({"nvidia.com/mig-1g.10gb": 2, "nvidia.com/gpu": 1}), MANAGED)
    assert spec.requests.get("nvidia.com/mig-1g.10gb") == 2
    assert "nvidia.com/gpu" not in spec.requests


def test_another_plugin_hands_the_instances_so_no_admission_key_waits_for_them() -> None:
    """The kubelet asks NVIDIA's plugin for these names, never Tessera's agent: the grant
    is marked external, makes no admission key (shared/core/admission.py) and the agent
    hands nothing for it."""
    pl = placer({"n": [gpu(0, mig=MIXED, **A100)]})
    placed = place(pl, {"nvidia.com/mig-1g.10gb": 1})
    [g] = [d for c in placed.grants for d in c.devices]
    assert g.external
    assert keys_of_grants(placed.grants) == frozenset()
    card = gpu(0, uuid=g.uuid, mig=MIXED, **A100)
    out = handout(Config(), NodeName("n"), ref(), placed.grants[0], {card.uuid: card})
    assert "NVIDIA_VISIBLE_DEVICES" not in out.envs
    own = place(placer({"n": [gpu(0, **A100)]}), {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 5000})
    assert keys_of_grants(own.grants) == frozenset({("nvidia", 1)})
