"""Monitoring holds together with the code: the Grafana dashboard (deploy/grafana/tessera.json)
and docs/metrics.md name only metrics and labels the services export, the monitoring
component (deploy/kustomize/components/monitoring) builds and its monitors find their
Services and ports, and every pod serving ``/metrics`` carries the scrape annotations.

What the services export is read from the services themselves: each service that
``main_entry`` runs is instantiated (no bus, no API server) with a :class:`Metrics` that
records one value in every counter and histogram it is given, its state is filled with
one node, one grant, one queue and one waiting gang so that the gauges report their
labels, and its ``/metrics`` text is parsed. The labels of counters and histograms are
given where they are recorded (``.add(1, {"result": ...})``), so they are read from the
source.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from services.device_allocator.service import Allocator
from services.gang_coordinator.queues import Snapshot
from services.gang_coordinator.service import Coordinator
from services.node_agent import metrics as node_metrics
from shared import config, runtime, views
from shared.core.model import DeviceInfo, DeviceUUID, NodeName, PodRef, PodRequest, PodUID
from shared.metrics import SECONDS, Metrics, Reading
from tools import localcluster

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy/grafana/tessera.json"
COMPONENT = REPO / "deploy/kustomize/components/monitoring"
DOCS = REPO / "docs/metrics.md"


# --- what the code exports -------------------------------------------------------------


class Sampled(Metrics):
    """A registry whose every instrument shows in the text: one value per counter and
    histogram, and a gauge with nothing to report reports 0 (its name, no labels)."""

    def counter(self, name: str, description: str) -> Any:
        made = super().counter(name, description)
        made.add(1)
        return made

    def histogram(self, name: str, description: str, buckets: Any = SECONDS) -> Any:
        made = super().histogram(name, description, buckets)
        made.record(1.0)
        return made

    def gauge(self, name: str, description: str, read: Reading) -> None:
        super().gauge(name, description, lambda: list(read()) or [(0.0, {})])


class NoBus:
    """The bus, for construction only: a service may keep its methods, none is called."""

    fence = None  # no lease: always acting

    def __getattr__(self, name: str) -> Any:
        def never(*_args: Any, **_kwargs: Any) -> None:
            raise AssertionError(f"bus.{name} called while only building the services")

        return never


@dataclass
class Exported:
    """Every metric the services serve."""

    kinds: dict[str, str] = field(default_factory=dict)
    """Family (``tessera_binds``) → type (counter, gauge, histogram)."""
    labels: dict[str, set[str]] = field(default_factory=dict)
    """Sample name as Prometheus stores it (``tessera_binds_total``) → its label names."""
    services: dict[str, set[str]] = field(default_factory=dict)
    """Family → the services serving it."""


def served_services() -> dict[str, type[runtime.Service]]:
    """Every service ``main_entry`` runs (services/*/__main__.py), by its name."""
    found: dict[str, type[runtime.Service]] = {}
    for main in sorted(REPO.glob("services/*/__main__.py")):
        tree = ast.parse(main.read_text())
        imported = {
            alias.asname or alias.name: node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
            for alias in node.names
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "main_entry"
                and isinstance(node.args[0], ast.Name)
            ):
                name = node.args[0].id
                cls = getattr(importlib.import_module(imported[name]), name)
                found[cls.NAME] = cls
    return found


def _fill(service: runtime.Service, metrics: Metrics, cache_dir: Path) -> None:
    """State for the gauges to report with their labels: a node and a grant in the
    allocator's ledger, a queue and a waiting gang at the coordinator, a node agent's
    card, container and MPS daemon."""
    rt = service.rt
    rt.lag = (("consumer", 3),)
    if isinstance(service, Allocator):
        service.ledger.set_node(NodeName("gpu-0"), [CARD])
        limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1024}
        main = {"name": "main", "resources": {"limits": limits}}
        request = config.request_parser(rt.cfg).parse({"spec": {"containers": [main]}})
        assert isinstance(request, PodRequest), request
        service.placer.place(PodRef(namespace="ml", name="p", uid=PodUID("u-1")), request)
        assert service.ledger.pods, "the grant the per-container gauges report"
    if isinstance(service, Coordinator):
        vector = {"nvidia.count": 1.0, "nvidia.memory": 1024.0}
        queue = views.QueueView(
            name="research",
            capability=vector,
            deserved=vector,
            allocated=vector,
            request=vector,
            podgroups={"Pending": 1},
            usage={"nvidia.count": 0.25},
        )
        gang = views.GangView(namespace="ml", name="g", pods={"pending": 1, "parked": 1})
        service.snapshot = lambda: Snapshot(queues=[queue], gangs=[gang])  # type: ignore[method-assign]
    if rt.service == "node-agent":
        # Its instruments come with its Agent (devices found at start): made here alike.
        container = cache_dir / "u-1_main"
        container.mkdir()
        (container / "u-1_main.cache").write_bytes(_accounting_region(CARD.uuid))
        node_metrics.NodeMetrics(
            metrics,
            "gpu-0",
            lambda: (CARD,),
            lambda: {CARD.uuid: (1 << 30, 40.0)},
            cache_dir,
            lambda: {PodUID("u-1"): PodRef(namespace="ml", name="p", uid=PodUID("u-1"))},
            lambda: 1,
        )


