"""The one typed configuration every Tessera service loads (``tessera.yaml``).

Upstream, the same resource name must be set in three places (device plugin flags, the
device ConfigMap, the scheduler ConfigMap) that drift apart; here every service reads
this one file, and the node agent publishes :func:`config_hash` so the allocator can
refuse a node that runs with another.

A file only names what differs from the defaults: it is deep-merged over them (mappings
merge, lists and scalars replace), then decoded strictly. An unknown key or a bad value
stops the service at start with a message naming the key and what is allowed.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import yaml

from shared.core.framework import PluginRef, Plugins, Profile, ProfileError
from shared.core.model import Policy, PosInt
from shared.core.request import RequestParser
from shared.core.shards import Shard, Shards
from shared.core.spec import GENERIC_VENDORS, DeviceSpecs, NodeOverride, VendorSpec, names

ENV_CONFIG = "TESSERA_CONFIG"
"""Environment variable naming the config file when no path is given."""


class ConfigError(ValueError):
    """The config cannot be used; the message names the key and the fix."""


class _Cfg(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    pass


MAX_SHARDS = 8
"""Allocator shards at most: each has its own durable consumer, ``device-allocator-<i>``,
which the bus's permissions name one by one (shared/busauth.py)."""

ShardName = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")]


class ShardConfig(_Cfg, frozen=True, kw_only=True):
    """One allocator shard (docs/sharding.md): a pool of nodes with its own allocator."""

    name: ShardName
    """Its allocator runs with ``--shard NAME`` (or ``TESSERA_SHARD``)."""
    node_selector: dict[str, str] = msgspec.field(default_factory=dict)
    """The node labels that put a node in this shard: the first shard whose selector a
    node matches owns it; an empty selector takes every node left."""


class UsageConfig(_Cfg, frozen=True, kw_only=True):
    """The memory of each queue's past use (shared/core/usage.py, docs/queues.md): kept and
    shown always, it moves shares only with ``weight`` above 0."""

    weight: Annotated[float, msgspec.Meta(ge=0.0)] = 0.0
    """KAI's ``kValue``: how far a queue's past use moves its part of the surplus above
    what queues are owed (``proportion``: the weighted division above guarantees;
    ``capacity``: the division above deserved that orders queues). 0, the default,
    leaves shares as without a memory, so existing queues behave as before; 1 is KAI's."""
    half_life_s: Annotated[float, msgspec.Meta(ge=0.0)] = 3600.0
    """Past use halves every this many seconds. One hour by default: an hour-old burst
    weighs half, one from yesterday nearly nothing (a zero default, as Kueue has, would
    turn the feature off without a word). 0 means no decay: a plain sum over ``windowS``,
    as KAI reads an unset half-life."""
    window_s: Annotated[float, msgspec.Meta(gt=0.0)] = 604800.0
    """Only use within this many seconds counts (KAI's default window, a week)."""
    sample_s: Annotated[float, msgspec.Meta(gt=0.0)] = 30.0
    """The coordinator counts what each queue holds this often, and stores the memory
    (the ``tessera-usage`` bucket) so that a restart forgets nothing."""


class ConsolidationConfig(_Cfg, frozen=True, kw_only=True):
    """Moving shared-GPU pods to other nodes so a gang that fits nowhere fits
    (docs/consolidation.md): tried before preemption, which evicts pods for good."""

    enabled: bool = False
    """Off by default: a move restarts a running pod (its controller recreates it), which
    a cluster should opt into. On, the ``Consolidation`` PostFilter runs first."""
    max_moves: Annotated[int, msgspec.Meta(ge=1, le=16)] = 4
    """Pods moved at most for one placement: each is a restart, and each adds trial
    placements to the bounded search (shared/core/consolidation.py)."""
    reserve_s: Annotated[float, msgspec.Meta(gt=0.0)] = 120.0
    """How long the place reserved for a moved pod waits for its recreated self (same
    controller, same request); unused by then, it is freed."""


