"""The admission webhook's decisions on plain pods (services/webhook/service.py), without
a server: the scheduler name, the device count it adds, its refusals. The same pods on
the real API server: tests/integration/test_webhook.py."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

from services.webhook.service import Webhook
from shared.config import parse as parse_config
from shared.core.model import PodRequest
from tests.unit.corekit import PARSER

HOOK = Webhook(parse_config({"scheduler": {"names": ["tessera", "volcano"]}}))


def container(name: str, limits: dict[str, Any], **resources: Any) -> dict[str, Any]:
    return {"name": name, "image": "busybox", "resources": {"limits": limits, **resources}}


def apply(doc: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 ``add`` as the API server applies it (the only op the webhook writes)."""
    out = copy.deepcopy(doc)
    for op in patch:
        assert op["op"] == "add", op
        *parents, last = [
            p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]
        ]
        target: Any = out
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        assert isinstance(target, dict), op
        target[last] = op["value"]
    return out


def test_a_container_asking_memory_or_cores_gets_its_vendors_count_limit_and_request() -> None:
    pod = {
        "metadata": {"name": "p"},
        "spec": {
            "initContainers": [container("fetch", {"nvidia.com/gpumem-percentage": 10})],
            "containers": [
                container(
                    "hami",
                    {"nvidia.com/gpumem": 2048, "cpu": "1"},
                    requests={"nvidia.com/gpumem": 2048, "cpu": "1"},
                ),
                container("volcano", {"volcano.sh/vgpu-memory": 1024, "volcano.sh/vgpu-cores": 20}),
                container("counted", {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 1}),
                container("share", {"volcano.sh/gpu-memory": 512}),
                {"name": "bare", "image": "busybox"},
            ],
        },
    }
    patch = HOOK.mutate(pod)
    after = apply(pod, patch)
    assert after["spec"]["schedulerName"] == "tessera"
    init, hami, volcano, counted, share, bare = (
        after["spec"]["initContainers"] + after["spec"]["containers"]
    )
    assert init["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # the API server wants an extended resource's request equal to its limit
    assert hami["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert hami["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert volcano["resources"]["limits"]["volcano.sh/vgpu-number"] == "1"
    assert volcano["resources"]["requests"] == {"volcano.sh/vgpu-number": "1"}
    assert counted == pod["spec"]["containers"][2]
    assert share == pod["spec"]["containers"][3]  # registered itself: nothing to add
    assert bare == pod["spec"]["containers"][4]
    # What the watcher then parses: every container with its devices, nothing refused.
    parsed = PARSER.parse(after)
    assert isinstance(parsed, PodRequest)
    assert [len(c.devices) for c in parsed.containers] == [1, 1, 1, 1, 1, 0]
    # The patch travels base64-encoded in the AdmissionReview answer.
    review = HOOK.review(
        {"request": {"uid": "u", "operation": "CREATE", "object": pod}}, mutating=True
    )
    assert json.loads(base64.b64decode(review["response"]["patch"])) == patch


def test_the_count_is_defaultgpunum_of_the_vendor_and_only_for_tesseras_pods() -> None:
    hook = Webhook(
        parse_config(
            {
                "devices": {"nvidia": {"defaultGPUNum": 2}},
                "webhook": {"setSchedulerName": False},
            }
        )
    )
    ours = {
        "spec": {
            "schedulerName": "tessera",
            "containers": [container("m", {"nvidia.com/gpucores": 30, "amd.com/gpumem": 100})],
        }
    }
    limits = apply(ours, hook.mutate(ours))["spec"]["containers"][0]["resources"]["limits"]
    assert (limits["nvidia.com/gpu"], limits["amd.com/gpu"]) == ("2", "1")
    # Another scheduler's pod, or one left to the default scheduler (setSchedulerName
    # off), is not Tessera's to change.
    for scheduler in ("default-scheduler", "hami-scheduler"):
        theirs = copy.deepcopy(ours)
        theirs["spec"]["schedulerName"] = scheduler
        assert hook.mutate(theirs) == []


# --- Volcano Jobs -------------------------------------------------------------------------


def vcjob(min_available: int = 1, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "mnist", "namespace": "ml"},
        "spec": {
            "minAvailable": min_available,
            "tasks": [
                {
                    "name": "worker",
                    "replicas": 2,
                    "template": {"spec": {"containers": [container("main", {})]}},
                }
            ],
            **spec,
        },
    }


def job_review(
    job: dict[str, Any], operation: str = "CREATE", old: dict[str, Any] | None = None
) -> dict[str, Any]:
    request = {
        "uid": "u1",
        "kind": {"group": "batch.volcano.sh", "version": "v1alpha1", "kind": "Job"},
        "operation": operation,
        "namespace": "ml",
        "object": job,
    }
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def test_a_job_volcano_refuses_is_refused_naming_the_field() -> None:
    """Volcano's webhook refuses it at creation; so does Tessera's, for the Jobs its
    controller runs (``schedulerName`` in ``scheduler.names``, default ``volcano``)."""
    answer = HOOK.review(job_review(vcjob(3)), mutating=False)["response"]
    assert answer["allowed"] is False
    assert answer["status"]["message"] == (
        "invalid Volcano Job: spec.minAvailable: 3 is greater than the tasks' replicas in all (2)"
    )
    assert HOOK.review(job_review(vcjob(2)), mutating=False)["response"]["allowed"] is True
    others = vcjob(3, schedulerName="kube-batch")  # another controller's Job: not ours
    assert HOOK.review(job_review(others), mutating=False)["response"]["allowed"] is True
    # the mutating hook is not registered for Jobs; asked anyway, it changes nothing
    assert "patch" not in HOOK.review(job_review(vcjob(3)), mutating=True)["response"]


def test_a_job_update_may_only_scale_and_not_break_a_rule() -> None:
    old = vcjob(2)
    scaled = copy.deepcopy(old)
    scaled["spec"]["tasks"][0]["replicas"] = 3
    assert HOOK.review(job_review(scaled, "UPDATE", old), mutating=False)["response"]["allowed"]
    moved = vcjob(2, queue="other")
    said = HOOK.validate_job(moved, old)
    assert said is not None
    assert "may change only minAvailable" in said
    broken = copy.deepcopy(old)
    broken["spec"]["minAvailable"] = 5
    assert "spec.minAvailable: 5" in (HOOK.validate_job(broken, old) or "")
    # made while no webhook ran, invalid: its labels may change, and it may be fixed
    invalid = vcjob(5)
    labelled = copy.deepcopy(invalid)
    labelled["metadata"]["labels"] = {"team": "a"}
    assert HOOK.validate_job(labelled, invalid) is None
    assert HOOK.validate_job(vcjob(2), invalid) is None


def test_a_jobs_queue_must_exist_be_open_and_be_a_leaf() -> None:
    """Volcano's webhook: "unable to find job queue", "can only submit job to queue with
    state Open", "can not submit job to root queue", "can only submit job to leaf
    queue"; with no Queue at all, queues are not checked (as Tessera's scheduler)."""
    queues = {
        "default": {"metadata": {"name": "default"}},
        "closed": {"metadata": {"name": "closed"}, "status": {"state": "Closed"}},
        "team": {"metadata": {"name": "team"}},
        "team-a": {"metadata": {"name": "team-a"}, "spec": {"parent": "team"}},
    }
    assert HOOK.validate_job(vcjob(2), queues=queues) is None
    for queue, said in (
        ("missing", 'queue "missing" does not exist'),
        ("closed", 'queue "closed" is Closed'),
        ("root", "a Job may not be submitted to the root queue"),
        ("team", 'queue "team" has 1 child queues'),
    ):
        found = HOOK.validate_job(vcjob(2, queue=queue), queues=queues)
        assert found is not None
        assert f"spec.queue: {said}" in found
    assert HOOK.validate_job(vcjob(2, queue="missing"), queues={}) is None


def queue_review(name: str, hook: Webhook = HOOK, **spec: Any) -> dict[str, Any]:
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u2",
            "kind": {"group": "scheduling.volcano.sh", "version": "v1beta1", "kind": "Queue"},
            "operation": "CREATE",
            "object": {"metadata": {"name": name}, "spec": spec},
        },
    }
    queues = {"org": {"metadata": {"name": "org"}, "spec": {}}}
    queues["team"] = {"metadata": {"name": "team"}, "spec": {"parent": "org"}}
    return hook.review(review, mutating=False, queues=queues)["response"]