CARD = DeviceInfo(
    uuid=DeviceUUID("GPU-0"),
    index=0,
    vendor="nvidia",
    model="NVIDIA-A100",
    memory_mib=81920,
    mps="running",
    mps_clients=1,
)


def _accounting_region(uuid: str) -> bytes:
    """One container's HAMi-core accounting region: one device, one process."""
    m = node_metrics
    data = bytearray(m.PROCS_AT + m.SLOT_SIZE)
    struct.pack_into("<iII", data, 0, m.MAGIC, *m.VERSION)
    struct.pack_into("<Q", data, m.UUIDS_AT - 8, 1)  # device count
    data[m.UUIDS_AT : m.UUIDS_AT + len(uuid)] = uuid.encode()
    struct.pack_into("<Q", data, m.LIMITS_AT, 2 << 30)
    struct.pack_into("<i", data, m.PROCS_AT, 7)  # a process in slot 0
    struct.pack_into("<Q", data, m.PROCS_AT + m.USED_AT + 32, 1 << 30)
    return bytes(data)


def recorded_labels() -> dict[str, set[str]]:
    """Counter and histogram family → the label names the code records it with.

    Read from the source: ``x = m.counter("name", ...)`` (or a ``Metrics`` method that
    returns one, like ``stages()``) binds ``x``; ``x.add(1, {"result": ...})`` or
    ``x.record(v, {"stage": ...})`` gives its labels."""
    sources = [*REPO.glob("shared/**/*.py"), *REPO.glob("services/**/*.py")]
    trees = [ast.parse(p.read_text()) for p in sources]
    makers: dict[str, str] = {}  # Metrics method → the family it makes (``stages``)
    for node in ast.walk(ast.parse((REPO / "shared/metrics.py").read_text())):
        if isinstance(node, ast.FunctionDef):
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and (name := _instrument(ret.value, {})):
                    makers[node.name] = name

    bound: dict[str, set[str]] = {}  # variable or attribute → families
    labels: dict[str, set[str]] = {}  # variable or attribute → label names
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and (name := _instrument(node.value, makers)):
                for target in node.targets:
                    bound.setdefault(_binding(target), set()).add(name)
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("add", "record")
                and len(node.args) == 2
                and isinstance(node.args[1], ast.Dict)
            ):
                keys = {
                    k.value
                    for k in node.args[1].keys
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)
                }
                labels.setdefault(_binding(node.func.value), set()).update(keys)
    out: dict[str, set[str]] = {}
    for binding, families in bound.items():
        for family in families:
            out.setdefault(family, set()).update(labels.get(binding, set()))
    return out


