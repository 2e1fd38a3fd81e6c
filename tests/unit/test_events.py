"""The event contract: every type round-trips, subjects are well formed, schema is fresh."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from shared import events as ev
from shared.core.model import PodRef, PodUID
from tests.samples import sample_events
from tools.cli import DEFAULT_SCHEMA, _schema_text

REPO = Path(__file__).resolve().parents[2]


def test_samples_cover_every_event_type() -> None:
    assert {type(e) for e in sample_events()} == set(ev.EVENT_TYPES)


@pytest.mark.parametrize("event", sample_events(), ids=lambda e: type(e).__name__)
def test_event_round_trips_through_json(event: ev.Event) -> None:
    data = ev.encode(event)
    decoded = ev.decode(data)
    assert decoded == event
    assert type(decoded) is type(event)
    assert json.loads(data)["type"] == event.__struct_config__.tag


@pytest.mark.parametrize("event", sample_events(), ids=lambda e: type(e).__name__)
def test_subject_is_under_the_stream_and_valid(event: ev.Event) -> None:
    subject = event.subject()
    assert subject.startswith(type(event).SUBJECT)
    assert subject.startswith("tessera.v1.")
    tokens = subject.split(".")
    assert all(tokens), subject
    assert not any(ch in subject for ch in " *>")


def test_subject_token_escapes_dots_and_wildcards_reversibly() -> None:
    assert ev.subject_token("gpu-node.rack-1") == "gpu-node%2Erack-1"
    assert ev.subject_token("a*b>c d%") == "a%2Ab%3Ec%20d%25"
    assert ev.subject_token("") == "%00"


def test_a_pod_event_names_its_namespace_and_whether_a_volcano_job_controls_it() -> None:
    pod = PodRef(namespace="ml", name="train-worker-0", uid=PodUID("u1"))
    assert ev.PodUpdated(pod=pod, job="train").subject() == "tessera.v1.pod.updated.ml.vcjob"
    assert ev.PodDeleted(pod=pod).subject() == "tessera.v1.pod.deleted.ml.-"
    # Filters: every pod's, or one namespace's (either owner).
    assert ev.PodUpdated.filter_subject() == "tessera.v1.pod.updated.>"
    assert ev.PodUpdated.filter_subject("ml") == "tessera.v1.pod.updated.ml.*"
    assert ev.NodeInventory.filter_subject("n.1") == "tessera.v1.node.inventory.n%2E1"


def test_the_job_controller_reads_job_events_only() -> None:
    """Its Jobs' pods it watches itself: their phase, readiness, restarts and exit codes
    are not on the bus (services/job_controller/service.py)."""
    from services.job_controller.service import JobController

    assert JobController.subjects(JobController.__new__(JobController)) == [
        "tessera.v1.job.deleted.>",
        "tessera.v1.job.updated.>",
    ]


def test_the_watcher_names_the_volcano_job_that_controls_a_pod() -> None:
    from services.watcher.translate import volcano_job

    owner = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "train"}
    assert volcano_job({"ownerReferences": [{**owner, "controller": True}]}) == "train"
    assert volcano_job({"ownerReferences": [owner]}) == ""  # not its controller
    batch = {**owner, "apiVersion": "batch/v1", "controller": True}
    assert volcano_job({"ownerReferences": [batch]}) == ""  # a Kubernetes Job
    assert volcano_job({}) == ""


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    event = sample_events()[5]
    data = json.loads(ev.encode(event))
    data["field_from_the_future"] = {"x": 1}
    assert ev.decode(json.dumps(data).encode()) == event


def test_malformed_payload_raises_a_validation_error() -> None:
    with pytest.raises(msgspec.ValidationError):
        ev.decode(b'{"type": "pod.pending", "pod": 3}')
    with pytest.raises(msgspec.ValidationError):
        ev.decode(b'{"type": "no.such.event"}')


def test_dedup_ids_are_stable_per_pod_and_attempt() -> None:
    decided = next(e for e in sample_events() if isinstance(e, ev.AllocationDecided))
    again = msgspec.structs.replace(decided, event_id="other")
    assert decided.dedup_id() == again.dedup_id()
    retried = msgspec.structs.replace(decided, attempt=decided.attempt + 1)
    assert decided.dedup_id() != retried.dedup_id()


def test_committed_schema_is_fresh() -> None:
    committed = (REPO / DEFAULT_SCHEMA).read_text()
    assert committed == _schema_text(), "run `tessera schema` and commit docs/events.schema.json"


def test_schema_describes_every_event() -> None:
    schema = ev.json_schema()
    names = {ref["$ref"].rsplit("/", 1)[1] for ref in schema["oneOf"]}
    assert names == {t.__name__ for t in ev.EVENT_TYPES}
    tag = schema["$defs"]["AllocationBound"]["properties"]["type"]
    assert tag == {"enum": ["allocation.bound"]}


def test_grant_annotations_round_trip_and_upstream_encodings() -> None:
    from shared.core import annotations as ann
    from tests.samples import GRANTS

    out = ann.grant_annotations(ev.NodeName("n1"), GRANTS, 1700000000.0, "hami")
    assert ann.read_grants(out) == GRANTS
    assert out["hami.io/vgpu-devices-to-allocate"] == (
        ";GPU-0,NVIDIA-A100-SXM4-80GB,10240,30:GPU-1,NVIDIA-A100-SXM4-80GB,10240,30:;"
        "GPU-0,NVIDIA-A100-SXM4-80GB,2048,0:;"
    )
    assert out["hami.io/vgpu-node"] == "n1"
    volcano = ann.grant_annotations(ev.NodeName("n1"), GRANTS, 1700000000.0, "volcano")
    assert volcano["volcano.sh/devices-to-allocate"] == out["hami.io/vgpu-devices-allocated"]
    assert "hami.io/vgpu-node" not in ann.grant_annotations(ev.NodeName("n1"), GRANTS, 0.0)
    assert ann.read_grants({ann.GRANT: "{not json"}) is None
    assert ann.read_grants({}) is None


def test_gangs_sent_in_parts_have_distinct_dedup_ids() -> None:
    from tests.samples import pod

    gang = next(e for e in sample_events() if isinstance(e, ev.GangReady))
    first = msgspec.structs.replace(
        gang, members=(msgspec.structs.replace(gang.members[0], pod=pod("a")),)
    )
    second = msgspec.structs.replace(
        gang, members=(msgspec.structs.replace(gang.members[0], pod=pod("b")),)
    )
    assert first.dedup_id() != second.dedup_id()
    assert first.dedup_id() == msgspec.structs.replace(first, event_id="x").dedup_id()


def test_cordoned_devices_merge_both_upstream_annotations() -> None:
    from shared.core import annotations as ann

    assert ann.cordoned_devices(
        {
            "hami.io/device-cordon": "GPU-b, GPU-a,",
            "volcano.sh/gpu-unhealthy-ids": "GPU-a,GPU-c",
            "other": "GPU-x",
        }
    ) == ("GPU-a", "GPU-b", "GPU-c")
    assert ann.cordoned_devices({}) == ()
