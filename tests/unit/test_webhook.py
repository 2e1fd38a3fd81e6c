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