class SchedulerConfig(_Cfg, frozen=True, kw_only=True):
    """Which pods are ours and how they are placed."""

    names: list[str] = msgspec.field(default_factory=lambda: ["tessera"])
    """``spec.schedulerName`` values Tessera serves; add ``volcano`` or ``hami-scheduler``
    to take users' YAML unchanged."""
    node_policy: Policy = "binpack"
    """Default node-level policy (HAMi's default, with ``fragmentationGuard``); pods
    override it by annotation. ``fgd`` packs best (bench/RESULTS.md) but weighs
    ``fgdCandidates`` nodes per pod: some 40 times the cost of a first fit."""
    queue_status: bool = True
    """Write each Volcano Queue's ``.status`` (state, PodGroup counts, allocated), as
    Volcano's queue controller does; off beside an installed Volcano, whose controller
    owns it (services/gang_coordinator/queues.py)."""
    device_policy: Policy = "spread"
    """Default device-level policy (HAMi's default)."""
    topology_aware: bool = False
    """HAMi's ``gpuSchedulerPolicy: topology-aware`` as the default, for pods without
    ``hami.io/gpu-scheduler-policy``: of the cards that fit on a node, the best-linked
    set (NVLinks, NVSwitch, then the PCIe path); for one card, the one whose use splits
    the least linked group; ``devicePolicy`` orders equals (shared/core/topology.py).
    Off as in HAMi; nodes whose agents report no links are placed as without it."""
    network_topology_labels: list[str] = msgspec.field(default_factory=list)
    """Node label keys, from the top tier down (``[example.com/spine, example.com/rack]``),
    whose values make network domains for gangs with ``networkTopology``, for clusters
    that write no HyperNodes (Volcano's ``label`` discovery source; shared/core/network.py
    ``from_labels``): the last key's values are tier 1. Empty (the default): only the
    HyperNode objects written count."""
    allow_more_devices_than_cards: bool = False
    """Let a container ask for more vGPUs than the node has cards (several slices of one
    card). Upstream refuses; off by default for the same behaviour."""
    memory_larger_than_card: Literal["reject", "clamp"] = "reject"
    """A memory request above every card: ``reject`` (HAMi) tells the user; ``clamp``
    (Volcano vGPU) gives the whole card."""
    cores_above_100: Literal["reject", "clamp"] = "reject"
    """A core request above 100 %: ``reject`` tells the user (a typo is likely); ``clamp``
    makes it 100 as HAMi and Volcano do."""
    fgd_candidates: PosInt = 64
    """Nodes that fit which the ``fgd`` policy compares per pod, drawn from both ends of
    the index (tightest and emptiest devices); the pods with no devices that
    ``fragmentationGuard`` places by FGD compare as many."""
    fragmentation_guard: Annotated[int, msgspec.Meta(ge=0)] = 16
    """With ``binpack`` or ``spread`` nodes, for pods that name no node policy and have
    no soft preferences: a pod with devices takes, of the first this many nodes that
    fit in the policy's order (binpack: from both ends of the index in turn, at most a
    quarter of them of one node kind, GPU model and card count, where there are
    several), the one whose expected fragmentation (FGD's measure, its cpu and memory
    counted) it increases least, and its devices there by the same measure unless it
    names a device policy; a pod with no devices is placed by FGD.
    0: HAMi's first fit and kube-scheduler's scores. 16 packs the openb trace as FGD
    does (bench/RESULTS.md); for pods with cpu and memory it costs some 20 times a first
    fit, so while the scheduler is behind (a gang reaches the allocator more than 1 s
    after it was sent or 3 s after its newest pod was created, or over 256 decisions
    wait for their bind) it is off: binpack's first fit, as HAMi places
    (``tessera_fragmentation_guard_nodes``)."""
    score_window: PosInt = 16
    """Nodes that fit which are scored per pod when scores matter: always for a pod
    that asks for no devices, and for one with soft preferences (preferred node or pod
    affinity, ScheduleAnyway spread) or when some node has a PreferNoSchedule taint;
    other pods take the first node that fits in the device policy's order. Scores are
    kube-scheduler's (resources by ``nodePolicy``: most allocated for binpack, least for
    spread; balance; taints; affinity; spread) with its weights."""
    bind_concurrency: PosInt = 64
    """Binding writes in flight at once (no per-node lock)."""
    binding_timeout_s: Annotated[float, msgspec.Meta(ge=1.0)] = 600.0
    """How long a pod whose ResourceClaims hold devices with binding conditions waits for
    them before its bind fails and it is placed again, counted from each allocation's
    ``allocationTimestamp`` (kube-scheduler's DynamicResources ``bindingTimeout``: 600 s,
    at least 1 s; services/binder/conditions.py). The allocator keeps such a pod's
    reservation this much longer."""
    scheduled_events: bool = True
    """Write a ``Scheduled`` Event on each pod bound (``Successfully assigned NS/NAME to
    NODE``), as kube-scheduler does; the binder writes them behind its Bindings, one at
    a time (services/binder/service.py). Off, a bind is one API write (the Binding)
    instead of two, for clusters where the Event volume weighs on the API server; the pod's
    ``PodScheduled`` condition, the grant annotations and the ``allocation.bound``
    event say the same. Events for pods that wait, are refused or preempted are written
    either way."""
    resync_s: Annotated[float, msgspec.Meta(gt=0.0)] = 30.0
    """The watcher re-announces still-pending pods this often, so no pod is forgotten."""
    leader_lease_s: Annotated[float, msgspec.Meta(ge=1.0)] = 2.0
    """The active replica of each service renews its lease at a third of this; a
    standby takes over at most this long after the active one stops renewing (at once
    when it stops cleanly and releases it)."""
    heartbeat_s: Annotated[float, msgspec.Meta(gt=0.0)] = 10.0
    """Node agents refresh their inventory in the KV bucket this often."""

    retry_backoff_s: Annotated[float, msgspec.Meta(gt=0.0)] = 1.0
    """First delay before an unschedulable pod is retried without a helpful event."""
    preemption: bool = True
    """A gang that does not fit may evict lower-priority pods (any queue, but only
    reclaimable ones across queues) and pods of reclaimable queues over their deserved
    share (Volcano's preempt and reclaim actions). No gang is ever cut below minMember.
    ``false`` leaves the DefaultPreemption plugin out of the profile (the same as
    ``plugins.postFilter.disabled: [{name: DefaultPreemption}]``)."""
    eviction_grace_s: Annotated[int, msgspec.Meta(ge=0)] | None = None
    """Grace period of the pods Tessera deletes (preemption victims, a Volcano Job's
    restart or deletion); unset: each pod's own ``terminationGracePeriodSeconds``. A
    victim's devices go to the preemptor only once it is gone."""
    preempt_min_runtime_s: Annotated[float, msgspec.Meta(ge=0.0)] = 0.0
    """How long a pod runs before a gang of its own queue may preempt it, for queues
    that set no ``spec.preemptMinRuntime`` (KAI's, on the queue or an ancestor). 0: at
    once. A pod's ``volcano.sh/cooldown-time`` protects it too."""
    reclaim_min_runtime_s: Annotated[float, msgspec.Meta(ge=0.0)] = 0.0
    """The same before another queue reclaims it (``spec.reclaimMinRuntime``)."""
    consolidation: ConsolidationConfig = msgspec.field(default_factory=ConsolidationConfig)
    """Move shared-GPU pods (``volcano.sh/preemptable: "true"`` or preemptible for the
    gang, owned by a controller, past their minimum runtime) to other nodes so that a
    gang fits, each to a place reserved before it is evicted; ``{enabled: true,
    maxMoves: 4, reserveS: 120}``. Tried before preemption (``Consolidation`` plugin)."""
    starvation_guard_s: Annotated[float, msgspec.Meta(ge=0.0)] = 300.0
    """Smaller gangs are backfilled past a gang that does not fit; once it has waited
    this long, the nodes it would fit on (after their pods finish) are held for it.
    0 turns the guard off (leaves the StarvationHold plugin out of the profile)."""
    queue_plugin: Literal["proportion", "capacity"] = "proportion"
    """How Volcano Queues share the cluster, named after Volcano's plugins:
    ``proportion`` (flat: each queue's deserved share is the weighted division of the
    cluster, capped by its capability, never below its guarantee) or ``capacity`` (a
    tree by ``spec.parent``: each queue's ``deserved``, ``guarantee`` and
    ``capability`` at every level, only leaf queues take pods, a queue may borrow up
    to its real capability and is reclaimed from when under others' deserved;
    docs/queues.md)."""
    ancestor_reclaim_level: Annotated[int, msgspec.Meta(ge=-1)] = -1
    """``capacity``: how many of a victim's ancestors below the reclaimer's common
    ancestor must be over their own deserved share too (Volcano's argument of that
    name). -1, the default: all of them, so a parent's deserved bounds its children's
    reclaim; 0 is Volcano's default (only the victim's own queue is checked)."""
    usage: UsageConfig = msgspec.field(default_factory=UsageConfig)
    """Each queue's past use, decayed by a half-life, and how much it moves the division of
    the surplus among queues (KAI's time-based fair share)."""
    shards: list[ShardConfig] = msgspec.field(default_factory=list)
    """Split the cluster into node pools, each placed by its own device-allocator (one
    Deployment per shard, ``--shard NAME``); empty: one allocator for every node. At
    most 8. Pods and gangs go to the shards they may run in, spread by a hash of their
    name; a gang no single shard fits is placed across shards all-or-nothing. Inter-pod
    (anti-)affinity and topology spread see one shard's pods only (docs/sharding.md)."""

    plugins: Plugins = msgspec.field(default_factory=Plugins)
    """The scheduling profile, written as a ``KubeSchedulerConfiguration`` profile's
    ``plugins`` (``filter``, ``postFilter`` and ``score``, each with ``enabled`` and
    ``disabled``, a score with its ``weight``) over the defaults: kube-scheduler's, then
    Tessera's device families (filters), node policies (scores) and PostFilters. E.g.
    ``score: {enabled: [{name: NodeAffinity, weight: 5}]}``, ``filter: {disabled:
    [{name: MIGInstances}]}``. Plugins are those of shared/core/plugins/
    (docs/plugins.md); an unknown name stops the service at start."""

    def profile(self) -> Profile:
        """``plugins`` over the defaults, as the core runs them (shared/core/framework.py),
        less the PostFilters ``preemption: false`` and ``starvationGuardS: 0`` turn off."""
        plugins = self.plugins
        off = [PluginRef(name=n) for n, on in _SWITCHED if not on(self)]
        if off:
            post = plugins.post_filter
            post = msgspec.structs.replace(post, disabled=[*post.disabled, *off])
            plugins = msgspec.structs.replace(plugins, post_filter=post)
        return Profile.build(plugins)

    def preempts(self) -> bool:
        """Whether gangs that do not fit may preempt (DefaultPreemption is in the
        profile): the coordinator offers them victims only then."""
        return any(p.name == "DefaultPreemption" for p in self.profile().post_filters)

    def consolidates(self) -> bool:
        """Whether gangs that do not fit may move pods (Consolidation is in the profile):
        the coordinator offers them movable pods only then."""
        return any(p.name == "Consolidation" for p in self.profile().post_filters)

    def starvation_window(self) -> float:
        """``starvation_guard_s``, or 0 when StarvationHold is not in the profile."""
        holds = any(p.name == "StarvationHold" for p in self.profile().post_filters)
        return self.starvation_guard_s if holds else 0.0

    def guard_window(self) -> int:
        """``fragmentation_guard``, or 0 when the profile leaves FragmentationGuard out
        (what ``tessera_fragmentation_guard_nodes`` reports while the scheduler keeps up)."""
        guarded = any(kind.name == "FragmentationGuard" for kind, _ in self.profile().policies)
        return self.fragmentation_guard if guarded else 0

    def shard_pools(self) -> Shards:
        """``shards`` as the core routes by them (shared/core/shards.py)."""
        return Shards(Shard(c.name, c.node_selector) for c in self.shards)


