"""Device-family settings the core consumes: resource names, defaults, MIG and vNPU tables.

These are the per-vendor blocks of ``tessera.yaml`` (shared/config.py loads them). Keys
keep the names HAMi and Volcano users already write (``resourceCountName``,
``deviceSplitCount``, ``knownMigGeometries``...), and every resource-name key takes one
name or a list of names, all accepted at once: by default a pod may use HAMi's
``nvidia.com/gpumem`` or Volcano's ``volcano.sh/vgpu-memory`` against the same cards.

Defaults live here, as data, so that the core, the config and the docs agree.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

import msgspec

from shared.core.model import NonNegInt, Percent, PosInt, SharingMode, Vendor

GENERIC_VENDORS: tuple[Vendor, ...] = tuple(v for v in get_args(Vendor) if v != "ascend")
"""Vendors sliced by count, memory and cores (Ascend has chips and templates instead)."""

Names = str | list[str]
"""One resource name or several; see :func:`names`."""

Scaling = Annotated[float, msgspec.Meta(gt=0.0)]


def names(value: Names) -> tuple[str, ...]:
    """Normalise a resource-name key (string or list) to a tuple; empty strings dropped."""
    items = [value] if isinstance(value, str) else value
    return tuple(n for n in items if n)


class _Spec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    """Config structs: camelCase keys like upstream; a typo is an error, never ignored."""


class MigProfile(_Spec, frozen=True, kw_only=True):
    """``{name: 1g.10gb, memory: 9856, count: 7}``: ``count`` instances of one profile."""

    name: str
    memory: PosInt
    """MiB of one instance."""
    count: PosInt


class MigGeometry(_Spec, frozen=True, kw_only=True):
    """One way to cut a card: the profiles that exist together."""

    geometries: list[MigProfile]
    group: str = ""


class KnownMigGeometries(_Spec, frozen=True, kw_only=True):
    """The alternative geometries of the GPU models named (substring, case-insensitive)."""

    models: list[str]
    allowed_geometries: list[MigGeometry]


class MemoryTemplate(_Spec, frozen=True, kw_only=True):
    """A slice size a vendor cuts cards into (Kunlunxin's vXPU): ``{memory: 24576,
    cores: 25}``, MiB and the percent of the card's cores it holds."""

    memory: PosInt
    cores: Percent


WholeWhen = Literal["several", "no-memory"]
"""When a vendor's request takes whole devices: ``several`` devices in one container
(Moore Threads', Iluvatar's webhook writes a whole card's cores), or ``no-memory`` named
(Moore Threads' webhook writes a whole card's memory and cores)."""


