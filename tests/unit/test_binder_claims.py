"""The binder's ResourceClaim writes (services/binder/claims.py) against a claim held in
memory: allocation and reservedFor written before the Binding, a conflict read again,
a claim allocated meanwhile refused, and the undo of a failed Binding."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from services.binder import claims
from shared import events as ev
from shared.core.dra import binding
from tests.unit.corekit import ref

ALLOCATION = {"devices": {"results": [{"request": "gpu", "pool": "n1", "device": "gpu-0"}]}}
OTHER = {"devices": {"results": [{"request": "gpu", "pool": "n2", "device": "gpu-0"}]}}
DECIDED = (ev.ClaimAllocation(namespace="ns", name="c", uid="u1", allocation=ALLOCATION),)


class FakeApi:
    """One claim ``ns/c``; ``conflicts`` PUTs are answered 409 first. A PUT of the claim
    writes its metadata only, one of ``/status`` its status only (as the API server
    does); ``writes`` records which, in order."""

    def __init__(self, status: dict[str, Any] | None = None, conflicts: int = 0) -> None:
        self.obj: dict[str, Any] = {
            "metadata": {"name": "c", "namespace": "ns", "uid": "u1", "resourceVersion": "1"},
            "status": status or {},
        }
        self.conflicts = conflicts
        self.puts = 0
        self.writes: list[str] = []

    async def request(self, _api: object, method: str, path: str, body: Any = None) -> Any:
        assert path.startswith(f"{claims.RESOURCE}/namespaces/ns/resourceclaims/c")
        if method == "GET":
            return copy.deepcopy(self.obj)
        assert method == "PUT"
        self.puts += 1
        if self.conflicts:
            self.conflicts -= 1
            raise ApiException(status=409)
        part = "status" if path.endswith("/status") else "metadata"
        self.writes.append(part)
        self.obj[part] = copy.deepcopy(body[part])
        return copy.deepcopy(self.obj)


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    fake = FakeApi()
    monkeypatch.setattr(claims.kube, "request", fake.request)
    return fake


async def test_the_allocation_and_the_pod_are_written_and_a_conflict_is_read_again(
    api: FakeApi,
) -> None:
    api.conflicts = 1
    pod = ref("p")
    assert await claims.reserve(object(), pod, DECIDED) is None  # type: ignore[arg-type]
    assert api.puts == 3  # the conflict, then the finalizer, then the status
    assert api.writes == ["metadata", "status"]  # kube-scheduler's finalizer first
    assert api.obj["metadata"]["finalizers"] == [claims.FINALIZER]
    written = dict(api.obj["status"]["allocation"])
    # stamped as kube-scheduler stamps it: binding conditions' timeout counts from it
    assert abs(binding.allocated_at({"status": {"allocation": written}}) - time.time()) < 5
    del written["allocationTimestamp"]
    assert written == ALLOCATION
    assert api.obj["status"]["reservedFor"] == [
        {"resource": "pods", "name": pod.name, "uid": pod.uid}
    ]
    # Delivered again: nothing more is written.
    assert await claims.reserve(object(), pod, DECIDED) is None  # type: ignore[arg-type]
    assert api.puts == 3
    # The Binding failed: the pod leaves, and with nobody left the allocation goes, then
    # the finalizer.
    await claims.undo(object(), pod, DECIDED)  # type: ignore[arg-type]
    assert api.obj["status"] == {}
    assert api.writes[2:] == ["status", "metadata"]
    assert api.obj["metadata"]["finalizers"] == []


async def test_a_claim_allocated_meanwhile_or_replaced_is_not_overwritten(api: FakeApi) -> None:
    api.obj["status"] = {"allocation": OTHER}
    refused = await claims.reserve(object(), ref("p"), DECIDED)  # type: ignore[arg-type]
    assert refused == ("refused", "resourceclaim ns/c was allocated meanwhile")
    assert api.obj["status"] == {"allocation": OTHER}
    api.obj = {"metadata": {"name": "c", "uid": "u2"}, "status": {}}
    refused = await claims.reserve(object(), ref("p"), DECIDED)  # type: ignore[arg-type]
    assert refused == ("refused", "resourceclaim ns/c was replaced")


async def test_undo_leaves_a_claim_another_pod_shares(api: FakeApi) -> None:
    other = {"resource": "pods", "name": "q", "uid": "q-uid"}
    api.obj["status"] = {"allocation": ALLOCATION, "reservedFor": [other]}
    pod = ref("p")
    assert await claims.reserve(object(), pod, DECIDED) is None  # type: ignore[arg-type]
    assert len(api.obj["status"]["reservedFor"]) == 2
    await claims.undo(object(), pod, DECIDED)  # type: ignore[arg-type]
    assert api.obj["status"] == {"allocation": ALLOCATION, "reservedFor": [other]}


async def test_a_claim_allocated_by_another_is_only_reserved_and_undo_keeps_it(
    api: FakeApi,
) -> None:
    api.obj["status"] = {"allocation": ALLOCATION}
    theirs = (
        ev.ClaimAllocation(
            namespace="ns", name="c", uid="u1", allocation=ALLOCATION, reserve_only=True
        ),
    )
    pod = ref("p")
    assert await claims.reserve(object(), pod, theirs) is None  # type: ignore[arg-type]
    assert [r["uid"] for r in api.obj["status"]["reservedFor"]] == [pod.uid]
    await claims.undo(object(), pod, theirs)  # type: ignore[arg-type]
    assert api.obj["status"] == {"allocation": ALLOCATION}
    assert "metadata" not in api.writes  # not Tessera's allocation: no finalizer of its own
