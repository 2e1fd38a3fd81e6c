"""One fully populated instance of every event type, shared by the round-trip tests."""

from __future__ import annotations

import msgspec

from shared import events as ev
from shared.core.disruption import Budget
from shared.core.hosts import label_selector, node_spec, pod_spec
from shared.core.model import (
    Constraints,
    ContainerGrant,
    ContainerRequest,
    DeviceGrant,
    DeviceInfo,
    DeviceRequest,
    DeviceUUID,
    MigInstance,
    NodeName,
    PodRef,
    PodRequest,
    PodUID,
    RequestError,
)
from shared.core.network import HyperNode, Member, NetworkTopology
from shared.core.status import Code, Reason, Status


def pod(name: str = "train-0", ns: str = "ml") -> PodRef:
    return PodRef(namespace=ns, name=name, uid=PodUID(f"uid-{ns}-{name}"))


REQUEST = PodRequest(
    containers=(
        ContainerRequest(name="init", init=True),
        ContainerRequest(
            name="main",
            devices=(
                DeviceRequest(
                    vendor="nvidia", resource="nvidia.com/gpu", count=2, memory_mib=10240, cores=30
                ),
                DeviceRequest(
                    vendor="ascend",
                    kind="npu-template",
                    resource="huawei.com/Ascend910B3",
                    memory_mib=16384,
                    chip="910B3",
                ),
            ),
            core_policy="force",
        ),
        ContainerRequest(
            name="share",
            devices=(
                DeviceRequest(
                    vendor="nvidia",
                    kind="gpu-share",
                    resource="volcano.sh/gpu-memory",
                    memory_resource="volcano.sh/gpu-memory",
                    memory_mib=2048,
                    units=2048,
                ),
            ),
        ),
    ),
    constraints=Constraints(
        use_types=("A100",),
        nouse_uuids=("GPU-bad",),
        mode="hami-core",
        node_policy="binpack",
        device_policy="spread",
        numa_bind=True,
    ),
)
POD_SPEC = pod_spec(
    {
        "metadata": {"namespace": "ml", "labels": {"app": "train", "tier": "gpu"}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "resources": {"requests": {"cpu": "2", "memory": "8Gi"}},
                    "ports": [{"containerPort": 8080, "hostPort": 8080}],
                }
            ],
            "nodeSelector": {"pool": "a100"},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}
                        ]
                    }
                },
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "labelSelector": {"matchLabels": {"app": "train"}},
                            "topologyKey": "kubernetes.io/hostname",
                        }
                    ]
                },
            },
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "topology.kubernetes.io/zone",
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"app": "train"}},
                }
            ],
        },
    },
    managed={"nvidia.com/gpu"},
)

GRANTS = (
    ContainerGrant(container="init", init=True),
    ContainerGrant(
        container="main",
        devices=(
            DeviceGrant(
                uuid=DeviceUUID("GPU-0"),
                index=0,
                model="NVIDIA-A100-SXM4-80GB",
                memory_mib=10240,
                cores=30,
            ),
            DeviceGrant(
                uuid=DeviceUUID("GPU-1"),
                index=1,
                model="NVIDIA-A100-SXM4-80GB",
                memory_mib=10240,
                cores=30,
                mig_profile="1g.10gb",
                mig_placement=3,
            ),
        ),
    ),
    ContainerGrant(
        container="share",
        devices=(
            DeviceGrant(
                uuid=DeviceUUID("GPU-0"),
                index=0,
                model="NVIDIA-A100-SXM4-80GB",
                memory_mib=2048,
                units=2048,
            ),
        ),
    ),
)

