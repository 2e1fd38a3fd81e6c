"""DRA in the gang search: the DynamicResources filter and Reserve
(shared/core/plugins/dynamic_resources.py) over the allocator's slices and claims
(services/device_allocator/dra.py): the nodes where a pod's ResourceClaims can be
allocated, members of a gang seeing what the ones before took (spread, or placed
without one whose claims fit nowhere), claims assumed per pod, given back on release,
and the reasons a user reads."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from services.device_allocator.dra import Dra
from shared import events as ev
from shared.core.dra import InUse, read
from shared.core.hosts import Claims, DraClaim, PodSpec
from shared.core.ledger import PodGrant, Statement
from shared.core.model import GangKey, NodeName, PodUID, VictimUnit
from shared.core.nodefit import Hosts
from shared.core.placement import GangMember, GangResult, Placer
from shared.core.preemption import plan
from shared.core.room import Room, Unplaced
from shared.core.status import Code, Reason, Status
from tests.unit.corekit import ledger, ref, request

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


@dataclass
class World:
    """The allocator's DRA shell on a ledger of nodes without devices, and the core's
    placer that reads it (``Hosts.dra``)."""

    dra: Dra
    placer: Placer

    def fits(self, m: GangMember) -> list[str] | Status:
        """The nodes that would take ``m`` now, or why none would."""
        outcome, answers = self.placer.verdicts(m)
        if not outcome.ok:
            return outcome
        return sorted(str(n) for n, s in answers if s is None)

    def place(self, *members: GangMember, min_member: int | None = None) -> GangResult:
        """Place ``members`` as one gang as the allocator does, and assume their claims."""
        self.dra.begin()
        wanted = len(members) if min_member is None else min_member
        result = self.placer.place_gang(members, wanted)
        if result.ok:
            self.dra.assume([self.placer.ledger.pods[p.pod.uid] for p in result.placed])
        return result

    def node_of(self, m: GangMember) -> str:
        return str(self.placer.ledger.pods[m.pod.uid].node)


def dra(*slices: dict[str, Any], nodes: tuple[str, ...] = ("n1", "n2")) -> World:
    led = ledger({n: [] for n in nodes})
    d = Dra(led.hosts)
    for s in slices:
        d.seen("slice", s["metadata"]["name"], s)
    return World(d, Placer(led))


def test_a_pod_without_claims_to_allocate_meets_no_allocation() -> None:
    w = dra(node_slice("n1", card("gpu-0")))
    plain = GangMember(pod=ref("p"), request=request({}), spec=PodSpec(namespace="ns"))
    assert w.fits(plain) == ["n1", "n2"]
    assert w.place(plain).ok
    assert w.dra.decided(plain.pod.uid) == ()


def test_a_claim_goes_only_to_nodes_whose_slices_serve_it_and_is_assumed_there() -> None:
    w = dra(node_slice("n2", card("gpu-0")))
    m = member("p", share(selector="device.attributes['gpu.tessera.io'].productName == 'H100'"))
    assert w.fits(m) == ["n2"]
    assert w.place(m).ok
    assert w.node_of(m) == "n2"
    [claim] = w.dra.decided(m.pod.uid)
    assert (claim.namespace, claim.name, claim.uid) == ("ns", "p-gpu", "uid-p")
    [result] = claim.allocation["devices"]["results"]
    assert (result["driver"], result["pool"], result["device"]) == (DRIVER, "n2", "gpu-0")
    assert result["consumedCapacity"] == {"cores": "100", "memory": str(80 * GIB)}
    assert result["shareID"]
    pin = claim.allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]
    assert pin["values"] == ["n2"]
    assert w.dra.claimed.taken == {}  # assumed now: the source holds it


def test_a_claim_that_fits_several_nodes_may_go_to_each() -> None:
    w = dra(node_slice("n1", card("gpu-0")), node_slice("n2", card("gpu-0")))
    assert w.fits(member("p", share())) == ["n1", "n2"]


def test_two_30_percent_shares_take_one_card_and_a_whole_card_claim_then_waits() -> None:
    w = dra(node_slice("n1", card("gpu-0")), nodes=("n1",))
    for name in ("a", "b"):
        assert w.place(member(name, share(cores="30", memory="4Gi"))).ok
    whole = w.fits(member("c", share()))  # the card's default: all its cores
    assert isinstance(whole, Status)
    assert whole.code == Code.UNSCHEDULABLE
    assert whole.message() == "0/1 nodes are available: 1 cannot allocate all claims."
    # One share given back: a 70 % share (memory asked: the default is the whole card)
    # fits beside the other.
    w.dra.release(PodUID("uid-of-a"))  # not a pod of ours: nothing changes
    w.dra.release(ref("a").uid)
    assert w.fits(member("d", share(cores="70", memory="4Gi"))) == ["n1"]


def test_a_claim_seen_allocated_by_another_scheduler_holds_its_devices() -> None:
    w = dra(node_slice("n1", card("gpu-0")), nodes=("n1",))
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
    w.dra.seen("claim", "other/theirs", theirs)
    assert isinstance(w.fits(member("p", share(cores="30", memory="1Gi"))), Status)
    w.dra.seen("claim", "other/theirs", None)  # deallocated: the cores are free again
    assert w.fits(member("p", share(cores="30", memory="1Gi"))) == ["n1"]


def test_a_gang_whose_members_contend_for_one_nodes_card_is_spread_over_two_nodes() -> None:
    w = dra(node_slice("n1", card("gpu-0")), node_slice("n2", card("gpu-0")))
    a, b = member("a", share()), member("b", share())  # each the whole card
    assert w.fits(a) == w.fits(b) == ["n1", "n2"]  # each alone fits either
    assert w.place(a, b).ok
    assert sorted((w.node_of(a), w.node_of(b))) == ["n1", "n2"]
    devices = {
        r["pool"]
        for m in (a, b)
        for r in w.dra.decided(m.pod.uid)[0].allocation["devices"]["results"]
    }
    assert devices == {"n1", "n2"}


def test_a_gang_that_one_card_cannot_serve_is_refused_whole_and_takes_nothing() -> None:
    w = dra(node_slice("n1", card("gpu-0")), nodes=("n1",))
    a, b = member("a", share(cores="60")), member("b", share(cores="60"))
    result = w.place(a, b)
    assert not result.ok
    assert result.message == (
        "2/2 tasks in gang unschedulable: 0/1 nodes are available: 1 cannot allocate all claims."
    )
    assert w.dra.claimed.taken == {}  # the statement gave a's allocation back
    assert w.dra.decided(a.pod.uid) == ()
    assert w.fits(member("c", share(cores="100"))) == ["n1"]


def test_a_gang_with_min_member_below_its_size_is_placed_without_a_member_that_fits_nowhere() -> (
    None
):
    w = dra(node_slice("n1", card("gpu-0")))
    fits = member("a", share())
    never = member("b", share(selector="device.attributes['gpu.tessera.io'].productName == 'B200'"))
    result = w.place(never, fits, min_member=1)
    assert result.ok, result.message
    assert [p.pod for p in result.placed] == [fits.pod]
    [failure] = result.failures
    assert failure.pod == never.pod
    assert "cannot allocate all claims" in failure.message
    assert w.node_of(fits) == "n1"
    assert len(w.dra.decided(fits.pod.uid)) == 1
    assert w.dra.decided(never.pod.uid) == ()
    # The whole gang (minMember 2) is refused instead.
    again = dra(node_slice("n1", card("gpu-0")))
    assert not again.place(member("c", share()), never).ok


def test_a_trial_placement_in_a_statement_gives_its_allocations_back() -> None:
    w = dra(node_slice("n1", card("gpu-0")), nodes=("n1",))
    w.dra.begin()
    with Statement(w.placer.ledger) as outer:
        assert w.placer.place_gang([member("a", share())], 1, statement=outer).ok
        assert set(w.dra.claimed.taken) == {ref("a").uid}
        assert isinstance(w.fits(member("b", share())), Status)  # the card is taken
    assert w.dra.claimed.taken == {}
    assert w.fits(member("b", share())) == ["n1"]


def test_bad_claims_are_refused_with_what_is_wrong() -> None:
    w = dra(node_slice("n1", card("gpu-0")), nodes=("n1",))
    missing = w.fits(member("p", share(), classes={}))
    assert isinstance(missing, Status)
    assert missing.unresolvable
    # A PreFilter's reason: on no node in particular (said without a count).
    assert [(r.text(), r.nodes) for r in missing.reasons] == [
        ("request gpu: device class gpu.tessera.io does not exist", 0)
    ]
    broken = w.fits(member("p", share(selector="device.attributes[")))
    assert isinstance(broken, Status)
    assert "compilation failed" in broken.message()
    too_big = w.fits(member("p", share(memory="100Gi")))
    assert isinstance(too_big, Status)
    text = too_big.message()
    assert "cannot allocate all claims" in text
    assert "100Gi" in text or "memory" in text
    nothing = w.fits(
        member("p", share(selector="device.attributes['gpu.tessera.io'].productName == 'B200'"))
    )
    assert isinstance(nothing, Status)
    assert nothing.message() == "0/1 nodes are available: 1 cannot allocate all claims."


def test_a_search_past_its_step_budget_refuses_the_node_with_the_reason() -> None:
    devices = [{"name": f"gpu-{i}", "attributes": {"group": {"int": i % 3}}} for i in range(24)]
    w = dra(node_slice("n1", *devices), nodes=("n1",))
    w.dra.max_steps = 200
    # Nine devices of one group where each group has eight: the search backtracks.
    requests = [{"name": f"r{i}", "exactly": {"deviceClassName": DRIVER}} for i in range(9)]
    spec = {"requests": requests, "constraints": [{"matchAttribute": f"{DRIVER}/group"}]}
    stopped = w.fits(member("p", spec))
    assert isinstance(stopped, Status)
    assert "timed out trying to allocate devices" in stopped.message()
    eight = {"requests": requests[:8], "constraints": spec["constraints"]}
    assert w.fits(member("q", eight)) == ["n1"]


def test_a_slice_or_claim_that_cannot_be_read_is_ignored_not_a_crash() -> None:
    bad = node_slice("n1", card("gpu-0"))
    bad["spec"]["devices"][0]["capacity"]["memory"]["value"] = "lots"
    w = dra(bad, nodes=("n1",))
    assert w.dra.slices.by_name == {}
    result = {"shareID": "s", "consumedCapacity": {"x": []}}
    claim = {"status": {"allocation": {"devices": {"results": [result]}}}}
    w.dra.seen("claim", "ns/c", claim)
    assert w.dra.observed == {}
    assert isinstance(w.fits(member("p", share())), Status)


def test_a_slice_change_forgets_only_its_nodes_pools() -> None:
    d = dra(node_slice("n1", card("gpu-0")), node_slice("n2", card("gpu-0"))).dra
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
    w = dra(node_slice("n1", card("gpu-0")), nodes=("n1",))
    m = member("a", share(cores="60", memory="4Gi"))
    assert w.place(m).ok
    held = {m.pod.uid: w.dra.decided(m.pod.uid)}
    restarted = dra(node_slice("n1", card("gpu-0")), nodes=("n1",))
    restarted.dra.restore(held)
    assert isinstance(restarted.fits(member("b", share(cores="60", memory="4Gi"))), Status)


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
    w = dra(body, nodes=(str(NODE),))

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
    assert w.place(pod).ok
    [result] = w.dra.decided(pod.pod.uid)[0].allocation["devices"]["results"]
    by_name = {x.name: x for x in dra_devices(CFG, NODE, (H100, A100_MIG))}
    grant = grant_of(by_name[result["device"]], result["consumedCapacity"])
    assert (grant.uuid, grant.memory_mib, grant.cores) == (H100.uuid, 4096, 30)
    mig = asking("mig", "mig.tessera.io")
    assert w.place(mig).ok
    [result] = w.dra.decided(mig.pod.uid)[0].allocation["devices"]["results"]
    assert by_name[result["device"]].mig is not None


def test_a_claim_allocated_but_not_reserved_is_reserved_for_the_pod_not_counted_twice() -> None:
    w = dra(node_slice("n1", card("gpu-0")), nodes=("n1",))
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
    w.dra.seen("claim", "ns/shared", {"status": {"allocation": allocation}})
    pod = GangMember(
        pod=ref("p"),
        request=request({}),
        spec=PodSpec(
            namespace="ns",
            claims=Claims(reserve=(DraClaim("ns", "shared", "u", allocation=allocation),)),
        ),
    )
    assert w.place(pod).ok
    [held] = w.dra.decided(pod.pod.uid)
    assert (held.name, held.reserve_only, held.allocation) == ("shared", True, allocation)
    # Its 60 % count once: a 40 % share still fits beside it.
    assert w.fits(member("q", share(cores="40", memory="1Gi"))) == ["n1"]


def whole_card_claim(name: str, *consumers: str) -> dict[str, Any]:
    """A claim allocated the whole of n1's gpu-0, reserved for ``consumers`` (pod names)."""
    result = {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "status": {
            "allocation": {"devices": {"results": [result]}},
            "reservedFor": [{"uid": ref(c).uid} for c in consumers],
        },
    }


