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
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import yaml

from shared.core.model import Policy
from shared.core.spec import GENERIC_VENDORS, DeviceSpecs, NodeOverride, PosInt, names

ENV_CONFIG = "TESSERA_CONFIG"
"""Environment variable naming the config file when no path is given."""


class ConfigError(ValueError):
    """The config cannot be used; the message names the key and the fix."""


class _Cfg(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    pass


class SchedulerConfig(_Cfg, frozen=True, kw_only=True):
    """Which pods are ours and how they are placed."""

    names: list[str] = msgspec.field(default_factory=lambda: ["tessera"])
    """``spec.schedulerName`` values Tessera serves; add ``volcano`` or ``hami-scheduler``
    to take users' YAML unchanged."""
    node_policy: Policy = "binpack"
    """Default node-level policy (HAMi's default); pods override it by annotation."""
    device_policy: Policy = "spread"
    """Default device-level policy (HAMi's default)."""
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
    """Nodes that fit which the ``fgd`` policy compares per pod."""
    score_window: PosInt = 16
    """Nodes that fit which are scored per pod when scores matter: always for a pod
    that asks for no devices, and for one with soft preferences (preferred node or pod
    affinity, ScheduleAnyway spread) or when some node has a PreferNoSchedule taint;
    other pods take the first node that fits in the device policy's order. Scores are
    kube-scheduler's (resources by ``nodePolicy``: most allocated for binpack, least for
    spread; balance; taints; affinity; spread) with its weights."""
    device_score_weight: Annotated[int, msgspec.Meta(ge=0)] = 5
    """Weight of the device policy's order among a window's scores (kube-scheduler's
    own plugins weigh 1 to 3 each, 0-100 points per plugin): high keeps device packing
    first, 0 lets only the node scores choose."""
    bind_concurrency: PosInt = 64
    """Binding writes in flight at once (no per-node lock)."""
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
    share (Volcano's preempt and reclaim actions). No gang is ever cut below minMember."""
    eviction_grace_s: Annotated[int, msgspec.Meta(ge=0)] | None = None
    """Grace period of the pods Tessera deletes (preemption victims, a Volcano Job's
    restart or deletion); unset: each pod's own ``terminationGracePeriodSeconds``. A
    victim's devices go to the preemptor only once it is gone."""
    starvation_guard_s: Annotated[float, msgspec.Meta(ge=0.0)] = 300.0

    """Smaller gangs are backfilled past a gang that does not fit; once it has waited
    this long, the nodes it would fit on (after their pods finish) are held for it.
    0 turns the guard off."""


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
    """Path to a kubeconfig; empty means ``$KUBECONFIG``, then the in-cluster account."""
    qps: Annotated[float, msgspec.Meta(gt=0.0)] = 500.0
    burst: PosInt = 1000


class TelemetryConfig(_Cfg, frozen=True, kw_only=True):
    """Logs, traces and metrics of every service."""

    otlp_endpoint: str = ""
    """OTLP gRPC endpoint for traces; empty exports nothing (spans still propagate)."""
    sample_ratio: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 1.0
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


class NodeAgentConfig(_Cfg, frozen=True, kw_only=True):
    """The node agent: kubelet device-plugin paths, timings and isolation files."""

    device_plugin_dir: str = "/var/lib/kubelet/device-plugins"
    """Where the kubelet's ``kubelet.sock`` is and the agent's own sockets go."""
    admission_wait_s: Annotated[float, msgspec.Meta(gt=0.0)] = 10.0
    """How long an Allocate waits for the grant of the pod it is for to reach the node."""
    health_interval_s: Annotated[float, msgspec.Meta(gt=0.0)] = 5.0
    """How often devices are re-read for health (NVML events also report at once)."""
    isolation: IsolationConfig = msgspec.field(default_factory=IsolationConfig)


class SecurityConfig(_Cfg, frozen=True, kw_only=True):
    """Who may be believed."""

    grant_key_file: str = ""
    """A file holding the key (any bytes, 32 random ones at least) Tessera signs grants
    with: the binder signs each grant it writes on a pod, and the allocator's rebuild and
    the node agents believe a ``tessera.io/grant`` only with a valid signature, so a user
    who writes one by hand gets no device. Mount it from a Secret shared by the
    device-allocator, the binder and the node agents. Empty: grants are neither signed
    nor checked (a warning at start)."""


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

    def node_override(self, node: str) -> NodeOverride | None:
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


def _hint(message: str) -> str:
    """Append the allowed keys or values to a msgspec validation message."""
    match = _PATH.search(message)
    if match is None:
        return message
    path = match["path"]
    where = "$" + path
    if "unknown field" in message:
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
    if values:
        return f"{message}; allowed values for `{where}`: {', '.join(values)}"
    return message


def _check(cfg: Config) -> None:
    """Rules no type can express: each resource name belongs to one place; names unique."""
    if not cfg.scheduler.names:
        raise ConfigError("`$.scheduler.names` is empty: name at least one schedulerName")
    owners: dict[str, str] = {}
    specs: list[tuple[str, tuple[str, ...]]] = []
    for vendor in GENERIC_VENDORS:
        spec = getattr(cfg.devices, vendor)
        if spec.enabled:
            specs.append((f"devices.{vendor}", spec.all_names()))
    for i, chip in enumerate(cfg.devices.vnpus):
        specs.append(
            (
                f"devices.vnpus[{i}]",
                (chip.resource_name, chip.resource_memory_name, *names(chip.resource_core_name)),
            )
        )
    if cfg.devices.mindcluster.enabled:
        specs.append(("devices.mindcluster", (cfg.devices.mindcluster.resource_name,)))
    for where, resource_names in specs:
        for name in resource_names:
            other = owners.setdefault(name, where)
            if other != where:
                raise ConfigError(
                    f"resource name {name!r} is claimed by both `$.{other}` and `$.{where}`: "
                    "each resource name must belong to one device block"
                )
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
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {file}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {file} is not valid YAML: {exc}") from None
    try:
        return parse(data)
    except ConfigError as exc:
        raise ConfigError(f"{file}: {exc}") from None


def config_hash(cfg: Config) -> str:
    """A short, stable hash of what node agents and the allocator must agree on to place
    safely: the device specs (resource names, scaling, geometries, templates) and the
    per-node overrides. Logging, telemetry, timings and policies are left out, so such a
    change rolls out without the allocator refusing every node until its agent restarts."""
    placement = {"devices": cfg.devices, "nodeConfigs": cfg.node_configs}
    blob = msgspec.json.encode(msgspec.to_builtins(placement), order="sorted")
    return hashlib.sha256(blob).hexdigest()[:16]


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


def dump(cfg: Config) -> str:
    """The effective config as YAML (``tessera config``)."""
    return yaml.safe_dump(msgspec.to_builtins(cfg), sort_keys=False)
