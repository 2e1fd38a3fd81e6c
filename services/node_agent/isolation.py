"""What one container is handed at Allocate: environment, mounts and device nodes.

Pure: a container's grant (from the pod's own ``allocation.bound``), the node's config
and its devices as the agent reads them go in; the kubelet's answer comes out.
docs/compat.md (section 3) lists what HAMi's device plugin hands over; the names and
paths are configuration (``nodeAgent.isolation``), HAMi-core's by default, so an
existing ``libvgpu.so`` works.

- Sliced NVIDIA devices (``hami-core``): ``NVIDIA_VISIBLE_DEVICES``, a memory limit per
  visible device (``CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m``, in visible order), the core
  limit, the shared accounting file, oversubscription when memory is scaled past the
  card, the core policy, log level and priority; the library, its accounting and lock
  directories, and ``/etc/ld.so.preload`` (not when the container set
  ``CUDA_DISABLE_CONTROL=true``).
- MPS devices (one card per container: the scheduler refuses more): the card's MPS daemon's
  pipe directory and its shared-memory directory at ``/dev/shm``
  (services/node_agent/mps/__init__.py), the active-thread percentage (the cores) and the
  pinned memory limit of device 0, the one the container sees; and HAMi-core as above for
  memory only (``nodeAgent.mps.hamiCore``), so the container sees its limit as the card's
  memory.
- MIG instances: their UUIDs in ``NVIDIA_VISIBLE_DEVICES``; MIG isolates in hardware.
- Ascend: ``ASCEND_VISIBLE_DEVICES`` (device indexes), ``ASCEND_VNPU_SPECS`` for a vNPU
  template, and the davinci device nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from services.node_agent.mps import card_dirs
from shared.config import Config
from shared.core.ledger import sharing_mode
from shared.core.model import ContainerGrant, DeviceGrant, DeviceInfo, DeviceUUID, NodeName, PodRef


class HandoutError(ValueError):
    """The grant cannot be handed over as it is (e.g. its MIG instance does not exist)."""


@dataclass(frozen=True, slots=True)
class Mount:
    """A host path mounted into the container."""

    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A device node (``/dev/...``) handed to the container."""

    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass
class Handout:
    """The kubelet's ``ContainerAllocateResponse``, before protobuf."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    devices: list[DeviceNode] = field(default_factory=list)


ASCEND_CONTROL_NODES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")


def handout(
    cfg: Config,
    node: NodeName,
    pod: PodRef,
    grant: ContainerGrant,
    devices: Mapping[DeviceUUID, DeviceInfo],
) -> Handout:
    """Everything the container gets for ``grant`` on ``node``, whose devices (with
    their sharing mode and running MIG instances) are ``devices``."""
    out = Handout()
    # an external device (a nvidia.com/mig-<profile> instance) is NVIDIA's plugin's to hand
    nvidia = [d for d in grant.devices if d.vendor == "nvidia" and not d.external]
    ascend = [d for d in grant.devices if d.vendor == "ascend"]
    if nvidia:
        mig = [d for d in nvidia if d.mig_profile is not None]
        if mig:
            _mig(out, mig, devices)
        else:
            _sliced(out, cfg, node, pod, grant, nvidia, devices)
    if ascend:
        _ascend(out, ascend)
    return out


def _mig(out: Handout, grants: list[DeviceGrant], devices: Mapping[DeviceUUID, DeviceInfo]) -> None:
    visible = []
    for d in grants:
        card = devices.get(d.uuid)
        running = card.mig_geometry if card is not None else ()
        uuid = next(
            (
                m.uuid
                for m in running
                if m.placement == d.mig_placement and m.profile == d.mig_profile
            ),
            None,
        )
        if uuid is None:
            raise HandoutError(
                f"MIG instance {d.mig_profile} at placement {d.mig_placement} of {d.uuid} "
                "does not exist"
            )
        visible.append(uuid)
    out.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(visible)


def _sliced(
    out: Handout,
    cfg: Config,
    node: NodeName,
    pod: PodRef,
    grant: ContainerGrant,
    devices: list[DeviceGrant],
    inventory: Mapping[DeviceUUID, DeviceInfo],
) -> None:
    spec = cfg.devices.nvidia
    override = cfg.node_override(node)
    iso = cfg.node_agent.isolation
    out.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(d.uuid for d in devices)
    if all(d.exclusive for d in devices):
        return  # whole cards: nothing to limit, no library needed
    card = inventory.get(devices[0].uuid)
    mode = sharing_mode(card, override) if card is not None else "hami-core"
    cores = max(d.cores for d in devices)

    if mode == "mps":
        _mps_client(out, cfg, devices, inventory, cores)
        if not cfg.node_agent.mps.hami_core:
            return
    for i, d in enumerate(devices):
        out.envs[f"{iso.memory_limit_env}_{i}"] = f"{d.memory_mib}m"
    if mode != "mps":
        out.envs[iso.core_limit_env] = str(cores)
    directory = f"{pod.uid}_{grant.container}"
    out.envs[iso.shared_cache_env] = f"{iso.cache_container_dir}/{directory}.cache"
    scaling = (override.device_memory_scaling if override else None) or spec.device_memory_scaling
    if scaling > 1:
        out.envs[iso.oversubscribe_env] = "true"
    policy = grant.core_policy
    if policy is None and (spec.disable_core_limit or spec.gpu_core_policy == "disable"):
        policy = "disable"
    elif policy is None and spec.gpu_core_policy == "force":
        policy = "force"
    if policy is not None:
        out.envs[iso.core_policy_env] = policy
    level = (override.lib_cuda_log_level if override else None) or spec.lib_cuda_log_level
    if level:
        out.envs[iso.log_level_env] = str(level)
    if grant.priority is not None:
        out.envs[iso.priority_env] = str(grant.priority)
    out.mounts.append(Mount(iso.library_container_path, iso.library_host_path, read_only=True))
    out.mounts.append(
        Mount(iso.cache_container_dir, f"{iso.cache_host_dir}/{directory}", read_only=False)
    )
    out.mounts.append(Mount(iso.lock_dir, iso.lock_dir, read_only=False))
    if not grant.disable_isolation:
        out.mounts.append(Mount("/etc/ld.so.preload", iso.preload_host_path, read_only=True))


def _mps_client(
    out: Handout,
    cfg: Config,
    devices: list[DeviceGrant],
    inventory: Mapping[DeviceUUID, DeviceInfo],
    cores: int,
) -> None:
    """A client of its card's MPS daemon (services/node_agent/mps/): the daemon's pipes and
    shared memory, its share of the SMs (all when no cores were asked) and its pinned
    memory. HAMi-core is added by the caller for memory only (MPS alone stops allocations
    at the limit but reports the whole card), unless nodeAgent.mps.hamiCore is off."""
    down = [d.uuid for d in devices if (c := inventory.get(d.uuid)) is None or c.mps != "running"]
    if down:
        raise HandoutError(
            f"no MPS daemon is known to run for {', '.join(down)} (see the node agent's log): "
            "the container would run without its core limit"
        )
    if len(devices) != 1:
        raise HandoutError(
            f"{len(devices)} MPS devices for one container: a client reaches one card's "
            "MPS daemon only"
        )
    mps = cfg.node_agent.mps
    (device,) = devices
    dirs = card_dirs(mps, device.uuid)
    out.envs["CUDA_MPS_PIPE_DIRECTORY"] = mps.pipe_container_dir
    out.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(cores or 100)
    # Device 0: the one card the container sees (NVIDIA_VISIBLE_DEVICES), whatever its
    # index on the node.
    out.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={device.memory_mib}M"
    out.mounts.append(Mount(mps.pipe_container_dir, str(dirs.pipe), read_only=False))
    out.mounts.append(Mount("/dev/shm", str(dirs.shm), read_only=False))


def _ascend(out: Handout, devices: list[DeviceGrant]) -> None:
    out.envs["ASCEND_VISIBLE_DEVICES"] = ",".join(str(d.index) for d in devices)
    templates = [d.vnpu_template for d in devices if d.vnpu_template]
    if templates:
        out.envs["ASCEND_VNPU_SPECS"] = ",".join(templates)
    for d in devices:
        path = f"/dev/davinci{d.index}"
        out.devices.append(DeviceNode(path, path))
    for path in ASCEND_CONTROL_NODES:
        out.devices.append(DeviceNode(path, path))