_SWITCHED: tuple[tuple[str, Callable[[SchedulerConfig], bool]], ...] = (
    ("Consolidation", lambda s: s.consolidation.enabled),
    ("DefaultPreemption", lambda s: s.preemption),
    ("StarvationHold", lambda s: s.starvation_guard_s > 0),
)
"""PostFilter plugins that a key of ``scheduler:`` turns off as well."""


class NatsConfig(_Cfg, frozen=True, kw_only=True):
    """Where the bus is and how its stream and consumers behave."""

    url: str = "nats://127.0.0.1:4222"
    """The server's URL, or several servers' (a cluster), comma-separated: a client
    connects to any and fails over to the others."""
    stream: str = "TESSERA"
    inventory_bucket: str = "tessera-inventory"
    ack_wait_s: Annotated[float, msgspec.Meta(gt=0.0)] = 30.0
    """A message not acked within this time is delivered again."""
    max_deliver: PosInt = 20
    duplicate_window_s: Annotated[float, msgspec.Meta(gt=0.0)] = 120.0
    """JetStream drops a re-published event with the same id within this window."""
    max_age_s: Annotated[float, msgspec.Meta(gt=0.0)] = 86400.0
    """How long the stream keeps events for late subscribers."""
    replicas: Annotated[int, msgspec.Meta(ge=1, le=5)] = 1
    """Copies JetStream keeps of the stream and every KV bucket (3 on a 3-server
    cluster: losing one server loses nothing)."""
    user: str = ""
    """The NATS user to connect as; empty: the service's own name (its role in
    shared/busauth.py). Only with ``password_file``."""
    password_file: str = ""
    """File holding the user's password (a Secret's key); ``{user}`` in the path is
    replaced by the user name. Empty: connect without credentials (a server without
    authorization, e.g. a throwaway test server)."""
    ca_file: str = ""
    """PEM CA that signed the server's certificate: the connection uses TLS and checks
    the server against it (use a ``tls://`` URL). Empty: the system's CAs if the URL is
    ``tls://``, plain TCP otherwise."""