def _instrument(value: ast.expr | None, makers: dict[str, str]) -> str | None:
    """The family ``value`` makes: ``m.counter("name", ...)``, ``m.histogram(...)``, or
    a call of one of ``makers``."""
    if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Attribute):
        return None
    if value.func.attr in makers:
        return makers[value.func.attr]
    if value.func.attr in ("counter", "histogram") and value.args:
        first = value.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value
    return None


def _binding(target: ast.expr) -> str:
    if isinstance(target, ast.Attribute):
        return target.attr
    return target.id if isinstance(target, ast.Name) else ""


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    out = Exported()
    recorded = recorded_labels()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runtime, "Metrics", Sampled)
        for name, cls in served_services().items():
            rt = runtime.Runtime(name, config.Config(), NoBus())  # type: ignore[arg-type]
            rt.role = "active"
            _fill(cls(rt, None), rt.metrics, tmp_path_factory.mktemp(name))
            for family in text_string_to_metric_families(rt.metrics.text().decode()):
                out.kinds[family.name] = family.type
                out.services.setdefault(family.name, set()).add(name)
                for sample in family.samples:
                    keys = out.labels.setdefault(sample.name, set())
                    keys.update(sample.labels, recorded.get(family.name, set()))
    return out


def test_the_catalogue_is_complete(exported: Exported) -> None:
    """The set-up above reaches every service and every kind of metric: a service or a
    gauge it misses would let a wrong dashboard query through."""
    assert set(served_services()) == {
        "watcher",
        "gang-coordinator",
        "device-allocator",
        "binder",
        "job-controller",
        "node-agent",
    }
    assert exported.kinds["tessera_binds"] == "counter"
    assert "tessera_binds_total" in exported.labels
    assert exported.labels["tessera_placements_total"] == {"result"}
    assert exported.labels["tessera_stage_latency_seconds_bucket"] == {"le", "stage"}
    assert exported.labels["tessera_allocate_total"] == {"resource", "result"}
    assert exported.labels["tessera_events_handled_total"] == {"type"}
    assert exported.services["tessera_stage_latency_seconds"] == {
        "gang-coordinator",
        "device-allocator",
        "binder",
    }
    unlabelled = {
        "tessera_ledger_nodes",
        "tessera_ledger_pods",
        "tessera_fragmentation_guard_nodes",
        "tessera_scheduled_events_queued",
        "tessera_gated_pods",
    }
    for family, kind in exported.kinds.items():
        if kind == "gauge" and family not in unlabelled:
            assert exported.labels[family], f"{family} reported no labels: fill its state"


# --- the dashboard ---------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from all_panels(p.get("panels", []))


FUNCTIONS = {
    # aggregations
    *("sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk"),
    *("quantile", "count_values", "group"),
    # functions
    *("rate", "irate", "increase", "delta", "deriv", "histogram_quantile", "vector"),
    *("label_replace", "label_join", "scalar", "clamp", "clamp_min", "clamp_max", "abs"),
    *("ceil", "floor", "round", "sort", "sort_desc", "time", "absent", "changes", "resets"),
    *("max_over_time", "min_over_time", "avg_over_time", "sum_over_time", "last_over_time"),
}
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
CLAUSE = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
SELECTOR = re.compile(r"([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}")
NAME = re.compile(r"[a-zA-Z_:][\w:]*")


@dataclass
class Query:
    """What one PromQL expression refers to."""

    metrics: set[str] = field(default_factory=set)
    matchers: dict[str, set[str]] = field(default_factory=dict)
    """Metric → the labels its selector matches on."""
    grouping: set[str] = field(default_factory=set)
    """Labels of by/without/on/ignoring/group_left/group_right."""
    made: set[str] = field(default_factory=set)
    """Labels label_replace writes."""
    functions: set[str] = field(default_factory=set)


