"""Turn a pod (plain data, as the API server returns it) into a validated PodRequest.

Every resource name of docs/compat.md (section 1) is recognised through the configured names
(HAMi's and Volcano's at once by default), together with the annotations of section 2.
The semantics follow upstream (``count`` devices, memory and cores per device,
``defaultMemory``/``defaultCores``, ``gpuMemoryFactor``, exclusivity), and each vendor as
HAMi's own device code reads it: its units, defaults, slice sizes, whole-card rules and
type/UUID annotation keys are data of its ``devices.<vendor>`` block (shared/core/spec.py),
applied here in one place (``_sliced``, ``_selectors``); NVIDIA's ``nvidia.com/mig-<profile>``
names (``migStrategy: mixed``) ask existing MIG instances of a profile.
Where upstream silently does something surprising, Tessera says so instead:

- memory or cores without a count name is an error naming the count to add: the
  kubelet calls a device plugin only for the names it registers, so such a container
  would run with no devices and no limits. The admission webhook adds the count
  (``defaultGPUNum``, as HAMi's webhook does) before the pod reaches the watcher
  (``missing_counts``);
- ``cores`` above 100 is an error naming the fix (upstream clamps; set
  ``clamp_cores=True`` to clamp as upstream does);
- memory and memory-percentage together is an error (upstream ignores one);
- an Ascend multi-card request must use whole cards unless the pod asks for
  ``huawei.com/vnpu-mode: hami-core``; a memory above the chip's capacity is an error.

A request that is valid as written but larger than every card of the cluster is found
by the placement core, which knows the cards (``Placer.check``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from msgspec.structs import replace

from shared.core.model import (
    MPS_ALONE,
    Constraints,
    ContainerRequest,
    DeviceRequest,
    PodRequest,
    Policy,
    RequestError,
    SharingMode,
    Vendor,
    VendorSelector,
    gpu_type,
)
from shared.core.quantity import parse_whole
from shared.core.spec import GENERIC_VENDORS, DeviceSpecs, VendorSpec, VnpuChip, names
from shared.core.status import UNRESOLVABLE, Code, Reason, Status

# --- annotation and label keys (docs/compat.md, section 2) -------------------------------------

USE_GPUTYPE = "nvidia.com/use-gputype"
NOUSE_GPUTYPE = "nvidia.com/nouse-gputype"
USE_UUID = ("nvidia.com/use-gpuuuid", "volcano.sh/vgpu-use-gpuuuid")
NOUSE_UUID = ("nvidia.com/nouse-gpuuuid", "volcano.sh/vgpu-nouse-gpuuuid")
GPU_INDEX = "volcano.sh/gpu-index"
VGPU_MODE = ("nvidia.com/vgpu-mode", "volcano.sh/vgpu-mode")
NODE_POLICY = "hami.io/node-scheduler-policy"
GPU_POLICY = "hami.io/gpu-scheduler-policy"
NUMA_BIND = "nvidia.com/numa-bind"
PODGROUP_POLICY = "volcano.sh/vgpu-podgroup-policy"
VNPU_MODE = "huawei.com/vnpu-mode"
GROUP_NAME = "scheduling.k8s.io/group-name"
TASK_SPEC = "volcano.sh/task-spec"
"""A Volcano Job pod's task role (``minTaskMember`` counts per role)."""
VNPU_LEVEL = "vnpu-level"
VNPU_DVPP = "vnpu-dvpp"
ASCEND_USE_UUID = "hami.io/use-{model}-uuid"
ASCEND_NOUSE_UUID = "hami.io/no-use-{model}-uuid"
"""Ascend's UUID keys, one pair per chip's common word (HAMi pkg/device/ascend/device.go)."""
MIG_PREFIX = "nvidia.com/mig-"
"""NVIDIA's device plugin with ``migStrategy: mixed`` registers one resource per MIG
profile, ``nvidia.com/mig-<profile>`` (``mig-1g.10gb``): each device asked is one
existing instance of that profile."""

ENV_CORE_POLICY = "GPU_CORE_UTILIZATION_POLICY"
ENV_DISABLE_CONTROL = "CUDA_DISABLE_CONTROL"


MAX_DEVICES = 1024
"""The most devices one container may ask for: more than any node has."""
MAX_AMOUNT = 1 << 24
"""The most any other device resource may ask for of one device (16777216: MiB of
memory, or cores): more than any device has."""
MAX_DIGITS_INDEX = 6
"""The most digits of a device index in ``volcano.sh/gpu-index``."""


class Role(enum.Enum):
    """What a configured resource name gives of a request (count, memory, cores...)."""

    COUNT = "count"
    WHOLE = "whole-count"
    MEMORY = "memory"
    MEMORY_PERCENT = "memory-percentage"
    CORES = "cores"
    PRIORITY = "priority"
    SHARE_MEMORY = "gpu-share memory"
    NPU_COUNT = "npu count"
    NPU_MEMORY = "npu memory"
    NPU_CORES = "npu cores"
    NPU_MINDCLUSTER = "npu-core"
    MIG = "MIG instance count"


_SLICING = frozenset({Role.MEMORY, Role.MEMORY_PERCENT, Role.CORES})
"""Roles that slice devices whose number a count name gives."""
_COUNTING = frozenset({Role.COUNT, Role.WHOLE, Role.SHARE_MEMORY})
"""Roles that say how many devices (or, gpu-share, itself a kubelet resource)."""

