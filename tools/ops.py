"""``tessera get``, ``tessera explain`` and ``tessera top``: the running scheduler as an
operator reads it.

The figures are the services' own live views (shared/views.py), asked over NATS
request/reply: the device-allocator's ledger (every card and who holds it, reservations
included), the gang-coordinator's queues and waiting gangs, and every node's verdict on
one pod now. Volcano Jobs and PodGroups come from the API server. Every table goes
through :func:`table` (columns as wide as their content, as kubectl prints them); the
renderers are pure functions of the views, so tests check their exact text. A command
that cannot reach NATS or the API server, or whose view nobody answers, fails within a
few seconds with one line naming the URL (:class:`Failed`) and exit 1, never a
traceback. tools/cli.py holds the argument parsers and calls ``cmd_*`` here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping, Sequence
from itertools import zip_longest
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
import yaml

from shared import views
from shared.aio import raise_if_cancelling
from shared.config import Config, ConfigError, KubernetesConfig, NatsConfig
from shared.config import load as load_config
from shared.core.claimed import CAPACITY as CLAIMED_CAPACITY
from shared.core.claimed import COUNT as CLAIMED_COUNT
from shared.core.claimed import is_claimed
from shared.core.ledger import UNLIMITED_SLOTS
from shared.core.model import RequestError

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient

    from shared import kube
    from shared.core.hosts import Claims

T = TypeVar("T", bound=msgspec.Struct)

VIEW_TIMEOUT_S = 3.0
"""How long a command waits for a view: with the bus's 2 s connect timeout, a command
whose service is gone fails within 5 s."""
API_TIMEOUT_S = 5.0
"""How long a command waits for one API server call."""
EXPLAIN_NODES = 20
"""Nodes ``tessera explain`` lists unless ``--all`` (those that fit come first)."""
RESERVED_MARK = "*"
NONE = "<none>"
DEFAULT_KUBECONFIG = Path("~/.kube/config")
VOLCANO_JOBS = "/apis/batch.volcano.sh/v1alpha1"
VOLCANO_GROUPS = "/apis/scheduling.volcano.sh/v1beta1"
CLEAR = "\033[H\033[2J"
COUNT_UNIT = {
    "ascend": "npu",
    "cambricon": "mlu",
    "hygon": "dcu",
    "enflame": "gcu",
    "kunlunxin": "xpu",
    "awsneuron": "neuron",
}
"""What a device of each vendor is called in a queue's figures (``gpu`` otherwise)."""
POD_STATES = ("pending", "parked", "inflight", "placed", "bound")
PHASES = ("Pending", "Inqueue", "Running", "Unknown", "Completed")


class Failed(Exception):  # noqa: N818 (what the command tells its user)
    """The command cannot go on; ``str()`` is the one line its user reads (exit 1)."""


# --- reaching NATS and the API server -----------------------------------------------------


def config_of(args: argparse.Namespace) -> Config:
    """``--config``, else ``$TESSERA_CONFIG``, else the defaults."""
    try:
        return load_config(args.config)
    except ConfigError as exc:
        raise Failed(str(exc)) from None


def nats_of(cfg: Config, args: argparse.Namespace) -> NatsConfig:
    """The bus as ``cfg`` sets it, ``--nats`` and ``--user`` overriding its URL and user
    (``admin`` unless set)."""
    return msgspec.structs.replace(
        cfg.nats, url=args.nats or cfg.nats.url, user=args.user or cfg.nats.user
    )


def nats_config(args: argparse.Namespace) -> NatsConfig:
    return nats_of(config_of(args), args)


CLOSE_WAIT_S = 2.0
"""How long a command waits for its bus connection to close."""


@contextlib.asynccontextmanager
async def bus(cfg: NatsConfig) -> AsyncIterator[NatsClient]:
    """A connection for a command someone waits for (``connect(patient=False)``): a bus
    that does not answer within about 3 s raises :class:`Failed` naming its URL."""
    import nats.errors

    from shared.bus import connect

    try:
        nc = await connect(cfg, "admin", patient=False)
    except (OSError, TimeoutError, nats.errors.Error) as exc:
        raise Failed(f"cannot reach NATS at {cfg.url}: {exc!r}") from None
    except RuntimeError as exc:  # nats.passwordFile unreadable (shared/bus.py credentials)
        raise Failed(f"cannot connect to NATS at {cfg.url}: {exc}") from None
    try:
        yield nc
    finally:
        # Bounded: a command stopped by Ctrl-C exits within this even when the bus does
        # not see the connection's close through (a loaded machine, a server gone).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_WAIT_S):
                await nc.close()