class VendorSpec(_Spec, frozen=True, kw_only=True):
    """The settings every vendor shares: how pods name its resources, how cards are shared.

    The keys below ``coreUnit`` say how HAMi's device code for the vendor reads a request
    (``pkg/device/<vendor>/`` at the commit ../shared/UPSTREAM.md names); their defaults
    in :data:`DEFAULT_VENDORS` are that code's, docs/compat.md section 1 has one table per
    vendor.
    """

    enabled: bool = True
    resource_count_name: Names = ""
    """Count of shared (sliced) devices per container."""
    resource_whole_count_name: Names = ""
    """Count of whole, exclusive devices (Volcano ``gpu-number``, Kunlunxin ``xpu``)."""
    resource_memory_name: Names = ""
    resource_memory_percentage_name: Names = ""
    resource_core_name: Names = ""
    resource_priority_name: Names = ""
    device_split_count: PosInt = 10
    """Most tasks that may share one card."""
    device_memory_scaling: Scaling = 1.0
    """>1 overcommits memory (the isolation library then allows oversubscription)."""
    device_core_scaling: Scaling = 1.0
    default_memory: NonNegInt = 0
    """MiB given when a pod names neither memory nor percentage; 0 means the whole card."""
    default_cores: Percent = 0
    default_gpu_num: PosInt = msgspec.field(default=1, name="defaultGPUNum")
    """Devices assumed when a pod asks memory or cores without a count."""
    gpu_memory_factor: PosInt = 1
    """Memory requests are in units of this many MiB."""
    disable_core_limit: bool = False
    core_unit: Literal["percent", "count"] = "percent"
    """``count`` when the core resource counts cores (AWS NeuronCores), not percent."""
    cores_per_device: PosInt = 100
    """What the core name asks for one whole device: 100 for a percentage; Moore Threads'
    ``sgpu-core`` counts 16 per card (booked as that share of 100 %, rounded down); AWS
    NeuronCores 2 per device (``coreUnit: count``: more is that many whole devices)."""
    use_type_annotation: str = ""
    """Pod annotation listing the device models to use (case-insensitive substrings of
    the model); applies to this vendor's devices only."""
    nouse_type_annotation: str = ""
    use_uuid_annotation: Names = ""
    """Pod annotation(s) listing the device UUIDs to use (the first one present is
    read). ``{model}`` stands for each of ``models``, the key then applies to that model."""
    nouse_uuid_annotation: Names = ""
    models: list[str] = msgspec.field(default_factory=list)
    """Device models the resource names carry (``iluvatar.ai/<model>-vgpu``): a request
    through a name holding a model lands only on devices of that model."""
    suffixed_memory_in_bytes: bool = False
    """A memory quantity written with a suffix (``4Gi``, ``512Mi``) is bytes, turned into
    MiB; a plain number is in units of ``gpuMemoryFactor`` MiB (MetaX reads GiB)."""
    allowed_memory: list[PosInt] = msgspec.field(default_factory=list)
    """The only memory values (as written, before ``gpuMemoryFactor``) a request may
    give; empty: any (Moore Threads' webhook refuses others)."""
    memory_templates: list[MemoryTemplate] = msgspec.field(default_factory=list)
    """Slice sizes: memory rounds up to the smallest template holding it, which fixes
    the cores, and a card holds slices of one size at a time (Kunlunxin's vXPU)."""
    whole_when: list[WholeWhen] = msgspec.field(default_factory=list)
    count_optional: bool = False
    """Memory or cores without a count ask for one device: the vendor's device plugin
    registers those names itself, so the webhook adds no count (Enflame, AWS Neuron)."""
    count_is_slices: bool = False
    """The count names ask that many slices of ONE device, of ``deviceSplitCount`` per
    device (Enflame's ``drs-gcu``), not that many devices."""
    count_alone: Literal["whole", "slot"] = "whole"
    """What a count with no memory and no cores asks of each device: ``whole``, the card
    to itself (HAMi books 100 % of its memory); ``slot``, one of its ``deviceSplitCount``
    tasks and nothing more, no memory or cores booked (HAMi's Biren and VastAI code
    checks only a device's task count, so the vendor's plugin decides the sharing)."""

    def all_names(self) -> tuple[str, ...]:
        """Every resource name this vendor answers to."""
        return (
            names(self.resource_count_name)
            + names(self.resource_whole_count_name)
            + names(self.resource_memory_name)
            + names(self.resource_memory_percentage_name)
            + names(self.resource_core_name)
            + names(self.resource_priority_name)
        )


class NvidiaSpec(VendorSpec, frozen=True, kw_only=True):
    """NVIDIA: HAMi's ``nvidia:`` block plus Volcano's gpu-share name and MIG tables."""

    gpu_share_memory_name: Names = ""
    """Volcano GPU share: one card, a memory slice, no core limit."""
    mig_strategy: Literal["none", "mixed"] = "none"
    known_mig_geometries: list[KnownMigGeometries] = msgspec.field(default_factory=list)
    gpu_core_policy: Literal["default", "force", "disable"] = "default"
    lib_cuda_log_level: Annotated[int, msgspec.Meta(ge=0, le=4)] = 0

    def all_names(self) -> tuple[str, ...]:
        """Every resource name NVIDIA answers to, Volcano's gpu-share memory name included."""
        return super().all_names() + names(self.gpu_share_memory_name)


class VnpuTemplate(_Spec, frozen=True, kw_only=True):
    """An Ascend hard-slice template: ``{name: vir05_1c_16g, memory: 16384, aiCore: 5}``."""

    name: str
    memory: PosInt
    ai_core: NonNegInt = 0
    ai_cpu: NonNegInt = 0


