"""A Volcano Job's pods and its plugins' objects (services/job_controller/: pods.py,
plugins/, made.py, podgroup.py), each as Volcano's controller makes them
(``createJobPod``, ``pkg/controllers/job/plugins``)."""

from __future__ import annotations

import json
from typing import Any

from services.job_controller import made, plugins, pods
from services.job_controller.made import JobRef
from services.job_controller.plugins import svc
from services.job_controller.podgroup import podgroup
from services.job_controller.status import Status
from shared.core import vcjob

REF = JobRef("ml", "train", "uid-1")


def spec(plugins: dict[str, list[str]], **more: Any) -> vcjob.JobSpec:
    template = {
        "metadata": {"labels": {"app": "x"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }
    return vcjob.read(
        {
            "plugins": plugins,
            "tasks": [
                {"name": "master", "replicas": 1, "template": template},
                {"name": "worker", "replicas": 2, "template": template},
            ],
            **more,
        }
    )


def pod(job: vcjob.JobSpec, task: str, index: int, **status: Any) -> dict[str, Any]:
    found = job.task(task)
    assert found is not None
    return pods.pod(REF, job, found, index, Status(**status))


def env(body: dict[str, Any]) -> dict[str, Any]:
    return {
        e["name"]: e.get("value", e.get("valueFrom")) for e in body["spec"]["containers"][0]["env"]
    }


def test_a_pod_carries_volcanos_labels_and_annotations() -> None:
    job = spec({}, queue="team", priorityClassName="high")
    body = pod(job, "worker", 1, version=2, retry_count=1)
    meta = body["metadata"]
    assert meta["name"] == "train-worker-1"
    assert meta["labels"] == {
        "app": "x",
        "volcano.sh/task-index": "1",
        "volcano.sh/job-name": "train",
        "volcano.sh/task-spec": "worker",
        "volcano.sh/job-namespace": "ml",
        "volcano.sh/queue-name": "team",
    }
    assert meta["annotations"]["scheduling.k8s.io/group-name"] == "train"
    assert meta["annotations"]["volcano.sh/job-version"] == "2"
    assert meta["annotations"]["volcano.sh/job-retry-count"] == "1"
    assert meta["annotations"]["volcano.sh/template-uid"] == "train-worker"
    assert meta["ownerReferences"][0]["uid"] == "uid-1"
    assert (body["spec"]["schedulerName"], body["spec"]["priorityClassName"]) == ("volcano", "high")


def test_env_svc_and_ssh_plugins_on_the_pod() -> None:
    """env: the task index; svc: hostname, subdomain, every task's hosts from the
    ConfigMap, mounted at /etc/volcano; ssh: the keys at /root/.ssh, 0600."""
    body = pod(spec({"env": [], "svc": [], "ssh": []}), "worker", 1)
    found = env(body)
    assert (found["VK_TASK_INDEX"], found["VC_TASK_INDEX"]) == ("1", "1")
    assert found["VC_MASTER_HOSTS"] == {
        "configMapKeyRef": {"name": "train-svc", "key": "VC_MASTER_HOSTS"}
    }
    assert "VC_WORKER_NUM" in found
    assert (body["spec"]["hostname"], body["spec"]["subdomain"]) == ("train-worker-1", "train")
    mounts = {m["mountPath"]: m for m in body["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["/root/.ssh"]["subPath"] == ".ssh"
    assert "/etc/volcano" in mounts
    volumes = {v["name"]: v for v in body["spec"]["volumes"]}
    assert volumes["train-ssh"]["secret"]["defaultMode"] == 0o600
    no_env = pod(spec({"svc": ["--inject-hosts-env=false"]}), "worker", 0)
    assert "env" not in no_env["spec"]["containers"][0]


def test_the_svc_and_ssh_objects() -> None:
    job = spec({"svc": ["--publish-not-ready-addresses"], "ssh": ["--ssh-port=2022"]})
    assert svc.hosts(REF, job) == {
        "master.host": "train-master-0.train",
        "VC_MASTER_HOSTS": "train-master-0.train",
        "VC_MASTER_NUM": "1",
        "worker.host": "train-worker-0.train\ntrain-worker-1.train",
        "VC_WORKER_HOSTS": "train-worker-0.train,train-worker-1.train",
        "VC_WORKER_NUM": "2",
    }
    by_kind = {m.body["kind"]: m for m in plugins.objects(REF, job, "svc")}
    assert by_kind["Service"].body["spec"]["publishNotReadyAddresses"] is True
    assert (
        by_kind["NetworkPolicy"].path
        == "/apis/networking.k8s.io/v1/namespaces/ml/networkpolicies/train"
    )
    assert "NetworkPolicy" not in {
        m.body["kind"]
        for m in plugins.objects(REF, spec({"svc": ["--disable-network-policy"]}), "svc")
    }
    [secret] = plugins.objects(REF, job, "ssh")
    data = secret.body["stringData"]
    assert data["id_rsa"].startswith("-----BEGIN RSA PRIVATE KEY-----")
    assert data["authorized_keys"].startswith("ssh-rsa ")
    assert "Host train-worker-1\n  HostName train-worker-1.train\n  Port 2022\n" in data["config"]
    assert sorted(plugins.made_paths(REF, "svc") + plugins.made_paths(REF, "ssh")) == sorted(
        [m.path for m in plugins.objects(REF, job, "svc")] + [secret.path]
    )


def test_framework_plugins() -> None:
    """pytorch: MASTER_ADDR, WORLD_SIZE, RANK; mpi: the master's MPI_HOST and the ssh
    port; tensorflow: TF_CONFIG with the pod's role and index."""
    torch = spec({"pytorch": ["--port=30000"]})
    worker = env(pod(torch, "worker", 1))
    assert "VC_MASTER_HOSTS" in worker  # pytorch brings svc (Volcano's mutating webhook)
    assert {k: worker[k] for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")} == {
        "MASTER_ADDR": "train-master-0.train",
        "MASTER_PORT": "30000",
        "WORLD_SIZE": "3",
        "RANK": "2",
    }
    assert env(pod(torch, "master", 0))["RANK"] == "0"
    waiting = pod(spec({"pytorch": ["--wait-master-enabled"]}), "worker", 0)
    assert waiting["spec"]["initContainers"][0]["name"] == "wait-for-master"
    mpi = spec({"mpi": []})
    master = pod(mpi, "master", 0)
    assert env(master)["MPI_HOST"] == "train-worker-0.train,train-worker-1.train"
    assert master["spec"]["containers"][0]["ports"] == [
        {"name": "mpijob-port", "containerPort": 22}
    ]
    assert "MPI_HOST" not in env(pod(mpi, "worker", 0))
    tf = spec({"tensorflow": ["--ps=master"]})
    config = json.loads(env(pod(tf, "worker", 1))["TF_CONFIG"])
    assert config == {
        "cluster": {
            "ps": ["train-master-0.train:2222"],
            "worker": ["train-worker-0.train:2222", "train-worker-1.train:2222"],
        },
        "task": {"type": "worker", "index": 1},
    }


def test_volumes_mount_the_claims() -> None:
    claim = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    job = spec(
        {},
        volumes=[
            {"mountPath": "/in", "volumeClaimName": "data"},
            {"mountPath": "/out", "volumeClaim": claim},
        ],
    )
    body = pod(job, "worker", 0)
    claims = {v["persistentVolumeClaim"]["claimName"] for v in body["spec"]["volumes"]}
    assert claims == {"data", "train-pvc-1"}
    [made_claim] = made.claims(REF, job)
    assert made_claim.path == "/api/v1/namespaces/ml/persistentvolumeclaims/train-pvc-1"


def test_the_podgroup_holds_each_task_where_volcanos_scheduler_does() -> None:
    """Volcano's CheckTaskValid checks each task's minAvailable only when the Job's
    minAvailable is at least the tasks' together."""
    whole = podgroup(REF, spec({}))
    assert whole["spec"]["minMember"] == 3
    assert whole["spec"]["minTaskMember"] == {"master": 1, "worker": 2}
    part = podgroup(REF, spec({}, minAvailable=1))
    assert "minTaskMember" not in part["spec"]
    assert "networkTopology" not in whole["spec"]


def test_the_podgroup_gets_the_jobs_network_topology() -> None:
    """As Volcano's controller: the Job's networkTopology is its PodGroup's."""
    topology = {"mode": "hard", "highestTierAllowed": 1}
    made_podgroup = podgroup(REF, spec({}, networkTopology=topology))
    assert made_podgroup["spec"]["networkTopology"] == topology


def test_a_pod_inherits_the_jobs_preemption_and_budget_keys_and_its_numa_policy() -> None:
    """createJobPod: the Job's preemptable, cooldown-time, revocable-zone and one of its
    jdb annotations (min-available first) pass to its pods; the task's topologyPolicy
    becomes the NUMA policy annotation."""
    ref = JobRef(
        "ml",
        "train",
        "uid-1",
        annotations={
            "volcano.sh/preemptable": "true",
            "volcano.sh/jdb-min-available": "1",
            "volcano.sh/jdb-max-unavailable": "2",
            "other": "x",
        },
        labels={"volcano.sh/cooldown-time": "60s"},
    )
    raw = {"tasks": [{"name": "w", "replicas": 1, "topologyPolicy": "best-effort", "template": {}}]}
    job = vcjob.read(raw)
    body = pods.pod(ref, job, job.tasks[0], 0, Status())
    annotations, labels = body["metadata"]["annotations"], body["metadata"]["labels"]
    assert annotations["volcano.sh/preemptable"] == "true"
    assert annotations["volcano.sh/jdb-min-available"] == "1"
    assert "volcano.sh/jdb-max-unavailable" not in annotations
    assert "other" not in annotations
    assert labels["volcano.sh/cooldown-time"] == "60s"
    assert annotations["volcano.sh/numa-topology-policy"] == "best-effort"