def bound(w: World, name: str) -> VictimUnit:
    """Pod ``name`` bound on n1 (in the ledger), offered as a victim."""
    w.placer.ledger.grant(
        PodGrant(pod=ref(name), node=NodeName("n1"), containers=(), spec=PodSpec(namespace="ns"))
    )
    return VictimUnit(pods=(ref(name),), why="priority 0 < 10")


def test_evicting_a_pod_frees_the_claims_reserved_for_it_alone_in_the_plan() -> None:
    w = dra(node_slice("n1", {"name": "gpu-0"}), nodes=("n1",))  # one card, not shared
    w.dra.seen("claim", "ns/low", whole_card_claim("low", "low"))
    unit = bound(w, "low")
    wants = member("high", share())
    assert isinstance(w.fits(wants), Status)  # the card is held by low's claim
    w.dra.begin()
    found = plan(w.placer, [wants], 1, [unit])
    assert found is not None
    assert found.pods == (ref("low").uid,)
    assert [p.node for p in found.placements] == ["n1"]
    # The plan leaves everything as it was: low holds its grant and its claim.
    assert ref("low").uid in w.placer.ledger.pods
    assert w.dra.claimed.freed == {}
    assert w.dra.claimed.taken == {}
    assert isinstance(w.fits(wants), Status)