class KubernetesConfig(_Cfg, frozen=True, kw_only=True):
    """How services reach the API server, and how hard they may press it."""

    kubeconfig: str = ""
    """Path to a kubeconfig; empty means ``$KUBECONFIG``, then the in-cluster account
    (each service's own ServiceAccount). ``{service}`` in the path is replaced by the
    service's name, so services sharing one config file still use their own
    credentials (the local cluster and the tests do)."""
    qps: Annotated[float, msgspec.Meta(gt=0.0)] = 500.0
    burst: PosInt = 1000


class TelemetryConfig(_Cfg, frozen=True, kw_only=True):
    """Logs, traces and metrics of every service."""

    otlp_endpoint: str = ""
    """OTLP gRPC endpoint for traces (``http://collector:4317`` plaintext, ``https://``
    TLS). Set, it wins over ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``; empty, those
    variables decide, and with none of them nothing is exported (spans still
    propagate). docs/tracing.md."""
    sample_ratio: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 1.0
    """Share of new traces recorded (ParentBased: a continued trace keeps its caller's
    choice). Below 1 it wins over ``OTEL_TRACES_SAMPLER``; at its default 1.0 that
    variable, when set, chooses the sampler."""
    metrics_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 9394
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"


class CompatConfig(_Cfg, frozen=True, kw_only=True):
    """What Tessera writes for HAMi's or Volcano's own node components."""

    annotations: Literal["none", "hami", "volcano"] = "none"
    """Also write upstream's assignment annotations (docs/compat.md, section 3) so HAMi's or
    Volcano's own device plugin can consume Tessera's grants."""


class IsolationConfig(_Cfg, frozen=True, kw_only=True):
    """What the node agent hands a container for the isolation library (HAMi-core's
    names and paths by default, so an existing ``libvgpu.so`` works unchanged)."""

    library_host_path: str = "/usr/local/vgpu/libvgpu.so"
    library_container_path: str = "/usr/local/vgpu/libvgpu.so"
    preload_host_path: str = "/usr/local/vgpu/ld.so.preload"
    """A file naming the library, mounted over the container's ``/etc/ld.so.preload``."""
    cache_host_dir: str = "/usr/local/vgpu/containers"
    """Per container ``<pod uid>_<container>`` below it: the shared accounting file."""
    cache_container_dir: str = "/usr/local/vgpu/cache"
    lock_dir: str = "/tmp/vgpulock"
    memory_limit_env: str = "CUDA_DEVICE_MEMORY_LIMIT"
    """Suffixed ``_<i>`` per visible device; the value is ``<MiB>m``."""
    core_limit_env: str = "CUDA_DEVICE_SM_LIMIT"
    shared_cache_env: str = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
    oversubscribe_env: str = "CUDA_OVERSUBSCRIBE"
    core_policy_env: str = "GPU_CORE_UTILIZATION_POLICY"
    log_level_env: str = "LIBCUDA_LOG_LEVEL"
    priority_env: str = "CUDA_TASK_PRIORITY"