async def ask(
    nc: NatsClient,
    subject: str,
    query: msgspec.Struct | None,
    answer: type[T],
    service: str,
    timeout_s: float = VIEW_TIMEOUT_S,
) -> T:
    """One view (shared/bus.py ``ask``); :class:`Failed` when it cannot be had."""
    from shared.bus import ViewUnavailable
    from shared.bus import ask as ask_view

    try:
        return await ask_view(nc, subject, query, answer, service=service, timeout_s=timeout_s)
    except ViewUnavailable as exc:
        raise Failed(str(exc)) from None


def kubeconfig_path(flag: str | None) -> str:
    """The kubeconfig a command uses, as kubectl picks it: ``--kubeconfig``, else
    ``$KUBECONFIG``, else ``~/.kube/config`` when it exists, else "" (the pod's own
    ServiceAccount, run in a cluster). The services' ``kubernetes.kubeconfig`` is theirs,
    not the operator's, and is not read."""
    given = flag or os.environ.get("KUBECONFIG", "")
    if given:
        for one in given.split(os.pathsep):
            if one and not Path(one).expanduser().is_file():
                raise Failed(
                    f"kubeconfig {one}: no such file (pass --kubeconfig or set $KUBECONFIG)"
                )
        return given
    default = DEFAULT_KUBECONFIG.expanduser()
    return str(default) if default.is_file() else ""


def context_namespace(path: str) -> str:
    """The namespace of the kubeconfig's current context, else ``default``."""
    if not path:
        return "default"
    from kubernetes_asyncio import config

    try:
        _, current = config.list_kube_config_contexts(path)
    except Exception:  # an unreadable kubeconfig is reported when connecting
        return "default"
    return str(((current or {}).get("context") or {}).get("namespace") or "default")


@contextlib.asynccontextmanager
async def api_server(flag: str | None) -> AsyncIterator[kube.Client]:
    """The API server as the kubeconfig (:func:`kubeconfig_path`) reaches it."""
    from kubernetes_asyncio.config import ConfigException

    from shared import kube

    path = kubeconfig_path(flag)
    try:
        api = await kube.connect(KubernetesConfig(kubeconfig=path))
    except (ConfigException, OSError, ValueError, KeyError, TypeError) as exc:
        where = f"kubeconfig {path}" if path else "the in-cluster ServiceAccount"
        hint = "" if path else " (pass --kubeconfig, set $KUBECONFIG or write ~/.kube/config)"
        raise Failed(f"cannot load {where}: {exc}{hint}") from None
    try:
        yield api
    finally:
        await api.close()


async def api_get(
    api: kube.Client, path: str, query: Mapping[str, str] | None = None, *, listing: bool = False
) -> Any:
    """One GET (or a paged list: ``listing``) within :data:`API_TIMEOUT_S`; None when the
    object or the API does not exist (404); :class:`Failed` when the server cannot be
    reached or refuses."""
    from kubernetes_asyncio.client import ApiException

    from shared import kube

    try:
        async with asyncio.timeout(API_TIMEOUT_S):
            if listing:
                return (await kube.list_all(api, path, query))[0]
            return await kube.request(api, "GET", path, query=query)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise Failed(
            f"the API server at {api.host} refused GET {path}: {exc.status} {exc.reason}"
        ) from None
    except TimeoutError:
        raise Failed(
            f"the API server at {api.host} did not answer GET {path} in {API_TIMEOUT_S:.0f}s"
        ) from None
    except OSError as exc:
        raise Failed(f"cannot reach the API server at {api.host}: {exc!r}") from None


