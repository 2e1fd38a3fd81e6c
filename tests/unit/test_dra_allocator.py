"""The allocator's DRA shell (services/device_allocator/dra.py): the nodes where a pod's
ResourceClaims can be allocated, claims assumed per pod (all or nothing for a gang),
given back on release, and the reasons a user reads."""

from __future__ import annotations

from typing import Any

from services.device_allocator.dra import Dra
from shared.core.hosts import Claims, DraClaim, PodSpec
from shared.core.model import NodeName, PodUID
from shared.core.nodefit import Hosts
from shared.core.placement import GangMember
from shared.core.status import Code, Status
from tests.unit.corekit import ref, request

DRIVER = "gpu.tessera.io"
GIB = 1024**3


def card(name: str, *, memory_gib: int = 80) -> dict[str, Any]:
    """One shared card as the node agent publishes it (services/node_agent/dra/slices.py)."""
    mem = f"{memory_gib}Gi"
    return {
        "name": name,
        "allowMultipleAllocations": True,
        "attributes": {"type": {"string": "gpu"}, "productName": {"string": "H100"}},
        "capacity": {
            "cores": {
                "value": "100",
                "requestPolicy": {"default": "100", "validRange": {"min": "1", "max": "100"}},
            },
            "memory": {
                "value": mem,
                "requestPolicy": {
                    "default": mem,
                    "validRange": {"min": "1Mi", "max": mem, "step": "1Mi"},
                },
            },
        },
    }


def node_slice(node: str, *cards: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": list(cards),
        },
    }


GPU_CLASS = {
    "metadata": {"name": DRIVER},
    "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
}


def share(
    cores: str | None = None, memory: str | None = None, selector: str = ""
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER}
    amounts = {k: v for k, v in (("cores", cores), ("memory", memory)) if v is not None}
    if amounts:
        exactly["capacity"] = {"requests": amounts}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"requests": [{"name": "gpu", "exactly": exactly}]}


def member(name: str, devices: dict[str, Any], classes: dict[str, Any] | None = None) -> GangMember:
    pod = ref(name)
    claims = Claims(
        allocate=(DraClaim("ns", f"{name}-gpu", f"uid-{name}", devices),),
        classes={DRIVER: GPU_CLASS} if classes is None else classes,
    )
    return GangMember(pod=pod, request=request({}), spec=PodSpec(namespace="ns", claims=claims))


def dra(*slices: dict[str, Any], nodes: tuple[str, ...] = ("n1", "n2")) -> Dra:
    hosts = Hosts()
    for n in nodes:
        hosts.node(NodeName(n))
    d = Dra(hosts)
    for s in slices:
        d.seen("slice", s["metadata"]["name"], s)
    return d


def nodes_of(m: GangMember | Status) -> list[str]:
    assert isinstance(m, GangMember)
    assert m.spec is not None
    assert m.spec.claims is not None
    [terms] = m.spec.claims.devices
    return [n for n in ("n1", "n2") if any(t.matches(n, {}) for t in terms)]


def test_a_pod_without_claims_to_allocate_is_left_as_it_is() -> None:
    plain = GangMember(pod=ref("p"), request=request({}), spec=PodSpec(namespace="ns"))
    assert dra().restrict(plain) is plain


def test_a_claim_goes_only_to_nodes_whose_slices_serve_it_and_is_assumed_there() -> None:
    d = dra(node_slice("n2", card("gpu-0")))
    m = member("p", share(selector="device.attributes['gpu.tessera.io'].productName == 'H100'"))
    limited = d.restrict(m)
    assert nodes_of(limited) == ["n2"]
    assert d.assume([(m.pod.uid, "n2")]) is None
    [claim] = d.decided(m.pod.uid)
    assert (claim.namespace, claim.name, claim.uid) == ("ns", "p-gpu", "uid-p")
    [result] = claim.allocation["devices"]["results"]
    assert (result["driver"], result["pool"], result["device"]) == (DRIVER, "n2", "gpu-0")
    assert result["consumedCapacity"] == {"cores": "100", "memory": str(80 * GIB)}
    assert result["shareID"]
    pin = claim.allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]
    assert pin["values"] == ["n2"]


def test_a_claim_that_fits_several_nodes_may_go_to_each() -> None:
    # one term per node: a metadata.name term naming two nodes is invalid (none matched)
    d = dra(node_slice("n1", card("gpu-0")), node_slice("n2", card("gpu-0")))
    assert nodes_of(d.restrict(member("p", share()))) == ["n1", "n2"]