class MpsConfig(_Cfg, frozen=True, kw_only=True):
    """NVIDIA MPS on the cards whose sharing mode is ``mps`` (``operatingMode``): one control
    daemon per card, run by the node's MPS supervisor (``tessera node-agent mps-control``,
    services/node_agent/mps/supervisor.py), read by the node agent
    (services/node_agent/mps/reader.py), which hands each MPS container its card's pipe and
    shared-memory directories and its limits (services/node_agent/isolation.py). A daemon
    serves one Linux user at a time, so the scheduler puts two pods on one MPS card only
    when they run as the same UID (shared/core/ledger.py)."""

    control_command: str = "nvidia-cuda-mps-control"
    """The MPS control binary (on the PATH the NVIDIA runtime gives the supervisor and the
    agent)."""
    host_dir: str = "/run/tessera/mps"
    """On the host, one directory per card in ``mps`` mode, ``<hostDir>/<card UUID>/``, with
    ``pipe/`` (the daemon's ``CUDA_MPS_PIPE_DIRECTORY``, mounted into each of the card's
    MPS containers at ``pipe_container_dir``), ``log/`` (its ``CUDA_MPS_LOG_DIRECTORY``)
    and ``shm/`` (its ``/dev/shm`` and its clients', see ``private_shm``). Keep it on a
    tmpfs (the host's ``/run`` is one): an MPS server and its clients share memory there."""
    pipe_container_dir: str = "/tmp/nvidia-mps"
    """Where an MPS container finds its card's pipes (``CUDA_MPS_PIPE_DIRECTORY``)."""
    private_shm: bool = True
    """Run each card's daemon in a mount namespace of its own with the card's ``shm/`` on
    ``/dev/shm`` (``unshare`` and ``mount``; the supervisor runs privileged), the directory
    every client container of the card gets at ``/dev/shm``. Off only where the daemon and
    its clients already share one ``/dev/shm`` (processes on one host, no containers)."""
    check_interval_s: Annotated[float, msgspec.Meta(gt=0.0)] = 5.0
    """How often each card's daemon is asked for its servers and clients (by the agent), and
    started again when dead (by the supervisor)."""
    hami_core: bool = True
    """Also preload HAMi-core with the same memory limit, so the container sees its limit
    as the card's memory and its use is in the node's metrics (MPS alone stops an
    allocation at the limit but reports the whole card)."""
    unset_user: Literal["refuse", "exclusive"] = "refuse"
    """A pod asking for an MPS slice whose UID is not set explicitly (``runAsUser`` of its
    containers or its pod): ``refuse`` it with a message (the webhook at creation, else
    the watcher's Event), or give it an MPS card of its ``exclusive`` own."""


DeviceApi = Literal["device-plugin", "dra"]
"""How a node's devices reach the kubelet: its device-plugin API (extended resources,
Tessera's scheduler places the pods) or DRA (ResourceSlices and ResourceClaims,
services/node_agent/dra/). One or the other per node, never both: the kubelet would hand
one card to a pod of each."""


class DraConfig(_Cfg, frozen=True, kw_only=True):
    """The node agent as a DRA driver (``deviceApi: dra``; docs/dra.md): its name, the
    kubelet's directories it registers in and the CDI directory the runtime reads."""

    driver_name: str = "gpu.tessera.io"
    """The driver's name: ResourceSlices' ``spec.driver``, the domain of its devices'
    attributes and capacities (``device.attributes['gpu.tessera.io']``) and the vendor of
    its CDI devices. The DeviceClasses of deploy/kustomize/components/dra select it."""
    plugins_dir: str = "/var/lib/kubelet/plugins"
    """The driver's DRA socket goes in ``<pluginsDir>/<driverName>/dra.sock``."""
    registry_dir: str = "/var/lib/kubelet/plugins_registry"
    """The kubelet's plugin watcher directory: the registration socket goes here."""
    cdi_dir: str = "/var/run/cdi"
    """Where a prepared claim's CDI spec is written (one file per claim); the container
    runtime must read it (containerd 2 does by default; ``cdi_spec_dirs``)."""


class NodeAgentConfig(_Cfg, frozen=True, kw_only=True):
    """The node agent: kubelet device-plugin paths, timings and isolation files."""

    device_api: DeviceApi = "device-plugin"
    """How every node's devices reach the kubelet unless its ``nodeConfigs`` entry says
    otherwise (``deviceApi`` there): ``device-plugin`` or ``dra``."""
    dra: DraConfig = msgspec.field(default_factory=DraConfig)

    device_plugin_dir: str = "/var/lib/kubelet/device-plugins"
    """Where the kubelet's ``kubelet.sock`` is and the agent's own sockets go."""
    admission_wait_s: Annotated[float, msgspec.Meta(gt=0.0)] = 10.0
    """How long an Allocate waits for the grant of the pod it is for to reach the node."""
    health_interval_s: Annotated[float, msgspec.Meta(gt=0.0)] = 5.0
    """How often devices are re-read for health (NVML events also report at once)."""
    isolation: IsolationConfig = msgspec.field(default_factory=IsolationConfig)
    mps: MpsConfig = msgspec.field(default_factory=MpsConfig)


