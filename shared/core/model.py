"""The values the placement core reasons about: identifiers, parsed requests, devices, grants.

They are msgspec Structs because the same values travel on the bus (inside events), sit
in the ledger by the hundred thousand, and are written into pod annotations: one compact
frozen type serves all three. New fields get defaults; nothing is renamed or retyped
(see the evolution rule in shared/events.py).
"""

from __future__ import annotations

from typing import Annotated, Literal, NewType

import msgspec

PodUID = NewType("PodUID", str)
NodeName = NewType("NodeName", str)
DeviceUUID = NewType("DeviceUUID", str)

NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
"""Memory, cores, counts and indexes: what arrives from the bus or an annotation with a
negative one is refused when decoded."""
PosInt = Annotated[int, msgspec.Meta(ge=1)]
Percent = Annotated[int, msgspec.Meta(ge=0, le=100)]

Vendor = Literal[
    "nvidia",
    "ascend",
    "cambricon",
    "hygon",
    "metax",
    "mthreads",
    "enflame",
    "kunlunxin",
    "iluvatar",
    "amd",
    "awsneuron",
    "biren",
    "vastai",
]
"""A device vendor: which node-side driver and isolation mechanism a device has."""

SharingMode = Literal["hami-core", "mig", "mps", "vnpu"]
"""How a device is shared: software slicing through the isolation library (``hami-core``,
NVIDIA or Ascend), MIG instances, MPS clients, or Ascend hard vNPU templates (``vnpu``)."""
MPS_ALONE = -1
"""``Constraints.run_as`` and ``DeviceGrant.mps_user`` of a pod whose UID is not set,
holding an MPS card alone (one MPS daemon serves one user per card at a time)."""
MpsState = Literal["", "running", "unavailable"]
"""The MPS control daemon of a card: not in MPS mode (empty), running, or unavailable
(no MPS binary on the node, or the daemon will not start)."""

RequestKind = Literal["vgpu", "gpu-share", "gpu-number", "npu-template", "npu-core"]
"""How a request slices devices.

- ``vgpu``: count devices, each with memory and cores (HAMi, Volcano vGPU, other vendors)
- ``gpu-share``: Volcano ``volcano.sh/gpu-memory``, one device, a memory slice, no cores
- ``gpu-number``: Volcano ``volcano.sh/gpu-number``, whole devices
- ``npu-template``: Ascend HAMi mode, memory rounded up to a vNPU template
- ``npu-core``: Ascend MindCluster ``huawei.com/npu-core``, AI cores mapped to a template
"""

Policy = Literal["binpack", "spread", "fgd"]
"""Placement policy at node or device level; ``fgd`` is fragmentation gradient descent."""


def gpu_type(name: str) -> str:
    """A device type as matched: lower case, spaces as dashes (NVML says ``Tesla
    V100-PCIE-32GB``, HAMi's documentation and node annotations ``Tesla-V100-PCIE-32GB``;
    users copy either)."""
    return "-".join(name.lower().split())