def test_a_queue_with_a_bad_quantity_a_broken_tree_or_a_share_above_its_cap_is_refused() -> None:
    capacity = Webhook(parse_config({"scheduler": {"queuePlugin": "capacity"}}))
    assert queue_review("fine", capacity, parent="team", deserved={"nvidia.com/gpu": 2})["allowed"]
    cases = {
        "spec.deserved.nvidia.com/gpu: -1 is negative": {"deserved": {"nvidia.com/gpu": "-1"}},
        "spec.capability.nvidia.com/gpumem: 'lots' is not a quantity": {
            "capability": {"nvidia.com/gpumem": "lots"}
        },
        "spec.guarantee.resource.nvidia.com/gpu: 4 is above the capability (2)": {
            "guarantee": {"resource": {"nvidia.com/gpu": 4}},
            "capability": {"nvidia.com/gpu": 2},
        },
        'spec.parent: queue "new": its parent "nowhere" does not exist': {"parent": "nowhere"},
    }
    for said, spec in cases.items():
        response = queue_review("new", capacity, **spec)
        assert not response["allowed"], said
        assert said in response["status"]["message"]
        assert response["status"]["message"].startswith("invalid Volcano Queue: ")
    # re-parenting org under team closes a cycle
    cycle = queue_review("org", capacity, parent="team")
    assert (
        'spec.parent: queue "org": its parents form a cycle: org → team → org'
        in (cycle["status"]["message"])
    )
    # the proportion plugin has no tree to break; quantities are still checked
    assert queue_review("new", HOOK, parent="nowhere")["allowed"]
    assert not queue_review("new", HOOK, deserved={"nvidia.com/gpu": "-1"})["allowed"]