class SecurityConfig(_Cfg, frozen=True, kw_only=True):
    """Who may be believed."""

    grant_key_file: str = ""
    """A file holding the key (any bytes, 32 random ones at least) Tessera signs grants
    with: the binder signs each grant it writes on a pod, and the allocator's rebuild and
    the node agents believe a ``tessera.io/grant`` only with a valid signature, so a user
    who writes one by hand gets no device. Mount it from a Secret shared by the
    device-allocator, the binder and the node agents (``tessera-grant-key``, made by
    ``tessera secrets``; deploy/kustomize/base mounts it). Empty: those services refuse
    to start (:func:`check_grant_key`), unless ``unsignedGrants``."""
    unsigned_grants: bool = False
    """Let the services that sign or check grants run without ``grantKeyFile``: grants
    are then neither signed nor checked (the binder warns at start), so anyone who may
    write a pod's annotations can give it devices. Only for a local development cluster
    whose users are all trusted; the local cluster of ``tessera dev up``, ``tessera
    demo`` and the tests gets a key all the same (tools/cli.py ``dev_config``). With a
    key set it changes nothing."""


class WebhookConfig(_Cfg, frozen=True, kw_only=True):
    """The admission webhook (services/webhook): what it changes and refuses at pod
    creation, and the certificate and webhook configurations it keeps itself."""

    port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 8443
    namespace: str = "tessera"
    """Where the webhook runs: its Service and its certificate's Secret live here, and
    its pods are never sent to it."""
    service: str = "tessera-webhook"
    """The Service the API server calls it through."""
    url: str = ""
    """Call it at this URL instead (``https://host:port``: a webhook outside the
    cluster, the tests'); its host goes into the certificate."""
    secret: str = "tessera-webhook-tls"
    """The Secret holding its CA and serving certificate (made and renewed by the
    webhook itself; no cert-manager needed)."""
    configuration: str = "tessera"
    """The name of the Mutating- and ValidatingWebhookConfiguration it writes."""
    failure_policy: Literal["Fail", "Ignore"] = "Fail"
    """What the API server does when the webhook cannot answer: refuse the pod
    (``Fail``) or create it unchecked (``Ignore``)."""
    namespace_selector: dict[str, Any] = msgspec.field(default_factory=dict)
    """A LabelSelector for the namespaces it serves (empty: all). Namespaces labelled
    ``tessera.io/webhook: disabled``, ``kube-system`` and its own are always left out."""
    set_scheduler_name: bool = True
    """Give a pod that asks for a managed device and names no scheduler (or
    ``default-scheduler``) the first of ``scheduler.names``, as HAMi's webhook does."""
    certificate_days: Annotated[int, msgspec.Meta(ge=2, le=3650)] = 365
    renew_days: Annotated[int, msgspec.Meta(ge=1, le=3650)] = 30
    """A serving certificate closer than this to its end is replaced (the CA stays)."""
    check_interval_s: Annotated[float, msgspec.Meta(gt=0.0, le=86400.0)] = 600.0
    """How often each replica reads the Secret again (and renews when due)."""


class Config(_Cfg, frozen=True, kw_only=True):
    """The whole of ``tessera.yaml``."""

    scheduler: SchedulerConfig = msgspec.field(default_factory=SchedulerConfig)
    devices: DeviceSpecs = msgspec.field(default_factory=DeviceSpecs)
    node_configs: list[NodeOverride] = msgspec.field(default_factory=list)
    nats: NatsConfig = msgspec.field(default_factory=NatsConfig)
    kubernetes: KubernetesConfig = msgspec.field(default_factory=KubernetesConfig)
    telemetry: TelemetryConfig = msgspec.field(default_factory=TelemetryConfig)
    compat: CompatConfig = msgspec.field(default_factory=CompatConfig)
    node_agent: NodeAgentConfig = msgspec.field(default_factory=NodeAgentConfig)
    security: SecurityConfig = msgspec.field(default_factory=SecurityConfig)
    webhook: WebhookConfig = msgspec.field(default_factory=WebhookConfig)

    def device_api(self, node: str) -> DeviceApi:
        """How ``node``'s devices reach its kubelet: its ``nodeConfigs`` entry's
        ``deviceApi``, else ``nodeAgent.deviceApi``."""
        override = self.node_override(node)
        if override is not None and override.device_api is not None:
            return override.device_api
        return self.node_agent.device_api

    def node_override(self, node: str) -> NodeOverride | None:
        """The ``nodeConfigs`` entry of ``node`` (the first of that name), or None: the node takes
        the defaults."""
        for override in self.node_configs:
            if override.name == node:
                return override
        return None


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        merged = dict(base)
        for key, value in over.items():
            merged[key] = _merge(base[key], value) if key in base else value
        return merged
    return over


_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


def _type_at(path: str) -> msgspec.inspect.Type | None:
    """The msgspec type found by walking a ``$.a.b[0].c`` error path through Config."""
    t: msgspec.inspect.Type | None = msgspec.inspect.type_info(Config)
    for key, _index in _STEP.findall(path):
        t = _unwrap(t)
        if isinstance(t, msgspec.inspect.StructType) and key:
            t = next((f.type for f in t.fields if f.encode_name == key), None)
        elif isinstance(t, msgspec.inspect.ListType | msgspec.inspect.TupleType):
            t = t.item_type if isinstance(t, msgspec.inspect.ListType) else None
        elif isinstance(t, msgspec.inspect.DictType):
            t = t.value_type
        else:
            return None
    return t