def parse_promql(expr: str) -> Query:
    """The metric names, labels and functions of ``expr``. Enough PromQL for dashboards:
    strings, ranges, selectors and grouping clauses are taken out first, then every
    remaining name is a function (followed by ``(``), a keyword or a metric."""
    q = Query()
    for call in re.finditer(r"label_replace\(", expr):
        strings = re.findall(r'"([^"]*)"', expr[call.end() :])
        q.made.add(strings[0])  # the destination label
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges: [5m], [$__rate_interval]
    for m in SELECTOR.finditer(text):
        q.matchers.setdefault(m.group(1), set()).update(re.findall(r"(\w+)\s*[=!]", m.group(2)))
    text = re.sub(r"\{[^}]*\}", "", text)
    for m in CLAUSE.finditer(text):
        q.grouping.update(x.strip() for x in m.group(2).split(",") if x.strip())
    text = CLAUSE.sub(" ", text)
    text = re.sub(r"\$\w+", "", text)
    text = re.sub(r"(?<![\w.])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?", "", text)
    for m in NAME.finditer(text):
        word = m.group(0)
        if re.match(r"\s*\(", text[m.end() :]):
            q.functions.add(word)
        elif word not in KEYWORDS:
            q.metrics.add(word)
    q.metrics.update(q.matchers)
    return q


def test_the_promql_reader_sees_names_labels_and_functions() -> None:
    q = parse_promql(
        'histogram_quantile(0.99, sum by (le, stage) (rate(a_bucket{x=~"$v", y!="1"}[5m])))'
        ' / on (n) group_left () label_replace(b > 0, "dst", "$1", "src", "(.*)") or vector(1e3)'
    )
    assert q.metrics == {"a_bucket", "b"}
    assert q.matchers == {"a_bucket": {"x", "y"}}
    assert q.grouping == {"le", "stage", "n"}
    assert q.made == {"dst"}
    assert q.functions == {"histogram_quantile", "sum", "rate", "label_replace", "vector"}