def test_a_claim_shared_with_a_pod_that_stays_is_not_freed_by_an_eviction() -> None:
    w = dra(node_slice("n1", {"name": "gpu-0"}), nodes=("n1",))
    w.dra.seen("claim", "ns/both", whole_card_claim("both", "low", "other"))
    unit = bound(w, "low")
    bound(w, "other")
    w.dra.begin()
    assert plan(w.placer, [member("high", share())], 1, [unit]) is None
    # Both pods offered: the claim is still reserved for each, so it is not counted free
    # (kube-controller-manager deallocates it once both are gone).
    assert plan(w.placer, [member("high", share())], 1, [unit, bound(w, "other")]) is None


def test_in_use_less_gives_back_whole_devices_and_shares() -> None:
    d = dra(node_slice("n1", card("gpu-0"))).dra
    share_of = {
        "metadata": {"name": "s", "namespace": "ns"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER,
                            "pool": "n1",
                            "device": "gpu-0",
                            "shareID": "a",
                            "consumedCapacity": {"cores": "30", "memory": "1Gi"},
                        }
                    ]
                }
            },
            "reservedFor": [{"uid": "uid-a"}],
        },
    }
    d.seen("claim", "ns/s", share_of)
    d.seen("claim", "ns/w", whole_card_claim("w", "b") | {"metadata": {"name": "w"}})
    held = d.held_by(PodUID("uid-a"))
    assert held is not None
    assert d.in_use().less(held).consumed == {}
    assert d.in_use().less(held).devices == d.in_use().devices
    whole = d.held_by(PodUID("uid-b"))
    assert whole is not None
    assert d.in_use().less(whole).devices == frozenset()
    assert d.held_by(PodUID("uid-c")) is None