class VnpuChip(_Spec, frozen=True, kw_only=True):
    """One Ascend chip model, as HAMi's ``vnpus:`` entries describe it."""

    chip_name: str
    """Model as the node reports it (``910B3``, ``310P3``)."""
    common_word: str
    """What the resource name carries (``Ascend910B3``)."""
    resource_name: str
    resource_memory_name: str
    resource_core_name: str = ""
    memory_allocatable: PosInt
    memory_capacity: PosInt
    ai_core: PosInt
    ai_cpu: NonNegInt = 0
    templates: list[VnpuTemplate] = msgspec.field(default_factory=list)


class MindClusterSpec(_Spec, frozen=True, kw_only=True):
    """Ascend MindCluster mode: ``huawei.com/npu-core`` with vnpu-level / vnpu-dvpp labels."""

    enabled: bool = True
    resource_name: str = "huawei.com/npu-core"
    chip_name: str = "310P3"
    """The chip MindCluster's 310P templates apply to."""


class FilterDevices(_Spec, frozen=True, kw_only=True):
    """Devices a node must never offer (HAMi ``filterdevices``)."""

    uuid: list[str] = msgspec.field(default_factory=list)
    index: list[NonNegInt] = msgspec.field(default_factory=list)

    def excludes(self, uuid: str, index: int) -> bool:
        """Whether a device, by UUID or index, is one the node must never offer."""
        return uuid in self.uuid or index in self.index


class NodeOverride(_Spec, frozen=True, kw_only=True):
    """Per-node settings (HAMi ``nodeconfig``); unset fields keep the vendor's value."""

    name: str
    operating_mode: SharingMode | None = None
    device_split_count: PosInt | None = None
    device_memory_scaling: Scaling | None = None
    device_core_scaling: Scaling | None = None
    lib_cuda_log_level: Annotated[int, msgspec.Meta(ge=0, le=4)] | None = None
    mig_strategy: Literal["none", "mixed"] | None = None
    filter_devices: FilterDevices = msgspec.field(default_factory=FilterDevices)
    device_api: Literal["device-plugin", "dra"] | None = None
    """How this node's devices reach its kubelet (``nodeAgent.deviceApi`` when unset):
    the device plugin or DRA, one of them, never both."""


def _vendor(
    vendor: Vendor, count: Names, memory: Names = "", cores: Names = "", **kw: object
) -> VendorSpec:
    return msgspec.convert(
        {
            "resourceCountName": count,
            "resourceMemoryName": memory,
            "resourceCoreName": cores,
            **kw,
        },
        VendorSpec,
    )


def _geometries(models: str, *alternatives: str) -> KnownMigGeometries:
    """A model's alternative MIG geometries, each written ``profile:MiB*count,...``."""
    parsed = []
    for i, text in enumerate(alternatives):
        profiles = []
        for item in text.split(","):
            name, _, rest = item.partition(":")
            memory, _, count = rest.partition("*")
            profiles.append(MigProfile(name=name, memory=int(memory), count=int(count)))
        parsed.append(MigGeometry(group=f"group{i + 1}", geometries=profiles))
    return KnownMigGeometries(models=models.split(","), allowed_geometries=parsed)


# The profiles NVIDIA documents per model, with the instance memory NVML reports.
DEFAULT_MIG_GEOMETRIES: list[KnownMigGeometries] = [
    _geometries("A30", "1g.6gb:5836*4", "2g.12gb:11904*2", "4g.24gb:24064*1"),
    _geometries(
        "A100-SXM4-40GB,A100-PCIE-40GB,A100-40GB",
        "1g.5gb:4864*7",
        "2g.10gb:9856*3,1g.5gb:4864*1",
        "3g.20gb:19968*2",
        "7g.40gb:40192*1",
    ),
    _geometries(
        "A100-SXM4-80GB,A100-PCIE-80GB,A100-80GB,A800",
        "1g.10gb:9856*7",
        "2g.20gb:19968*3,1g.10gb:9856*1",
        "3g.40gb:40192*2",
        "7g.80gb:80384*1",
    ),
    _geometries(
        "H100,H800",
        "1g.10gb:9856*7",
        "1g.20gb:19968*4",
        "2g.20gb:19968*3,1g.10gb:9856*1",
        "3g.40gb:40192*2",
        "7g.80gb:80384*1",
    ),
    _geometries(
        "H200,H20",
        "1g.18gb:16640*7",
        "1g.35gb:33792*4",
        "2g.35gb:33792*3,1g.18gb:16640*1",
        "3g.71gb:71936*2",
        "7g.141gb:143360*1",
    ),
]

