"""The DRA allocation core (shared/core/dra): request-policy rounding and refusal,
constraints, firstAvailable order, All mode, admin access, taints, in-use state, the
selectors' CEL with Kubernetes' functions, and the allocation written. Each case states
what the structured allocator of the pinned release decides (bench/parity_dra.py checks
the same against it on random cases)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from shared.core.dra import CANNOT_ALLOCATE, InUse, Outcome, allocate, prepare, read
from shared.core.dra import capacity as cap
from shared.core.dra.cel import SelectorError, activation, compile_selector
from shared.core.dra.model import Capacity, Range
from shared.core.dra.prepare import Prepared

D = "gpu.tessera.io"
NODE = "node-a"
MI = 1024 * 1024


def dev(name: str, shared: bool = False, **attrs: Any) -> dict[str, Any]:
    """A device with attributes (ints, bools, strings; ``v_`` prefix: a version)."""
    out: dict[str, Any] = {"name": name, "attributes": {}}
    for key, value in attrs.items():
        if key.startswith("v_"):
            out["attributes"][key[2:]] = {"version": value}
        elif isinstance(value, bool):
            out["attributes"][key] = {"bool": value}
        elif isinstance(value, int):
            out["attributes"][key] = {"int": value}
        else:
            out["attributes"][key] = {"string": value}
    if shared:
        out["allowMultipleAllocations"] = True
        out["capacity"] = {
            "memory": {
                "value": "80Gi",
                "requestPolicy": {
                    "default": "80Gi",
                    "validRange": {"min": "1Gi", "max": "80Gi", "step": "1Gi"},
                },
            },
            "cores": {
                "value": "100",
                "requestPolicy": {"default": "100", "validValues": ["10", "25", "50", "100"]},
            },
        }
    return out


def pools(*devices: dict[str, Any], pool: str = NODE) -> list[Any]:
    slices = [
        {
            "metadata": {"name": f"{pool}-gpu"},
            "spec": {
                "driver": D,
                "nodeName": NODE,
                "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                "devices": list(devices),
            },
        }
    ]
    return read.node_pools(slices, NODE)


CLASSES = {
    "gpu": read.class_record(
        {
            "metadata": {"name": "gpu"},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{D}'"}}]},
        }
    )
}


def claim(*requests: dict[str, Any], constraints: Any = (), name: str = "c") -> Any:
    spec: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        spec["constraints"] = list(constraints)
    return read.claim_record(
        {"metadata": {"name": name, "namespace": "ns"}, "spec": {"devices": spec}}
    )


def exactly(name: str = "r", **fields: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": "gpu", **fields}}


def decide(claims: list[Any], node_pools: list[Any], in_use: InUse | None = None) -> Outcome:
    prep = prepare(claims, CLASSES)
    assert isinstance(prep, Prepared)
    return allocate(prep, NODE, node_pools, in_use or InUse())


def devices_of(out: Outcome) -> list[list[str]]:
    assert out.allocations is not None, out.reason
    return [[f"{r.request}={r.device}" for r in a.results] for a in out.allocations]


# --- request policies ---------------------------------------------------------------


def test_a_request_is_rounded_up_to_the_next_step_of_the_range() -> None:
    c = Capacity(Fraction(80 * 1024 * MI), range=Range(Fraction(MI), None, Fraction(MI)))
    assert cap.consumed(Fraction(1_500_000), c) == 2 * MI  # 1500k is over 1Mi: 2Mi
    assert cap.consumed(Fraction(100), c) == MI  # below min: min
    assert cap.consumed(Fraction(3 * MI), c) == 3 * MI  # on a step: kept
    assert cap.consumed(None, c) == 80 * 1024 * MI  # not asked, no default: all of it


def test_steps_count_from_min_not_from_zero() -> None:
    c = Capacity(Fraction(100), range=Range(Fraction(5), Fraction(100), Fraction(10)))
    assert cap.consumed(Fraction(6), c) == 15
    assert cap.consumed(Fraction(15), c) == 15
    assert cap.consumed(Fraction(16), c) == 25


def test_valid_values_round_up_to_the_first_not_below() -> None:
    c = Capacity(Fraction(8), Fraction(1), values=(Fraction(1), Fraction(2), Fraction(4)))
    assert cap.consumed(Fraction(3), c) == 4
    assert cap.consumed(None, c) == 1  # the default
    assert cap.consumed(Fraction(5), c) == 5  # beyond the last: kept, and refused
    assert cap.breaks_policy(Fraction(5), c)


def test_a_request_above_the_range_is_refused_with_a_reason() -> None:
    c = Capacity(Fraction(100), range=Range(Fraction(1), Fraction(100), Fraction(1)))
    assert not cap.fits({"cores": Fraction(120)}, {"cores": c}, None, None)
    assert "outside the request policy's range" in cap.refusal(
        {"cores": Fraction(120)}, {"cores": c}
    )
    assert cap.refusal({"cores": Fraction(50)}, {"cores": c}) == ""


def test_refusals_name_the_amounts_as_quantities() -> None:
    c = Capacity(Fraction(100), values=(Fraction(10), Fraction(25)))
    assert cap.refusal({"cores": Fraction(30)}, {"cores": c}) == (
        "capacity 'cores': 30 is not one of the valid values (10, 25)"
    )
    r = Capacity(Fraction(8 << 30), range=Range(Fraction(1 << 20), None, Fraction(1 << 20)))
    assert cap.refusal({"m": Fraction(9 << 30)}, {"m": r}) == (
        "capacity 'm': 9Gi is more than the device has (8Gi)"
    )
    assert cap.refusal({"m": Fraction(1_500_000)}, {"m": r}) == ""
    assert cap.shown(Fraction(1_500_000)) == "1500k"


def test_a_capacity_the_device_lacks_does_not_fit() -> None:
    c = Capacity(Fraction(100))
    assert not cap.fits({"memory": Fraction(1)}, {"cores": c}, None, None)
    assert "not one of the device's" in cap.refusal({"memory": Fraction(1)}, {"cores": c})


def test_shares_consume_the_rounded_amounts_and_stop_at_the_value() -> None:
    node = pools(dev("gpu-0", shared=True, type="gpu"))
    # 30 cores round up to 50 (valid values), 20.5Gi to 21Gi; the whole memory otherwise.
    want = {"capacity": {"requests": {"cores": "30", "memory": "20.5Gi"}}}
    out = decide([claim(exactly(**want))], node)
    assert out.allocations is not None
    result = out.allocations[0].results[0]
    assert result.share
    assert result.consumed == {"cores": 50, "memory": 21 * 1024 * MI}
    # Two such claims fit (100 cores), a third does not.
    two = [claim(exactly(**want), name=f"c{i}") for i in range(2)]
    assert decide(two, node).fits
    three = [claim(exactly(**want), name=f"c{i}") for i in range(3)]
    assert decide(three, node).reason == CANNOT_ALLOCATE
    # What allocated claims consumed counts too.
    held = InUse(consumed={(D, NODE, "gpu-0"): {"cores": Fraction(60), "memory": Fraction(0)}})
    assert decide([claim(exactly(**want))], node, held).reason == CANNOT_ALLOCATE


def test_a_claim_asking_nothing_of_a_shared_device_takes_the_defaults() -> None:
    out = decide([claim(exactly())], pools(dev("gpu-0", shared=True)))
    assert out.allocations is not None
    assert out.allocations[0].results[0].consumed == {"cores": 100, "memory": 80 * 1024 * MI}


# --- constraints ----------------------------------------------------------------------


def test_distinct_attribute_needs_different_values() -> None:
    node = pools(dev("gpu-0", numa=0), dev("gpu-1", numa=0), dev("gpu-2", numa=1))
    distinct = [{"distinctAttribute": f"{D}/numa"}]
    out = decide([claim(exactly(count=2), constraints=distinct)], node)
    assert devices_of(out) == [["r=gpu-0", "r=gpu-2"]]  # gpu-1 skipped: same numa
    three = decide([claim(exactly(count=3), constraints=distinct)], node)
    assert three.reason == CANNOT_ALLOCATE


def test_match_attribute_backtracks_to_a_later_first_device() -> None:
    node = pools(dev("gpu-0", numa=0), dev("gpu-1", numa=1), dev("gpu-2", numa=1))
    match = [{"matchAttribute": f"{D}/numa"}]
    out = decide([claim(exactly(count=2), constraints=match)], node)
    assert devices_of(out) == [["r=gpu-1", "r=gpu-2"]]


def test_a_constraint_on_an_attribute_a_device_lacks_excludes_it() -> None:
    node = pools(dev("gpu-0"), dev("gpu-1", numa=0))
    out = decide([claim(exactly(), constraints=[{"matchAttribute": f"{D}/numa"}])], node)
    assert devices_of(out) == [["r=gpu-1"]]


def test_distinct_attribute_remembers_one_value_per_request() -> None:
    # The allocator compares a new device with the last one added per request name:
    # within one request of three devices the first and third may share a value.
    node = pools(dev("gpu-0", numa=0), dev("gpu-1", numa=1), dev("gpu-2", numa=0))
    out = decide([claim(exactly(count=3), constraints=[{"distinctAttribute": f"{D}/numa"}])], node)
    assert devices_of(out) == [["r=gpu-0", "r=gpu-1", "r=gpu-2"]]


# --- firstAvailable, All, admin access, taints ---------------------------------------------


def first_available(*subs: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "r",
        "firstAvailable": [
            {"name": f"s{i}", "deviceClassName": "gpu", **s} for i, s in enumerate(subs)
        ],
    }


def test_first_available_takes_the_first_subrequest_that_can_be_served() -> None:
    node = pools(dev("gpu-0", type="gpu"), dev("gpu-1", type="gpu"))
    big = {"count": 3}
    small = {"count": 2}
    out = decide([claim(first_available(big, small))], node)
    assert devices_of(out) == [["r/s1=gpu-0", "r/s1=gpu-1"]]
    out = decide([claim(first_available(small, {"count": 1}))], node)
    assert devices_of(out) == [["r/s0=gpu-0", "r/s0=gpu-1"]]  # order, not fewest


def test_first_available_choice_is_revisited_for_a_later_claim() -> None:
    node = pools(dev("gpu-0"), dev("gpu-1"))
    greedy = claim(first_available({"count": 2}, {"count": 1}), name="a")
    other = claim(exactly(), name="b")
    out = decide([greedy, other], node)
    assert devices_of(out) == [["r/s1=gpu-0"], ["r=gpu-1"]]


def test_all_mode_with_no_matching_device_does_not_fit() -> None:
    sel = [{"cel": {"expression": f"device.attributes['{D}'].type == 'npu'"}}]
    out = decide([claim(exactly(allocationMode="All", selectors=sel))], pools(dev("g", type="gpu")))
    assert out.reason == CANNOT_ALLOCATE


def test_all_mode_takes_every_match_and_fails_if_one_is_held() -> None:
    node = pools(dev("gpu-0"), dev("gpu-1"))
    out = decide([claim(exactly(allocationMode="All"))], node)
    assert devices_of(out) == [["r=gpu-0", "r=gpu-1"]]
    held = InUse(devices=frozenset({(D, NODE, "gpu-1")}))
    assert decide([claim(exactly(allocationMode="All"))], node, held).reason == CANNOT_ALLOCATE


def test_admin_access_ignores_devices_in_use_and_holds_nothing() -> None:
    node = pools(dev("gpu-0"))
    held = InUse(devices=frozenset({(D, NODE, "gpu-0")}))
    assert decide([claim(exactly())], node, held).reason == CANNOT_ALLOCATE
    out = decide([claim(exactly(adminAccess=True))], node, held)
    assert out.allocations is not None
    assert out.allocations[0].results[0].admin_access is True
    # An admin result does not count as held.
    status = {
        "devices": {
            "results": [
                {"request": "r", "driver": D, "pool": NODE, "device": "gpu-0", "adminAccess": True}
            ]
        }
    }
    assert read.in_use([{"status": {"allocation": status}}]) == InUse()


def test_a_tainted_device_needs_a_toleration() -> None:
    tainted = dev("gpu-0") | {"taints": [{"key": f"{D}/unhealthy", "effect": "NoSchedule"}]}
    node = pools(tainted)
    assert decide([claim(exactly())], node).reason == CANNOT_ALLOCATE
    tolerating = exactly(tolerations=[{"key": f"{D}/unhealthy", "operator": "Exists"}])
    assert decide([claim(tolerating)], node).fits


def test_exclusive_devices_are_not_given_twice_in_one_attempt() -> None:
    node = pools(dev("gpu-0"))
    assert decide([claim(exactly(), name="a"), claim(exactly(), name="b")], node).reason == (
        CANNOT_ALLOCATE
    )


def test_a_missing_device_class_is_refused_before_any_node() -> None:
    out = prepare([claim({"name": "r", "exactly": {"deviceClassName": "nope"}})], CLASSES)
    assert isinstance(out, Outcome)
    assert out.reason == "request r: device class nope does not exist"


def test_an_incomplete_pool_is_skipped_and_all_mode_on_it_is_an_error() -> None:
    slices = [
        {
            "metadata": {"name": "s0"},
            "spec": {
                "driver": D,
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 2},
                "devices": [dev("gpu-0")],
            },
        }
    ]
    node = read.node_pools(slices, NODE)
    assert node[0].incomplete
    assert decide([claim(exactly())], node).reason == CANNOT_ALLOCATE
    out = decide([claim(exactly(allocationMode="All"))], node)
    assert out.error
    assert "is currently being updated" in out.reason


# --- selectors ------------------------------------------------------------------------------


def matches(expression: str, device: dict[str, Any]) -> bool:
    [pool] = pools(device)
    return compile_selector(expression).matches(activation(D, pool.slices[0].devices[0]))


def test_unqualified_attributes_are_in_the_driver_domain() -> None:
    d = dev("g", index=3) | {"attributes": {"index": {"int": 3}, "x.io/zone": {"string": "a"}}}
    assert matches(f"device.attributes['{D}'].index == 3", d)
    assert matches("device.attributes['x.io'].zone == 'a'", d)
    assert not matches("has(device.attributes['other.io'].zone)", d)
    assert matches("device.driver == 'gpu.tessera.io'", d)


def test_versions_and_quantities_compare_with_kubernetes_functions() -> None:
    d = dev("g", shared=True, v_driverVersion="580.65.6")
    assert matches(f"device.attributes['{D}'].driverVersion.isGreaterThan(semver('550.0.0'))", d)
    assert matches(f"device.attributes['{D}'].driverVersion.major() == 580", d)
    assert matches(f"device.capacity['{D}'].memory.compareTo(quantity('80Gi')) == 0", d)
    assert matches(f"device.capacity['{D}'].memory.isLessThan(quantity('81Gi'))", d)
    assert matches("semver('1.2.3-rc.1').isLessThan(semver('1.2.3'))", d)
    assert matches("quantity('1Gi') == quantity('1024Mi')", d)
    assert matches("device.allowMultipleAllocations", d)


def test_values_of_different_types_are_unequal_not_an_error() -> None:
    assert not matches(f"device.attributes['{D}'].index == 'three'", dev("g", index=3))


def test_a_selector_that_does_not_compile_stops_the_attempt() -> None:
    sel = [{"cel": {"expression": "device.attributes["}}]
    out = decide([claim(exactly(selectors=sel))], pools(dev("gpu-0")))
    assert out.error
    assert out.reason.startswith("claim ns/c: selector #0: CEL compile error: compilation failed")


def test_a_selector_that_fails_on_a_device_stops_the_attempt() -> None:
    sel = [{"cel": {"expression": f"device.attributes['{D}'].missing == 1"}}]
    out = decide([claim(exactly(selectors=sel))], pools(dev("gpu-0")))
    assert out.error
    assert "CEL runtime error" in out.reason
    # ... but only where a device reaches it: with none, the node just does not fit.
    assert decide([claim(exactly(selectors=sel))], []).reason == CANNOT_ALLOCATE


def test_compiled_selectors_are_cached() -> None:
    assert compile_selector("device.driver == 'x'") is compile_selector("device.driver == 'x'")


# --- the allocation written --------------------------------------------------------------


def test_the_allocation_as_status_allocation() -> None:
    out = decide([claim(exactly(capacity={"requests": {"cores": "20"}}))], pools(dev("g", True)))
    assert out.allocations is not None
    written = read.allocation_json(out.allocations[0], lambda: "share-1")
    assert written == {
        "devices": {
            "results": [
                {
                    "request": "r",
                    "driver": D,
                    "pool": NODE,
                    "device": "g",
                    "shareID": "share-1",
                    "consumedCapacity": {"memory": str(80 * 1024 * MI), "cores": "25"},
                }
            ]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
            ]
        },
    }


@pytest.mark.parametrize(
    ("value", "text"),
    [(Fraction(3), "3"), (Fraction(3, 2), "1500m"), (Fraction(1, 3), "333333334n")],
)
def test_quantity_text(value: Fraction, text: str) -> None:
    assert read.quantity_text(value) == text


def test_a_search_beyond_its_step_budget_stops_the_attempt() -> None:
    node = pools(*(dev(f"gpu-{i}", numa=i % 2) for i in range(6)))
    # Four devices of one numa node do not exist: every choice is tried.
    hopeless = claim(exactly(count=4), constraints=[{"matchAttribute": f"{D}/numa"}])
    prep = prepare([hopeless], CLASSES)
    assert isinstance(prep, Prepared)
    assert allocate(prep, NODE, node, InUse()).reason == CANNOT_ALLOCATE
    out = allocate(prep, NODE, node, InUse(), max_steps=10)
    assert out.error
    assert out.reason == f"node {NODE}: timed out trying to allocate devices"


def test_a_subrequest_has_no_admin_access() -> None:
    # resource.k8s.io/v1 has no adminAccess on a firstAvailable subrequest: a field
    # written there is not read, so the device in use stays unavailable.
    node = pools(dev("gpu-0"))
    held = InUse(devices=frozenset({(D, NODE, "gpu-0")}))
    out = decide([claim(first_available({"adminAccess": True}))], node, held)
    assert out.reason == CANNOT_ALLOCATE


def test_an_error_in_an_equality_stays_an_error() -> None:
    sel = f"device.attributes['{D}'].missing == 1 || true"
    assert matches(sel, dev("g"))  # CEL's || absorbs the error
    with pytest.raises(SelectorError):
        matches(f"device.attributes['{D}'].missing != 1", dev("g"))


def test_class_and_claim_config_are_copied_per_request() -> None:
    classes = {
        "gpu": read.class_record(
            {
                "metadata": {"name": "gpu"},
                "spec": {"config": [{"opaque": {"driver": D, "parameters": {"a": 1}}}]},
            }
        )
    }
    spec = {
        "requests": [exactly("r0"), exactly("r1")],
        "config": [{"requests": ["r1"], "opaque": {"driver": D, "parameters": {"b": 2}}}],
    }
    c = read.claim_record({"metadata": {"name": "c"}, "spec": {"devices": spec}})
    prep = prepare([c], classes)
    assert isinstance(prep, Prepared)
    out = allocate(prep, NODE, pools(dev("gpu-0"), dev("gpu-1")), InUse())
    assert out.allocations is not None
    written = read.allocation_json(out.allocations[0], lambda: "x")["devices"]["config"]
    assert written == [
        {
            "source": "FromClass",
            "requests": ["r0", "r1"],
            "opaque": {"driver": D, "parameters": {"a": 1}},
        },
        {
            "source": "FromClaim",
            "requests": ["r1"],
            "opaque": {"driver": D, "parameters": {"b": 2}},
        },
    ]


def test_the_newest_generation_of_a_pool_is_read() -> None:
    def sl(name: str, generation: int, count: int, *devices: str) -> dict[str, Any]:
        pool = {"name": "p", "generation": generation, "resourceSliceCount": count}
        spec = {"driver": D, "nodeName": NODE, "pool": pool, "devices": [dev(d) for d in devices]}
        return {"metadata": {"name": name}, "spec": spec}

    [pool] = read.node_pools([sl("old", 1, 1, "a"), sl("new", 2, 1, "b")], NODE)
    assert [d.name for s in pool.slices for d in s.devices] == ["b"]
    assert not pool.incomplete
    [pool] = read.node_pools([sl("x", 2, 2, "b")], NODE)
    assert pool.incomplete
    assert read.node_pools([sl("x", 2, 1, "b")], "other-node") == []


def test_in_use_sums_the_shares_of_a_device() -> None:
    def share(uid: str, memory: str) -> dict[str, Any]:
        result = {
            "request": "r",
            "driver": D,
            "pool": NODE,
            "device": "g",
            "shareID": uid,
            "consumedCapacity": {"memory": memory},
        }
        return {"status": {"allocation": {"devices": {"results": [result]}}}}

    held = read.in_use([share("1", "1Gi"), share("2", "512Mi")])
    assert held.consumed == {(D, NODE, "g"): {"memory": Fraction(1536 * MI)}}
    assert held.devices == frozenset()


def test_a_slice_node_selector_becomes_the_allocation_node_selector() -> None:
    rack = {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}
    spec = {
        "driver": D,
        "nodeSelector": {"nodeSelectorTerms": [rack]},
        "pool": {"name": "rack", "generation": 1, "resourceSliceCount": 1},
        "devices": [dev("nic-0")],
    }
    slices = [{"metadata": {"name": "rack"}, "spec": spec}]
    assert read.node_pools(slices, NODE, {"rack": "r2"}) == []
    node = read.node_pools(slices, NODE, {"rack": "r1"})
    out = decide([claim(exactly())], node)
    assert out.allocations is not None
    assert out.allocations[0].node_selector == {"nodeSelectorTerms": [rack]}
    # Two terms: the allocator cannot write one selector for them.
    spec["nodeSelector"] = {"nodeSelectorTerms": [rack, rack]}
    out = decide([claim(exactly())], read.node_pools(slices, NODE, {"rack": "r1"}))
    assert out.error
    assert out.reason.endswith("unsupported ResourceSlice.NodeSelector with 2 terms")


def test_in_use_plus_then_minus_an_allocation_is_what_it_was() -> None:
    node = pools(dev("gpu-0", shared=True), dev("gpu-1"))
    out = decide([claim(exactly("a", capacity={"requests": {"cores": "25"}}), exactly("b"))], node)
    assert out.allocations is not None
    before = InUse(consumed={(D, NODE, "gpu-0"): {"cores": Fraction(50)}})
    after = before.plus(out.allocations)
    assert after.devices == {(D, NODE, "gpu-1")}
    assert after.consumed[(D, NODE, "gpu-0")]["cores"] == 75
    assert after.minus(out.allocations) == before
    # Assumed, the same claims do not fit again beside themselves.
    again = decide([claim(exactly("a", capacity={"requests": {"cores": "60"}}))], node, after)
    assert again.reason == CANNOT_ALLOCATE


def partitioned(*sizes: int, held: tuple[str, ...] = ()) -> tuple[list[Any], InUse]:
    """A card of 8 slices offered as partitions of ``sizes`` slices each."""
    ref = {"name": "card", "generation": 1, "resourceSliceCount": 2}
    devices = [
        dev(f"p{i}")
        | {
            "consumesCounters": [
                {"counterSet": "card", "counters": {"slices": {"value": str(size)}}}
            ]
        }
        for i, size in enumerate(sizes)
    ]
    slices = [
        {
            "metadata": {"name": "a-counters"},
            "spec": {
                "driver": D,
                "nodeName": NODE,
                "pool": ref,
                "sharedCounters": [{"name": "card", "counters": {"slices": {"value": "8"}}}],
            },
        },
        {
            "metadata": {"name": "b-devices"},
            "spec": {"driver": D, "nodeName": NODE, "pool": ref, "devices": devices},
        },
    ]
    return read.node_pools(slices, NODE), InUse(devices=frozenset((D, "card", h) for h in held))


def test_partitions_draw_on_the_shared_counters() -> None:
    node, nothing = partitioned(4, 4, 2)
    out = decide([claim(exactly(count=2))], node, nothing)
    assert devices_of(out) == [["r=p0", "r=p1"]]  # 4 + 4 of 8
    assert decide([claim(exactly(count=3))], node, nothing).reason == CANNOT_ALLOCATE
    # p0 allocated already: 4 left, p1 and p2 together would need 6.
    node, held = partitioned(4, 4, 2, held=("p0",))
    assert decide([claim(exactly(count=2))], node, held).reason == CANNOT_ALLOCATE
    assert devices_of(decide([claim(exactly())], node, held)) == [["r=p1"]]


def test_a_pool_drawing_on_a_missing_counter_is_invalid() -> None:
    spec = {"driver": D, "nodeName": NODE, "devices": [dev("x")]}
    ref = {"name": "card", "generation": 1, "resourceSliceCount": 1}
    broken = dev("x") | {
        "consumesCounters": [{"counterSet": "nope", "counters": {"s": {"value": "1"}}}]
    }
    slices = [{"metadata": {"name": "s"}, "spec": {**spec, "pool": ref, "devices": [broken]}}]
    [pool] = read.node_pools(slices, NODE)
    assert pool.invalid == "counter set nope not found"
    out = decide([claim(exactly())], [pool])
    assert out.reason == "invalid resource pools were encountered"
    assert not out.error
    assert decide([claim(exactly(allocationMode="All"))], [pool]).error


def test_a_capacity_request_no_device_can_serve_is_explained() -> None:
    node = pools(dev("gpu-0", shared=True))
    out = decide([claim(exactly(capacity={"requests": {"memory": "100Gi"}}))], node)
    assert out.reason == CANNOT_ALLOCATE
    assert out.hints == (
        "claim ns/c, request r: no device it selects can serve its capacity request "
        "(capacity 'memory': 100Gi is outside the request policy's range (1Gi to 80Gi, "
        "step 1Gi))",
    )
    # A request that merely finds the device full gets no such hint.
    held = InUse(consumed={(D, NODE, "gpu-0"): {"memory": Fraction(80 * 1024 * MI)}})
    full = decide([claim(exactly(capacity={"requests": {"memory": "1Gi"}}))], node, held)
    assert full.reason == CANNOT_ALLOCATE
    assert full.hints == ()


def test_per_device_node_selection_offers_only_this_nodes_devices() -> None:
    devices = [dev("far") | {"nodeName": "node-b"}, dev("near") | {"nodeName": NODE}]
    spec = {
        "driver": D,
        "perDeviceNodeSelection": True,
        "pool": {"name": "spread", "generation": 1, "resourceSliceCount": 1},
        "devices": devices,
    }
    node = read.node_pools([{"metadata": {"name": "spread"}, "spec": spec}], NODE)
    out = decide([claim(exactly())], node)
    assert devices_of(out) == [["r=near"]]
    assert out.allocations is not None
    pin = {"key": "metadata.name", "operator": "In", "values": [NODE]}
    assert out.allocations[0].node_selector == {"nodeSelectorTerms": [{"matchFields": [pin]}]}


def test_numbers_of_different_types_compare_by_value() -> None:
    d = dev("g", index=3)
    assert matches(f"device.attributes['{D}'].index < 3.5", d)
    assert matches(f"device.attributes['{D}'].index >= 3.0", d)
    assert matches(f"device.attributes['{D}'].index == 3.0", d)
    assert not matches(f"device.attributes['{D}'].index > 3", d)