_MOST: dict[Role, tuple[int, str]] = {
    Role.COUNT: (MAX_DEVICES, "devices per container"),
    Role.WHOLE: (MAX_DEVICES, "devices per container"),
    Role.NPU_COUNT: (MAX_DEVICES, "NPUs per container"),
    Role.NPU_MINDCLUSTER: (8 * MAX_DEVICES, "AI cores per container"),
    Role.MIG: (MAX_DEVICES, "MIG instances per container"),
}
"""The largest value of each role and what it counts per container; any other role
asks for :data:`MAX_AMOUNT` of one device at most."""


@dataclass(frozen=True)
class Resource:
    """What one resource name means."""

    name: str
    vendor: Vendor
    role: Role
    chip: VnpuChip | None = None
    model: str = ""
    """The device model the name pins (``VendorSpec.models``), or a MIG profile."""


def _model_of(name: str, models: Sequence[str]) -> str:
    """The longest of ``models`` that ``name`` carries ("" when none)."""
    return max((m for m in models if m in name), key=len, default="")


@dataclass(frozen=True)
class ResourceTable:
    """Every configured resource name, looked up once per container resource."""

    by_name: dict[str, Resource]
    vendors: dict[Vendor, VendorSpec]
    specs: DeviceSpecs

    def lookup(self, name: str) -> Resource | None:
        """What ``name`` means: a configured name, or NVIDIA's mixed-strategy MIG name."""
        found = self.by_name.get(name)
        if found is not None or not name.startswith(MIG_PREFIX) or "nvidia" not in self.vendors:
            return found
        profile = name[len(MIG_PREFIX) :]
        return Resource(name, "nvidia", Role.MIG, model=profile) if profile else None

    @classmethod
    def build(cls, specs: DeviceSpecs) -> ResourceTable:
        """Every enabled vendor's resource names with their roles, Volcano's gpu-share name, each
        vNPU chip's and MindCluster's; a disabled vendor's names mean nothing."""
        by_name: dict[str, Resource] = {}
        vendors: dict[Vendor, VendorSpec] = {}
        for vendor in GENERIC_VENDORS:
            spec = specs.vendor(vendor)
            if spec is None or not spec.enabled:
                continue
            vendors[vendor] = spec
            for key, role in (
                (spec.resource_count_name, Role.COUNT),
                (spec.resource_whole_count_name, Role.WHOLE),
                (spec.resource_memory_name, Role.MEMORY),
                (spec.resource_memory_percentage_name, Role.MEMORY_PERCENT),
                (spec.resource_core_name, Role.CORES),
                (spec.resource_priority_name, Role.PRIORITY),
            ):
                for name in names(key):
                    by_name[name] = Resource(name, vendor, role, model=_model_of(name, spec.models))
        for name in names(specs.nvidia.gpu_share_memory_name):
            if specs.nvidia.enabled:
                by_name[name] = Resource(name, "nvidia", Role.SHARE_MEMORY)
        for chip in specs.vnpus:
            by_name[chip.resource_name] = Resource(
                chip.resource_name, "ascend", Role.NPU_COUNT, chip
            )
            by_name[chip.resource_memory_name] = Resource(
                chip.resource_memory_name, "ascend", Role.NPU_MEMORY, chip
            )
            for name in names(chip.resource_core_name):
                by_name[name] = Resource(name, "ascend", Role.NPU_CORES, chip)
        if specs.mindcluster.enabled:
            name = specs.mindcluster.resource_name
            mc_chip = next(
                (c for c in specs.vnpus if c.chip_name == specs.mindcluster.chip_name), None
            )
            by_name[name] = Resource(name, "ascend", Role.NPU_MINDCLUSTER, mc_chip)
        return cls(by_name=by_name, vendors=vendors, specs=specs)


@dataclass
class _Values:
    """The resource values one container gives for one vendor (or Ascend chip)."""

    vendor: Vendor
    chip: VnpuChip | None = None
    model: str = ""
    values: dict[Role, tuple[str, int]] = field(default_factory=dict)
    memory_in_mib: bool = False
    """The memory was written with a suffix and read as bytes, now MiB
    (``VendorSpec.suffixed_memory_in_bytes``): no ``gpuMemoryFactor`` applies."""

    def get(self, role: Role) -> int | None:
        found = self.values.get(role)
        return None if found is None else found[1]

    def name(self, role: Role) -> str:
        return self.values[role][0]