DEFAULT_NVIDIA = NvidiaSpec(
    resource_count_name=["nvidia.com/gpu", "volcano.sh/vgpu-number"],
    resource_whole_count_name="volcano.sh/gpu-number",
    resource_memory_name=["nvidia.com/gpumem", "volcano.sh/vgpu-memory"],
    resource_memory_percentage_name=[
        "nvidia.com/gpumem-percentage",
        "volcano.sh/vgpu-memory-percentage",
    ],
    resource_core_name=["nvidia.com/gpucores", "volcano.sh/vgpu-cores"],
    resource_priority_name="nvidia.com/priority",
    gpu_share_memory_name="volcano.sh/gpu-memory",
    known_mig_geometries=DEFAULT_MIG_GEOMETRIES,
    use_type_annotation="nvidia.com/use-gputype",
    nouse_type_annotation="nvidia.com/nouse-gputype",
    use_uuid_annotation=["nvidia.com/use-gpuuuid", "volcano.sh/vgpu-use-gpuuuid"],
    nouse_uuid_annotation=["nvidia.com/nouse-gpuuuid", "volcano.sh/vgpu-nouse-gpuuuid"],
)

_ILUVATAR_MODELS = ("BI-V100", "BI-V150", "MR-V100", "MR-V50")

DEFAULT_VENDORS: dict[str, VendorSpec] = {
    # HAMi pkg/device/cambricon/device.go: vmemory counts 256 MiB, cores default to 100.
    "cambricon": _vendor(
        "cambricon",
        "cambricon.com/vmlu",
        "cambricon.com/mlu.smlu.vmemory",
        "cambricon.com/mlu.smlu.vcore",
        gpuMemoryFactor=256,
        defaultCores=100,
        useTypeAnnotation="cambricon.com/use-mlutype",
        nouseTypeAnnotation="cambricon.com/nouse-mlutype",
        useUuidAnnotation="cambricon.com/use-gpuuuid",
        nouseUuidAnnotation="cambricon.com/nouse-gpuuuid",
    ),
    # HAMi pkg/device/hygon/device.go: cores default to 100, dcutype keys.
    "hygon": _vendor(
        "hygon",
        "hygon.com/dcunum",
        "hygon.com/dcumem",
        "hygon.com/dcucores",
        defaultCores=100,
        useTypeAnnotation="hygon.com/use-dcutype",
        nouseTypeAnnotation="hygon.com/nouse-dcutype",
        useUuidAnnotation="hygon.com/use-gpuuuid",
        nouseUuidAnnotation="hygon.com/nouse-gpuuuid",
    ),
    # HAMi pkg/device/metax/sdevice.go (sGPU: GiB, cores default 100) and device.go
    # (metax-tech.com/gpu: whole cards).
    "metax": _vendor(
        "metax",
        "metax-tech.com/sgpu",
        "metax-tech.com/vmemory",
        "metax-tech.com/vcore",
        resourceWholeCountName="metax-tech.com/gpu",
        gpuMemoryFactor=1024,
        suffixedMemoryInBytes=True,
        defaultCores=100,
        useUuidAnnotation="metax-tech.com/use-gpuuuid",
        nouseUuidAnnotation="metax-tech.com/nouse-gpuuuid",
    ),
    # HAMi pkg/device/mthreads/device.go: 512 MiB blocks of listed sizes, 16 cores a card.
    "mthreads": _vendor(
        "mthreads",
        "mthreads.com/vgpu",
        "mthreads.com/sgpu-memory",
        "mthreads.com/sgpu-core",
        gpuMemoryFactor=512,
        allowedMemory=[2, 4, 8, 16, 32, 64, 96],
        coresPerDevice=16,
        wholeWhen=["several", "no-memory"],
        useUuidAnnotation="mthreads.ai/use-gpuuuid",
        nouseUuidAnnotation="mthreads.ai/nouse-gpuuuid",
    ),
    # HAMi pkg/device/enflame/gcu.go (gcu: whole cards) and device.go (drs-gcu: slices of
    # one card; memory and cores alone ask one card).
    "enflame": _vendor(
        "enflame",
        ["enflame.com/drs-gcu", "enflame.com/vgcu"],
        "enflame.com/gcu-memory",
        "enflame.com/gcu-core",
        resourceWholeCountName="enflame.com/gcu",
        resourceMemoryPercentageName="enflame.com/vgcu-percentage",
        countOptional=True,
        countIsSlices=True,
        useUuidAnnotation="enflame.com/use-gpuuuid",
        nouseUuidAnnotation="enflame.com/nouse-gpuuuid",
    ),
    # HAMi pkg/device/kunlun/vdevice.go (vXPU templates) and device.go (xpu: whole cards).
    "kunlunxin": _vendor(
        "kunlunxin",
        "kunlunxin.com/vxpu",
        "kunlunxin.com/vxpu-memory",
        resourceWholeCountName="kunlunxin.com/xpu",
        memoryTemplates=[
            {"memory": 24576, "cores": 25},
            {"memory": 49152, "cores": 50},
            {"memory": 98304, "cores": 100},
        ],
        useUuidAnnotation=["hami.io/use-xpu-uuid", "baidu.com/use-gpuuuid"],
        nouseUuidAnnotation=["hami.io/no-use-xpu-uuid", "baidu.com/nouse-gpuuuid"],
    ),
    # HAMi pkg/device/iluvatar/device.go: one device type per model, vMem counts 256 MiB.
    "iluvatar": _vendor(
        "iluvatar",
        [f"iluvatar.ai/{m}-vgpu" for m in _ILUVATAR_MODELS],
        [f"iluvatar.ai/{m}.vMem" for m in _ILUVATAR_MODELS],
        [f"iluvatar.ai/{m}.vCore" for m in _ILUVATAR_MODELS],
        models=list(_ILUVATAR_MODELS),
        gpuMemoryFactor=256,
        wholeWhen=["several"],
        useUuidAnnotation="hami.io/use-{model}-uuid",
        nouseUuidAnnotation="hami.io/no-use-{model}-uuid",
    ),
    # HAMi pkg/device/amd/device.go: cores default to 100, gputype and gpu-uuid keys.
    "amd": _vendor(
        "amd",
        "amd.com/gpu",
        "amd.com/gpumem",
        "amd.com/gpucores",
        defaultCores=100,
        useTypeAnnotation="amd.com/use-gputype",
        nouseTypeAnnotation="amd.com/nouse-gputype",
        useUuidAnnotation="amd.com/use-gpu-uuid",
        nouseUuidAnnotation="amd.com/nouse-gpu-uuid",
    ),
    # HAMi pkg/device/awsneuron/device.go: neuron = whole devices, neuroncore = cores (2
    # a device) asked on their own.
    "awsneuron": _vendor(
        "awsneuron",
        "",
        cores="aws.amazon.com/neuroncore",
        resourceWholeCountName="aws.amazon.com/neuron",
        coreUnit="count",
        coresPerDevice=2,
        countOptional=True,
        useUuidAnnotation="aws.amazon.com/use-neuron-uuid",
        nouseUuidAnnotation="aws.amazon.com/nouse-neuron-uuid",
    ),
    # HAMi pkg/device/biren/device.go and vastai/device.go: a count alone takes task slots,
    # nothing else is booked; a device has one (Biren's plugin registers one a device,
    # biren-device-plugin pkg/brgpu/register.go; HAMi's VastAI tests register one). Only
    # the UUID keys are read (use-biren / use-va are declared, never read).
    "biren": _vendor(
        "biren",
        "birentech.com/gpu",
        countAlone="slot",
        deviceSplitCount=1,
        useUuidAnnotation="birentech.com/use-gpuuuid",
        nouseUuidAnnotation="birentech.com/nouse-gpuuuid",
    ),
    "vastai": _vendor(
        "vastai",
        "vastaitech.com/va",
        countAlone="slot",
        deviceSplitCount=1,
        useUuidAnnotation="vastaitech.com/use-gpuuuid",
        nouseUuidAnnotation="vastaitech.com/nouse-gpuuuid",
    ),
}


