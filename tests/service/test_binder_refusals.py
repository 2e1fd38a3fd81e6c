"""The binder's reading of a refused Binding (services/binder/service.py): the API
server's ``Status`` (shared/kube.py ``refusal``) and, for a conflict, the pod as it is
now give the cause the coordinator acts on; a refusal is never retried blindly, and only
one its owner can act on is told to them.

The ``Status`` bodies are the pinned kube-apiserver's own answers to a Binding, recorded
from tests/integration/test_gates.py's cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from services.binder import service as binder
from shared import events as ev
from shared import kube
from shared.core import annotations as ann
from shared.core.model import NodeName, PodRef, PodUID
from shared.metrics import Metrics
from tests.samples import GRANTS

POD = PodRef(namespace="ml", name="g", uid=PodUID("uid-g"))
NODE = NodeName("n1")
DECIDED = ev.AllocationDecided(pod=POD, node=NODE, grants=GRANTS, attempt=3)


def status(code: int, reason: str, message: str, kind: str = "pods/binding") -> bytes:
    """A ``Status`` body as the API server writes it."""
    return json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "details": {"name": "g", "kind": kind},
            "code": code,
        }
    ).encode()


CONFLICT = 'Operation cannot be fulfilled on pods/binding "g": '
GATED = status(409, "Conflict", CONFLICT + "pod g has non-empty .spec.schedulingGates")
ASSIGNED = status(409, "Conflict", CONFLICT + 'pod g is already assigned to node "n2"')
DELETING = status(
    409, "Conflict", CONFLICT + "pod g is being deleted, cannot be assigned to a host"
)
REPLACED = status(
    409,
    "Conflict",
    'Operation cannot be fulfilled on pods "g": StorageError: invalid object, Code: 4, '
    "AdditionalErrorMsg: Precondition failed: UID in precondition: uid-g, UID in object "
    "meta: uid-other",
    kind="pods",
)
NOT_FOUND = status(404, "NotFound", 'pods "g" not found', kind="pods")
DENIED = status(
    403,
    "Forbidden",
    'pods "g" is forbidden: User "system:serviceaccount:tessera:binder" cannot create '
    'resource "pods/binding" in API group "" in the namespace "ml"',
)
POLICY = status(
    403,
    "Forbidden",
    'admission webhook "gpu-policy.example.com" denied the request: team ml may not use node n1',
)


def refused(code: int, body: bytes | None) -> ApiException:
    exc = ApiException(status=code, reason="Whatever")
    exc.body = body
    return exc


def pod(
    *,
    uid: str = POD.uid,
    node: str = "",
    gates: tuple[str, ...] = (),
    deleting: bool = False,
    grants: bool = False,
) -> dict[str, Any]:
    """The pod as a GET answers it just after the conflict."""
    meta: dict[str, Any] = {"name": POD.name, "namespace": POD.namespace, "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if grants:
        meta["annotations"] = ann.grant_annotations(NODE, GRANTS, 0.0)
    spec: dict[str, Any] = {"containers": [{"name": "main"}]}
    if node:
        spec["nodeName"] = node
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    return {"metadata": meta, "spec": spec}


def test_the_status_body_is_read_and_a_body_that_is_none_falls_back_to_the_phrase() -> None:
    said = kube.refusal(refused(409, GATED))
    assert (said.code, said.reason) == (409, "Conflict")
    assert said.message.endswith("pod g has non-empty .spec.schedulingGates")
    proxy = kube.refusal(refused(502, b"<html>Bad Gateway</html>"))
    assert proxy == kube.ApiStatus(code=502, reason="Whatever", message="Whatever")
    assert kube.refusal(refused(500, None)).code == 500
    assert kube.refusal(refused(500, b'{"code": "five hundred"}')).code == 500


@pytest.mark.parametrize(
    ("body", "found", "cause", "words"),
    [
        (
            GATED,
            pod(gates=("example.com/quota", "kueue.x-k8s.io/admission")),
            "gated",
            "scheduling gates example.com/quota, kueue.x-k8s.io/admission",
        ),
        (ASSIGNED, pod(node="n2"), "taken", "already bound to n2"),
        (ASSIGNED, pod(node=NODE), "taken", "already bound to n1"),  # not with this grant
        (DELETING, pod(deleting=True), "gone", "being deleted"),
        (REPLACED, pod(uid="uid-other"), "gone", "replaced by another of the same name"),
        (GATED, None, "gone", "no longer exists"),
        (status(409, "Conflict", "something new"), pod(), "refused", "something new"),
    ],
)
def test_a_conflict_is_read_from_the_pod_as_it_is_now(
    body: bytes, found: dict[str, Any] | None, cause: str, words: str
) -> None:
    reading = binder.read_conflict(DECIDED, kube.refusal(refused(409, body)), found)
    assert reading is not None
    assert reading.cause == cause
    assert words in reading.why


def test_a_conflict_with_the_pod_bound_as_decided_is_an_earlier_try_that_succeeded() -> None:
    answer = kube.refusal(refused(409, ASSIGNED))
    assert binder.read_conflict(DECIDED, answer, pod(node=NODE, grants=True)) is None


@pytest.mark.parametrize(
    ("code", "body", "cause"),
    [
        (404, NOT_FOUND, "gone"),
        (503, None, "transient"),
        (429, None, "transient"),
        (403, DENIED, "refused"),
        (403, POLICY, "refused"),
        (422, status(422, "Invalid", "Binding.target.name: Required value"), "refused"),
    ],
)
def test_any_other_answer_is_read_by_its_code(code: int, body: bytes | None, cause: str) -> None:
    assert binder.read_refusal(kube.refusal(refused(code, body))).cause == cause


class _Binder:
    """What ``Binder._bind``, ``_conflict`` and ``_refused`` use of the binder."""

    def __init__(self) -> None:
        self.api: Any = None
        self.published: list[ev.Event] = []
        self.told: list[str] = []
        self.bind_failures = Metrics("test").counter("failures", "")
        self.rt: Any = type("Rt", (), {"bus": self})()

    async def publish(self, event: ev.Event) -> None:
        self.published.append(event)

    async def tell_unschedulable(self, _pod: PodRef, message: str) -> None:
        self.told.append(message)

    async def _conflict(self, decided: ev.AllocationDecided, answer: kube.ApiStatus) -> Any:
        return await binder.Binder._conflict(self, decided, answer)  # type: ignore[arg-type]


async def test_a_gated_pod_s_binding_is_tried_once_read_and_not_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bug: a gated pod's Binding, refused 409, was read as "already bound to None"
    and tried again about 19 times a second for as long as it stayed gated."""
    tries: list[NodeName] = []

    async def bind(_api: Any, _pod: PodRef, node: NodeName, _annotations: Any) -> None:
        tries.append(node)
        raise refused(409, GATED)

    async def read(_api: Any, method: str, path: str, *_: Any, **__: Any) -> Any:
        assert (method, path) == ("GET", "/api/v1/namespaces/ml/pods/g")
        return pod(gates=("example.com/quota",))

    monkeypatch.setattr(kube, "bind", bind)
    monkeypatch.setattr(kube, "request", read)
    fake = _Binder()
    reading = await binder.Binder._bind(fake, DECIDED, {})  # type: ignore[arg-type]
    assert reading is not None
    assert tries == [NODE]
    await binder.Binder._refused(fake, DECIDED, reading)  # type: ignore[arg-type]
    [failed] = fake.published
    assert isinstance(failed, ev.AllocationBindFailed)
    assert (failed.cause, failed.attempt) == ("gated", 3)
    assert fake.told == []