def test_two_30_percent_shares_take_one_card_and_a_whole_card_claim_then_waits() -> None:
    d = dra(node_slice("n1", card("gpu-0")), nodes=("n1",))
    for name in ("a", "b"):
        m = member(name, share(cores="30", memory="4Gi"))
        assert nodes_of(d.restrict(m)) == ["n1"]
        assert d.assume([(m.pod.uid, "n1")]) is None
    whole = d.restrict(member("c", share()))  # the card's default: all its cores
    assert isinstance(whole, Status)
    assert whole.code == Code.UNSCHEDULABLE
    assert whole.message() == "0/1 nodes are available: 1 cannot allocate all claims."
    # One share given back: a 70 % share (memory asked: the default is the whole card)
    # fits beside the other.
    d.release(PodUID("uid-of-a"))  # not a pod of ours: nothing changes
    d.release(ref("a").uid)
    assert nodes_of(d.restrict(member("d", share(cores="70", memory="4Gi")))) == ["n1"]


def test_a_claim_seen_allocated_by_another_scheduler_holds_its_devices() -> None:
    d = dra(node_slice("n1", card("gpu-0")), nodes=("n1",))
    theirs = {
        "metadata": {"name": "theirs", "namespace": "other"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER,
                            "pool": "n1",
                            "device": "gpu-0",
                            "shareID": "x",
                            "consumedCapacity": {"cores": "80", "memory": "1Gi"},
                        }
                    ]
                }
            }
        },
    }
    d.seen("claim", "other/theirs", theirs)
    assert isinstance(d.restrict(member("p", share(cores="30", memory="1Gi"))), Status)
    d.seen("claim", "other/theirs", None)  # deallocated: the cores are free again
    assert nodes_of(d.restrict(member("p", share(cores="30", memory="1Gi")))) == ["n1"]


def test_a_gang_whose_members_contend_for_one_card_is_refused_whole() -> None:
    d = dra(node_slice("n1", card("gpu-0")), nodes=("n1",))
    a, b = member("a", share(cores="60")), member("b", share(cores="60"))
    assert nodes_of(d.restrict(a)) == nodes_of(d.restrict(b)) == ["n1"]
    refused = d.assume([(a.pod.uid, "n1"), (b.pod.uid, "n1")])
    assert refused is not None
    assert "cannot allocate all claims on n1" in refused.message()
    assert d.decided(a.pod.uid) == ()  # nothing held
    assert nodes_of(d.restrict(member("c", share(cores="100")))) == ["n1"]


def test_bad_claims_are_refused_with_what_is_wrong() -> None:
    d = dra(node_slice("n1", card("gpu-0")), nodes=("n1",))
    missing = d.restrict(member("p", share(), classes={}))
    assert isinstance(missing, Status)
    assert missing.unresolvable
    assert "request gpu: device class gpu.tessera.io does not exist" in missing.message()
    broken = d.restrict(member("p", share(selector="device.attributes[")))
    assert isinstance(broken, Status)  # the attempt stops, as kube-scheduler's does
    assert "compilation failed" in broken.message()
    too_big = d.restrict(member("p", share(memory="100Gi")))
    assert isinstance(too_big, Status)
    text = too_big.message()
    assert "cannot allocate all claims" in text
    assert "100Gi" in text or "memory" in text
    nothing = d.restrict(
        member("p", share(selector="device.attributes['gpu.tessera.io'].productName == 'B200'"))
    )
    assert isinstance(nothing, Status)
    assert nothing.message() == "0/1 nodes are available: 1 cannot allocate all claims."


def test_a_search_past_its_step_budget_stops_the_attempt_with_the_reason() -> None:
    devices = [{"name": f"gpu-{i}", "attributes": {"group": {"int": i % 3}}} for i in range(24)]
    d = dra(node_slice("n1", *devices), nodes=("n1",))
    d.max_steps = 200
    # Nine devices of one group where each group has eight: the search backtracks.
    requests = [{"name": f"r{i}", "exactly": {"deviceClassName": DRIVER}} for i in range(9)]
    spec = {"requests": requests, "constraints": [{"matchAttribute": f"{DRIVER}/group"}]}
    stopped = d.restrict(member("p", spec))
    assert isinstance(stopped, Status)
    assert "timed out trying to allocate devices" in stopped.message()
    eight = {"requests": requests[:8], "constraints": spec["constraints"]}
    assert nodes_of(d.restrict(member("q", eight))) == ["n1"]


def test_a_slice_or_claim_that_cannot_be_read_is_ignored_not_a_crash() -> None:
    bad = node_slice("n1", card("gpu-0"))
    bad["spec"]["devices"][0]["capacity"]["memory"]["value"] = "lots"
    d = dra(bad, nodes=("n1",))
    assert d.slices.by_name == {}
    result = {"shareID": "s", "consumedCapacity": {"x": []}}
    claim = {"status": {"allocation": {"devices": {"results": [result]}}}}
    d.seen("claim", "ns/c", claim)
    assert d.observed == {}
    assert isinstance(d.restrict(member("p", share())), Status)