def _unwrap(t: msgspec.inspect.Type | None) -> msgspec.inspect.Type | None:
    while isinstance(t, msgspec.inspect.Metadata):
        t = t.type
    if t is None:
        return None
    if isinstance(t, msgspec.inspect.UnionType):
        structured = [
            u
            for u in t.types
            if isinstance(_unwrap(u), msgspec.inspect.StructType | msgspec.inspect.ListType)
        ]
        if len(structured) == 1:
            inner: msgspec.inspect.Type | None = _unwrap(structured[0])
            return inner
    return t


_MOVED = {
    "deviceScoreWeight": "the weight of the Binpack and Spread score plugins, e.g. "
    "`scheduler.plugins.score.enabled: [{name: Binpack, weight: 7}]`",
}
"""Keys of ``scheduler:`` that earlier releases had, and where they went."""


def _hint(message: str) -> str:
    """Append the allowed keys or values to a msgspec validation message."""
    match = _PATH.search(message)
    if match is None:
        return message
    path = match["path"]
    where = "$" + path
    if "unknown field" in message:
        moved = next((m for key, m in _MOVED.items() if f"`{key}`" in message), None)
        if moved is not None and path == ".scheduler":
            return f"{message}; it moved: {moved}"
        t = _unwrap(_type_at(path))
        if isinstance(t, msgspec.inspect.StructType):
            allowed = ", ".join(f.encode_name for f in t.fields)
            return f"{message}; keys allowed at `{where}`: {allowed}"
        return message
    t = _unwrap(_type_at(path))
    values: list[str] = []
    if isinstance(t, msgspec.inspect.LiteralType):
        values = [str(v) for v in t.values]
    elif isinstance(t, msgspec.inspect.UnionType):
        for member in t.types:
            inner = _unwrap(member)
            if isinstance(inner, msgspec.inspect.LiteralType):
                values += [str(v) for v in inner.values]
    if path.endswith(".deviceApi"):
        return (
            f"{message}; a node offers its devices through the device plugin or through "
            "DRA, never both (the kubelet would hand one card to a pod of each): "
            f"set `{where}` to device-plugin or dra"
        )
    if values:
        return f"{message}; allowed values for `{where}`: {', '.join(values)}"
    return message


ROLE_KEYS = (
    "resourceCountName",
    "resourceWholeCountName",
    "resourceMemoryName",
    "resourceMemoryPercentageName",
    "resourceCoreName",
    "resourcePriorityName",
    "gpuShareMemoryName",
)
"""The resource-name keys of a vendor's block (``gpuShareMemoryName``: NVIDIA's only)."""


def _out_of_range(value: Any, where: str = "$") -> str | None:
    """Why the first number of a config (as builtins) that no setting can mean is wrong,
    naming where it is, or None: every float is a duration, a rate or a scaling (never
    infinite), every number fits in int64."""
    if isinstance(value, float) and math.isinf(value):
        return f"`{where}` is infinite: give a finite number"
    if isinstance(value, (int, float)) and not -(2**63) <= value < 2**63:
        return f"`{where}` is out of range: give a number below 2**63"
    if isinstance(value, dict):
        steps = [(f"{where}.{k}", v) for k, v in value.items()]
    elif isinstance(value, list):
        steps = [(f"{where}[{i}]", v) for i, v in enumerate(value)]
    else:
        return None
    return next((f for w, v in steps if (f := _out_of_range(v, w)) is not None), None)


def _check(cfg: Config) -> None:
    """Rules no type can express: numbers finite and in int64; each resource name has
    one role, in one place; node names unique."""
    if not cfg.scheduler.names:
        raise ConfigError("`$.scheduler.names` is empty: name at least one schedulerName")
    try:
        profile = cfg.scheduler.profile()
    except ProfileError as exc:
        raise ConfigError(f"`$.scheduler.plugins`: {exc}") from None
    policies = {kind.policy for kind, _ in profile.policies}
    if cfg.scheduler.node_policy not in policies:
        raise ConfigError(
            f"`$.scheduler.nodePolicy` is {cfg.scheduler.node_policy!r}, whose plugin "
            "`$.scheduler.plugins` disables: enable it or choose another"
        )
    wrong = _out_of_range(msgspec.to_builtins(cfg))
    if wrong is not None:
        raise ConfigError(wrong)
    owners: dict[str, str] = {}
    roles: list[tuple[str, tuple[str, ...]]] = []
    for vendor in GENERIC_VENDORS:
        spec: VendorSpec = getattr(cfg.devices, vendor)
        if spec.enabled:
            given = msgspec.to_builtins(spec)
            roles += [(f"devices.{vendor}.{k}", names(given[k])) for k in ROLE_KEYS if k in given]
        keys = names(spec.use_uuid_annotation) + names(spec.nouse_uuid_annotation)
        if not spec.models and any("{model}" in k for k in keys):
            raise ConfigError(
                f"`$.devices.{vendor}` names UUID annotations per model ({{model}}) but lists "
                "no `models`: list the models, or write the keys without {model}"
            )
    for i, chip in enumerate(cfg.devices.vnpus):
        roles += [
            (f"devices.vnpus[{i}].resourceName", (chip.resource_name,)),
            (f"devices.vnpus[{i}].resourceMemoryName", (chip.resource_memory_name,)),
            (f"devices.vnpus[{i}].resourceCoreName", names(chip.resource_core_name)),
        ]
    if cfg.devices.mindcluster.enabled:
        roles.append(("devices.mindcluster.resourceName", (cfg.devices.mindcluster.resource_name,)))
    for where, resource_names in roles:
        for name in resource_names:
            other = owners.setdefault(name, where)
            if other != where:
                raise ConfigError(
                    f"resource name {name!r} is given by both `$.{other}` and `$.{where}`: "
                    "each resource name must have one role in one device block"
                )
    shard_names = [s.name for s in cfg.scheduler.shards]
    if len(shard_names) > MAX_SHARDS:
        raise ConfigError(
            f"`$.scheduler.shards` lists {len(shard_names)} shards: at most {MAX_SHARDS}"
        )
    for i, name in enumerate(shard_names):
        if name in shard_names[:i]:
            raise ConfigError(f"`$.scheduler.shards[{i}].name` {name!r} is listed twice")
    seen: set[str] = set()
    for i, override in enumerate(cfg.node_configs):
        if override.name in seen:
            raise ConfigError(
                f"`$.nodeConfigs[{i}].name` {override.name!r} is listed twice: "
                "merge the two entries"
            )
        seen.add(override.name)


