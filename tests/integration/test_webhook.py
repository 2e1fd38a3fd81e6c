"""The admission webhook on the real API server (services/webhook): it runs as its own
ServiceAccount, makes its certificate and webhook configurations, and the API server
calls it for every pod created in the namespaces it serves."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import ApiException

from services.webhook import certs
from shared import kube, pki
from shared.config import KubernetesConfig, WebhookConfig
from shared.core import annotations as ann
from tests.helpers import eventually
from tools import localcluster
from tools.localcluster import free_port, service_kubeconfig

pytestmark = pytest.mark.integration

LABEL = {"tessera-webhook-test": "on"}
CONFIGURATION = "tessera"  # the name its ClusterRole lets it write


@pytest.fixture(scope="module")
async def api(kubeconfig: Path) -> AsyncIterator[kube.Client]:
    client = await kube.connect(KubernetesConfig(kubeconfig=str(kubeconfig)))
    yield client
    await client.close()


@pytest.fixture(scope="module")
async def webhook(
    kubeconfig: Path, api: kube.Client, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[dict[str, Any]]:
    """The webhook as a process, reached by URL on loopback, serving only namespaces
    labelled for this test (a webhook left behind must not refuse other tests' pods)."""
    workdir = tmp_path_factory.mktemp("webhook")
    port = free_port()
    settings = {
        "port": port,
        "url": f"https://127.0.0.1:{port}",
        "configuration": CONFIGURATION,
        "namespaceSelector": {"matchLabels": LABEL},
        "checkIntervalS": 1.0,
    }
    config = workdir / "tessera.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "scheduler": {"names": ["tessera", "volcano"], "queuePlugin": "capacity"},
                "kubernetes": {"kubeconfig": service_kubeconfig(kubeconfig)},
                "webhook": settings,
            }
        )
    )
    log = (workdir / "webhook.log").open("ab")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.webhook", "--config", str(config), stdout=log, stderr=log
    )

    async def configured() -> bool:
        try:
            found = await kube.request(
                api,
                "GET",
                "/apis/admissionregistration.k8s.io/v1/"
                f"validatingwebhookconfigurations/{CONFIGURATION}",
            )
        except ApiException:
            return False
        return bool(found["webhooks"][0]["clientConfig"].get("caBundle"))

    try:
        await eventually(configured, timeout_s=30, what="the webhook configurations")
        yield {"settings": settings, "log": workdir / "webhook.log"}
    finally:
        for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
            with contextlib.suppress(ApiException):
                await kube.request(
                    api,
                    "DELETE",
                    f"/apis/admissionregistration.k8s.io/v1/{kind}/{CONFIGURATION}",
                )
        proc.terminate()
        await proc.wait()


async def _namespace(api: kube.Client, labels: dict[str, str]) -> str:
    name = f"wh-{uuid.uuid4().hex[:8]}"
    await kube.request(
        api,
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}},
    )
    return name


def _pod(name: str, limits: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **meta},
        "spec": {
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}]
        },
    }


def _apply(
    kubeconfig: Path, namespace: str, pod: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            localcluster.kubectl(),
            "--kubeconfig",
            str(kubeconfig),
            "-n",
            namespace,
            "apply",
            "-f",
            "-",
        ],
        input=yaml.safe_dump(pod),
        capture_output=True,
        text=True,
        check=False,
    )


async def test_a_pod_asking_for_gpu_memory_gets_tesseras_scheduler(
    webhook: dict[str, Any], api: kube.Client
) -> None:
    ns = await _namespace(api, LABEL)
    created = await kube.request(
        api, "POST", f"/api/v1/namespaces/{ns}/pods", _pod("slice", {"nvidia.com/gpumem": 2048})
    )
    assert created["spec"]["schedulerName"] == "tessera"
    plain = await kube.request(
        api, "POST", f"/api/v1/namespaces/{ns}/pods", _pod("cpu-only", {"cpu": "1"})
    )
    assert plain["spec"]["schedulerName"] == "default-scheduler"


