"""The kustomize manifests render, pass the real API server, and carry a valid config."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared import config
from tools import localcluster
from tools.localcluster import LocalCluster

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
SERVICES = [
    "watcher",
    "gang-coordinator",
    "device-allocator",
    "binder",
    "job-controller",
    "node-agent",
    "webhook",
]


def _render(overlay: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [localcluster.kubectl(), "kustomize", str(REPO / "deploy/kustomize" / overlay)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


OVERLAYS = ["base", "overlays/dev", "overlays/volcano-coexist"]


def test_every_overlay_is_tested() -> None:
    overlays = (REPO / "deploy/kustomize/overlays").iterdir()
    assert sorted(["base", *(f"overlays/{p.name}" for p in overlays)]) == sorted(OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_manifests_apply_on_the_real_api_server(overlay: str, kube: LocalCluster) -> None:
    docs = _render(overlay)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for service in SERVICES:
        assert ("ServiceAccount", f"tessera-{service}") in kinds
        assert ("ClusterRole", f"tessera-{service}") in kinds
        assert ("ClusterRoleBinding", f"tessera-{service}") in kinds
    workloads = [d for d in docs if d["kind"] in ("Deployment", "DaemonSet")]
    # Beside Volcano, Volcano's Job controller creates the Jobs' pods; Tessera's is left out.
    expected = {*SERVICES, "dashboard"} - ({"job-controller"} if "volcano" in overlay else set())
    assert {d["spec"]["template"]["spec"]["containers"][0]["args"][0] for d in workloads} == (
        expected
    )
    if "volcano" in overlay:  # its CRDs are Volcano's: none here
        assert not [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    for w in workloads:  # probed (shared/health.py), and a budget for each Deployment
        container = w["spec"]["template"]["spec"]["containers"][0]
        if w["metadata"]["name"] == "tessera-mps-control":
            # Never restarted by a probe: its MPS daemons and servers end with it.
            assert "livenessProbe" not in container
            assert w["spec"]["updateStrategy"]["type"] == "OnDelete"
            assert container["args"][:2] == ["node-agent", "mps-control"]
        elif w["metadata"]["name"] != "tessera-simulated-nodes":
            assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", w["metadata"]
            assert container["livenessProbe"]["httpGet"]["path"] == "/healthz", w["metadata"]
        if w["kind"] == "Deployment" and w["spec"].get("replicas", 1) > 1:
            assert ("PodDisruptionBudget", w["metadata"]["name"]) in kinds
    if overlay == "overlays/dev":  # simulated nodes, from an inventory the agent can read
        [sim] = [d for d in workloads if d["metadata"]["name"] == "tessera-simulated-nodes"]
        assert "--simulate" in sim["spec"]["template"]["spec"]["containers"][0]["args"]
        inventory = next(
            d
            for d in docs
            if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("tessera-inventory")
        )
        assert yaml.safe_load(inventory["data"]["inventory.yaml"])["nodes"]
    [cm] = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("tessera-config")
    ]
    config.parse(yaml.safe_load(cm["data"]["tessera.yaml"]))  # raises if invalid

    kubectl = [localcluster.kubectl(), "--kubeconfig", str(kube.kubeconfig)]
    subprocess.run([*kubectl, "create", "namespace", "tessera"], capture_output=True, check=False)
    rendered = yaml.safe_dump_all(docs)  # the Namespace too (made above: a dry run makes none)
    proc = subprocess.run(
        [*kubectl, "apply", "--dry-run=server", "-f", "-"],
        input=rendered,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "deployment.apps/tessera-binder created (server dry run)" in proc.stdout


def test_crds_are_installed_and_accept_volcano_objects(kube: LocalCluster) -> None:
    kubectl = [localcluster.kubectl(), "--kubeconfig", str(kube.kubeconfig)]
    queue = subprocess.run(
        [*kubectl, "get", "queue", "default", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert '"weight": 1' in queue
    podgroup = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": "pg-crd-check", "namespace": "default"},
        "spec": {
            "minMember": 2,
            "minTaskMember": {"worker": 2},
            "queue": "default",
            "minResources": {"nvidia.com/gpu": "2"},
            "priorityClassName": "high",
        },
    }
    job = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "job-crd-check", "namespace": "default"},
        "spec": {
            "minAvailable": 2,
            "schedulerName": "tessera",
            "queue": "default",
            "policies": [{"event": "PodEvicted", "action": "RestartJob"}],
            "plugins": {"env": [], "svc": []},
            "tasks": [
                {
                    "replicas": 2,
                    "name": "worker",
                    "template": {"spec": {"containers": [{"name": "w", "image": "busybox"}]}},
                }
            ],
        },
    }
    for doc in (podgroup, job):
        subprocess.run(
            [*kubectl, "apply", "-f", "-"],
            input=yaml.safe_dump(doc),
            text=True,
            capture_output=True,
            check=True,
        )
    names = subprocess.run(
        [*kubectl, "get", "podgroups,vcjob", "-o", "name"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "podgroup.scheduling.volcano.sh/pg-crd-check" in names
    assert "job.batch.volcano.sh/job-crd-check" in names
    subprocess.run(
        [*kubectl, "delete", "podgroup/pg-crd-check", "vcjob/job-crd-check"],
        capture_output=True,
        check=True,
    )