def test_the_dashboard_is_well_formed() -> None:
    d = dashboard()
    assert d["uid"]
    assert d["title"]
    assert d["schemaVersion"] >= 36
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("node", "queue"):
        assert "label_values(" in _variable_query(variables[name]), name
    panels = list(all_panels(d["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    titles = [p["title"] for p in panels if p["type"] == "row"]
    assert titles == ["Cluster", "Devices", "Queues", "Scheduling", "Node usage"]
    taken: set[tuple[int, int]] = set()
    for p in panels:
        pos = p["gridPos"]
        assert 0 <= pos["x"] < pos["x"] + pos["w"] <= 24, p["title"]
        cells = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & taken, f"{p['title']} overlaps another panel"
        taken |= cells
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs, p["title"]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
            for var in re.findall(r"\$(\w+)", t["expr"]):
                assert var.startswith("__") or var in variables or var.isdigit(), (
                    f"{p['title']}: ${var} is not a variable"
                )


def _variable_query(variable: dict[str, Any]) -> str:
    query = variable["query"]
    return str(query["query"] if isinstance(query, dict) else query)


def query_errors(
    expr: str, exported: Exported, legend: str = "", targets: frozenset[str] = frozenset()
) -> list[str]:
    """What is wrong with ``expr``: unknown functions, metrics or labels (``targets``:
    labels the scrape adds, allowed too)."""
    q = parse_promql(expr)
    errors = [f"unknown function {f}" for f in sorted(q.functions - FUNCTIONS)]
    if not q.metrics:
        errors.append("no metric")
    errors += [f"no such metric {m}" for m in sorted(q.metrics - set(exported.labels))]
    known = {m: exported.labels[m] | targets for m in q.metrics if m in exported.labels}
    for metric, used in q.matchers.items():
        errors += [f"{metric} has no label {x}" for x in sorted(used - known.get(metric, used))]
    available = set().union(targets, q.made, *known.values())
    errors += [f"no metric here has {x}" for x in sorted(q.grouping - available)]
    shown = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))
    errors += [f"legend label {x} is not in the result" for x in sorted(shown - available)]
    return errors


def test_every_dashboard_query_names_exported_metrics_and_labels(exported: Exported) -> None:
    d = dashboard()
    checked = 0
    for p in all_panels(d["panels"]):
        for t in p.get("targets", []):
            errors = query_errors(t["expr"], exported, t.get("legendFormat", ""))
            assert not errors, f"{p['title']!r}: {t['expr']}: {errors}"
            checked += 1
    for variable in d["templating"]["list"]:
        if variable["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", _variable_query(variable))
        assert m, variable["name"]
        assert m.group(2) in exported.labels[m.group(1)], variable["name"]
    assert checked > 30


def test_the_dashboard_shows_every_metric_family_users_ask_about(exported: Exported) -> None:
    """Every row has its figures: HAMi's card figures, Volcano's queues and latencies,
    Tessera's stages, results and lag, the node agents' usage."""
    used: set[str] = set()
    for p in all_panels(dashboard()["panels"]):
        for t in p.get("targets", []):
            used |= parse_promql(t["expr"]).metrics
    for name in (
        "hami_gpu_memory_allocated_bytes",
        "hami_gpu_memory_limit_bytes",
        "hami_gpu_shared_count",
        "hami_node_gpu_memory_allocated_ratio",
        "volcano_queue_deserved_scalar_resources",
        "volcano_queue_allocated_scalar_resources",
        "volcano_queue_pod_group_pending_count",
        "volcano_queue_share",
        "volcano_queue_overused",
        "tessera_binds_total",
        "volcano_e2e_scheduling_latency_milliseconds_bucket",
        "tessera_stage_latency_seconds_bucket",
        "tessera_placements_total",
        "tessera_bind_failures_total",
        "tessera_preemptions_total",
        "tessera_pending_pods",
        "tessera_bus_pending_messages",
        "hami_host_gpu_memory_used_bytes",
        "hami_host_gpu_utilization_ratio",
        "hami_container_device_utilization_ratio",
    ):
        assert name in used, name


# --- the documentation -----------------------------------------------------------------


def test_docs_list_every_metric_and_only_those(exported: Exported) -> None:
    text = DOCS.read_text()
    listed = set(re.findall(r"`((?:hami|volcano|tessera)_\w+)`", text))
    for family in exported.kinds:
        shown = {family, *(s for s in exported.labels if s.startswith(family + "_"))}
        assert shown & listed, f"docs/metrics.md does not list {family}"
    named = set(re.findall(r"\b(?:hami|volcano|tessera)_\w+", text))
    names = set(exported.kinds) | set(exported.labels)
    assert not named - names, f"docs/metrics.md names {sorted(named - names)}"


def test_the_docs_example_queries_are_right(exported: Exported) -> None:
    """Each ``promql`` block: an expression starts on an unindented line, indented lines
    continue it, ``#`` comments end a line."""
    blocks = re.findall(r"```promql\n(.*?)```", DOCS.read_text(), re.S)
    expressions: list[str] = []
    for block in blocks:
        for line in block.splitlines():
            code = line.split("#", 1)[0].rstrip()
            if not code:
                continue
            if code[0].isspace() and expressions:
                expressions[-1] += " " + code.strip()
            else:
                expressions.append(code)
    assert len(expressions) > 10
    for expr in expressions:
        errors = query_errors(expr, exported, targets=frozenset({"pod"}))
        assert not errors, f"{expr}: {errors}"


# --- the manifests ---------------------------------------------------------------------


def render(path: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [localcluster.kubectl(), "kustomize", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def with_monitoring(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """base plus the monitoring component, as a user's overlay writes it."""
    overlay = tmp_path_factory.mktemp("overlay")
    relative = {
        "base": os.path.relpath(REPO / "deploy/kustomize/base", overlay),
        "component": os.path.relpath(COMPONENT, overlay),
    }
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": "tessera",
                "resources": [relative["base"]],
                "components": [relative["component"]],
            }
        )
    )
    return render(overlay)


def _kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _metrics_workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Deployments and DaemonSets running a service that serves ``/metrics`` (not the
    MPS supervisor, ``node-agent mps-control``: the node agent reports its daemons)."""
    served = set(served_services())
    return [
        w
        for w in docs
        if w["kind"] in ("Deployment", "DaemonSet")
        and (args := w["spec"]["template"]["spec"]["containers"][0].get("args", [""]))[0] in served
        and args[1:2] != ["mps-control"]
    ]


def test_every_service_pod_carries_the_scrape_annotations() -> None:
    docs = render(REPO / "deploy/kustomize/base")
    [cm] = [
        d for d in _kind(docs, "ConfigMap") if d["metadata"]["name"].startswith("tessera-config")
    ]
    port = config.parse(yaml.safe_load(cm["data"]["tessera.yaml"])).telemetry.metrics_port
    workloads = _metrics_workloads(docs)
    assert {w["spec"]["template"]["spec"]["containers"][0]["args"][0] for w in workloads} == set(
        served_services()
    )
    for w in workloads:
        name = w["metadata"]["name"]
        template = w["spec"]["template"]
        annotations = template["metadata"].get("annotations", {})
        assert annotations.get("prometheus.io/scrape") == "true", name
        assert annotations.get("prometheus.io/path") == "/metrics", name
        assert annotations.get("prometheus.io/port") == str(port), name
        container = template["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        probed = container["readinessProbe"]["httpGet"]["port"]
        assert ports[probed] == port, f"{name}: /metrics is served beside /readyz"
        assert container["livenessProbe"]["httpGet"]["port"] == probed, name
    assert not [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com")], (
        "base must apply without the Prometheus Operator: monitors belong to the component"
    )


def test_the_monitors_find_every_service_and_its_metrics_port(
    with_monitoring: list[dict[str, Any]],
) -> None:
    docs = with_monitoring
    services = _kind(docs, "Service")
    workloads = _metrics_workloads(docs)
    scraped: set[str] = set()
    [monitor] = _kind(docs, "ServiceMonitor")
    chosen = [
        s
        for s in services
        if s["metadata"]["namespace"] == monitor["metadata"]["namespace"]
        and _matches(monitor["spec"]["selector"]["matchLabels"], s["metadata"].get("labels", {}))
    ]
    assert chosen, "the ServiceMonitor selects no Service"
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["path"] == "/metrics"
        assert endpoint["honorLabels"] is True
        for service in chosen:
            name = service["metadata"]["name"]
            assert service["spec"]["clusterIP"] == "None", f"{name}: every replica, headless"
            [port] = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
            pods = [
                w
                for w in workloads
                if _matches(
                    service["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"]
                )
            ]
            assert [w["kind"] for w in pods] == ["Deployment"], name
            container = pods[0]["spec"]["template"]["spec"]["containers"][0]
            assert port["targetPort"] in {p["name"] for p in container["ports"]}, name
            scraped.add(pods[0]["metadata"]["name"])
    [pod_monitor] = _kind(docs, "PodMonitor")
    for endpoint in pod_monitor["spec"]["podMetricsEndpoints"]:
        assert endpoint["path"] == "/metrics"
        assert endpoint["honorLabels"] is True
        for w in workloads:
            if _matches(
                pod_monitor["spec"]["selector"]["matchLabels"],
                w["spec"]["template"]["metadata"]["labels"],
            ):
                container = w["spec"]["template"]["spec"]["containers"][0]
                assert endpoint["port"] in {p["name"] for p in container["ports"]}
                scraped.add(w["metadata"]["name"])
    assert scraped == {w["metadata"]["name"] for w in workloads}, "every service is scraped"


def test_the_component_carries_the_dashboard_for_grafana(
    with_monitoring: list[dict[str, Any]],
) -> None:
    [cm] = [
        d
        for d in _kind(with_monitoring, "ConfigMap")
        if d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"
    ]
    assert cm["metadata"]["namespace"] == "tessera"
    assert json.loads(cm["data"]["tessera.json"]) == dashboard()