def test_the_validating_configuration_covers_volcano_jobs() -> None:
    from services.webhook.configuration import configurations

    cfg = parse_config({"webhook": {"url": "https://127.0.0.1:8443"}})
    (_, mutating), (_, validating) = configurations(cfg, b"ca")
    assert [h["name"] for h in mutating["webhooks"]] == ["mutate.pods.tessera.io"]
    hooks = {h["name"]: h for h in validating["webhooks"]}
    jobs = hooks["validate.jobs.tessera.io"]
    assert jobs["rules"] == [
        {
            "apiGroups": ["batch.volcano.sh"],
            "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["jobs"],
            "scope": "Namespaced",
        }
    ]
    assert jobs["clientConfig"]["url"].endswith("/validate")
    assert hooks["validate.queues.tessera.io"]["rules"][0]["resources"] == ["queues"]
    assert jobs["namespaceSelector"] == hooks["validate.pods.tessera.io"]["namespaceSelector"]
    assert hooks["validate.hypernodes.tessera.io"]["rules"][0]["resources"] == ["hypernodes"]


def topology_review(
    group: str, kind: str, obj: dict[str, Any], hypernodes: dict[str, Any] | None
) -> dict[str, Any]:
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u3",
            "kind": {"group": group, "version": "v1", "kind": kind},
            "operation": "CREATE",
            "namespace": "ml",
            "object": obj,
        },
    }
    return HOOK.review(review, mutating=False, hypernodes=hypernodes)["response"]


def rack(name: str, tier: int = 1, **member: Any) -> dict[str, Any]:
    selector = member or {"exactMatch": {"name": "n1"}}
    kind = "HyperNode" if member else "Node"
    return {
        "metadata": {"name": name},
        "spec": {
            "tier": tier,
            "tierName": "rack",
            "members": [{"type": kind, "selector": selector}],
        },
    }


def test_a_podgroups_network_topology_is_checked_against_the_hypernodes() -> None:
    known = {"r1": rack("r1")}

    def podgroup(**topology: Any) -> dict[str, Any]:
        body = {"metadata": {"name": "pg"}, "spec": {"networkTopology": topology}}
        return topology_review("scheduling.volcano.sh", "PodGroup", body, known)

    assert podgroup(mode="hard", highestTierName="rack")["allowed"]
    both = podgroup(highestTierAllowed=1, highestTierName="rack")
    assert "highestTierAllowed and highestTierName are both set" in both["status"]["message"]
    unknown = podgroup(highestTierName="spine")
    assert (
        'spec.networkTopology.highestTierName: "spine" is no HyperNode\'s tierName (known: rack)'
        in unknown["status"]["message"]
    )


def test_a_hypernode_naming_itself_or_closing_a_cycle_is_refused() -> None:
    group = "topology.volcano.sh"
    mine = rack("self", 2, exactMatch={"name": "self"})
    assert (
        "names the HyperNode self itself"
        in (topology_review(group, "HyperNode", mine, {})["status"]["message"])
    )
    known = {"up": rack("up", 3, exactMatch={"name": "down"})}
    closing = rack("down", 2, exactMatch={"name": "up"})
    message = topology_review(group, "HyperNode", closing, known)["status"]["message"]
    assert message.startswith("invalid HyperNode: spec.members: HyperNodes form a cycle")
    assert topology_review(group, "HyperNode", rack("r1"), known)["allowed"]