async def test_a_container_asking_memory_or_cores_gets_the_count_the_kubelet_allocates_by(
    webhook: dict[str, Any], api: kube.Client, kubeconfig: Path
) -> None:
    """HAMi's and Volcano's users leave the count to ``defaultGPUNum``; the kubelet calls
    the device plugin only for a registered name the container asks for, so the webhook
    writes the count (limits and requests, which the API server wants equal)."""
    ns = await _namespace(api, LABEL)
    pod = _pod("mem-only", {"nvidia.com/gpumem": 2048})
    pod["spec"]["initContainers"] = [
        {
            "name": "fetch",
            "image": "busybox",
            "resources": {
                "limits": {"volcano.sh/vgpu-memory": 1024, "cpu": "1"},
                "requests": {"volcano.sh/vgpu-memory": 1024, "cpu": "500m"},
            },
        }
    ]
    pod["spec"]["containers"].append(
        {
            "name": "counted",
            "image": "busybox",
            "resources": {"limits": {"nvidia.com/gpu": 2, "nvidia.com/gpucores": 10}},
        }
    )
    created = await kube.request(api, "POST", f"/api/v1/namespaces/{ns}/pods", pod)
    [fetch] = created["spec"]["initContainers"]
    main, counted = created["spec"]["containers"]
    assert fetch["resources"]["limits"]["volcano.sh/vgpu-number"] == "1"
    assert fetch["resources"]["requests"]["volcano.sh/vgpu-number"] == "1"
    assert fetch["resources"]["requests"]["cpu"] == "500m"  # the rest as written
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert main["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert counted["resources"]["limits"]["nvidia.com/gpu"] == "2"
    # kubectl apply of a pod asking cores alone, for Volcano's scheduler name: accepted
    # (the validating webhook sees the count the mutating one added).
    cores = _pod("cores-only", {"volcano.sh/vgpu-cores": 30})
    cores["spec"]["schedulerName"] = "volcano"
    proc = _apply(kubeconfig, ns, cores)
    assert proc.returncode == 0, proc.stderr
    applied = await kube.request(api, "GET", f"/api/v1/namespaces/{ns}/pods/cores-only")
    assert applied["spec"]["containers"][0]["resources"]["limits"] == {
        "volcano.sh/vgpu-cores": "30",
        "volcano.sh/vgpu-number": "1",
    }


async def test_an_invalid_request_is_refused_at_kubectl_apply_with_the_watchers_message(
    webhook: dict[str, Any], api: kube.Client, kubeconfig: Path
) -> None:
    ns = await _namespace(api, LABEL)
    proc = _apply(kubeconfig, ns, _pod("typo", {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 150}))
    assert proc.returncode != 0
    assert 'admission webhook "validate.pods.tessera.io" denied the request' in proc.stderr
    assert "invalid device request: nvidia.com/gpucores (container main)" in proc.stderr


async def test_a_hand_written_grant_is_refused(
    webhook: dict[str, Any], api: kube.Client, kubeconfig: Path
) -> None:
    ns = await _namespace(api, LABEL)
    for key in (ann.GRANT, "hami.io/vgpu-devices-allocated", "volcano.sh/vgpu-ids-new"):
        pod = _pod("thief", {"nvidia.com/gpu": 1}, annotations={key: "[]"})
        proc = _apply(kubeconfig, ns, pod)
        assert proc.returncode != 0, key
        assert f"annotation {key} is written by the scheduler" in proc.stderr


async def test_namespaces_it_does_not_serve_are_left_alone(
    webhook: dict[str, Any], api: kube.Client
) -> None:
    for labels in ({}, {**LABEL, "tessera.io/webhook": "disabled"}):
        ns = await _namespace(api, labels)
        pod = _pod("left-alone", {"nvidia.com/gpumem": 2048}, annotations={ann.GRANT: "[]"})
        created = await kube.request(api, "POST", f"/api/v1/namespaces/{ns}/pods", pod)
        assert created["spec"]["schedulerName"] == "default-scheduler"


async def test_its_certificate_is_renewed_and_it_keeps_serving(
    webhook: dict[str, Any], api: kube.Client
) -> None:
    """A serving certificate near its end is replaced (the CA stays, so the API server
    trusts the new one at once); here the Secret's is swapped for one about to end."""
    cfg = WebhookConfig(url=webhook["settings"]["url"])
    path = "/api/v1/namespaces/tessera/secrets/tessera-webhook-tls"
    secret = await kube.request(api, "GET", path)
    data = secret["data"]
    ca = pki.KeyPair(cert=base64.b64decode(data["ca.crt"]), key=base64.b64decode(data["ca.key"]))
    ending = pki.issue(ca, "tessera-webhook", hosts=certs.hosts(cfg), days=2)  # < renewDays
    data["tls.crt"] = base64.b64encode(ending.cert).decode()
    data["tls.key"] = base64.b64encode(ending.key).decode()
    await kube.request(api, "PUT", path, secret)

    async def renewed() -> bool:
        now = await kube.request(api, "GET", path)
        cert = base64.b64decode(now["data"]["tls.crt"])
        return cert != ending.cert and base64.b64decode(now["data"]["ca.crt"]) == ca.cert

    await eventually(renewed, timeout_s=20, what="a renewed serving certificate")
    ns = await _namespace(api, LABEL)
    created = await kube.request(
        api, "POST", f"/api/v1/namespaces/{ns}/pods", _pod("after", {"nvidia.com/gpumem": 1024})
    )
    assert created["spec"]["schedulerName"] == "tessera"


def _vcjob(name: str, **spec: Any) -> dict[str, Any]:
    worker = {
        "name": "worker",
        "replicas": 2,
        "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
    }
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"minAvailable": 2, "schedulerName": "volcano", "tasks": [worker], **spec},
    }


