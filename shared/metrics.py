"""Every service's ``/metrics``: OpenTelemetry instruments read out as Prometheus text.

One :class:`Metrics` per process (the runtime makes it: ``Runtime.metrics``), served on
the same port as ``/healthz`` (``telemetry.metricsPort``, shared/health.py). A service
adds its instruments at start:

- :meth:`Metrics.gauge`: a value read at each scrape from the service's own state (the
  ledger's per-device figures, each queue's share). Scrapes run on the event loop, so a
  callback reads state no handler is changing at that moment.
- :meth:`Metrics.counter` (plain integers, read at each scrape) and
  :meth:`Metrics.histogram`: counted as things happen.

The names are those users' dashboards already query (HAMi's scheduler and device
plugin, Volcano's scheduler; docs/metrics.md lists them all), plus ``tessera_*``.
Counters get Prometheus's ``_total`` suffix from the exporter; a histogram's name
carries its unit (``..._seconds``, ``..._milliseconds``), as Volcano's do.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import threading
from collections.abc import Callable, Iterable, Sequence

from aiohttp import web
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

Labels = dict[str, str]
Reading = Callable[[], Iterable[tuple[float, Labels]]]
"""A gauge's values now: (value, labels) pairs."""

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
"""Buckets of the ``tessera_*_seconds`` latency histograms."""
MILLISECONDS = tuple(5.0 * 2**i for i in range(15))
"""Volcano's latency buckets (5 ms doubling, to 82 s)."""


class Tally:
    """A counter's values by label set (see :meth:`Metrics.counter`)."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[tuple[tuple[str, str], ...], float] = {}

    def add(self, amount: float = 1, labels: Labels | None = None) -> None:
        """Count ``amount`` more (labels given in the same order each time)."""
        key = tuple(labels.items()) if labels else ()
        self.counts[key] = self.counts.get(key, 0) + amount

    def value(self, labels: Labels | None = None) -> float:
        """The count of one label set (0 when never counted); the labels in the order they were
        counted with."""
        return self.counts.get(tuple(labels.items()) if labels else (), 0)

    def observe(self, _options: CallbackOptions) -> list[Observation]:
        """Every label set's count, for the exporter at a scrape."""
        return [Observation(v, dict(k)) for k, v in list(self.counts.items())]


class Buckets:
    """A histogram's bucket counts and sums by label set, in plain numbers read at each
    scrape (see :meth:`Metrics.histogram`)."""

    __slots__ = ("bounds", "series")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(sorted(bounds))
        self.series: dict[tuple[tuple[str, str], ...], list[float]] = {}
        """Per label set: a count per bucket (the last is above every bound), then the sum."""

    def record(self, value: float, labels: Labels | None = None) -> None:
        """Count ``value`` (labels given in the same order each time)."""
        key = tuple(labels.items()) if labels else ()
        counts = self.series.get(key)
        if counts is None:
            counts = self.series[key] = [0.0] * (len(self.bounds) + 2)
        counts[bisect.bisect_left(self.bounds, value)] += 1  # the first bound >= value
        counts[-1] += value

    def family(self, name: str, description: str) -> Metric:
        """The histogram as Prometheus reads it: cumulative ``_bucket`` per ``le``."""
        family = Metric(name, description, "histogram")
        for key, counts in list(self.series.items()):
            labels = dict(key)
            seen = 0.0
            for bound, count in zip((*self.bounds, math.inf), counts, strict=False):
                seen += count
                family.add_sample(f"{name}_bucket", {**labels, "le": _le(bound)}, seen)
            family.add_sample(f"{name}_count", labels, seen)
            family.add_sample(f"{name}_sum", labels, counts[-1])
        return family


def _le(bound: float) -> str:
    return "+Inf" if bound == math.inf else repr(float(bound))


class _Histograms(Collector):
    """The registry's view of every :class:`Buckets` of one :class:`Metrics`."""

    def __init__(self) -> None:
        self.made: list[tuple[str, str, Buckets]] = []

    def collect(self) -> Iterable[Metric]:
        return [buckets.family(name, text) for name, text, buckets in self.made]

    def describe(self) -> Iterable[Metric]:
        return [Metric(name, text, "histogram") for name, text, _ in self.made]


class Metrics:
    """One process's registry: instruments in, Prometheus text out."""

    def __init__(self, scope: str, *, blocking: bool = False) -> None:
        """``blocking``: the gauges read files or devices; scrape off the event loop."""
        self.registry = CollectorRegistry(auto_describe=True)
        reader = PrometheusMetricReader(
            disable_target_info=True, scope_info_enabled=False, registry=self.registry
        )
        self.provider = MeterProvider(metric_readers=[reader])
        self.meter = self.provider.get_meter(scope)
        self.blocking = blocking
        self.prepare: list[Callable[[], None]] = []
        """Run before each scrape (one reading that several gauges then report)."""
        self._scrape = threading.Lock()
        self._histograms = _Histograms()
        self.registry.register(self._histograms)

    def gauge(self, name: str, description: str, read: Reading) -> None:
        """A gauge whose values ``read`` gives at each scrape."""

        def observe(_options: CallbackOptions) -> list[Observation]:
            return [Observation(value, labels) for value, labels in read()]

        self.meter.create_observable_gauge(name, callbacks=[observe], description=description)

    def counter(self, name: str, description: str) -> Tally:
        """A counter (``name`` without ``_total``: the exporter adds it), counted in plain
        integers and read at each scrape: an OpenTelemetry ``Counter.add`` with labels
        costs tens of microseconds, and services count several events per pod."""
        tally = Tally()
        self.meter.create_observable_counter(
            name, callbacks=[tally.observe], description=description
        )
        return tally

    def histogram(self, name: str, description: str, buckets: Sequence[float] = SECONDS) -> Buckets:
        """A histogram with explicit bucket bounds, in the unit its name says, counted in
        plain numbers and read at each scrape: an OpenTelemetry ``Histogram.record``
        costs 12-21 µs, and services record several latencies per pod."""
        made = Buckets(buckets)
        self._histograms.made.append((name, description, made))
        return made

    def text(self) -> bytes:
        """One scrape: every instrument, as Prometheus text."""
        with self._scrape:  # two scrapes at once would share one reading otherwise
            for step in self.prepare:
                step()
            return generate_latest(self.registry)

    async def scrape(self, _request: web.Request) -> web.Response:
        """``GET /metrics``."""
        body = await asyncio.to_thread(self.text) if self.blocking else self.text()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def route(self) -> web.RouteDef:
        """The ``GET /metrics`` route of a service's HTTP app."""
        return web.get("/metrics", self.scrape)

    def stages(self) -> Buckets:
        """``tessera_stage_latency_seconds``: each service records the stages it ends
        (``stage``: pending, the watcher's announcement after the pod's creation; ready,
        the gang sent to the allocator; decided; bound)."""
        return self.histogram(
            "tessera_stage_latency_seconds",
            "Time from one stage of a pod's placement to the next (stage: the later one).",
        )