def test_a_preemptors_gone_victims_claims_count_free_for_it_until_it_is_placed() -> None:
    w = dra(node_slice("n1", {"name": "gpu-0"}), nodes=("n1",))
    w.dra.seen("claim", "ns/low", whole_card_claim("low", "low"))
    unit = bound(w, "low")
    high = member("high", share())
    room = Room(w.placer)
    key = GangKey.of(high.pod, None)
    gang = Unplaced(key=key, members=[high], min_member=1, victims=(unit,))
    no_room = Status(code=Code.UNSCHEDULABLE, nodes=1, reasons=(Reason(kind="claim-allocate"),))
    w.dra.begin()
    made = room.make_room(gang, no_room, now=0.0)
    assert made.preempting is not None
    assert made.preempting.pods == (ref("low").uid,)
    assert room.gone(ref("low")) == key
    assert room.waiting(key, now=1.0) is None  # its victim is gone: it may be placed
    # kube-controller-manager has not deallocated low's claim yet: held for everyone...
    assert isinstance(w.fits(high), Status)
    # ...but not for the gang it was evicted for (as the allocator places it: gangs.py).
    gone, _ = room.released[key]
    w.dra.begin()
    for uid in gone:
        w.dra.claimed.leave(uid)
    assert w.placer.place_gang([high], 1).ok
    room.placed(key)
    assert key not in room.released