def _chip(
    chip: str,
    word: str,
    allocatable: int,
    capacity: int,
    ai_core: int,
    templates: list[tuple[str, int, int]],
    ai_cpu: int = 0,
) -> VnpuChip:
    return VnpuChip(
        chip_name=chip,
        common_word=word,
        resource_name=f"huawei.com/{word}",
        resource_memory_name=f"huawei.com/{word}-memory",
        resource_core_name=f"huawei.com/{word}-core",
        memory_allocatable=allocatable,
        memory_capacity=capacity,
        ai_core=ai_core,
        ai_cpu=ai_cpu,
        templates=[VnpuTemplate(name=n, memory=m, ai_core=c) for n, m, c in templates],
    )


_910B3_TEMPLATES = [("vir05_1c_16g", 16384, 5), ("vir10_3c_32g", 32768, 10)]

DEFAULT_VNPUS: list[VnpuChip] = [
    _chip(
        "910A",
        "Ascend910A",
        32768,
        32768,
        32,
        [("vir02", 2184, 2), ("vir04", 4369, 4), ("vir08", 8738, 8), ("vir16", 17476, 16)],
    ),
    _chip(
        "910B2",
        "Ascend910B2",
        65536,
        65536,
        24,
        [("vir03_1c_8g", 8192, 3), ("vir06_1c_16g", 16384, 6), ("vir12_3c_32g", 32768, 12)],
    ),
    _chip("910B3", "Ascend910B3", 65536, 65536, 20, _910B3_TEMPLATES),
    _chip("910B4-1", "Ascend910B4-1", 65536, 65536, 20, _910B3_TEMPLATES),
    _chip("910C", "Ascend910C", 65536, 65536, 20, _910B3_TEMPLATES),
    _chip(
        "910B4",
        "Ascend910B4",
        32768,
        32768,
        20,
        [("vir05_1c_8g", 8192, 5), ("vir10_3c_16g", 16384, 10)],
    ),
    _chip(
        "310P3",
        "Ascend310P",
        21527,
        24576,
        8,
        [("vir01", 3072, 1), ("vir02", 6144, 2), ("vir04", 12288, 4)],
        ai_cpu=7,
    ),
]


