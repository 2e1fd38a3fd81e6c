"""The scheduling framework: extension points, the plugins on them, and the profile.

kube-scheduler's framework is the model: one small interface per extension point, each
plugin a named class, and a profile that says which plugins run, in which order, with
which score weights. A pod's cycle state is its :class:`~shared.core.nodefit.Prepared`
(what its PreFilters computed once); the plugins themselves keep nothing per pod.

- **PreFilter** (:meth:`FilterPlugin.pre_filter`): once per pod, before any node; it
  computes what the plugin's Filter reads, may reject every node at once (an
  unresolvable :class:`~shared.core.status.Status`), and says whether the Filter has
  anything to check for this pod at all (kube-scheduler's ``Skip``: a pod with no host
  ports never meets NodePorts).
- **Filter** (:meth:`FilterPlugin.filter`): one node, the first failure wins, in the
  profile's order; every reason carries the plugin's name (``Reason.plugin``).
- **Score** (:meth:`ScorePlugin.score`): a window of feasible nodes, 0 to 100 each,
  times the plugin's weight in the profile.
- **PostFilter** (:meth:`PostFilterPlugin.post_filter`): for a gang that was not placed,
  in the profile's order until one makes room: Consolidation, DefaultPreemption,
  StarvationHold.

Two points are Tessera's own, for what kube-scheduler has no notion of:

- **DeviceFit** (:class:`DeviceFitPlugin`): after the filters, one plugin per device
  family fits the pod's device requests on the node (DeviceShare, MIGInstances,
  AscendTemplates, AscendCores). They are listed with the filters, after them; their
  order is the preference among families that serve one request (a vGPU request tries
  DeviceShare's cards before MIGInstances').
- **NodePolicy** (:class:`NodePolicyPlugin`): which of the nodes that fit takes the pod.
  Binpack, Spread and FGD each serve the node policy of their name (a pod's
  ``hami.io/node-scheduler-policy``, else the config's ``nodePolicy``); Binpack and
  Spread walk the device index in their order and weigh it among the window's scores
  by their weight; FragmentationGuard, when enabled, re-weighs the first nodes of
  Binpack's or Spread's walk by FGD's measure. They are listed with the scores.

Both are made per placer (a family holds its ledger's device specs) and are given the
placer per call; the others are made once per profile.

Plugins live one per module in shared/core/plugins/ and are found there by name: a new
filter or score is a new module there plus its name in a profile (the defaults below,
or ``scheduler.plugins`` in the config, shaped as a ``KubeSchedulerConfiguration``
profile's ``plugins``). docs/plugins.md walks through one.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, ClassVar

import msgspec

from shared.core.status import Status

if TYPE_CHECKING:
    from shared.core.families import FitContext, Picks
    from shared.core.ledger import NodeState, PoolIndex, PoolKey
    from shared.core.model import (
        Constraints,
        ContainerGrant,
        DeviceRequest,
        GangKey,
        PodRequest,
        Policy,
        RequestKind,
    )
    from shared.core.nodefit import HostNode, Hosts, Prepared
    from shared.core.placement import Placer
    from shared.core.room import Made, Room, Unplaced
    from shared.core.spec import DeviceSpecs
    from shared.core.status import Reason


class Plugin:
    """A named part of the scheduling cycle (one instance per profile, shared by every
    pod: what a plugin learns about one pod lives in that pod's ``Prepared``)."""

    name: ClassVar[str] = ""
    """The name profiles, reasons and metrics use (kube-scheduler's, for its plugins)."""


class FilterPlugin(Plugin):
    """PreFilter and Filter: may a node take the pod at all?"""

    node_only: ClassVar[bool] = False
    """It reads the Node object alone (labels, taints, cordon), never what runs there:
    the nodes it rejects are the same whatever they come to hold, so a device walk skips
    them without fitting each (``Prepared.ruled_out``)."""
    labels_only: ClassVar[bool] = False
    """It answers for a node whose Node object is not known yet, on no labels (the
    pod's volumes and resource claims): the other filters pass such a node."""
    reads: ClassVar[str] = ""
    """The field of the pod's spec (``PodSpec``) without which it has nothing to check:
    a pod whose field is empty skips the plugin, its PreFilter not even called."""

    def pre_filter(self, hosts: Hosts, prep: Prepared) -> Status | bool:
        """Once per pod: fill what :meth:`filter` reads into ``prep``; True if the filter
        has something to check for this pod, False to skip it (kube-scheduler's Skip),
        or a Status that rejects every node at once."""
        return True

    def filter(self, prep: Prepared, host: HostNode) -> Status | None:
        """Why ``host`` cannot take the pod (a per-node Status), or None."""
        raise NotImplementedError


class ScorePlugin(Plugin):
    """Score: how much a feasible node suits the pod."""

    weight: ClassVar[int] = 1
    """The weight when a profile names none (kube-scheduler's default for its plugins)."""

    def score(self, prep: Prepared, hosts: Sequence[HostNode], policy: str) -> list[float] | None:
        """Each of ``hosts``' score, 0 to 100 (normalised over them), or None when the
        plugin has no opinion on this pod (no score at all, not zeros). ``policy`` is
        the pod's node policy (``binpack``: most allocated first; ``spread``: least)."""
        raise NotImplementedError


class DeviceFitPlugin(Plugin):
    """DeviceFit: one family's way of sharing devices, fitting one device request on
    one node (the contract is shared/core/families.py's). Made per ledger, from its
    device specs."""

    kinds: ClassVar[frozenset[RequestKind]] = frozenset()
    """The request kinds it serves (``DeviceRequest.kind``)."""

    def __init__(self, specs: DeviceSpecs) -> None:
        self.specs = specs

    def pools(self, request: DeviceRequest, constraints: Constraints) -> tuple[PoolKey, ...]:
        """The device pools (vendor, mode, chip) that may serve ``request``; none: this
        family does not serve it."""
        raise NotImplementedError

    def demand(self, request: DeviceRequest, index: PoolIndex) -> tuple[int, int]:
        """The least free memory (MiB) and cores (percent) one device of the pool must
        offer, so the ledger's index skips devices that cannot fit."""
        raise NotImplementedError

    def filter(
        self, node: NodeState, request: DeviceRequest, constraints: Constraints, ctx: FitContext
    ) -> Picks | Reason:
        """The devices and grants chosen for ``request`` on ``node``, or the reason none
        fit (unresolvable only when load cannot change it); changes nothing."""
        raise NotImplementedError


Chosen = tuple["NodeState", tuple["ContainerGrant", ...]]
"""A node policy's choice: the node and the pod's grants there (not yet reserved)."""


@dataclass(slots=True)
class Choice:
    """What a node policy reads of one pod, and the placer it walks and fits with."""

    placer: Placer
    request: PodRequest
    primary: DeviceRequest | None
    """The pod's first device request (the device index is walked for it); None: the
    pod asks for no devices, and every node is offered in turn."""
    ctx: FitContext
    prep: Prepared | None
    """Its cycle state (None: devices only, the core's own tests)."""
    owner: GangKey | None
    policy: Policy
    """The node policy that applies (the pod's, else the config's)."""
    guard: int
    """The fragmentation guard's window for this pod (0: off)."""


class NodePolicyPlugin(Plugin):
    """NodePolicy: which node that fits takes the pod, and its devices there, walking
    and fitting with ``Choice.placer`` (shared/core/placement.py). Made per placer,
    with its weight; it keeps no reference to the placer (no cycle keeps a dropped
    ledger alive)."""

    policy: ClassVar[str] = ""
    """The node policy value it serves (``hami.io/node-scheduler-policy``); "" for one
    that applies over another's (the fragmentation guard)."""
    weight: ClassVar[int] = 0
    """The weight of its walk's order among a window's scores when the profile names
    none; 0: it chooses by its own measure and takes no weight."""

    def __init__(self, weight: int) -> None:
        self.weight_in_window = weight

    def applies(self, choice: Choice) -> bool:
        """Whether it chooses for ``choice`` (a policy of its name always does)."""
        return choice.policy == self.policy

    def choose(self, choice: Choice) -> Chosen | None:
        """The node and grants for the pod; None when its walk found no node that fits
        (the placer then scans every node for the reasons)."""
        raise NotImplementedError


class PostFilterPlugin(Plugin):
    """PostFilter: what is done for a gang that was not placed (kube-scheduler's point,
    where its DefaultPreemption sits). Its state is the allocator's :class:`Room`
    (shared/core/room.py): nominations and holds, each lapsing at a ``now`` given in."""

    def post_filter(self, room: Room, gang: Unplaced, status: Status, now: float) -> Made | None:
        """Room made for ``gang`` (``status``: why it was not placed): pods to evict (the
        profile's later PostFilters do not run then), a note for its pods' message or
        nodes held for it; None when the plugin does nothing for it."""
        raise NotImplementedError


def normalised(raw: Sequence[int], *, reverse: bool = False) -> list[float]:
    """kube-scheduler's DefaultNormalizeScore: each raw score as 0 to 100 of the
    highest (``reverse``: 100 less that, the lowest raw best); all 0 (reverse: 100)
    when none is above 0."""
    top = max(raw, default=0)
    if top <= 0:
        return [100.0 if reverse else 0.0] * len(raw)
    return [float(100 - 100 * r // top if reverse else 100 * r // top) for r in raw]


# --- configuration ---------------------------------------------------------------------


class PluginRef(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"
):
    """One plugin in a profile's list: its name, and for a score its weight."""

    name: str
    """A plugin's name, or ``*`` (in ``disabled``: every default plugin)."""
    weight: Annotated[int, msgspec.Meta(ge=1, le=100)] | None = None
    """A score's weight (kube-scheduler allows 1 to 100); the plugin's default if unset."""


class PluginSet(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"
):
    """One extension point of a profile, as kube-scheduler writes it: the defaults, less
    ``disabled``, with ``enabled`` (a default named again keeps its place and takes the
    new weight; others come after the defaults, in their order)."""

    enabled: list[PluginRef] = msgspec.field(default_factory=list)
    disabled: list[PluginRef] = msgspec.field(default_factory=list)


class Plugins(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"
):
    """A profile's plugins per extension point (``KubeSchedulerConfiguration``'s
    ``profiles[].plugins``, for the points Tessera's cycle has): a filter's PreFilter
    runs with it."""

    filter: PluginSet = msgspec.field(default_factory=PluginSet)
    post_filter: PluginSet = msgspec.field(default_factory=PluginSet)
    score: PluginSet = msgspec.field(default_factory=PluginSet)


DEFAULT_FILTERS: tuple[str, ...] = (
    "NodeUnschedulable",
    "NodeName",
    "TaintToleration",
    "NodeAffinity",
    "NodePorts",
    "NodeResourcesFit",
    "VolumeRestrictions",
    "VolumeBinding",
    "VolumeZone",
    "PodTopologySpread",
    "InterPodAffinity",
    "DynamicResources",
)
"""kube-scheduler's default filters that Tessera has, in its order (the pinned release's
default profile)."""

DEFAULT_SCORES: tuple[tuple[str, int], ...] = (
    ("NodeResourcesFit", 1),
    ("NodeResourcesBalancedAllocation", 1),
    ("TaintToleration", 3),
    ("NodeAffinity", 2),
    ("PodTopologySpread", 2),
    ("InterPodAffinity", 2),
    ("ImageLocality", 1),
)
"""kube-scheduler's default scores with their default weights."""


DEFAULT_DEVICES: tuple[str, ...] = ("DeviceShare", "MIGInstances", "AscendTemplates", "AscendCores")
"""The device families, after the filters, in their order of preference."""

DEFAULT_POST_FILTERS: tuple[str, ...] = ("Consolidation", "DefaultPreemption", "StarvationHold")
"""For a gang that was not placed: moving shared-GPU pods elsewhere (with
``scheduler.consolidation.enabled``), then preemption, then (if no one was evicted) the
nodes held for a gang that has waited past ``scheduler.starvationGuardS``."""

DEFAULT_POLICIES: tuple[str, ...] = ("Binpack", "Spread", "FGD", "FragmentationGuard")
"""The node policies, after the scores (each with its own default weight)."""


class ProfileError(ValueError):
    """A profile names a plugin that does not exist, or one at the wrong point."""


@dataclass(frozen=True, slots=True)
class Profile:
    """The plugins one scheduling cycle runs: filters in order, scores with weights,
    and the per-ledger device families and node policies (classes: a placer makes
    them)."""

    filters: tuple[FilterPlugin, ...]
    scores: tuple[tuple[ScorePlugin, int], ...]
    devices: tuple[type[DeviceFitPlugin], ...] = ()
    policies: tuple[tuple[type[NodePolicyPlugin], int], ...] = ()
    post_filters: tuple[PostFilterPlugin, ...] = ()
    steps: tuple[tuple[str, PreFilter | None, Check], ...] = ()
    """Each filter as a pod's cycle calls it: the field it reads (``reads``), its bound
    PreFilter (None when the plugin has none of its own: it always filters) and its
    bound Filter."""

    @classmethod
    def default(cls) -> Profile:
        """The default profile (built once, on first use: plugin modules import the
        core, so not while the core is being imported)."""
        global _DEFAULT
        if _DEFAULT is None:
            _DEFAULT = cls.build()
        return _DEFAULT

    @classmethod
    def build(cls, plugins: Plugins | None = None) -> Profile:
        """The default profile with ``plugins``' changes; ProfileError names a plugin
        that does not exist or cannot serve the point it is listed at."""
        plugins = plugins or Plugins()
        found = registry()
        points = (
            ("filter", plugins.filter),
            ("postFilter", plugins.post_filter),
            ("score", plugins.score),
        )
        for point, changes in points:
            for ref in changes.disabled:
                if ref.name != "*" and ref.name not in found:
                    # a typo here would silently leave the plugin on
                    raise ProfileError(
                        f"cannot disable {point} plugin {ref.name!r}: no such plugin"
                    )
        filters: list[FilterPlugin] = []
        devices: list[type[DeviceFitPlugin]] = []
        defaults = [(n, 0) for n in (*DEFAULT_FILTERS, *DEFAULT_DEVICES)]
        for name, _ in _merged(defaults, plugins.filter):
            kind = _kind(found, name, (FilterPlugin, DeviceFitPlugin), "filter")
            if issubclass(kind, DeviceFitPlugin):
                devices.append(kind)
            else:
                filters.append(_single(kind))  # type: ignore[arg-type]
        post_filters = [
            _single(_kind(found, name, (PostFilterPlugin,), "postFilter"))
            for name, _ in _merged([(n, 0) for n in DEFAULT_POST_FILTERS], plugins.post_filter)
        ]
        scores: list[tuple[ScorePlugin, int]] = []
        policies: list[tuple[type[NodePolicyPlugin], int]] = []
        defaults = [*DEFAULT_SCORES, *((n, 0) for n in DEFAULT_POLICIES)]
        for name, weight in _merged(defaults, plugins.score):
            kind = _kind(found, name, (ScorePlugin, NodePolicyPlugin), "score")
            if issubclass(kind, NodePolicyPlugin):
                if weight and not kind.weight:
                    raise ProfileError(
                        f"score plugin {name!r} chooses by its own measure: it takes no weight"
                    )
                policies.append((kind, weight or kind.weight))
            else:
                plugin = _single(kind)
                assert isinstance(plugin, ScorePlugin)
                scores.append((plugin, weight or plugin.weight))
        return cls(
            filters=tuple(filters),
            scores=tuple(scores),
            devices=tuple(devices),
            policies=tuple(policies),
            post_filters=tuple(p for p in post_filters if isinstance(p, PostFilterPlugin)),
            steps=tuple(
                (
                    f.reads,
                    f.pre_filter if type(f).pre_filter is not FilterPlugin.pre_filter else None,
                    f.filter,
                )
                for f in filters
            ),
        )


_DEFAULT: Profile | None = None

PreFilter = Callable[["Hosts", "Prepared"], Status | bool]
"""A filter plugin's ``pre_filter``, bound."""
Check = Callable[["Prepared", "HostNode"], Status | None]
"""A filter plugin's ``filter``, bound: one node's answer for the prepared pod."""


def _merged(defaults: list[tuple[str, int]], changes: PluginSet) -> list[tuple[str, int]]:
    """kube-scheduler's merge of a profile's plugin set over the defaults."""
    off = {p.name for p in changes.disabled}
    kept = [] if "*" in off else [(n, w) for n, w in defaults if n not in off]
    named = {p.name: p for p in changes.enabled}
    out = []
    for name, weight in kept:
        ref = named.pop(name, None)
        out.append((name, ref.weight if ref is not None and ref.weight else weight))
    for ref in changes.enabled:
        if ref.name in named:
            out.append((ref.name, ref.weight or 0))  # 0: the plugin's own weight
    return out


def _kind(
    found: dict[str, type[Plugin]], name: str, kinds: tuple[type[Plugin], ...], point: str
) -> type[Plugin]:
    """The plugin class named ``name``, which must serve one of ``kinds`` (the point
    ``point`` of a profile lists them)."""
    plugin = found.get(name)
    if plugin is None:
        known = ", ".join(sorted(n for n, p in found.items() if issubclass(p, kinds)))
        raise ProfileError(f"no {point} plugin named {name!r}; known: {known}")
    if not issubclass(plugin, kinds):
        raise ProfileError(f"plugin {name!r} has no {point} extension point")
    return plugin


_INSTANCES: dict[type[Plugin], Plugin] = {}


def _single(plugin: type[Plugin]) -> Plugin:
    """One instance per plugin class: a plugin that is both a filter and a score is one
    object at both points."""
    made = _INSTANCES.get(plugin)
    if made is None:
        made = _INSTANCES[plugin] = plugin()
    return made


_REGISTRY: dict[str, type[Plugin]] = {}


def registry() -> dict[str, type[Plugin]]:
    """Every plugin of shared/core/plugins/ by name (each module's classes that name
    themselves), read once."""
    if not _REGISTRY:
        from shared.core import plugins

        for module in pkgutil.iter_modules(plugins.__path__):
            loaded = importlib.import_module(f"{plugins.__name__}.{module.name}")
            for value in vars(loaded).values():
                if (
                    isinstance(value, type)
                    and issubclass(value, Plugin)
                    and value.__module__ == loaded.__name__
                    and value.name
                ):
                    if value.name in _REGISTRY:
                        raise ProfileError(f"two plugins are named {value.name!r}")
                    _REGISTRY[value.name] = value
    return _REGISTRY