def parse(data: dict[str, Any]) -> Config:
    """Merge ``data`` over the defaults and decode it strictly."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"the config must be a mapping at the top level, got {type(data).__name__}"
        )
    defaults = msgspec.to_builtins(Config())
    try:
        cfg = msgspec.convert(_merge(defaults, data), Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid config: {_hint(str(exc))}") from None
    _check(cfg)
    return cfg


def load(path: str | os.PathLike[str] | None = None) -> Config:
    """Load the config from ``path``, else ``$TESSERA_CONFIG``, else the built-in defaults."""
    chosen = path if path is not None else os.environ.get(ENV_CONFIG)
    if not chosen:
        return Config()
    file = Path(chosen)
    data = read_yaml(file, "config")
    try:
        return parse(data)
    except ConfigError as exc:
        raise ConfigError(f"{file}: {exc}") from None


def read_yaml(file: Path, what: str) -> Any:
    """A UTF-8 YAML file's data ({} when empty); ConfigError naming ``what`` and the
    file when it cannot be read, is not UTF-8, or is not YAML."""
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {file}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{what} {file} is not UTF-8 text: byte {exc.start} ({exc.reason})"
        ) from None
    try:
        return yaml.safe_load(text) or {}
    except (yaml.YAMLError, ValueError, TypeError, AttributeError) as exc:
        # PyYAML's safe loader raises more than YAMLError on a bad scalar: a date such as
        # 2024-13-45, an !!int of more than 4300 digits, a malformed !!timestamp
        raise ConfigError(f"{what} {file} is not valid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{what} {file} nests lists or mappings too deep") from None


def config_hash(cfg: Config) -> str:
    """A short, stable hash of what node agents and the allocator must agree on to place
    safely: the device specs (resource names, scaling, geometries, templates) and the
    per-node overrides. Logging, telemetry, timings and policies are left out, so such a
    change rolls out without the allocator refusing every node until its agent restarts."""
    placement = {"devices": cfg.devices, "nodeConfigs": cfg.node_configs}
    blob = msgspec.json.encode(msgspec.to_builtins(placement), order="sorted")
    return hashlib.sha256(blob).hexdigest()[:16]


def request_parser(cfg: Config) -> RequestParser:
    """The pod request parser as the config sets it (the watcher and the webhook give the
    same answer for the same pod)."""
    return RequestParser(
        cfg.devices,
        clamp_cores=cfg.scheduler.cores_above_100 == "clamp",
        mps_unset_user=cfg.node_agent.mps.unset_user,
    )


GRANT_KEY_HOLDERS = frozenset({"device-allocator", "binder", "node-agent"})
"""The services that sign grants (the binder) or believe them only signed (the
device-allocator's rebuild, the node agents; a simulating node agent runs under the same
name): each mounts the grant key and refuses to start without one
(:func:`check_grant_key`, called by shared/runtime.py ``main_entry``)."""


def grant_key(cfg: Config) -> bytes | None:
    """The grant-signing key (``security.grantKeyFile``), or None when unset."""
    path = cfg.security.grant_key_file
    if not path:
        return None
    try:
        key = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"security.grantKeyFile: cannot read {path}: {exc}") from None
    if len(key) < 16:
        raise ConfigError(f"security.grantKeyFile: {path} holds {len(key)} bytes; use 32 or more")
    return key


def check_grant_key(cfg: Config, service: str) -> None:
    """Refuse, with a ``ConfigError`` naming ``security.grantKeyFile``, to start
    ``service`` when it is one of :data:`GRANT_KEY_HOLDERS` and has no key it can read,
    unless ``security.unsignedGrants`` says unsigned grants are accepted (a local
    development cluster)."""
    if service not in GRANT_KEY_HOLDERS:
        return
    if grant_key(cfg) is None and not cfg.security.unsigned_grants:
        raise ConfigError(
            "security.grantKeyFile is not set: grants would be neither signed nor checked, "
            "so anyone who may write a pod could give it devices. Set it to a file holding "
            "the grant key (the Secret tessera-grant-key, made by `tessera secrets`), or, "
            "on a local development cluster only, set security.unsignedGrants: true"
        )


def dump(cfg: Config) -> str:
    """The effective config as YAML (``tessera config``)."""
    return yaml.safe_dump(msgspec.to_builtins(cfg), sort_keys=False)