async def test_a_volcano_job_volcano_refuses_is_refused_naming_the_field(
    webhook: dict[str, Any], api: kube.Client, kubeconfig: Path
) -> None:
    """The rules of Volcano's own invalid examples (example/invalid_jobs: minAvailable
    above the replicas, two tasks of one name, one event in two policies) and its queue
    checks, at kubectl apply; a valid Job is created; an update may only scale it."""
    ns = await _namespace(api, LABEL)
    worker = _vcjob("x")["spec"]["tasks"][0]
    cases = {
        "spec.minAvailable: 3 is greater than the tasks' replicas in all (2)": _vcjob(
            "too-few", minAvailable=3
        ),
        "spec.tasks[1].name: duplicated task name 'worker'": _vcjob(
            "twins", tasks=[worker, worker]
        ),
        "spec.policies[1]: duplicate event PodFailed": _vcjob(
            "twice",
            policies=[
                {"event": "PodFailed", "action": "RestartJob"},
                {"event": "PodFailed", "action": "AbortJob"},
            ],
        ),
        'spec.queue: queue "nowhere" does not exist': _vcjob("lost", queue="nowhere"),
    }
    for message, job in cases.items():
        proc = _apply(kubeconfig, ns, job)
        assert proc.returncode != 0, message
        assert 'admission webhook "validate.jobs.tessera.io" denied the request' in proc.stderr
        assert message in proc.stderr
    proc = _apply(kubeconfig, ns, _vcjob("fine"))
    assert proc.returncode == 0, proc.stderr
    theirs = _vcjob("theirs", minAvailable=3, schedulerName="kube-batch")  # not ours
    assert _apply(kubeconfig, ns, theirs).returncode == 0
    moved = _apply(kubeconfig, ns, _vcjob("fine", queue="other"))
    assert moved.returncode != 0
    assert "may change only minAvailable" in moved.stderr
    scaled = _vcjob("fine", minAvailable=3)
    scaled["spec"]["tasks"][0]["replicas"] = 3
    proc = _apply(kubeconfig, ns, scaled)
    assert proc.returncode == 0, proc.stderr
    # no job-controller runs here; a later module's would run what is left
    await kube.request(api, "DELETE", f"/apis/batch.volcano.sh/v1alpha1/namespaces/{ns}/jobs")


async def test_a_queue_that_would_break_the_tree_is_refused_at_kubectl_apply(
    webhook: dict[str, Any], api: kube.Client, kubeconfig: Path
) -> None:
    """Under ``queuePlugin: capacity``: a missing parent and a negative deserved share
    are refused naming the field; a child of an existing queue is created."""
    tag = uuid.uuid4().hex[:6]
    org, team = f"org-{tag}", f"team-{tag}"

    def queue(name: str, **spec: Any) -> dict[str, Any]:
        return {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "Queue",
            "metadata": {"name": name},
            "spec": spec,
        }

    try:
        refused = _apply(kubeconfig, "default", queue(team, parent=f"gone-{tag}"))
        assert refused.returncode != 0
        assert 'admission webhook "validate.queues.tessera.io" denied the request' in (
            refused.stderr
        )
        assert f'spec.parent: queue "{team}": its parent "gone-{tag}" does not exist' in (
            refused.stderr
        )
        negative = _apply(kubeconfig, "default", queue(org, deserved={"nvidia.com/gpu": "-2"}))
        assert "spec.deserved.nvidia.com/gpu: -2 is negative" in negative.stderr
        assert _apply(kubeconfig, "default", queue(org)).returncode == 0
        made = _apply(kubeconfig, "default", queue(team, parent=org))
        assert made.returncode == 0, made.stderr
    finally:
        for name in (team, org):
            with contextlib.suppress(ApiException):
                await kube.request(
                    api, "DELETE", f"/apis/scheduling.volcano.sh/v1beta1/queues/{name}"
                )


async def test_a_podgroup_whose_subgroup_policy_breaks_a_rule_is_refused_naming_the_field(
    webhook: dict[str, Any], api: kube.Client, kubeconfig: Path
) -> None:
    ns = await _namespace(api, LABEL)

    def podgroup(name: str, size: int) -> dict[str, Any]:
        policy = {"name": "prefill", "subGroupSize": size, "matchLabelKeys": ["replica"]}
        return {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": name},
            "spec": {"minMember": 2, "subGroupPolicy": [policy]},
        }

    refused = _apply(kubeconfig, ns, podgroup("broken", 0))
    assert refused.returncode != 0
    assert 'admission webhook "validate.podgroups.tessera.io" denied the request' in (
        refused.stderr
    )
    assert "spec.subGroupPolicy[0].subGroupSize: 0 must be at least 1" in refused.stderr
    made = _apply(kubeconfig, ns, podgroup("fine", 2))
    assert made.returncode == 0, made.stderr
    podgroups = f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{ns}/podgroups"
    await kube.request(api, "DELETE", podgroups)