async def test_a_transient_answer_is_retried_and_any_other_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers = [refused(503, None), refused(429, None), refused(403, POLICY)]
    tries = 0

    async def bind(*_: Any) -> None:
        nonlocal tries
        tries += 1
        raise answers[min(tries, len(answers)) - 1]

    async def nap(_s: float) -> None:
        return None

    monkeypatch.setattr(kube, "bind", bind)
    monkeypatch.setattr(binder.asyncio, "sleep", nap)
    reading = await binder.Binder._bind(_Binder(), DECIDED, {})  # type: ignore[arg-type]
    assert reading is not None
    assert (tries, reading.cause) == (3, "refused")


async def test_only_a_refusal_the_owner_can_act_on_is_told() -> None:
    """An admission policy's refusal is the pod owner's to act on; the binder's own
    account denied is the operator's (logged), and so is an API server out of reach."""
    fake = _Binder()
    for code, body in ((403, POLICY), (403, DENIED), (503, None), (404, NOT_FOUND)):
        reading = binder.read_refusal(kube.refusal(refused(code, body)))
        await binder.Binder._refused(fake, DECIDED, reading)  # type: ignore[arg-type]
    assert [e.cause for e in fake.published if isinstance(e, ev.AllocationBindFailed)] == [
        "refused",
        "refused",
        "transient",
        "gone",
    ]
    [told] = fake.told
    assert "gpu-policy.example.com" in told
    assert told.startswith("Binding to n1 refused; placed again later:")