class RequestParser:
    """Parses pods against one device configuration; build once, call for every pod."""

    def __init__(
        self,
        specs: DeviceSpecs,
        *,
        clamp_cores: bool = False,
        mps_unset_user: Literal["refuse", "exclusive"] = "refuse",
    ) -> None:
        self.table = ResourceTable.build(specs)
        self.clamp_cores = clamp_cores
        self.mps_unset_user = mps_unset_user
        """What an MPS card does with a pod whose UID is not set (``run_as``)."""

    def wants_devices(self, pod: Mapping[str, Any]) -> bool:
        """Cheap pre-check: does any container name one of our resources?"""
        spec = pod.get("spec") or {}
        for key in ("initContainers", "containers"):
            for c in spec.get(key) or ():
                res = c.get("resources") or {}
                for part in ("limits", "requests"):
                    if any(self.table.lookup(n) is not None for n in res.get(part) or ()):
                        return True
        return False

    def missing_counts(self, pod: Mapping[str, Any]) -> list[MissingCount]:
        """Every container that names a vendor's memory, percentage or core resource but
        none of its count names (the webhook adds one; ``parse`` refuses the pod)."""
        spec = pod.get("spec") or {}
        out = []
        for key in ("initContainers", "containers"):
            for i, c in enumerate(spec.get(key) or ()):
                if not isinstance(c, Mapping):
                    continue
                resources = c.get("resources") or {}
                written = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
                asked: dict[Vendor, list[str]] = {}
                counted: set[Vendor] = set()
                for rname in written:
                    res = self.table.by_name.get(rname)
                    if res is None or res.vendor not in self.table.vendors:
                        continue
                    if self.table.vendors[res.vendor].count_optional:
                        continue  # its device plugin registers memory and cores itself
                    if res.role in _SLICING:
                        asked.setdefault(res.vendor, []).append(rname)
                    elif res.role in _COUNTING:
                        counted.add(res.vendor)
                for vendor, asked_names in asked.items():
                    vendor_spec = self.table.vendors[vendor]
                    name = count_name(vendor_spec, asked_names)
                    if vendor not in counted and name:
                        cname = str(c.get("name", ""))
                        out.append(MissingCount(key, i, cname, name, vendor_spec.default_gpu_num))
        return out

    def parse(self, pod: Mapping[str, Any]) -> PodRequest | tuple[RequestError, ...]:
        """The pod's request, or every error found (never only the first)."""
        meta = pod.get("metadata") or {}
        annotations: Mapping[str, str] = meta.get("annotations") or {}
        labels: Mapping[str, str] = meta.get("labels") or {}
        spec = pod.get("spec") or {}
        errors: list[RequestError] = []
        constraints = _constraints(annotations, labels, errors, self.table)
        containers: list[ContainerRequest] = []
        users: set[int | None] = set()
        pod_user = _run_as_user(spec.get("securityContext"))
        for key, init in (("initContainers", True), ("containers", False)):
            for c in spec.get(key) or ():
                if not isinstance(c, Mapping):
                    errors.append(RequestError(field=key, message="each entry must be an object"))
                    continue
                containers.append(self._container(c, init, constraints, errors))
                if any(not d.exclusive for d in containers[-1].devices):  # an MPS client
                    user = _run_as_user(c.get("securityContext"))
                    users.add(pod_user if user is None else user)
        constraints = self._run_as(constraints, users, errors)
        _mps_one_card(constraints, containers, errors)
        if errors:
            return tuple(errors)
        return PodRequest(containers=tuple(containers), constraints=constraints)

    def _run_as(
        self, constraints: Constraints, users: set[int | None], errors: list[RequestError]
    ) -> Constraints:
        """The UID an MPS card's clients must share with the pod (Constraints.run_as);
        an error when the pod asks for MPS and gives none (a second user's client would
        hang at CUDA initialisation until the first user's clients end)."""
        if not users:
            return constraints
        if len(users) == 1 and None not in users:
            return replace(constraints, run_as=users.pop())
        if self.mps_unset_user == "exclusive":
            return replace(constraints, run_as=MPS_ALONE)
        if constraints.mode == "mps":
            known = sorted(u for u in users if u is not None)
            errors.append(
                RequestError(
                    field="securityContext.runAsUser",
                    message=(
                        f"the containers asking for MPS devices run as different users {known}"
                        if len(known) > 1
                        else "a pod in MPS mode must set runAsUser (on the pod, or on each "
                        "container asking for a device)"
                    )
                    + ": one MPS daemon serves one user per card at a time, and another "
                    "user's pod would hang at CUDA initialisation (or set "
                    "nodeAgent.mps.unsetUser: exclusive to give such pods a card of their own)",
                )
            )
        return constraints

    # --- one container -------------------------------------------------------------

    def _container(
        self,
        c: Mapping[str, Any],
        init: bool,
        constraints: Constraints,
        errors: list[RequestError],
    ) -> ContainerRequest:
        cname = str(c.get("name", ""))
        resources = c.get("resources") or {}
        merged: dict[str, Any] = dict(resources.get("requests") or {})
        merged.update(resources.get("limits") or {})
        groups: dict[tuple[Vendor, str], _Values] = {}
        for rname, raw in merged.items():
            res = self.table.lookup(rname)
            if res is None:
                continue
            where = f"{rname} (container {cname})"
            try:
                value = parse_whole(raw)
            except ValueError as exc:
                errors.append(RequestError(field=where, message=f"{exc}; write a whole number"))
                continue
            if value < 0:
                errors.append(
                    RequestError(field=where, message=f"{value} is negative; ask for 0 or more")
                )
                continue
            in_bytes = res.role == Role.MEMORY and _suffixed(raw)
            in_bytes = in_bytes and self.table.vendors[res.vendor].suffixed_memory_in_bytes
            if in_bytes:  # MetaX: "4Gi" is bytes, a plain number GiB
                value //= 1 << 20
            most, what = _MOST.get(res.role, (MAX_AMOUNT, "per device"))
            if value > most:
                holder = "device" if res.role not in _MOST else "node"
                errors.append(
                    RequestError(
                        field=where,
                        message=f"{value} is more than any {holder} has; ask for at most "
                        f"{most} {what}",
                    )
                )
                continue
            chip_key = res.chip.chip_name if res.chip and res.role != Role.NPU_MINDCLUSTER else ""
            if res.role == Role.MIG:
                chip_key = rname  # each MIG profile is a request of its own
            group = groups.setdefault(
                (res.vendor, chip_key or res.model), _Values(res.vendor, res.chip, res.model)
            )
            if in_bytes:
                group.memory_in_mib = True
            if res.role in group.values:
                other = group.values[res.role][0]
                errors.append(
                    RequestError(
                        field=where,
                        message=f"{other} and {rname} both give the {res.role.value} of the same "
                        "devices; keep one",
                    )
                )
                continue
            group.values[res.role] = (rname, value)
        devices: list[DeviceRequest] = []
        for group in groups.values():
            devices.extend(self._devices(group, cname, constraints, errors))
        env = {str(e.get("name")): str(e.get("value", "")) for e in c.get("env") or ()}
        return ContainerRequest(
            name=cname,
            init=init,
            sidecar=init and c.get("restartPolicy") == "Always",
            devices=tuple(devices),
            disable_isolation=env.get(ENV_DISABLE_CONTROL, "").lower() == "true",
            core_policy=env.get(ENV_CORE_POLICY) or None,
        )

    def _devices(
        self, g: _Values, cname: str, constraints: Constraints, errors: list[RequestError]
    ) -> list[DeviceRequest]:
        if g.vendor == "ascend":
            if Role.NPU_MINDCLUSTER in g.values:
                return _mindcluster(g, cname, constraints, errors)
            return self._ascend(g, cname, constraints, errors)
        if Role.MIG in g.values:
            return _mig_mixed(g)
        return self._sliced(g, self.table.vendors[g.vendor], cname, errors)

    def _err(
        self, errors: list[RequestError], g: _Values, role: Role, cname: str, message: str
    ) -> None:
        errors.append(RequestError(field=f"{g.name(role)} (container {cname})", message=message))

    def _cores(
        self, g: _Values, role: Role, cname: str, errors: list[RequestError], most: int | None = 100
    ) -> int | None:
        """The cores asked as written; above ``most`` (a whole device: 100 %, or Moore
        Threads' 16) an error, or ``most`` with ``clamp_cores``. None: no bound."""
        cores = g.get(role)
        if cores is not None and most is not None and cores > most:
            if self.clamp_cores:
                return most
            what = (
                "cores are percent of one device"
                if most == 100
                else f"{g.name(role)} counts {most} for one whole device"
            )
            self._err(
                errors,
                g,
                role,
                cname,
                f"{cores} exceeds {most} ({what}); ask for at most {most}, where {most} means "
                "the whole device",
            )
            return None
        return cores

    def _sliced(
        self, g: _Values, spec: VendorSpec, cname: str, errors: list[RequestError]
    ) -> list[DeviceRequest]:
        n_errors = len(errors)
        whole = g.get(Role.WHOLE)
        share = g.get(Role.SHARE_MEMORY)
        count = g.get(Role.COUNT)
        memory = g.get(Role.MEMORY)
        percent = g.get(Role.MEMORY_PERCENT)
        percent_unit = spec.core_unit == "percent"
        per_device = spec.cores_per_device
        cores = self._cores(g, Role.CORES, cname, errors, per_device if percent_unit else None)
        priority = g.get(Role.PRIORITY)
        slicing = [
            r for r in (Role.COUNT, Role.MEMORY, Role.MEMORY_PERCENT, Role.CORES) if r in g.values
        ]
        if whole is not None or share is not None:
            role = Role.WHOLE if whole is not None else Role.SHARE_MEMORY
            if slicing:
                self._err(
                    errors,
                    g,
                    role,
                    cname,
                    f"cannot be combined with {g.name(slicing[0])}: {role.value} is its "
                    "own way to ask for devices; keep one",
                )
                return []
            if not (whole or share):
                return []  # zero devices, or zero memory: nothing asked
            asked = DeviceRequest(vendor=g.vendor, kind="gpu-share", resource=g.name(role))
            if whole is not None:  # Volcano gpu-number: whole devices, exclusive
                cores_all = 100 if percent_unit else 0  # exclusive takes them all anyway
                whole_cards = {"memory_percent": 100, "cores": cores_all, "exclusive": True}
                return [replace(asked, kind="gpu-number", count=whole, **whole_cards)]
            # Volcano gpu-share: a memory slice of one device, no cores; the kubelet asks
            # its device plugin for one ID per memory unit (shared/core/admission.py)
            assert share is not None
            memory_mib = share * spec.gpu_memory_factor
            return [
                replace(asked, memory_mib=memory_mib, memory_resource=asked.resource, units=share)
            ]
        if not slicing:
            return []  # priority alone asks for nothing
        if count is None and not spec.count_optional:
            asked_names = [g.name(r) for r in slicing]
            self._err(errors, g, slicing[0], cname, missing_count(spec, g.vendor, asked_names))
        for role, value in ((Role.MEMORY, memory), (Role.MEMORY_PERCENT, percent)):
            if value == 0 and count != 0:
                self._err(
                    errors,
                    g,
                    role,
                    cname,
                    "is 0, which asks for no memory; ask for at least 1, or leave it out for "
                    + (f"{spec.default_memory} MiB" if spec.default_memory else "the whole card"),
                )
        if priority is not None and priority not in (0, 1):
            self._err(
                errors,
                g,
                Role.PRIORITY,
                cname,
                f"{priority} is not a task priority; use 0 (high) or 1 (low)",
            )
        if percent is not None and percent > 100:
            self._err(
                errors,
                g,
                Role.MEMORY_PERCENT,
                cname,
                f"{percent} exceeds 100; ask for a percentage of one device, 1 to 100",
            )
        if memory and percent:
            self._err(
                errors,
                g,
                Role.MEMORY,
                cname,
                f"memory and {g.name(Role.MEMORY_PERCENT)} are both set; give one of them",
            )
        self._vendor_checks(g, spec, cname, errors)
        if count == 0:
            if memory or percent or cores:
                self._err(
                    errors,
                    g,
                    Role.COUNT,
                    cname,
                    "is 0 while memory or cores are requested; ask for at least 1 device",
                )
            return []
        if len(errors) > n_errors:
            return []
        devices = 1 if count is None else count  # count_optional: one device
        resource = g.name(Role.COUNT if count is not None else slicing[0])
        if memory and not g.memory_in_mib:
            memory *= spec.gpu_memory_factor
        if memory and memory > MAX_AMOUNT:
            self._err(
                errors,
                g,
                Role.MEMORY,
                cname,
                f"{memory} MiB is more than any device has; ask for at most {MAX_AMOUNT} MiB",
            )
            return []
        memory = memory or None
        percent = percent or None
        if cores is not None and percent_unit and per_device != 100:
            cores = cores * 100 // per_device  # Moore Threads: 16 a card, booked as percent
        if spec.count_is_slices and count is not None:  # Enflame drs-gcu: slices of one card
            devices, split = 1, spec.device_split_count
            if count < split:
                percent, cores = max(1, count * 100 // split), -(-count * 100 // split)
            else:
                percent = 100
        if count is None and not percent_unit and cores is not None and cores > per_device:
            devices, cores = cores // per_device, per_device  # AWS: that many whole devices
        if spec.memory_templates and memory is not None:
            t = min(
                (t for t in spec.memory_templates if t.memory >= memory), key=lambda t: t.memory
            )
            memory, cores = t.memory, t.cores
        if ("several" in spec.whole_when and devices > 1) or (
            "no-memory" in spec.whole_when and memory is None and percent is None
        ):
            memory, percent, cores = None, 100, None  # the webhook writes whole cards
        if spec.count_alone == "slot" and memory is None and percent is None and cores is None:
            memory, cores = 0, 0  # Biren, VastAI: a task slot of each device, nothing else
        exclusive = (cores == 100 and percent_unit) or percent == 100
        if not names(spec.resource_memory_name) and not names(spec.resource_memory_percentage_name):
            memory = 0  # the vendor slices no memory (AWS Neuron): cores or whole devices only
            exclusive = exclusive or cores is None
        elif memory is None and percent is None:
            if spec.default_memory:
                memory = spec.default_memory
            else:
                percent = 100
                if cores is None:
                    exclusive = True  # count only: whole cards, as upstream
        if cores is None:
            # an exclusive grant takes the whole device whatever its cores say
            whole = 100 if percent_unit else 0
            cores = whole if exclusive else spec.default_cores
        # cores 100 holds the card alone, given or by default (HAMi: "Coresreq=100
        # indicates it want this card exclusively"; defaultCores 100 for several vendors)
        exclusive = exclusive or (cores == 100 and percent_unit)

        return [
            DeviceRequest(
                vendor=g.vendor,
                kind="vgpu",
                resource=resource,
                count=devices,
                memory_mib=memory,
                memory_percent=percent,
                cores=cores,
                exclusive=exclusive,
                priority=priority,
                memory_resource=_named(
                    g,
                    Role.MEMORY_PERCENT if percent and Role.MEMORY not in g.values else Role.MEMORY,
                    spec.resource_memory_name,
                ),
                core_resource=_named(g, Role.CORES, spec.resource_core_name),
                model=g.model,
            )
        ]

    def _vendor_checks(
        self, g: _Values, spec: VendorSpec, cname: str, errors: list[RequestError]
    ) -> None:
        """The refusals of one vendor's own rules (docs/compat.md, its table)."""
        memory = g.get(Role.MEMORY)
        count = g.get(Role.COUNT)
        cores = g.get(Role.CORES)
        allowed = spec.allowed_memory
        if memory and allowed and not g.memory_in_mib and memory not in allowed:
            sizes = ", ".join(str(m) for m in allowed)
            self._err(
                errors,
                g,
                Role.MEMORY,
                cname,
                f"{memory} is not a size this device offers; ask for one of {sizes} "
                f"(units of {spec.gpu_memory_factor} MiB), or leave it out for the whole card",
            )
        if memory and spec.memory_templates:
            mib = memory if g.memory_in_mib else memory * spec.gpu_memory_factor
            largest = max(t.memory for t in spec.memory_templates)
            if mib > largest:
                self._err(
                    errors,
                    g,
                    Role.MEMORY,
                    cname,
                    f"{mib} MiB is larger than the largest slice ({largest} MiB); ask for at "
                    "most that, or leave it out for the whole card",
                )
        if spec.count_is_slices and count:
            other = [r for r in (Role.MEMORY, Role.MEMORY_PERCENT, Role.CORES) if r in g.values]
            if other:
                self._err(
                    errors,
                    g,
                    Role.COUNT,
                    cname,
                    f"asks {count} slice(s) of one device by itself: drop {g.name(other[0])}, "
                    f"or drop {g.name(Role.COUNT)} to ask by memory and cores",
                )
            elif count > spec.device_split_count:
                self._err(
                    errors,
                    g,
                    Role.COUNT,
                    cname,
                    f"{count} slices are more than one device has ({spec.device_split_count}, "
                    "deviceSplitCount); ask for at most that",
                )
        per_device = spec.cores_per_device
        counted = spec.core_unit == "count" and count is None
        if counted and cores and cores > per_device and cores % per_device:
            self._err(
                errors,
                g,
                Role.CORES,
                cname,
                f"{cores} cores fill no whole number of devices ({per_device} a device); ask "
                f"for at most {per_device}, or a multiple of {per_device}",
            )
        elif counted and cores and cores > per_device * MAX_DEVICES:
            self._err(
                errors,
                g,
                Role.CORES,
                cname,
                f"{cores} cores are more than {MAX_DEVICES} devices ({per_device} a device) "
                f"hold; ask for at most {per_device * MAX_DEVICES}",
            )

    def _ascend(
        self, g: _Values, cname: str, constraints: Constraints, errors: list[RequestError]
    ) -> list[DeviceRequest]:
        chip = g.chip
        assert chip is not None
        count = g.get(Role.NPU_COUNT)
        memory = g.get(Role.NPU_MEMORY) or None
        cores = (
            self._cores(g, Role.NPU_CORES, cname, errors) if Role.NPU_CORES in g.values else None
        )
        if count is None:
            role = Role.NPU_MEMORY if Role.NPU_MEMORY in g.values else Role.NPU_CORES
            self._err(
                errors,
                g,
                role,
                cname,
                f"needs {chip.resource_name} too: say how many NPUs (usually 1)",
            )
            return []
        if count == 0:
            return []
        if memory is not None and memory > chip.memory_capacity:
            self._err(
                errors,
                g,
                Role.NPU_MEMORY,
                cname,
                f"{memory} MiB is larger than an {chip.common_word} "
                f"({chip.memory_capacity} MiB); ask for at most that",
            )
            return []
        asked = DeviceRequest(
            vendor="ascend",
            kind="npu-template",
            resource=g.name(Role.NPU_COUNT),
            count=count,
            chip=chip.chip_name,
        )
        if constraints.vnpu_hami_core:  # software slicing, as NVIDIA's hami-core
            exclusive = memory is None and cores is None
            sliced = {"memory_resource": chip.resource_memory_name}
            sliced |= {"core_resource": chip.resource_core_name}
            return [
                replace(
                    asked,
                    kind="vgpu",
                    memory_mib=memory,
                    memory_percent=100 if memory is None else None,
                    cores=100 if exclusive else (cores or 0),
                    exclusive=exclusive,
                    **sliced,
                )
            ]
        if cores is not None:
            self._err(
                errors,
                g,
                Role.NPU_CORES,
                cname,
                f"core limits need software slicing: add the annotation {VNPU_MODE}: "
                "hami-core, or drop the core request (templates fix the cores)",
            )
            return []
        whole = memory is None or memory >= chip.memory_allocatable
        if count > 1 and not whole:
            self._err(
                errors,
                g,
                Role.NPU_MEMORY,
                cname,
                f"{count} NPUs with {memory} MiB each: a multi-card Ascend request must "
                f"use whole cards; drop {g.name(Role.NPU_MEMORY)}, ask for 1 NPU, or add "
                f"{VNPU_MODE}: hami-core",
            )
            return []
        if whole:
            return [replace(asked, memory_percent=100, exclusive=True)]
        return [replace(asked, memory_mib=memory)]


def _suffixed(raw: object) -> bool:
    """Was a quantity written with a suffix (``4Gi``, ``512Mi``, ``20k``)?"""
    return isinstance(raw, str) and raw.strip()[-1:].isalpha()


def _mig_mixed(g: _Values) -> list[DeviceRequest]:
    """``nvidia.com/mig-<profile>: N``: N existing MIG instances of that profile, as the
    kubelet hands them from NVIDIA's device plugin in ``migStrategy: mixed``."""
    name, count = g.values[Role.MIG]
    if not count:
        return []
    request = DeviceRequest(vendor="nvidia", resource=name, count=count, mig_profile=g.model)
    return [request]


def _named(g: _Values, role: Role, configured: str | list[str]) -> str:
    """The resource name the user wrote for ``role``, else the vendor's first name."""
    if role in g.values:
        return g.name(role)
    return next(iter(names(configured)), "")


def count_name(spec: VendorSpec, asked: Sequence[str]) -> str:
    """The count name to add beside ``asked`` (a container's memory and core names of one
    vendor): the vendor's count name sharing the longest prefix with one of them
    (``nvidia.com/gpu`` for ``nvidia.com/gpumem``, ``volcano.sh/vgpu-number`` for
    ``volcano.sh/vgpu-memory``), the first configured on a tie; "" when it has none."""

    def shared(candidate: str) -> int:
        return max((_common_prefix(candidate, a) for a in asked), default=0)

    return max(names(spec.resource_count_name), key=shared, default="")


def _common_prefix(a: str, b: str) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def missing_count(spec: VendorSpec, vendor: Vendor, asked: Sequence[str]) -> str:
    """Why a container asking ``asked`` of ``vendor`` and no device count is refused,
    and the fix (the admission webhook adds the count: services/webhook/mutation.py)."""
    what = ", ".join(asked)
    name = count_name(spec, asked)
    if not name:
        return (
            f"{what} without a device count, and devices.{vendor}.resourceCountName names "
            "none: the kubelet hands devices only to a container that asks for a count; "
            "configure a count name and ask for it"
        )
    return (
        f"{what} without a device count: the kubelet hands devices and limits only to a "
        f"container that asks for a count, so it would run with none; add {name}: "
        f"{spec.default_gpu_num} (Tessera's admission webhook adds it when the pod is "
        "created: is it running?)"
    )


@dataclass(frozen=True)
class MissingCount:
    """A container that asks a vendor's memory or cores but no device count: the count
    the admission webhook adds (``defaultGPUNum`` of ``count_name``), as HAMi's does."""

    key: str
    """``containers`` or ``initContainers``."""
    index: int
    container: str
    count_name: str
    count: int


def _mindcluster(
    g: _Values, cname: str, constraints: Constraints, errors: list[RequestError]
) -> list[DeviceRequest]:
    name = g.name(Role.NPU_MINDCLUSTER)
    cores = g.get(Role.NPU_MINDCLUSTER) or 0
    chip = g.chip.chip_name if g.chip else "310P3"
    if cores == 0:
        return []
    if cores % 8 == 0:
        return [
            DeviceRequest(
                vendor="ascend",
                kind="npu-core",
                resource=name,
                count=cores // 8,
                npu_cores=8,
                memory_percent=100,
                exclusive=True,
                chip=chip,
                units=8,
            )
        ]
    if cores not in (1, 2, 4):
        errors.append(
            RequestError(
                field=f"{name} (container {cname})",
                message=f"{cores} AI cores match no vNPU template; ask for 1, 2 or 4 cores, or a "
                "multiple of 8 for whole cards",
            )
        )
        return []
    return [
        DeviceRequest(
            vendor="ascend",
            kind="npu-core",
            resource=name,
            count=1,
            npu_cores=cores,
            chip=chip,
            units=cores,
        )
    ]


_MODES: dict[str, SharingMode] = {"hami-core": "hami-core", "mig": "mig", "mps": "mps"}
_POLICIES: dict[str, Policy] = {"binpack": "binpack", "spread": "spread", "fgd": "fgd"}
_LEVELS: dict[str, Literal["low", "high"]] = {"low": "low", "high": "high"}
_DVPP: dict[str, Literal["yes", "no", "null"]] = {"yes": "yes", "no": "no", "null": "null"}


def _split(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def _first(annotations: Mapping[str, str], keys: Sequence[str]) -> tuple[str, str] | None:
    for key in keys:
        if key in annotations:
            return key, annotations[key]
    return None


def _lists(
    annotations: Mapping[str, str], keys: Sequence[Sequence[str]], errors: list[RequestError]
) -> list[tuple[str, ...]]:
    """Per group of keys, the comma list of the first key present (empty when none is);
    a key present that names nothing is an error (it would silently filter nothing)."""
    out: list[tuple[str, ...]] = []
    for group in keys:
        found = _first(annotations, [k for k in group if k])
        if found is None:
            out.append(())
            continue
        key, value = found
        items = _split(value)
        if not items:
            errors.append(
                RequestError(
                    field=key,
                    message=f"{value!r} names no device; list at least one, or remove the "
                    "annotation",
                )
            )
        out.append(items)
    return out


_Keys = tuple[str, ...]


def _selectors(
    annotations: Mapping[str, str], table: ResourceTable, errors: list[RequestError]
) -> tuple[tuple[tuple[str, ...], ...], tuple[VendorSelector, ...]]:
    """NVIDIA's type and UUID lists, and every other vendor's (its own keys; a key with
    ``{model}`` once per model, applying to that model), from the pod's annotations."""
    scopes: list[tuple[Vendor, str, _Keys, _Keys, _Keys, _Keys]] = []
    for vendor, spec in table.vendors.items():
        use, nouse = names(spec.use_uuid_annotation), names(spec.nouse_uuid_annotation)
        types = (names(spec.use_type_annotation), names(spec.nouse_type_annotation))
        if not any("{model}" in k for k in use + nouse):
            scopes.append((vendor, "", *types, use, nouse))
            continue
        scopes.append((vendor, "", *types, (), ()))
        for m in spec.models:
            scopes.append(
                (
                    vendor,
                    m,
                    (),
                    (),
                    tuple(k.replace("{model}", m) for k in use),
                    tuple(k.replace("{model}", m) for k in nouse),
                )
            )
    for chip in table.specs.vnpus:
        word = chip.common_word
        use_key = ASCEND_USE_UUID.replace("{model}", word)
        nouse_key = ASCEND_NOUSE_UUID.replace("{model}", word)
        scopes.append(("ascend", chip.chip_name, (), (), (use_key,), (nouse_key,)))
    nvidia: tuple[tuple[str, ...], ...] = ((), (), (), ())
    found: list[VendorSelector] = []
    for vendor, model, *keys in scopes:
        lists = _lists(annotations, keys, errors)
        use_types = tuple(gpu_type(t) for t in lists[0])
        nouse_types = tuple(gpu_type(t) for t in lists[1])
        if vendor == "nvidia":
            nvidia = (use_types, nouse_types, lists[2], lists[3])
        elif any(lists):
            found.append(
                VendorSelector(
                    vendor=vendor,
                    model=model,
                    use_types=use_types,
                    nouse_types=nouse_types,
                    use_uuids=lists[2],
                    nouse_uuids=lists[3],
                )
            )
    return nvidia, tuple(found)


def _constraints(
    annotations: Mapping[str, str],
    labels: Mapping[str, str],
    errors: list[RequestError],
    table: ResourceTable,
) -> Constraints:
    def bad(key: str, value: str, allowed: str) -> None:
        errors.append(RequestError(field=key, message=f"{value!r} is not valid; use {allowed}"))

    indexes: list[int] = []
    if GPU_INDEX in annotations:
        for item in _split(annotations[GPU_INDEX]):
            if item.isascii() and item.isdigit() and len(item) <= MAX_DIGITS_INDEX:
                indexes.append(int(item))
            else:
                bad(GPU_INDEX, item, "a comma list of device indexes such as 0,1")
    mode: SharingMode | None = None
    found = _first(annotations, VGPU_MODE)
    if found:
        key, value = found
        mode = _MODES.get(value)
        if mode is None:
            bad(key, value, "hami-core, mig or mps")
    node_policy: Policy | None = None
    if NODE_POLICY in annotations:
        node_policy = _POLICIES.get(annotations[NODE_POLICY])
        if node_policy is None:
            bad(NODE_POLICY, annotations[NODE_POLICY], "binpack, spread or fgd")
    device_policy: Policy | None = None
    numa = False
    topology: bool | None = None
    if GPU_POLICY in annotations:
        # HAMi's comma list: at most one order (binpack, spread, fgd), and the filters
        # numa (one NUMA node) and topology-aware (the best-linked cards).
        topology = False
        for value in _split(annotations[GPU_POLICY]) or (annotations[GPU_POLICY],):
            if value == "numa":
                numa = True
            elif value == "topology-aware":
                topology = True
            elif value in _POLICIES and device_policy is None:
                device_policy = _POLICIES[value]
            else:
                bad(
                    GPU_POLICY,
                    value,
                    "binpack, spread, fgd, numa or topology-aware (a comma list names one "
                    "of binpack, spread and fgd at most)",
                )
    if NUMA_BIND in annotations:
        value = annotations[NUMA_BIND].lower()
        if value in ("true", "false"):
            numa = numa or value == "true"
        else:
            bad(NUMA_BIND, annotations[NUMA_BIND], "true or false")
    group_spread = False
    if PODGROUP_POLICY in annotations:
        value = annotations[PODGROUP_POLICY]
        if value == "spread":
            group_spread = True
        elif value not in ("", "binpack"):
            bad(PODGROUP_POLICY, value, "spread")
    hami_core = False
    if VNPU_MODE in annotations:
        value = annotations[VNPU_MODE]
        if value == "hami-core":
            hami_core = True
        else:
            bad(VNPU_MODE, value, "hami-core (or remove it for vNPU templates)")
    raw_level = labels.get(VNPU_LEVEL) or annotations.get(VNPU_LEVEL)
    level = _LEVELS.get(raw_level) if raw_level is not None else None
    if raw_level is not None and level is None:
        bad(VNPU_LEVEL, raw_level, "low or high")
    raw_dvpp = labels.get(VNPU_DVPP) or annotations.get(VNPU_DVPP)
    dvpp = _DVPP.get(raw_dvpp) if raw_dvpp is not None else None
    if raw_dvpp is not None and dvpp is None:
        bad(VNPU_DVPP, raw_dvpp, "yes, no or null")
    (use_types, nouse_types, use_uuids, nouse_uuids), selectors = _selectors(
        annotations, table, errors
    )
    return Constraints(
        use_types=use_types,
        nouse_types=nouse_types,
        use_uuids=use_uuids,
        nouse_uuids=nouse_uuids,
        selectors=selectors,
        device_indexes=tuple(indexes),
        mode=mode,
        node_policy=node_policy,
        device_policy=device_policy,
        numa_bind=numa,
        topology=topology,
        group_spread=group_spread,
        vnpu_hami_core=hami_core,
        vnpu_level=level,
        vnpu_dvpp=dvpp,
    )


REQUEST_CHECK = "RequestCheck"
"""The plugin name of the checks a request fails before any node is looked at."""


def refused(errors: Sequence[RequestError]) -> Status:
    """A request's errors as the one Status every outcome is: unresolvable, one
    ``invalid`` reason per field, decided by the request check."""
    return Status(
        code=Code.UNRESOLVABLE,
        reasons=tuple(
            Reason(
                kind="invalid",
                code=UNRESOLVABLE,
                resource=e.field,
                detail=e.message,
                nodes=0,
                plugin=REQUEST_CHECK,
            )
            for e in errors
        ),
    )


def rejection(errors: Sequence[RequestError]) -> str:
    """What a pod whose request can never be placed is told, by the watcher (its Event)
    and the admission webhook (the refusal ``kubectl apply`` prints) alike."""
    return "invalid device request: " + refused(errors).message()


def _mps_one_card(
    constraints: Constraints, containers: Sequence[ContainerRequest], errors: list[RequestError]
) -> None:
    """A pod in MPS mode whose container asks two or more cards to share: refused, as no
    node can serve it (an MPS client reaches one card's daemon; shared/core/families.py
    ``MPS_MULTI_CARD`` says the same of a pod that names no mode)."""
    if constraints.mode != "mps":
        return
    for c in containers:
        for d in c.devices:
            if d.vendor == "nvidia" and d.count > 1 and not d.exclusive:
                errors.append(
                    RequestError(
                        field=f"{d.resource} (container {c.name})",
                        message=f"{d.count} cards asked in MPS mode: an MPS client reaches one "
                        "card's MPS daemon, so a container shares one card (ask for 1, or for "
                        "whole cards, or another vgpu-mode)",
                    )
                )


def _run_as_user(context: Any) -> int | None:
    """``runAsUser`` of a securityContext, when set to a UID."""
    if not isinstance(context, Mapping):
        return None
    user = context.get("runAsUser")
    return user if isinstance(user, int) and not isinstance(user, bool) and user >= 0 else None