class DeviceSpecs(_Spec, frozen=True, kw_only=True):
    """Every vendor's block; omitted blocks take the defaults below."""

    nvidia: NvidiaSpec = msgspec.field(default_factory=lambda: DEFAULT_NVIDIA)
    cambricon: VendorSpec = msgspec.field(default_factory=lambda: DEFAULT_VENDORS["cambricon"])
    hygon: VendorSpec = msgspec.field(default_factory=lambda: DEFAULT_VENDORS["hygon"])
    metax: VendorSpec = msgspec.field(default_factory=lambda: DEFAULT_VENDORS["metax"])
    mthreads: VendorSpec = msgspec.field(default_factory=lambda: DEFAULT_VENDORS["mthreads"])
    enflame: VendorSpec = msgspec.field(default_factory=lambda: DEFAULT_VENDORS["enflame"])
    kunlunxin: VendorSpec = msgspec.field(default_factory=lambda: DEFAULT_VENDORS["kunlunxin"])
    iluvatar: VendorSpec = msgspec.field(default_factory=lambda: DEFAULT_VENDORS["iluvatar"])
    amd: VendorSpec = msgspec.field(default_factory=lambda: DEFAULT_VENDORS["amd"])
    awsneuron: VendorSpec = msgspec.field(default_factory=lambda: DEFAULT_VENDORS["awsneuron"])
    biren: VendorSpec = msgspec.field(default_factory=lambda: DEFAULT_VENDORS["biren"])
    vastai: VendorSpec = msgspec.field(default_factory=lambda: DEFAULT_VENDORS["vastai"])
    vnpus: list[VnpuChip] = msgspec.field(default_factory=lambda: list(DEFAULT_VNPUS))
    mindcluster: MindClusterSpec = msgspec.field(default_factory=MindClusterSpec)

    def vendor(self, vendor: Vendor) -> VendorSpec | None:
        """The block of a vendor that slices by count/memory/cores; None for Ascend."""
        if vendor == "ascend":
            return None
        spec: VendorSpec = getattr(self, vendor)
        return spec