def test_a_slice_change_forgets_only_its_nodes_pools() -> None:
    d = dra(node_slice("n1", card("gpu-0")), node_slice("n2", card("gpu-0")))
    first = {n: d.pools(n) for n in ("n1", "n2")}
    newer = node_slice("n1", card("gpu-0"), card("gpu-1"))
    newer["spec"]["pool"]["generation"] = 2
    d.seen("slice", newer["metadata"]["name"], newer)
    assert d.pools("n2") is first["n2"]  # kept
    [pool] = d.pools("n1")
    assert [dev.name for s in pool.slices for dev in s.devices] == ["gpu-0", "gpu-1"]
    assert d.slices.of("n2") == [node_slice("n2", card("gpu-0"))]
    everywhere = node_slice("x", card("gpu-9"))
    everywhere["spec"].pop("nodeName")
    everywhere["spec"]["allNodes"] = True
    d.seen("slice", "x", everywhere)
    assert len(d.pools("n2")) == 2  # its own pool and the one every node sees
    d.seen("slice", "x", None)
    assert d.slices.everywhere == {}
    assert len(d.pools("n2")) == 1


def test_claims_held_by_open_reservations_are_held_again_after_a_restart() -> None:
    d = dra(node_slice("n1", card("gpu-0")), nodes=("n1",))
    m = member("a", share(cores="60", memory="4Gi"))
    d.restrict(m)
    assert d.assume([(m.pod.uid, "n1")]) is None
    held = {m.pod.uid: d.decided(m.pod.uid)}
    restarted = dra(node_slice("n1", card("gpu-0")), nodes=("n1",))
    restarted.restore(held)
    assert isinstance(restarted.restrict(member("b", share(cores="60", memory="4Gi"))), Status)


def test_the_node_agents_slice_and_the_shipped_classes_serve_shares_and_mig() -> None:
    """The node agent's own slice (services/node_agent/dra/slices.py) and the DeviceClasses
    of deploy/kustomize/components/dra: a 30 % / 4 GiB share of the card, handed to the
    container as that share; a MIG instance whole."""
    from pathlib import Path

    import yaml

    from services.node_agent.dra.slices import dra_devices, grant_of, resource_slice
    from tests.unit.test_dra import A100_MIG, CFG, H100, NODE

    shipped = Path(__file__).resolve().parents[2] / "deploy/kustomize/components/dra"
    classes = {
        c["metadata"]["name"]: c
        for c in yaml.safe_load_all((shipped / "deviceclasses.yaml").read_text())
    }
    body = resource_slice(CFG, NODE, (H100, A100_MIG), generation=1)
    d = dra(body, nodes=(str(NODE),))

    def asking(name: str, cls: str, **capacity: str) -> GangMember:
        exactly: dict[str, Any] = {"deviceClassName": cls}
        if capacity:
            exactly["capacity"] = {"requests": capacity}
        spec = {"requests": [{"name": "gpu", "exactly": exactly}]}
        claims = Claims(allocate=(DraClaim("ns", name, "u", spec),), classes=classes)
        return GangMember(
            pod=ref(name), request=request({}), spec=PodSpec(namespace="ns", claims=claims)
        )

    pod = asking("share", "gpu.tessera.io", cores="30", memory="4Gi")
    assert not isinstance(d.restrict(pod), Status)
    assert d.assume([(pod.pod.uid, str(NODE))]) is None
    [result] = d.decided(pod.pod.uid)[0].allocation["devices"]["results"]
    by_name = {x.name: x for x in dra_devices(CFG, NODE, (H100, A100_MIG))}
    grant = grant_of(by_name[result["device"]], result["consumedCapacity"])
    assert (grant.uuid, grant.memory_mib, grant.cores) == (H100.uuid, 4096, 30)
    mig = asking("mig", "mig.tessera.io")
    assert not isinstance(d.restrict(mig), Status)
    assert d.assume([(mig.pod.uid, str(NODE))]) is None
    [result] = d.decided(mig.pod.uid)[0].allocation["devices"]["results"]
    assert by_name[result["device"]].mig is not None


def test_a_claim_allocated_but_not_reserved_is_reserved_for_the_pod_not_counted_twice() -> None:
    d = dra(node_slice("n1", card("gpu-0")), nodes=("n1",))
    allocation = {
        "devices": {
            "results": [
                {
                    "request": "gpu",
                    "driver": DRIVER,
                    "pool": "n1",
                    "device": "gpu-0",
                    "shareID": "s",
                    "consumedCapacity": {"cores": "60", "memory": "1Gi"},
                }
            ]
        }
    }
    d.seen("claim", "ns/shared", {"status": {"allocation": allocation}})
    pod = GangMember(
        pod=ref("p"),
        request=request({}),
        spec=PodSpec(
            namespace="ns",
            claims=Claims(reserve=(DraClaim("ns", "shared", "u", allocation=allocation),)),
        ),
    )
    assert d.restrict(pod) is pod
    assert d.assume([(pod.pod.uid, "n1")]) is None
    [held] = d.decided(pod.pod.uid)
    assert (held.name, held.reserve_only, held.allocation) == ("shared", True, allocation)
    # Its 60 % count once: a 40 % share still fits beside it.
    assert nodes_of(d.restrict(member("q", share(cores="40", memory="1Gi")))) == ["n1"]