def test_what_is_in_use_is_kept_as_claims_change_exactly_as_summed_from_scratch() -> None:
    # The running sum (shared/core/dra/model.py Tally) against the sum of every observed
    # claim and every assumed one not observed, after each of 400 random changes; whole
    # devices are counted per claim too, so two claims holding one device and one of them
    # gone still hold it.
    rng = random.Random(7)
    d = Dra(Hosts())
    pods = [PodUID(f"u{i}") for i in range(6)]
    names = [f"c{i}" for i in range(8)]

    def allocation() -> dict[str, Any]:
        results = []
        for _ in range(rng.randint(1, 3)):
            device = f"gpu-{rng.randint(0, 3)}"
            if rng.random() < 0.5:
                results.append({"request": "r", "driver": DRIVER, "pool": "n1", "device": device})
            else:
                consumed = {"cores": str(rng.randint(1, 40)), "memory": f"{rng.randint(1, 9)}Gi"}
                results.append(
                    {
                        "request": "r",
                        "driver": DRIVER,
                        "pool": "n1",
                        "device": device,
                        "shareID": str(rng.random()),
                        "consumedCapacity": consumed,
                    }
                )
        return {"devices": {"results": results}}

    def claim(name: str) -> ev.ClaimAllocation:
        return ev.ClaimAllocation(namespace="ns", name=name, uid=name, allocation=allocation())

    def unseen() -> list[dict[str, Any]]:
        return [
            {"status": {"allocation": c.allocation}}
            for claims in d.assumed.values()
            for c in claims
            if f"{c.namespace}/{c.name}" not in d.observed
        ]

    def from_scratch() -> InUse:
        return read.in_use([*d.observed.values(), *unseen()])

    for _ in range(400):
        step = rng.random()
        name = rng.choice(names)
        if step < 0.35:
            obj = {
                "metadata": {"namespace": "ns", "name": name},
                "status": {"allocation": allocation()},
            }
            d.seen("claim", f"ns/{name}", obj)
        elif step < 0.5:
            d.seen("claim", f"ns/{name}", None)
        elif step < 0.75:
            d._assume(rng.choice(pods), tuple(claim(n) for n in rng.sample(names, 2)))
        elif step < 0.85:
            d.restore({rng.choice(pods): (claim(name),)})
        else:
            d.release(rng.choice(pods))
        held: dict[tuple[str, str, str], int] = {}
        for obj in [*d.observed.values(), *unseen()]:
            for key in read.in_use([obj]).devices:
                held[key] = held.get(key, 0) + 1
        assert d._held.devices == held
        now, want = d.in_use(), from_scratch()
        assert (now.devices, dict(now.consumed), dict(now.shares)) == (
            want.devices,
            want.consumed,
            want.shares,
        )