class PodRef(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Names one pod. ``uid`` tells apart two pods that reused a name."""

    namespace: str
    name: str
    uid: PodUID

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class GangKey(msgspec.Struct, frozen=True, order=True):
    """One gang's identity: a PodGroup in its namespace, or a lone pod (a gang of one).

    The one spelling every service and the core use (dict keys, holds, nominations,
    the PodGroup a grant belongs to). ``str()`` gives ``namespace/name`` for people.
    """

    namespace: str
    name: str
    """The PodGroup's name, or the pod's name for a lone pod."""
    lone: bool = False

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def of(cls, pod: PodRef, group: str | None) -> GangKey:
        """The gang of ``pod``: its PodGroup (``scheduling.k8s.io/group-name``) or itself."""
        if group:
            return cls(namespace=pod.namespace, name=group)
        return cls(namespace=pod.namespace, name=pod.name, lone=True)


class VictimUnit(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Pods that may be evicted together to make room for a gang: a lone pod, a gang's
    member beyond its ``minMember``, a whole gang (never cut below ``minMember``), or
    every pod of a node (a hold)."""

    pods: tuple[PodRef, ...]
    why: str = ""
    """Why they may go, for the Events: lower priority, or a queue over its share."""
    budgets: tuple[tuple[str, ...], ...] = ()
    """Per pod of ``pods``, in order, the PodDisruptionBudgets (``namespace/name``) its
    eviction counts against (shared/core/disruption.py); empty when none covers any."""


class DeviceRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What one container asks of one device vendor, already validated.

    ``memory_mib`` and ``cores`` apply to EACH of the ``count`` devices, as upstream.
    ``memory_mib`` is None when the request is a percentage (``memory_percent``) that
    the core resolves against each candidate card.
    """

    vendor: Vendor
    kind: RequestKind = "vgpu"
    resource: str
    """The count resource name the user wrote; messages name it."""
    memory_resource: str = ""
    """The memory resource name the user wrote (or the vendor's first), for messages."""
    core_resource: str = ""
    """The core resource name the user wrote (or the vendor's first), for messages."""
    count: NonNegInt = 1
    memory_mib: NonNegInt | None = None
    memory_percent: Percent | None = None
    cores: NonNegInt = 0
    """Percent of one device's compute; 100 means exclusive."""
    exclusive: bool = False
    chip: str | None = None
    """Ascend chip the request targets (``910B3``...), from the resource name."""
    npu_cores: NonNegInt | None = None
    """MindCluster AI cores (``huawei.com/npu-core``)."""
    priority: NonNegInt | None = None
    units: NonNegInt = 0
    """Device IDs the kubelet asks per device when the resource counts units, not
    devices: Volcano gpu-share (memory units of ``gpuMemoryFactor`` MiB, as written) and
    MindCluster ``npu-core`` (AI cores); 0 for a count resource (shared/core/admission.py)."""
    model: str = ""
    """The device model the resource name pins (Iluvatar's ``iluvatar.ai/<model>-vgpu``,
    matched as ``nvidia.com/use-gputype`` matches); empty: any model of the vendor."""
    mig_profile: str | None = None
    """A MIG instance of exactly this profile per device (``nvidia.com/mig-<profile>``,
    NVIDIA's ``migStrategy: mixed`` names); None for every other request."""


class ContainerRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The device requests of one container; init containers come first, as in the pod."""

    name: str
    init: bool = False
    sidecar: bool = False
    """An init container with ``restartPolicy: Always``: it runs beside the app
    containers for the pod's life, so its devices add to theirs."""
    devices: tuple[DeviceRequest, ...] = ()
    disable_isolation: bool = False
    """``CUDA_DISABLE_CONTROL=true``: no isolation library for this container."""
    core_policy: str | None = None
    """``GPU_CORE_UTILIZATION_POLICY`` as the container sets it."""


class VendorSelector(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One vendor's type and UUID allow/deny lists (its own annotation keys, as HAMi
    reads them per vendor: ``hygon.com/use-dcutype``, ``amd.com/use-gpu-uuid``...): they
    apply to that vendor's devices only, and to one ``model`` of it when set (Ascend's
    and Iluvatar's keys name the chip)."""

    vendor: Vendor
    model: str = ""
    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: tuple[str, ...] = ()
    nouse_uuids: tuple[str, ...] = ()


class Constraints(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Pod-level placement constraints, from the annotations of docs/compat.md, section 2."""

    use_types: tuple[str, ...] = ()
    """NVIDIA's ``nvidia.com/use-gputype``: it filters NVIDIA devices only (the other
    vendors' keys are in ``selectors``)."""
    nouse_types: tuple[str, ...] = ()
    use_uuids: tuple[str, ...] = ()
    nouse_uuids: tuple[str, ...] = ()
    device_indexes: tuple[NonNegInt, ...] = ()
    mode: SharingMode | None = None
    node_policy: Policy | None = None
    device_policy: Policy | None = None
    numa_bind: bool = False
    topology: bool | None = None
    """HAMi's ``topology-aware`` device policy (shared/core/topology.py): True when the
    pod's ``hami.io/gpu-scheduler-policy`` names it, False when that annotation names
    other policies only, None when the pod has none (``scheduler.topologyAware`` decides)."""
    group_spread: bool = False
    vnpu_hami_core: bool = False
    vnpu_level: Literal["low", "high"] | None = None
    vnpu_dvpp: Literal["yes", "no", "null"] | None = None
    run_as: int | None = None
    """The UID an MPS card's clients must share with this pod (shared/core/request.py):
    the one ``runAsUser`` of its device containers; :data:`MPS_ALONE` when unset and
    ``nodeAgent.mps.unsetUser`` is ``exclusive`` (an MPS card of its own); None when
    unset and that rule is ``refuse`` (no MPS card)."""
    selectors: tuple[VendorSelector, ...] = ()
    """Every other vendor's type and UUID lists the pod's annotations give."""


class PodRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Everything placement needs to know about one pod's devices."""

    containers: tuple[ContainerRequest, ...] = ()
    constraints: Constraints = Constraints()

    @property
    def wants_devices(self) -> bool:
        """Whether some container asks a device (else the pod is placed by its node filters
        alone)."""
        return any(c.devices for c in self.containers)


class Movable(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A bound shared-GPU pod that consolidation may move to another node to make room
    for a gang (shared/core/consolidation.py): its controller recreates it, and the
    recreated pod (same owner, same request) takes the place reserved for it."""

    pod: PodRef
    request: PodRequest
    owner: str
    """Its controller ``ownerReference`` as ``Kind/name`` (a bare pod is never moved)."""
    budgets: tuple[str, ...] = ()
    """The PodDisruptionBudgets (``namespace/name``) its eviction counts against."""


class RequestError(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Why a pod's request can never be placed as written: the field and the fix."""

    field: str
    """Where: a resource name with its container, or an annotation key."""
    message: str


class MigInstance(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One MIG instance slot of a card's geometry."""

    profile: str
    """Profile name, e.g. ``1g.10gb``."""
    memory_mib: NonNegInt
    placement: NonNegInt
    """Index of this slot within the geometry; stable across reconfiguration."""
    uuid: str | None = None
    """The instance UUID once it exists on the card."""


class DeviceInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One physical device as a node agent reports it (before node overrides)."""

    uuid: DeviceUUID
    index: NonNegInt
    vendor: Vendor
    model: str
    """Type string users match with use-gputype, e.g. ``NVIDIA-A100-SXM4-80GB``."""
    memory_mib: NonNegInt
    cores: NonNegInt = 100
    """Compute capacity in percent of one device (100 x core scaling)."""
    sm_count: NonNegInt = 0
    numa: NonNegInt = 0
    mode: SharingMode = "hami-core"
    healthy: bool = True
    chip: str | None = None
    """Ascend chip name (``910B3``, ``310P3``) or None."""
    ai_cores: NonNegInt = 0
    """Ascend AI cores of the chip."""
    ai_cpus: NonNegInt = 0
    """Ascend AI CPUs of the chip."""
    mig_geometry: tuple[MigInstance, ...] = ()
    """The MIG geometry the card runs now; empty when MIG is off or unconfigured."""
    pci_bus_id: str = ""
    """The card's PCI address (``0000:3b:00.0``), as NVML reads it; empty when unread."""
    architecture: str = ""
    """The NVIDIA architecture (``Hopper``, ``Ampere``...); empty when unread."""
    compute_capability: str = ""
    """CUDA compute capability (``9.0``); empty when unread."""
    driver_version: str = ""
    """The node's driver version (``580.65.06``); empty when unread. These four are
    published as DRA device attributes (services/node_agent/dra/slices.py)."""
    mps: MpsState = ""
    """The MPS control daemon serving this card (cards in ``mps`` mode; empty otherwise):
    a card in ``mps`` mode whose daemon is ``unavailable`` is offered to no MPS pod."""
    mps_clients: NonNegInt = 0
    """MPS client processes on this card now (cards in ``mps`` mode)."""
    links: dict[NonNegInt, NonNegInt] = msgspec.field(default_factory=dict)
    """How this card is linked to each other card of its vendor on the node: the peer's
    ``index`` → the pair's score on HAMi's scale (shared/core/topology.py: 100 per NVLink,
    plus 10 to 60 for the PCIe path); read with NVML by the node agent. Empty when not
    read (no NVML topology, another vendor, an older agent): ``topology-aware`` then
    has nothing to weigh on this node."""


class DeviceGrant(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What one container gets of one device."""

    uuid: DeviceUUID
    index: NonNegInt = 0
    vendor: Vendor = "nvidia"
    model: str = ""
    memory_mib: NonNegInt = 0
    cores: NonNegInt = 0
    exclusive: bool = False
    mig_profile: str | None = None
    mig_placement: NonNegInt | None = None
    mig_geometry: str | None = None
    """The geometry the instance belongs to (its profiles in placement order, comma
    separated): the node agent creates it on a card that runs another one."""
    mps_user: int | None = None
    """On an MPS card: the UID its clients run as (:data:`MPS_ALONE`: this pod's alone)."""
    vnpu_template: str | None = None
    ai_cores: NonNegInt = 0
    """Ascend AI cores the vNPU template holds."""
    ai_cpus: NonNegInt = 0
    """Ascend AI CPUs the vNPU template holds."""
    units: NonNegInt = 0
    """Device IDs of a resource counted in units that the kubelet asks for this device
    (its request's ``units``); 0 when the device is asked by count."""
    external: bool = False
    """Handed by another device plugin, not Tessera's node agent (NVIDIA's MIG profile
    names of ``migStrategy: mixed``): the kubelet asks that plugin, so the grant makes no
    admission key (shared/core/admission.py)."""
    whole: bool = False
    """Granted through a whole-count name (``volcano.sh/gpu-number``, ``kunlunxin.com/xpu``,
    ``metax-tech.com/gpu``, ``enflame.com/gcu``, ``aws.amazon.com/neuron``): upstream
    serves these through another device type than the vendor's slices, with its own
    bind annotations (shared/core/annotations.py)."""


class ContainerGrant(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Every device grant of one container."""

    container: str
    init: bool = False
    devices: tuple[DeviceGrant, ...] = ()
    reuses: bool = False
    """An init container's devices, each within what the pod's app containers hold on
    it: they run one after the other (the kubelet's device manager hands an init
    container's devices on to the app containers), so it is not booked again."""
    priority: NonNegInt | None = None
    """``<vendor>/priority`` as the container asked (the isolation library's task priority)."""
    disable_isolation: bool = False
    """The container set ``CUDA_DISABLE_CONTROL=true``: no preload library."""
    core_policy: str | None = None
    """``GPU_CORE_UTILIZATION_POLICY`` as the container set it."""
