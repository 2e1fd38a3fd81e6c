"""Binding conditions read as kube-scheduler's DynamicResources PreBind reads them
(shared/core/dra/binding.py): a claim is ready once every result with binding
conditions has them all True in the matching ``status.devices`` entry (driver, pool,
device), failed once a failure condition is True, timed out past the binding timeout
counted from ``allocationTimestamp``."""

from __future__ import annotations

from typing import Any

from services.device_allocator.pods import bind_wait_s
from services.device_allocator.reservations import Reservation
from shared.core.dra import binding
from shared.core.ledger import PodGrant
from shared.core.model import NodeName, PodRef, PodUID
from shared.events import ClaimAllocation

DRIVER = "gpu.example.com"
AT = "2026-11-27T01:00:00Z"
AT_S = 1795741200.0  # AT in seconds since the epoch


def result(device: str = "gpu-0", *, conditions: bool = True, pool: str = "n1") -> dict[str, Any]:
    found: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}
    if conditions:
        found["bindingConditions"] = ["attached", "ready"]
        found["bindingFailureConditions"] = ["failed"]
    return found


def cond(
    kind: str, status: str = "True", reason: str = "Done", message: str = ""
) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def claim(
    *results: dict[str, Any], devices: list[dict[str, Any]] | None = None, at: str | None = AT
) -> dict[str, Any]:
    allocation: dict[str, Any] = {"devices": {"results": list(results)}}
    if at is not None:
        allocation["allocationTimestamp"] = at
    status: dict[str, Any] = {"allocation": allocation}
    if devices is not None:
        status["devices"] = devices
    return {"metadata": {"name": "c1", "namespace": "ns"}, "status": status}


def status(device: str = "gpu-0", *conds: dict[str, Any], pool: str = "n1") -> dict[str, Any]:
    return {"driver": DRIVER, "pool": pool, "device": device, "conditions": list(conds)}


def test_a_claim_without_binding_conditions_is_ready_and_one_not_allocated_waits() -> None:
    assert binding.readiness(claim(result(conditions=False))).state == "ready"
    assert not binding.conditioned(claim(result(conditions=False))["status"]["allocation"])
    assert binding.conditioned(claim(result())["status"]["allocation"])
    assert binding.readiness({"metadata": {"name": "c1"}, "status": {}}).state == "waiting"


def test_it_waits_until_every_binding_condition_of_the_matching_device_is_true() -> None:
    assert binding.readiness(claim(result())) == (
        "waiting",
        "claim c1 waits for attached, ready on gpu.example.com/n1/gpu-0",
        "",
    )
    half = claim(result(), devices=[status("gpu-0", cond("attached"), cond("ready", "False"))])
    assert binding.readiness(half) == (
        "waiting",
        "claim c1 waits for ready on gpu.example.com/n1/gpu-0",
        "",
    )
    done = claim(result(), devices=[status("gpu-0", cond("attached"), cond("ready"))])
    assert binding.readiness(done).state == "ready"


def test_the_status_is_matched_by_driver_pool_and_device() -> None:
    ready = [cond("attached"), cond("ready")]
    elsewhere = claim(
        result(), devices=[status("gpu-1", *ready), status("gpu-0", *ready, pool="n2")]
    )
    assert binding.readiness(elsewhere).state == "waiting"
    # Two results: each needs its own device's conditions.
    two = claim(result("gpu-0"), result("gpu-1"), devices=[status("gpu-1", *ready)])
    assert "gpu-0" in binding.readiness(two).why
    two["status"]["devices"].append(status("gpu-0", *ready))
    assert binding.readiness(two).state == "ready"


def test_a_failure_condition_fails_it_with_kube_schedulers_words() -> None:
    failed = cond("failed", reason="NoFabric", message='link "x" down')
    found = binding.readiness(claim(result(), devices=[status("gpu-0", cond("attached"), failed)]))
    assert found == (
        "failed",
        'device binding failed: claim=c1, reason=NoFabric, message="link \\"x\\" down"',
        "c1",
    )
    # A failure condition False, or one of a result without binding conditions, is no failure.
    calm = claim(result(), devices=[status("gpu-0", cond("failed", "False"))])
    assert binding.readiness(calm).state == "waiting"
    plain = result(conditions=False)
    plain["bindingFailureConditions"] = ["failed"]
    assert binding.readiness(claim(plain, devices=[status("gpu-0", failed)])).state == "ready"


def test_the_timeout_counts_from_the_allocation_timestamp() -> None:
    waiting = claim(result())
    assert binding.allocated_at(waiting) == AT_S
    assert not binding.timed_out(waiting, AT_S + 600, 600)
    assert binding.timed_out(waiting, AT_S + 600.5, 600)
    assert not binding.timed_out(claim(result(), at=None), AT_S + 10_000, 600)
    assert not binding.timed_out(claim(result(conditions=False)), AT_S + 10_000, 600)
    assert binding.allocated_at(claim(result(), at="yesterday")) is None
    assert binding.timestamp(AT_S + 0.7) == AT


def test_a_pods_claims_are_ready_together_and_the_first_failure_or_timeout_fails_it() -> None:
    ready = claim(result(), devices=[status("gpu-0", cond("attached"), cond("ready"))])
    plain = claim(result(conditions=False))
    assert binding.pod_readiness([ready, plain], AT_S, 600).state == "ready"
    waiting = claim(result())
    assert binding.pod_readiness([ready, waiting], AT_S, 600).state == "waiting"
    late = binding.pod_readiness([ready, waiting], AT_S + 601, 600)
    assert late.state == "failed"
    assert late.why.startswith("device binding timeout: claim=c1 (claim c1 waits for attached")
    failed = claim(result(), devices=[status("gpu-0", cond("failed"))])
    assert binding.pod_readiness([waiting, failed], AT_S, 600).why.startswith(
        "device binding failed: claim=c1"
    )


def test_the_allocator_keeps_a_reservation_whose_devices_have_binding_conditions_longer() -> None:
    """Its binder waits up to the binding timeout: the devices must stay reserved."""
    pod = PodRef(namespace="ns", name="p", uid=PodUID("u1"))

    def reservation(*results: dict[str, Any]) -> Reservation:
        allocation = {"devices": {"results": list(results)}}
        claims = (ClaimAllocation(namespace="ns", name="c1", uid="c", allocation=allocation),)
        grant = PodGrant(pod=pod, node=NodeName("n1"), containers=())
        return Reservation(grant=grant, attempt=1, at=0.0, claims=claims)

    assert bind_wait_s(reservation(result()), 30, 600) == 630
    assert bind_wait_s(reservation(result(conditions=False)), 30, 600) == 30
    plain = Reservation(
        grant=PodGrant(pod=pod, node=NodeName("n1"), containers=()), attempt=1, at=0.0
    )
    assert bind_wait_s(plain, 30, 600) == 30