DEVICES = (
    DeviceInfo(
        uuid=DeviceUUID("GPU-0"),
        index=0,
        vendor="nvidia",
        model="NVIDIA-A100-SXM4-80GB",
        memory_mib=81920,
        sm_count=108,
        numa=0,
    ),
    DeviceInfo(
        uuid=DeviceUUID("GPU-1"),
        index=1,
        vendor="nvidia",
        model="NVIDIA-A100-SXM4-80GB",
        memory_mib=81920,
        sm_count=108,
        numa=1,
        mode="mig",
        mig_geometry=(MigInstance(profile="1g.10gb", memory_mib=9856, placement=0),),
    ),
    DeviceInfo(
        uuid=DeviceUUID("NPU-0"),
        index=0,
        vendor="ascend",
        model="Ascend910B3",
        memory_mib=65536,
        chip="910B3",
        ai_cores=20,
        healthy=False,
    ),
)

GANG = ev.GangRef(namespace="ml", name="job-a", queue="research")


def sample_events() -> list[ev.Event]:
    pending = ev.PodPending(
        pod=pod(),
        request=REQUEST,
        scheduler_name="tessera",
        group="job-a",
        priority=100,
        created_at=1700000000.5,
        resource_version="42",
        spec=POD_SPEC,
        preemption_policy="Never",
    )
    node = NodeName("gpu-node.rack-1")
    return [
        pending,
        ev.PodUpdated(
            pod=pod(),
            node=node,
            phase="Running",
            grants=GRANTS,
            resource_version="43",
            spec=POD_SPEC,
            scheduler_name="volcano",
        ),
        ev.PodDeleted(pod=pod(), node=node, grants=GRANTS),
        ev.PodRejected(
            pod=pod("bad"),
            errors=(
                RequestError(
                    field="nvidia.com/gpucores (container main)",
                    message="cores 150 exceed 100; ask for at most 100",
                ),
            ),
        ),
        ev.NodeInventory(node=node, devices=DEVICES, config_hash="abc123", agent="agent-1", seq=7),
        ev.NodeUpdated(
            node=node,
            cordoned_devices=("GPU-1",),
            unschedulable=True,
            spec=node_spec(
                {
                    "metadata": {"name": node, "labels": {"topology.kubernetes.io/zone": "a"}},
                    "spec": {
                        "unschedulable": True,
                        "taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}],
                    },
                    "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}},
                }
            ),
        ),
        ev.NodeDeleted(node=node),
        ev.NamespaceUpdated(name="ml", labels={"team": "research"}),
        ev.DraObject(
            kind="slice",
            key="node-7-gpu.tessera.io",
            obj={"metadata": {"name": "node-7-gpu.tessera.io"}, "spec": {"driver": "d"}},
        ),
        ev.PodGroupUpdated(
            namespace="ml",
            name="job-a",
            uid="pg-1",
            min_member=2,
            min_task_member={"worker": 2},
            queue="research",
            priority_class="high",
            min_resources={"nvidia.com/gpu": "2"},
            network_topology=NetworkTopology(mode="hard", highest_tier=1),
        ),
        ev.PodGroupDeleted(namespace="ml", name="job-a"),
        ev.HyperNodeUpdated(
            hypernode=HyperNode(
                name="rack-0",
                tier=1,
                tier_name="rack",
                members=(
                    Member(type="Node", pattern="^gpu-0"),
                    Member(type="Node", labels=label_selector({"matchLabels": {"rack": "0"}})),
                ),
            )
        ),
        ev.HyperNodeDeleted(name="rack-0"),
        ev.PdbUpdated(
            budget=Budget(
                namespace="ml",
                name="web",
                selector=label_selector(
                    {
                        "matchLabels": {"app": "web"},
                        "matchExpressions": [{"key": "tier", "operator": "Exists"}],
                    }
                ),
                allowed=1,
                disrupted=("web-0",),
                computed=True,
            )
        ),
        ev.PdbDeleted(namespace="ml", name="web"),
        ev.QueueUpdated(
            name="research",
            weight=3,
            capability={"nvidia.com/gpumem": "100k"},
            guarantee={"nvidia.com/gpumem": "10k"},
            reclaimable=False,
            priority=5,
            state="Closed",
        ),
        ev.QueueDeleted(name="research"),
        ev.JobUpdated(
            namespace="ml",
            name="mnist",
            uid="job-1",
            spec={
                "minAvailable": 2,
                "queue": "research",
                "tasks": [{"name": "worker", "replicas": 2, "template": {"spec": {}}}],
            },
        ),
        ev.JobDeleted(namespace="ml", name="mnist", uid="job-1"),
        ev.GangReady(
            gang=GANG,
            min_member=1,
            members=(pending,),
            attempt=2,
            victims=(
                ev.VictimUnit(
                    pods=(pod("batch-0"),), why="priority 0 < 1000", budgets=(("ml/web",),)
                ),
            ),
            budgets={"ml/web": 0},
            hold=True,
        ),
        ev.GangReady(  # passed on by an allocator shard, in the second pass
            gang=GANG,
            min_member=2,
            members=(pending,),
            attempt=2,
            shard="pool-b",
            route=("pool-c",),
            offered=("pool-a", "pool-b", "pool-c"),
            tried=Status(
                code=Code.UNSCHEDULABLE,
                nodes=4,
                reasons=(Reason(kind="insufficient", resource="cpu", nodes=4),),
            ),
            spanning=(ev.SpanPart(shard="pool-a", pods=(pod("train-0"),)),),
        ),
        ev.GangSpan(
            gang=GANG,
            attempt=2,
            commit=True,
            parts=(
                ev.SpanPart(shard="pool-a", pods=(pod("train-0"),)),
                ev.SpanPart(shard="pool-b", pods=(pod("train-1"),)),
            ),
        ),
        ev.AllocationDecided(pod=pod(), node=node, grants=GRANTS, gang=GANG, attempt=2),
        ev.AllocationDecided(
            pod=pod(),
            node=node,
            grants=(),
            claims=(
                ev.ClaimAllocation(
                    namespace="ml",
                    name="train-0-gpu",
                    uid="c1",
                    allocation={"devices": {"results": [{"request": "gpu", "device": "gpu-0"}]}},
                ),
            ),
        ),
        ev.AllocationFailed.of(
            (pod(), pod("train-1")),
            Status(
                code=Code.UNSCHEDULABLE,
                nodes=12,
                reasons=(
                    Reason(
                        kind="device-insufficient",
                        resource="nvidia.com/gpumem",
                        requested=20000,
                        free=8192,
                        capacity=81920,
                        nodes=7,
                    ),
                    Reason(kind="type-excluded", code=Code.UNRESOLVABLE, nodes=5),
                ),
            ),
            gang=GANG,
            attempt=3,
        ),
        msgspec.structs.replace(
            ev.AllocationFailed.of(
                (pod("train-3"),),
                Status(code=Code.UNSCHEDULABLE, note="Preempting 1 pod(s) to make room on n."),
            ),
            nominated={pod("train-3").uid: node},
        ),
        ev.PodWaiting.of(
            (pod("train-2"),),
            Status(
                code=Code.UNSCHEDULABLE,
                reasons=(Reason(kind="waiting", detail="PodGroup train not found"),),
            ),
        ),
        ev.AllocationBound(pod=pod(), node=node, grants=GRANTS, attempt=2),
        ev.AllocationPreempting(
            gang=GANG,
            preemptor=(pod("train-0"), pod("train-1")),
            victims=(
                ev.VictimUnit(
                    pods=(pod("batch-0"), pod("batch-1")), why="priority 0 < 1000: whole gang"
                ),
            ),
            nodes=(node,),
            attempt=4,
        ),
        ev.AllocationBindFailed(
            pod=pod(), node=node, error="pod was deleted", attempt=2, cause="gone"
        ),
        ev.AllocationReleased(pod=pod(), node=node, reason="pod deleted"),
        ev.AllocationAdmitted(pod=pod(), node=node),
    ]