def run(what: str, main: Coroutine[Any, Any, int], *, interrupted: int = 130) -> int:
    """Run a command's coroutine: :class:`Failed` becomes one line on stderr and exit 1,
    Ctrl-C exit ``interrupted``."""
    try:
        return asyncio.run(main)
    except Failed as exc:
        print(f"{what}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return interrupted


# --- the one table renderer and the figures in it -------------------------------------------


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Columns as wide as their widest cell, three spaces apart, as kubectl prints them;
    nothing is cut. Ends with a newline."""
    lines = [list(headers), *(list(r) for r in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]
    return "".join(
        "   ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() + "\n"
        for line in lines
    )


def number(value: float) -> str:
    """A whole number as such, else one decimal."""
    return str(round(value)) if abs(value - round(value)) < 0.05 else f"{value:.1f}"


def memory(mib: float) -> str:
    """MiB as people read them: ``512Mi``, ``20Gi``, ``79.6Gi``."""
    return f"{number(mib / 1024)}Gi" if mib >= 1024 else f"{number(mib)}Mi"


def used_of(used: float, total: float, unit: str = "") -> str:
    return f"{number(used)}/{number(total)}{unit}"


def memory_used(used_mib: float, total_mib: float) -> str:
    """``40/320Gi`` (both in the unit that suits the total)."""
    if total_mib >= 1024:
        return used_of(used_mib / 1024, total_mib / 1024, "Gi")
    return used_of(used_mib, total_mib, "Mi")


def percent(used: float, total: float) -> str:
    return f"{round(100 * used / total)}%" if total else "0%"


def duration(seconds: float) -> str:
    """``45s``, ``3m05s``, ``2h10m``, ``3d4h``, as kubectl's AGE."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def vector(v: Mapping[str, float]) -> str:
    """A queue's resource vector (``<vendor>.count|memory|cores``, shared/core/queues.py)
    compactly: ``nvidia: 3 gpu, 120Gi, 250%``; vendors apart with ``; ``; claimed devices
    by DeviceClass after them: ``gpu.tessera.io: 2 claimed, cores 60, memory 8Gi``."""
    by_vendor: dict[str, dict[str, float]] = {}
    claimed: dict[str, dict[str, float]] = {}
    for key, value in v.items():
        if abs(value) <= 1e-6:
            continue
        if is_claimed(key):  # claimed devices, by DeviceClass (shared/core/claimed.py)
            if CLAIMED_CAPACITY in key:
                dim, _, device_class = key.partition(CLAIMED_CAPACITY)
            else:
                dim, device_class = "count", key.removeprefix(CLAIMED_COUNT)
            claimed.setdefault(device_class, {})[dim] = value
            continue
        vendor, _, dim = key.partition(".")
        by_vendor.setdefault(vendor, {})[dim] = value
    parts = []
    for vendor, dims in sorted(by_vendor.items()):
        shown = []
        for dim, value in sorted(dims.items(), key=lambda kv: (_DIMS.get(kv[0], 9), kv[0])):
            if dim == "count":
                shown.append(f"{number(value)} {COUNT_UNIT.get(vendor, 'gpu')}")
            elif dim == "memory":
                shown.append(memory(value))
            elif dim == "cores":
                shown.append(f"{number(value)}%")
            else:
                shown.append(f"{dim} {number(value)}")
        parts.append(f"{vendor}: {', '.join(shown)}")
    for device_class, dims in sorted(claimed.items()):
        shown = [f"{number(dims.pop('count'))} claimed"] if "count" in dims else []
        for dim, value in sorted(dims.items()):
            shown.append(f"{dim} {memory(value / 2**20) if dim == 'memory' else number(value)}")
        parts.append(f"{device_class}: {', '.join(shown)}")
    return "; ".join(parts) or NONE


_DIMS = {"count": 0, "memory": 1, "cores": 2}


def counts(by: Mapping[str, int], order: Sequence[str]) -> str:
    """``2 pending, 1 placed``: the non-zero counts, in ``order`` then the others."""
    keys = [k for k in order if k in by] + sorted(k for k in by if k not in order)
    return ", ".join(f"{by[k]} {k}" for k in keys if by[k]) or NONE


def dump(view: Any, output: str) -> str:
    """``-o json`` (the view itself, as the service sent it) or ``-o yaml``."""
    if output == "json":
        return msgspec.json.format(msgspec.json.encode(view), indent=2).decode() + "\n"
    return str(yaml.safe_dump(msgspec.to_builtins(view), sort_keys=False))


# --- the ledger: nodes and devices ---------------------------------------------------------


def share(g: views.GrantView) -> str:
    """What a grant takes of its card: ``20000MiB 30%``, ``whole``, ``2g.10gb``."""
    if g.mig_profile or g.vnpu_template:
        return str(g.mig_profile or g.vnpu_template)
    if g.exclusive:
        return "whole"
    return f"{g.memory_mib}MiB {g.cores}%" if g.cores else f"{g.memory_mib}MiB"


def holder(g: views.GrantView, wide: bool = False) -> str:
    """``ns/pod(container)[*] share``: ``*`` when only reserved (not yet bound)."""
    mark = "" if g.bound else RESERVED_MARK
    group = f" [{g.group}]" if wide and g.group else ""
    return f"{g.namespace}/{g.pod}({g.container}){mark} {share(g)}{group}"


def health(d: views.DeviceView) -> str:
    parts = ["Healthy" if d.healthy else "Unhealthy"]
    if d.cordoned:
        parts.append("Cordoned")
    if d.mps:
        parts.append(f"mps:{d.mps}")
    return ",".join(parts)


def node_status(n: views.NodeView) -> str:
    if n.refused:
        return f"Refused ({n.refused})"
    status = "Unschedulable" if n.unschedulable else "Ready"
    sick = sum(1 for d in n.devices if not d.healthy or d.cordoned)
    if sick:
        status += f" ({sick} device{'s' if sick > 1 else ''} unhealthy or cordoned)"
    return status


def nodes_table(view: views.LedgerView, wide: bool = False) -> str:
    """One row per node: its devices by model, their memory, cores and slots used, its
    pods and whether the allocator places there."""
    headers = ["NAME", "DEVICES", "MEMORY", "CORES", "SLOTS", "PODS", "STATUS"]
    if wide:
        headers += ["MEMORY%", "CORES%", "SLOTS%", "RESERVED"]
    rows = []
    for n in view.nodes:
        used, total = _sums(n.devices)
        models = Counter(d.model for d in n.devices)
        row = [n.name, ", ".join(f"{c}x {m}" for m, c in models.items()) or NONE]
        if n.devices:
            row += [
                memory_used(used["memory_mib"], total["memory_mib"]),
                used_of(used["cores"], total["cores"], "%"),
                slots_used(used["slots"], total["slots"]),
            ]
        else:
            row += ["-", "-", "-"]
        row += [str(n.pods), node_status(n)]
        if wide:
            row += [percent(used[f], total[f]) if total[f] else "-" for f in _FIGURES]
            row.append(str(len({g.uid for d in n.devices for g in d.grants if not g.bound})))
        rows.append(row)
    return table(headers, rows)


_FIGURES = ("memory_mib", "cores", "slots")
"""A device's capacities; ``used_<figure>`` is what its grants take."""


def _sums(devices: Sequence[views.DeviceView]) -> tuple[dict[str, int], dict[str, int]]:
    """Each figure used and in all, over ``devices``; slots only of the cards that
    count them (a MIG or vNPU card is limited by its instances, not by slots)."""
    used = {f: sum(int(getattr(d, f"used_{f}")) for d in devices) for f in _FIGURES}
    total = {f: sum(int(getattr(d, f)) for d in devices) for f in _FIGURES}
    counted = [d for d in devices if d.slots < UNLIMITED_SLOTS]
    used["slots"] = sum(d.used_slots for d in counted)
    total["slots"] = sum(d.slots for d in counted)
    return used, total


def slots_used(used: int, total: int) -> str:
    """``2/10``; ``-`` where no slot limit applies (``1/-`` on a card that has some)."""
    if not total or total >= UNLIMITED_SLOTS:
        return f"{used}/-" if used else "-"
    return used_of(used, total)


def devices_table(view: views.LedgerView, wide: bool = False) -> str:
    """One row per card; a footnote when some share is only reserved."""
    headers = ["NODE", "INDEX", "MODEL", "MODE", "MEMORY(MiB)", "CORES", "SLOTS", "HEALTH"]
    headers += ["UUID", "VENDOR", "WHO"] if wide else ["WHO"]
    rows = []
    reserved = False
    for n in view.nodes:
        for d in sorted(n.devices, key=lambda d: d.index):
            row = [
                n.name,
                str(d.index),
                d.model,
                d.mode,
                used_of(d.used_memory_mib, d.memory_mib),
                used_of(d.used_cores, d.cores),
                slots_used(d.used_slots, d.slots),
                health(d),
            ]
            if wide:
                row += [d.uuid, d.vendor]
            row.append(", ".join(holder(g, wide) for g in d.grants) or NONE)
            reserved |= any(not g.bound for g in d.grants)
            rows.append(row)
    text = table(headers, rows)
    if reserved:
        text += f"{RESERVED_MARK} reserved: placed by the allocator, not yet bound\n"
    return text


def totals(ledger: views.LedgerView, queues: views.QueuesView | None) -> str:
    """The cluster in one line: device memory, cores and slots used, pods placed (and
    how many only reserved), gangs waiting."""
    devices = [d for n in ledger.nodes for d in n.devices]
    used, total = _sums(devices)
    mem, cores, slots = ((used[f], total[f]) for f in _FIGURES)
    placed = {g.uid: g.bound for d in devices for g in d.grants}
    reserved = sum(1 for bound in placed.values() if not bound)
    parts = [
        f"nodes {len(ledger.nodes)}",
        f"devices {len(devices)}",
        f"memory {memory_used(*mem)} ({percent(*mem)})",
        f"cores {used_of(*cores, '%')} ({percent(*cores)})",
        f"slots {slots_used(*slots)} ({percent(*slots)})",
        f"pods placed {len(placed)} ({reserved} reserved)",
    ]
    if queues is not None:
        parts.append(f"gangs waiting {len(queues.gangs)}")
    return "   ".join(parts) + "\n"


# --- queues and gangs ---------------------------------------------------------------------


def queues_table(view: views.QueuesView, wide: bool = False) -> str:
    """The queues; under the ``capacity`` plugin as a tree (each child indented under
    its parent), with deserved, guarantee, capability and the real capability that
    follows from them side by side (the three are easily confused)."""
    if view.plugin == "capacity":
        return _queue_tree_table(view, wide)
    headers = ["NAME", "STATE", "WEIGHT", "DESERVED", "ALLOCATED", "REQUEST", "PAST USE"]
    headers += ["PODGROUPS"]
    if wide:
        headers += ["PRIORITY", "CAPABILITY"]
    rows = []
    for q in view.queues:
        row = [
            q.name,
            q.state,
            number(q.weight),
            vector(q.deserved),
            vector(q.allocated),
            vector(q.request),
            past_use(q.usage),
            counts(q.podgroups, PHASES),
        ]
        if wide:
            row += [str(q.priority), vector(q.capability) if q.capability else "unlimited"]
        rows.append(row)
    return table(headers, rows)


def _queue_tree_table(view: views.QueuesView, wide: bool) -> str:
    headers = ["NAME", "STATE", "DESERVED", "GUARANTEE", "CAPABILITY", "REAL CAPABILITY"]
    headers += ["ALLOCATED", "REQUEST", "PAST USE", "PODGROUPS"]
    if wide:
        headers += ["PRIORITY", "REFUSED"]
    parent = {q.name: q.parent for q in view.queues}
    rows = []
    for q in view.queues:
        depth, up = 0, q.parent
        while up in parent and depth < len(parent):
            depth, up = depth + 1, parent[up]
        row = [
            "  " * depth + q.name,
            "Refused" if q.refused else q.state,
            vector(q.deserved),
            vector(q.guarantee),
            vector(q.capability) if q.capability else "unlimited",
            vector(q.real_capability) if q.real_capability is not None else "unlimited",
            vector(q.allocated),
            vector(q.request),
            past_use(q.usage),
            counts(q.podgroups, PHASES),
        ]
        if wide:
            row += [str(q.priority), q.refused or NONE]
        rows.append(row)
    return table(headers, rows)


def past_use(usage: dict[str, float]) -> str:
    """A queue's past use as a part of the cluster (shared/views.py ``QueueView.usage``):
    its largest dimension, in percent."""
    return f"{100 * max(usage.values()):.1f}%" if usage else NONE


def gangs_table(view: views.QueuesView) -> str:
    """The gangs with pods not yet bound, longest waiting first, with what they were told."""
    rows = []
    for g in sorted(view.gangs, key=lambda g: (-g.waiting_s, g.namespace, g.name)):
        why = g.why or NONE
        rows.append(
            [
                f"{g.namespace}/{g.name}" + (" (pod)" if g.lone else ""),
                g.queue,
                str(g.min_member),
                counts(g.pods, POD_STATES),
                duration(g.waiting_s),
                f"unresolvable: {why}" if g.unresolvable else why,
            ]
        )
    return table(["GANG", "QUEUE", "MIN", "PODS", "WAITING", "WHY"], rows)


def queues_text(view: views.QueuesView, wide: bool = False, gangs_only: bool = False) -> str:
    """The queues, then the waiting gangs (``gangs_only``: those alone)."""
    gangs = gangs_table(view) if view.gangs else "No gangs waiting.\n"
    if gangs_only:
        return gangs
    return queues_table(view, wide) + "\n" + gangs


# --- Volcano Jobs and PodGroups (the API server) --------------------------------------------


def jobs_table(
    jobs: Sequence[Mapping[str, Any]], groups: Sequence[Mapping[str, Any]], all_namespaces: bool
) -> str:
    """Volcano Jobs and PodGroups with their status: one row each, a Job's before the
    PodGroup of the same name (the one its controller made)."""
    rows: list[tuple[tuple[str, str, int], list[str]]] = []
    for kind, objs in (("job", jobs), ("podgroup", groups)):
        for obj in objs:
            meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
            status = obj.get("status") or {}
            if kind == "job":
                phase = (status.get("state") or {}).get("phase", "")
                minimum = spec.get("minAvailable", "")
                pending = str(status.get("pending", 0))
                message = (status.get("state") or {}).get("message", "")
            else:
                phase = status.get("phase", "")
                minimum = spec.get("minMember", "")
                pending = "-"
                message = next(
                    (
                        c.get("message", "")
                        for c in status.get("conditions") or ()
                        if c.get("type") == "Unschedulable" and c.get("status") == "True"
                    ),
                    "",
                )
            ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
            row = [ns] if all_namespaces else []
            row += [
                f"{kind}/{name}",
                phase or "Unknown",
                str(minimum),
                str(status.get("running", 0)),
                pending,
                str(status.get("succeeded", 0)),
                str(status.get("failed", 0)),
                str(spec.get("queue") or "default"),
                message or "",
            ]
            rows.append(((ns, name, 0 if kind == "job" else 1), row))
    headers = ["NAMESPACE"] if all_namespaces else []
    headers += ["NAME", "PHASE", "MIN", "RUNNING", "PENDING", "SUCCEEDED", "FAILED", "QUEUE"]
    return table([*headers, "MESSAGE"], [row for _, row in sorted(rows, key=lambda r: r[0])])


# --- explain -------------------------------------------------------------------------------


def pod_state(pod: Mapping[str, Any], schedulers: Sequence[str]) -> list[str]:
    """The pod now as the API server shows it; ``schedulers``: Tessera's
    (``scheduler.names``)."""
    from tools.cli import _grant_text

    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    status = pod.get("status") or {}
    scheduler = spec.get("schedulerName", "default-scheduler")
    ours = "" if scheduler in schedulers else f" (not Tessera's: {', '.join(schedulers)})"
    lines = [
        f"Pod:        {meta.get('namespace')}/{meta.get('name')} (uid {meta.get('uid')})",
        f"Scheduler:  {scheduler}{ours}",
    ]
    node = spec.get("nodeName")
    phase = status.get("phase", "Pending")
    if node:
        grants = _grant_text(dict(pod))
        lines.append(f"State:      {phase}, bound to {node}" + (f": {grants}" if grants else ""))
    else:
        lines.append(f"State:      {phase}, not bound")
    return lines


def last_attempt(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> list[str]:
    """The PodScheduled condition and the latest FailedScheduling Event."""
    conditions = (pod.get("status") or {}).get("conditions") or ()
    scheduled = next((c for c in conditions if c.get("type") == "PodScheduled"), None)
    lines = ["Last attempt (as the API server shows it):"]
    if scheduled is None:
        lines.append("  PodScheduled: not set yet")
    else:
        reason = f" ({scheduled['reason']})" if scheduled.get("reason") else ""
        at = scheduled.get("lastTransitionTime")
        when = f" at {at}" if at else ""
        message = f": {scheduled['message']}" if scheduled.get("message") else ""
        lines.append(f"  PodScheduled: {scheduled.get('status')}{reason}{when}{message}")
    failed = [e for e in events if e.get("reason") == "FailedScheduling"]
    if not failed:
        lines.append("  Event:        no FailedScheduling Event")
    else:
        e = max(failed, key=_event_time)
        count = f" x{e['count']}" if int(e.get("count") or 1) > 1 else ""
        lines.append(
            f"  Event:        FailedScheduling{count} at {_event_time(e)}: {e.get('message')}"
        )
    return lines


def _event_time(e: Mapping[str, Any]) -> str:
    """When an Event last happened (RFC 3339 strings compare in time order)."""
    meta = e.get("metadata") or {}
    return str(e.get("lastTimestamp") or e.get("eventTime") or meta.get("creationTimestamp") or "")


def explain_table(view: views.ExplainView, limit: int | None = EXPLAIN_NODES) -> str:
    """Every node's verdict, those that fit first: one row per reason, with the plugin
    that found it and what would make the node fit; past ``limit`` nodes, how many more
    there are."""
    shown = view.nodes if limit is None else view.nodes[:limit]
    rows = []
    for v in shown:
        if v.fits:
            rows.append([v.node, "yes", "", "", ""])
            continue
        plugins = [r.plugin for r in v.reasons]
        rows_of = list(zip_longest(plugins, v.texts, v.hints, fillvalue="")) or [("", "", "")]
        for i, (plugin, text, hint) in enumerate(rows_of):
            first = i == 0
            rows.append([v.node if first else "", "no" if first else "", plugin, text, hint])
    out = table(["NODE", "FITS", "PLUGIN", "WHY NOT", "WHAT WOULD MAKE IT FIT"], rows)
    if len(shown) < len(view.nodes):
        out += f"... and {len(view.nodes) - len(shown)} more nodes (--all lists them)\n"
    return out


Answer = views.ExplainView | Sequence[RequestError] | None
"""What ``tessera explain`` learnt beside the API server's view: the allocator's verdict,
the errors that make the request invalid, or nothing (the pod is bound or finished)."""


def explain_text(
    pod: Mapping[str, Any],
    events: Sequence[Mapping[str, Any]],
    answer: Answer,
    *,
    schedulers: Sequence[str] = ("tessera",),
    limit: int | None = EXPLAIN_NODES,
) -> str:
    """The whole of ``tessera explain pod``: the pod, its last attempt, then the
    allocator's verdict now, or the errors the watcher tells it."""
    from shared.core.request import rejection

    lines = [*pod_state(pod, schedulers), "", *last_attempt(pod, events), ""]
    if answer is None:
        lines.append("Now: nothing to try (the pod is bound or finished).")
        return "\n".join(lines) + "\n"
    if not isinstance(answer, views.ExplainView):
        lines += [
            "Now: the request is invalid; Tessera never places it as written. The watcher "
            "tells the pod:",
            f"  {rejection(answer)}",
            "Each error (the field, and the fix):",
            *(f"  {e.field}: {e.message}" for e in answer),
        ]
        return "\n".join(lines) + "\n"
    lines += [
        "Now (the device-allocator tried it on every node, placing nothing):",
        f"  {answer.message}",
    ]
    if answer.unresolvable:
        lines.append(
            "  Unresolvable: no pod leaving can help; only a new or changed node, or a changed pod."
        )
    if not answer.nodes:  # refused before any node: the reason above holds for all
        lines.append("  No node was tried: no node could take the request as written.")
        return "\n".join(lines) + "\n"
    return "\n".join(lines) + "\n\n" + explain_table(answer, limit)


_CLAIMED = {
    "pvc": "/api/v1/namespaces/{}/persistentvolumeclaims/{}",
    "pv": "/api/v1/persistentvolumes/{}",
    "class": "/apis/storage.k8s.io/v1/storageclasses/{}",
    "claim": "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims/{}",
    "dclass": "/apis/resource.k8s.io/v1/deviceclasses/{}",
}
"""Where each kind of object a pod's claims verdict reads is (shared/core/claims.py keys)."""


async def claims_verdict(api: kube.Client, pod: dict[str, Any]) -> Claims | None:
    """What the pod's volumes and resource claims allow, as the watcher decides it
    (services/watcher/claims.py), from the objects read now; None: it claims nothing."""
    from shared.core import claims as core

    uses = core.pod_uses(pod)
    if uses is None:
        return None
    records: dict[str, Callable[[dict[str, Any]], core.Record]] = {
        "pvc": core.pvc_record,
        "pv": core.pv_record,
        "class": core.class_record,
        "claim": core.claim_record,
        "dclass": core.api_object,
    }
    known: dict[core.Key, core.Record | None] = {}
    while True:  # each object read may name more (a claim its class, a volume its PV)
        found, reads = core.claims_of(uses, lambda key: known.get(key))
        missing = [key for key in reads if key not in known]
        if not missing:
            return found
        for kind, key in missing:
            obj = await api_get(api, _CLAIMED[kind].format(*key.split("/")))
            known[kind, key] = None if obj is None else records[kind](obj)


def explain_query(
    cfg: Config, pod: dict[str, Any], claims: Claims | None = None
) -> views.ExplainQuery | list[RequestError]:
    """The pod parsed as the watcher parses it (its request, node-fit spec and group,
    with ``claims``, its claims' verdict), or the errors that make its request invalid."""
    from services.watcher.translate import pending_event
    from shared import kube
    from shared.config import request_parser
    from shared.core.hosts import pod_spec
    from shared.core.model import PodRequest

    parser = request_parser(cfg)
    parsed = parser.parse(pod)
    if not isinstance(parsed, PodRequest):
        return list(parsed)
    ref = kube.pod_ref(pod)
    spec = pod_spec(pod, frozenset(parser.table.by_name))
    if claims is not None:
        spec = msgspec.structs.replace(spec, claims=claims)
    pending = pending_event(pod, ref, parsed, spec)
    return views.ExplainQuery(pod=ref, request=parsed, spec=pending.spec, group=pending.group)


# --- the commands ---------------------------------------------------------------------------

KINDS = {
    "nodes": "nodes",
    "node": "nodes",
    "no": "nodes",
    "devices": "devices",
    "device": "devices",
    "dev": "devices",
    "queues": "queues",
    "queue": "queues",
    "q": "queues",
    "jobs": "jobs",
    "job": "jobs",
    "podgroups": "jobs",
    "podgroup": "jobs",
    "pg": "jobs",
}


def _print(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


async def _get(args: argparse.Namespace) -> int:
    kind = KINDS[args.kind]
    output = args.output or ""
    if kind == "jobs":
        return await _get_jobs(args)
    async with bus(nats_config(args)) as nc:
        if kind == "queues":
            qv = await ask(
                nc, views.VIEW_QUEUES_SUBJECT, None, views.QueuesView, "gang-coordinator"
            )
            _print(
                dump(qv, output)
                if output in ("json", "yaml")
                else queues_text(qv, output == "wide", args.gangs)
            )
            return 0
        query = views.LedgerQuery(nodes=tuple(args.node or ()))
        lv = await ask(nc, views.VIEW_LEDGER_SUBJECT, query, views.LedgerView, "device-allocator")
    if output in ("json", "yaml"):
        _print(dump(lv, output))
    elif not lv.nodes:
        print("No nodes in the allocator's ledger.", file=sys.stderr)
    else:
        render = nodes_table if kind == "nodes" else devices_table
        _print(render(lv, output == "wide"))
    return 0


async def _get_jobs(args: argparse.Namespace) -> int:
    namespace = None if args.all_namespaces else args.namespace
    if namespace is None and not args.all_namespaces:
        namespace = context_namespace(kubeconfig_path(args.kubeconfig))
    where = f"/namespaces/{namespace}" if namespace else ""
    async with api_server(args.kubeconfig) as api:
        jobs = await api_get(api, f"{VOLCANO_JOBS}{where}/jobs", listing=True)
        groups = await api_get(api, f"{VOLCANO_GROUPS}{where}/podgroups", listing=True)
    if jobs is None and groups is None:
        raise Failed(
            f"the API server at {api.host} serves neither Volcano Jobs nor PodGroups "
            "(kubectl apply -k deploy/crds)"
        )
    jobs, groups = jobs or [], groups or []
    if args.output in ("json", "yaml"):
        _print(dump({"apiVersion": "v1", "kind": "List", "items": jobs + groups}, args.output))
    elif not jobs and not groups:
        where = f"namespace {namespace}" if namespace else "any namespace"
        print(f"No Volcano Jobs or PodGroups in {where}.", file=sys.stderr)
    else:
        _print(jobs_table(jobs, groups, args.all_namespaces))
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    return run(f"{args.prog} get", _get(args))


async def _explain(args: argparse.Namespace) -> int:
    cfg = config_of(args)
    namespace, _, name = args.target.rpartition("/")
    namespace = namespace or args.namespace or context_namespace(kubeconfig_path(args.kubeconfig))
    async with api_server(args.kubeconfig) as api:
        pod = await api_get(api, f"/api/v1/namespaces/{namespace}/pods/{name}")
        if pod is None:
            raise Failed(f"pod {namespace}/{name} not found (at {api.host})")
        claims = await claims_verdict(api, pod)
        found = await api_get(
            api,
            f"/api/v1/namespaces/{namespace}/events",
            {"fieldSelector": f"involvedObject.name={name},involvedObject.kind=Pod"},
        )
    uid = pod["metadata"].get("uid")
    events = [
        e
        for e in (found or {}).get("items", [])
        if (e.get("involvedObject") or {}).get("uid") in (None, uid)
    ]
    answer: Answer = None
    placed = (pod.get("spec") or {}).get("nodeName")
    if not placed and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
        query = explain_query(cfg, pod, claims)
        if isinstance(query, views.ExplainQuery):
            async with bus(nats_of(cfg, args)) as nc:
                answer = await ask(
                    nc,
                    views.VIEW_EXPLAIN_SUBJECT,
                    query,
                    views.ExplainView,
                    "device-allocator",
                    args.timeout,
                )
            if answer.error:
                raise Failed(
                    f"the device-allocator could not try {namespace}/{name}: {answer.error}"
                )
        else:
            answer = query
    if args.output in ("json", "yaml") and isinstance(answer, views.ExplainView):
        _print(dump(answer, args.output))
    else:
        text = explain_text(
            pod,
            events,
            answer,
            schedulers=cfg.scheduler.names,
            limit=None if args.all else EXPLAIN_NODES,
        )
        _print(text)
    return 1 if answer is not None and not isinstance(answer, views.ExplainView) else 0


def cmd_explain(args: argparse.Namespace) -> int:
    return run(f"{args.prog} explain", _explain(args))


async def frame(nc: NatsClient, wide: bool = False) -> tuple[str, list[str]]:
    """One screen of ``tessera top``: the totals, the devices, the queues and the waiting
    gangs; a view that cannot be had is one line in its place (also returned)."""
    ledger, queues = await asyncio.gather(
        ask(nc, views.VIEW_LEDGER_SUBJECT, None, views.LedgerView, "device-allocator"),
        ask(nc, views.VIEW_QUEUES_SUBJECT, None, views.QueuesView, "gang-coordinator"),
        return_exceptions=True,
    )
    errors = []
    for got in (ledger, queues):
        if isinstance(got, Failed):
            errors.append(str(got))
        elif isinstance(got, BaseException):
            raise got
    parts = []
    if isinstance(ledger, views.LedgerView):
        parts.append(totals(ledger, queues if isinstance(queues, views.QueuesView) else None))
        parts.append(devices_table(ledger, wide))
    else:
        parts.append(f"{ledger}\n")
    if isinstance(queues, views.QueuesView):
        parts.append(queues_text(queues, wide))
    else:
        parts.append(f"{queues}\n")
    return "\n".join(parts), errors


async def _top(args: argparse.Namespace) -> int:
    tty = sys.stdout.isatty()
    wide = args.output == "wide"
    async with bus(nats_config(args)) as nc:
        while True:
            text, errors = await frame(nc, wide)
            raise_if_cancelling()  # a Ctrl-C a library took for its own timeout
            if args.once:
                if errors:
                    raise Failed(errors[0])
                _print(text)
                return 0
            clock = time.strftime("%H:%M:%S")
            head = f"{args.prog} top   {clock}   every {number(args.interval)}s (Ctrl-C quits)\n"
            _print((CLEAR if tty else "\n") + head + "\n" + text)
            await asyncio.sleep(args.interval)


def cmd_top(args: argparse.Namespace) -> int:
    return run(f"{args.prog} top", _top(args), interrupted=0)
