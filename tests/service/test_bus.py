"""The bus on a real nats-server: round trips, redelivery, trace context, inventory KV."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import nats.js.errors
import pytest
import uvloop
from nats.js.api import KeyValueConfig
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from shared import bus as bus_module
from shared import busauth
from shared import events as ev
from shared.aio import Acting
from shared.bus import Bus, Delivery, connect
from shared.config import NatsConfig, TelemetryConfig
from shared.core.model import PodRef, PodUID
from shared.telemetry import setup_tracing, tracer
from tests.helpers import eventually
from tests.samples import sample_events
from tools.localcluster import LocalCluster, free_port


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    memory = InMemorySpanExporter()
    setup_tracing("test", TelemetryConfig(), processor=SimpleSpanProcessor(memory))
    return memory


async def _collect(
    n: int, queue: asyncio.Queue[tuple[ev.AnyEvent, Delivery]], timeout_s: float = 10
) -> list[tuple[ev.AnyEvent, Delivery]]:
    out = []
    async with asyncio.timeout(timeout_s):
        while len(out) < n:
            out.append(await queue.get())
    return out


async def test_every_event_type_round_trips_through_jetstream(nats_cfg: NatsConfig) -> None:
    sent = sample_events()
    got: asyncio.Queue[tuple[ev.AnyEvent, Delivery]] = asyncio.Queue()

    async def handler(event: ev.AnyEvent, delivery: Delivery) -> None:
        await got.put((event, delivery))

    async with Bus(nats_cfg, name="test") as bus:
        await bus.publish(sent[0])
        await bus.publish_many(sent[1:])
        bus.consume("roundtrip", [ev.STREAM_SUBJECTS], handler)
        received = await _collect(len(sent), got)
    assert [e for e, _ in received] == sent
    assert [d.subject for _, d in received] == [e.subject() for e in sent]
    assert all(d.attempt == 1 for _, d in received)


async def test_a_republished_event_is_stored_once(nats_cfg: NatsConfig) -> None:
    decided = next(e for e in sample_events() if isinstance(e, ev.AllocationDecided))
    async with Bus(nats_cfg, name="test") as bus:
        await bus.publish(decided)
        once = await bus.js.stream_info(nats_cfg.stream)
        await bus.publish(decided)  # a retry after a lost ack: same Nats-Msg-Id
        again = await bus.js.stream_info(nats_cfg.stream)
    # Counted as a difference: one run of the suite found the previous test's 21
    # messages still in the fresh stream (a machine loaded by a stray API server).
    assert again.state.messages == once.state.messages
    assert again.state.last_seq == once.state.last_seq


async def test_consumer_that_dies_before_ack_gets_the_message_again(nats_cfg: NatsConfig) -> None:
    event = sample_events()[0]
    first_seen = asyncio.Event()

    async def dies(_event: ev.AnyEvent, _delivery: Delivery) -> None:
        first_seen.set()
        await asyncio.sleep(3600)  # never returns: the process "crashes" below

    async with Bus(nats_cfg, name="publisher") as publisher:
        await publisher.publish(event)

    crashing = Bus(nats_cfg, name="crashing")
    await crashing.connect()
    crashing.consume("worker", [ev.STREAM_SUBJECTS], dies)
    async with asyncio.timeout(10):
        await first_seen.wait()
    await crashing.close()  # cancels the handler mid-flight: nothing was acked

    got: asyncio.Queue[tuple[ev.AnyEvent, Delivery]] = asyncio.Queue()

    async def survives(e: ev.AnyEvent, d: Delivery) -> None:
        await got.put((e, d))

    async with Bus(nats_cfg, name="restarted") as restarted:
        restarted.consume("worker", [ev.STREAM_SUBJECTS], survives)  # same durable
        [(again, delivery)] = await _collect(1, got)
        await asyncio.sleep(1.5)  # past ack_wait: an acked message must not come back
        assert got.empty()
    assert again == event
    assert delivery.attempt == 2


async def test_handler_error_naks_and_the_event_is_redelivered(nats_cfg: NatsConfig) -> None:
    event = sample_events()[1]
    attempts: list[int] = []
    done = asyncio.Event()

    async def flaky(_e: ev.AnyEvent, d: Delivery) -> None:
        attempts.append(d.attempt)
        if d.attempt < 3:
            raise RuntimeError("transient")
        done.set()

    async with Bus(nats_cfg, name="test") as bus:
        await bus.publish(event)
        bus.consume("flaky", [ev.STREAM_SUBJECTS], flaky)
        async with asyncio.timeout(10):
            await done.wait()
    assert attempts == [1, 2, 3]


async def test_acks_gathered_when_the_consumer_stops_are_sent_before_it_lets_go(
    nats_cfg: NatsConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Acks wait for others (``ACK_DELAY_S``, made long here); a consumer stopped
    meanwhile sends them, so nothing it handled comes again."""
    monkeypatch.setattr(bus_module, "ACK_DELAY_S", 30.0)
    sent = sample_events()[:3]
    got: asyncio.Queue[tuple[ev.AnyEvent, Delivery]] = asyncio.Queue()

    async def handler(e: ev.AnyEvent, d: Delivery) -> None:
        await got.put((e, d))

    async with Bus(nats_cfg, name="test") as bus:
        await bus.publish_many(sent)
        bus.consume("gathered", [ev.STREAM_SUBJECTS], handler)
        assert [e for e, _ in await _collect(3, got)] == sent
        info = await bus.js.consumer_info(nats_cfg.stream, "gathered")
        assert info.num_ack_pending == 3  # handled, the acks still gathered
    async with Bus(nats_cfg, name="restarted") as bus:
        bus.consume("gathered", [ev.STREAM_SUBJECTS], handler)  # same durable
        await asyncio.sleep(1.5)  # past ack_wait: an acked message must not come back
        assert got.empty()
        info = await bus.js.consumer_info(nats_cfg.stream, "gathered")
        assert info.num_ack_pending == 0


async def test_a_pull_request_whose_renewal_is_lost_is_asked_again(
    nats_cfg: NatsConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One message per request, and the renewal after it lost (a server gone, a
    reconnect): the consumer asks again once the request's answer is overdue, and the
    next event still arrives."""

    async def lost(_self: object) -> None:
        return None

    monkeypatch.setattr(bus_module._Pull, "renew", lost)
    first, second = sample_events()[:2]
    got: asyncio.Queue[tuple[ev.AnyEvent, Delivery]] = asyncio.Queue()

    async def handler(e: ev.AnyEvent, d: Delivery) -> None:
        await got.put((e, d))

    async with Bus(nats_cfg, name="test") as bus:
        await bus.publish(first)
        bus.consume("renewed", [ev.STREAM_SUBJECTS], handler, batch=1)
        assert [e for e, _ in await _collect(1, got)] == [first]
        await bus.publish(second)  # no request is waiting for it now
        overdue = bus_module.PULL_EXPIRES_S + bus_module.PULL_GRACE_S
        assert [e for e, _ in await _collect(1, got, timeout_s=overdue + 3)] == [second]


async def test_a_burst_of_many_requests_worth_flows_without_waiting_on_renewals(
    nats_cfg: NatsConfig,
) -> None:
    """Fifteen requests' worth of events at once: each request is renewed as its last
    event arrives, none waits for the overdue check (fifteen of those would take 22 s)."""
    pods = [
        ev.PodDeleted(pod=PodRef(namespace="burst", name=f"p{i}", uid=PodUID(f"burst-{i}")))
        for i in range(120)
    ]
    got: asyncio.Queue[tuple[ev.AnyEvent, Delivery]] = asyncio.Queue()

    async def handler(e: ev.AnyEvent, d: Delivery) -> None:
        await got.put((e, d))

    async with Bus(nats_cfg, name="test") as bus:
        await bus.publish_many(pods)
        bus.consume("burst", [ev.PodDeleted.filter_subject()], handler, batch=8)
        overdue = bus_module.PULL_EXPIRES_S + bus_module.PULL_GRACE_S
        received = await _collect(len(pods), got, timeout_s=overdue)
    assert [e for e, _ in received] == pods


async def test_a_handler_slower_than_a_request_leaves_one_request_waiting(
    nats_cfg: NatsConfig,
) -> None:
    """A handler busy past the request's expiry: the consumer asks again meanwhile, and
    the first request's end, read late, must not renew it beside the second (requests
    would pile up on the server, one more per slow handler)."""
    first, second = sample_events()[:2]
    got: asyncio.Queue[tuple[ev.AnyEvent, Delivery]] = asyncio.Queue()
    overdue = bus_module.PULL_EXPIRES_S + bus_module.PULL_GRACE_S

    async def slow_once(e: ev.AnyEvent, d: Delivery) -> None:
        if e == first:
            await asyncio.sleep(overdue + 0.7)
        await got.put((e, d))

    async with Bus(nats_cfg, name="test") as bus:
        await bus.publish(first)
        bus.consume("slow", [ev.STREAM_SUBJECTS], slow_once, ack_wait_s=30)
        assert [e for e, _ in await _collect(1, got, timeout_s=10)] == [first]
        await asyncio.sleep(2 * bus_module.PULL_EXPIRES_S + 0.5)  # a few renewals
        info = await bus.js.consumer_info(nats_cfg.stream, "slow")
        assert info.num_waiting == 1
        await bus.publish(second)
        assert [e for e, _ in await _collect(1, got)] == [second]


async def test_a_consumer_deleted_under_it_is_asked_again_calmly_until_it_is_back(
    nats_cfg: NatsConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """The server ends a pull with an error (the durable deleted by hand: 409, then no
    one answering): the consumer says so once, asks again at a calm pace, and takes
    events again once the durable is back."""
    first, second = sample_events()[:2]
    got: asyncio.Queue[tuple[ev.AnyEvent, Delivery]] = asyncio.Queue()

    async def handler(e: ev.AnyEvent, d: Delivery) -> None:
        await got.put((e, d))

    async with Bus(nats_cfg, name="test") as bus:
        bus.consume("deleted", [ev.STREAM_SUBJECTS], handler, deliver="new")
        await eventually(lambda: _exists(bus, "deleted"), what="the durable")
        await bus.publish(first)
        assert [e for e, _ in await _collect(1, got)] == [first]
        published = bus.nc.stats["out_msgs"]
        await bus.js.delete_consumer(nats_cfg.stream, "deleted")
        await asyncio.sleep(2.0)
        asked = bus.nc.stats["out_msgs"] - published
        assert asked <= 2.0 / bus_module.RETRY_WAIT_S + 2  # no request a turn of the loop
        warned = [r for r in caplog.records if "pull on deleted answered" in r.getMessage()]
        assert len(warned) == 1
        await bus.ensure_consumer("deleted", [ev.STREAM_SUBJECTS], deliver="new")
        await bus.publish(second)
        assert [e for e, _ in await _collect(1, got, timeout_s=5)] == [second]


async def _exists(bus: Bus, durable: str) -> bool:
    try:
        await bus.js.consumer_info(bus.cfg.stream, durable)
    except Exception:
        return False
    return True


async def test_consumer_filters_by_subject(nats_cfg: NatsConfig) -> None:
    got: asyncio.Queue[tuple[ev.AnyEvent, Delivery]] = asyncio.Queue()

    async def handler(e: ev.AnyEvent, d: Delivery) -> None:
        await got.put((e, d))

    async with Bus(nats_cfg, name="test") as bus:
        bus.consume("allocations", ["tessera.v1.allocation.>"], handler)
        samples = sample_events()
        await bus.publish_many(samples)
        wanted = sum(e.subject().startswith("tessera.v1.allocation.") for e in samples)
        received = await _collect(wanted, got)
        await asyncio.sleep(0.3)
        assert got.empty()
    assert all(d.subject.startswith("tessera.v1.allocation.") for _, d in received)


def _by_name(spans: tuple[ReadableSpan, ...], prefix: str) -> ReadableSpan:
    return next(s for s in spans if s.name.startswith(prefix))


async def test_trace_context_survives_a_hop(
    nats_cfg: NatsConfig, exporter: InMemorySpanExporter
) -> None:
    exporter.clear()
    seen: asyncio.Queue[trace.SpanContext] = asyncio.Queue()

    async def handler(_e: ev.AnyEvent, _d: Delivery) -> None:
        await seen.put(trace.get_current_span().get_span_context())

    event = sample_events()[0]
    async with Bus(nats_cfg, name="test") as bus:
        with tracer().start_as_current_span("watcher: pod pending") as root:
            await bus.publish(event)
        bus.consume("traced", [ev.STREAM_SUBJECTS], handler)
        async with asyncio.timeout(10):
            handler_ctx = await seen.get()
    spans = exporter.get_finished_spans()
    producer = _by_name(spans, "send tessera.v1.pod.pending")
    consumer = _by_name(spans, "process tessera.v1.pod.pending")
    trace_id = root.get_span_context().trace_id
    assert producer.kind == SpanKind.PRODUCER
    assert consumer.kind == SpanKind.CONSUMER
    assert producer.context is not None
    assert consumer.context is not None
    assert producer.context.trace_id == consumer.context.trace_id == trace_id
    assert consumer.parent is not None
    assert consumer.parent.span_id == producer.context.span_id
    assert handler_ctx.trace_id == trace_id


def _pods(tag: str, n: int, namespace: str = "burst") -> list[ev.Event]:
    return [
        ev.PodDeleted(pod=PodRef(namespace=namespace, name=f"{tag}-{i}", uid=PodUID(f"{tag}-{i}")))
        for i in range(n)
    ]


async def test_a_burst_of_pod_events_travels_in_few_messages_and_arrives_whole_in_order(
    nats_cfg: NatsConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Consecutive events of a batched type on one subject, published together, go as
    one message (up to ``BATCH_MAX``); a decision between them (``allocation.*``, which
    external tools read one by one), another namespace or a trace to carry on splits the
    run. The consumer gets every event, in order. Fails if batches are not formed, if
    an event of a batch is lost or reordered, or if a traced event loses its trace."""
    monkeypatch.setattr(bus_module, "recording", lambda: False)  # as with nothing exported
    decided = next(e for e in sample_events() if isinstance(e, ev.AllocationDecided))
    root = trace.SpanContext(
        trace_id=0x5EED, span_id=0xB0B, is_remote=True, trace_flags=trace.TraceFlags(1)
    )
    traced = trace.set_span_in_context(trace.NonRecordingSpan(root))
    sent = [
        *_pods("a", bus_module.BATCH_MAX + 10),  # two messages
        decided,  # alone
        *_pods("b", 5),  # one
        *_pods("c", 3, namespace="other"),  # one: another subject
        *_pods("d", 1),  # alone: in a trace
        *_pods("e", 2),  # one
    ]
    contexts: list[otel_context.Context | None] = [None] * len(sent)
    contexts[-3] = traced
    got: asyncio.Queue[tuple[ev.AnyEvent, Delivery]] = asyncio.Queue()
    trace_ids: list[int] = []

    async def handler(event: ev.AnyEvent, delivery: Delivery) -> None:
        trace_ids.append(trace.get_current_span().get_span_context().trace_id)
        await got.put((event, delivery))

    async with Bus(nats_cfg, name="test") as bus:
        before = (await bus.js.stream_info(nats_cfg.stream)).state.last_seq
        await bus.publish_many(sent, contexts)
        after = (await bus.js.stream_info(nats_cfg.stream)).state.last_seq
        bus.consume("burst", [ev.STREAM_SUBJECTS], handler, deliver="all")
        received = await _collect(len(sent) + before, got)
    mine = [(e, d) for e, d in received if d.stream_seq > before]
    assert after - before == 7
    assert [e for e, _ in mine] == sent
    assert trace_ids[before:][len(sent) - 3] == root.trace_id
    assert [d.stream_seq for e, d in mine if e in sent[:5]] == [before + 1] * 5


async def test_a_batch_stays_under_its_byte_limit(
    nats_cfg: NatsConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run is cut where the next event would take its message past ``BATCH_BYTES`` (a
    message over the server's ``max_payload`` would be refused whole)."""
    monkeypatch.setattr(bus_module, "recording", lambda: False)
    sent = _pods("h", 10)
    size = max(len(ev.encode(e)) for e in sent)  # emitted_at's digits vary by a byte
    monkeypatch.setattr(bus_module, "BATCH_BYTES", 3 * size + 4)  # three, with "[,,]"
    got: asyncio.Queue[tuple[ev.AnyEvent, Delivery]] = asyncio.Queue()

    async def handler(event: ev.AnyEvent, delivery: Delivery) -> None:
        await got.put((event, delivery))

    async with Bus(nats_cfg, name="test") as bus:
        await bus.publish_many(sent)
        stored = (await bus.js.stream_info(nats_cfg.stream)).state.messages
        bus.consume("sized", [ev.STREAM_SUBJECTS], handler)
        received = await _collect(len(sent), got)
    assert stored == 4  # 3 + 3 + 3 + 1
    assert [e for e, _ in received] == sent


async def test_a_failing_event_of_a_batch_redelivers_the_batch_and_the_others_are_handled(
    nats_cfg: NatsConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The events of a batch are handled one by one; one whose handler fails has the
    whole message delivered again (its batch-mates handled again: handlers are
    idempotent), and an event that cannot be decoded is dropped alone."""
    monkeypatch.setattr(bus_module, "recording", lambda: False)
    sent = _pods("f", 4)
    handled: list[tuple[str, int]] = []
    done = asyncio.Event()

    async def flaky(event: ev.AnyEvent, delivery: Delivery) -> None:
        assert isinstance(event, ev.PodDeleted)
        handled.append((event.pod.name, delivery.attempt))
        if event.pod.name == "f-1" and delivery.attempt < 2:
            raise RuntimeError("transient")
        if {("f-3", 2), ("g-1", 1)} <= set(handled):
            done.set()

    async with Bus(nats_cfg, name="test") as bus:
        await bus.publish_many(sent)
        broken = [ev.encode(e) for e in _pods("g", 2)]
        broken.insert(1, b'{"type": "pod.deleted", "pod": 7}')
        await bus.nc.publish(
            sent[0].subject(),
            b"[" + b",".join(broken) + b"]",
            headers={bus_module.BATCH_HEADER: "3"},
        )
        bus.consume("flaky-batch", [ev.PodDeleted.filter_subject()], flaky, deliver="all")
        async with asyncio.timeout(10):
            await done.wait()
    # The batch that failed comes again after its backoff, the next one meanwhile.
    assert [h for h in handled if h[1] == 1] == [
        *[(f"f-{i}", 1) for i in range(4)],
        ("g-0", 1),
        ("g-1", 1),  # its undecodable middle event dropped, with a log line
    ]
    assert [h for h in handled if h[1] == 2] == [(f"f-{i}", 2) for i in range(4)]


async def test_inventory_kv_keeps_the_latest_per_node(nats_cfg: NatsConfig) -> None:
    inv = next(e for e in sample_events() if isinstance(e, ev.NodeInventory))
    newer = ev.NodeInventory(node=inv.node, devices=inv.devices[:1], config_hash="h2", seq=8)
    other = ev.NodeInventory(node=ev.NodeName("n2"), devices=(), config_hash="h2")
    async with Bus(nats_cfg, name="agent") as bus:
        assert await bus.inventories() == {}
        await bus.put_inventory(inv)
        await bus.put_inventory(newer)
        await bus.put_inventory(other)
    async with Bus(nats_cfg, name="allocator") as fresh:
        assert await fresh.inventories() == {inv.node: newer, other.node: other}
        await fresh.delete_inventory(other.node)
        await fresh.delete_inventory(other.node)  # idempotent
        assert set(await fresh.inventories()) == {inv.node}


async def test_an_inventory_read_that_finds_nothing_in_a_full_bucket_reads_again(
    nats_cfg: NatsConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nats-py's watcher can give its end marker before anything when its consumer has
    not counted what is pending yet (seen after a failover: an allocator started with no
    devices). A read that finds nothing in a bucket that holds values is read again; an
    empty bucket is read once."""
    inv = next(e for e in sample_events() if isinstance(e, ev.NodeInventory))
    async with Bus(nats_cfg, name="allocator") as bus:
        real = bus._inventories
        reads: list[int] = []

        async def first_read_misses(timeout_s: float) -> dict[Any, ev.NodeInventory]:
            reads.append(1)
            return {} if len(reads) == 1 else await real(timeout_s)

        monkeypatch.setattr(bus, "_inventories", first_read_misses)
        assert await bus.inventories() == {}
        assert len(reads) == 1  # empty bucket: nothing to read again
        await bus.put_inventory(inv)
        reads.clear()
        assert await bus.inventories() == {inv.node: inv}
        assert len(reads) == 2


async def test_concurrent_handlers_run_together_and_all_are_acked(nats_cfg: NatsConfig) -> None:
    sent = sample_events()
    in_flight = 0
    peak = 0
    done: asyncio.Queue[ev.AnyEvent] = asyncio.Queue()

    async def slow(e: ev.AnyEvent, _d: Delivery) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.2)
        in_flight -= 1
        await done.put(e)

    async with Bus(nats_cfg, name="test") as bus:
        await bus.publish_many(sent)
        bus.consume("parallel", [ev.STREAM_SUBJECTS], slow, concurrency=8)
        async with asyncio.timeout(10):
            got = [await done.get() for _ in sent]

            # acks follow the handlers' return: wait until the server has them all
            async def all_acked() -> bool:
                info = await bus.js.consumer_info(nats_cfg.stream, "parallel")
                return info.num_ack_pending == 0

            await eventually(all_acked, timeout_s=10, what="every message acked")

    assert sorted(e.event_id for e in got) == sorted(e.event_id for e in sent)
    assert peak == 8


async def test_publishes_made_at_once_go_out_together_in_the_order_asked(
    nats_cfg: NatsConfig,
) -> None:
    pods = [PodRef(namespace="default", name=f"p{i}", uid=PodUID(f"u{i}")) for i in range(64)]
    sent = [ev.PodDeleted(pod=pod) for pod in pods]
    async with Bus(nats_cfg, name="test") as bus:
        writes = []
        store = bus._publish_many

        async def counted(batch: Any, contexts: Any) -> None:
            writes.append(len(batch))
            await store(batch, contexts)

        bus._publish_many = counted  # type: ignore[method-assign]
        await asyncio.gather(*(bus.publish(e) for e in sent))
        # Asked for in one turn of the loop: one pipelined write (not a round trip each).
        assert writes == [64]
        got: asyncio.Queue[tuple[ev.AnyEvent, Delivery]] = asyncio.Queue()

        async def keep(e: ev.AnyEvent, d: Delivery) -> None:
            await got.put((e, d))

        bus.consume("order", [ev.STREAM_SUBJECTS], keep)
        stored = await _collect(64, got)
    assert [e.event_id for e, _ in stored] == [e.event_id for e in sent]


async def test_every_caller_of_a_write_that_failed_is_told_and_the_next_write_goes_out(
    nats_cfg: NatsConfig,
) -> None:
    pods = [PodRef(namespace="default", name=f"p{i}", uid=PodUID(f"u{i}")) for i in range(3)]
    async with Bus(nats_cfg, name="test") as bus:
        store = bus._publish_many
        failing = True

        async def once(batch: Any, contexts: Any) -> None:
            if failing:
                raise RuntimeError("refused")
            await store(batch, contexts)

        bus._publish_many = once  # type: ignore[method-assign]
        results = await asyncio.gather(
            *(bus.publish(ev.PodDeleted(pod=p)) for p in pods), return_exceptions=True
        )
        assert [str(r) for r in results] == ["refused"] * 3
        failing = False
        await bus.publish(ev.PodDeleted(pod=pods[0]))
        info = await bus.js.stream_info(nats_cfg.stream)
        assert info.state.messages == 1


@pytest.mark.parametrize(
    "loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"]
)
def test_closing_a_tls_connection_makes_the_event_loop_warn_nothing(
    nats_cfg: NatsConfig,
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A TLS connection to NATS opened and closed, on asyncio's loop and on uvloop (the
    services' loop): the stream's protocol knows it is over TLS (shared/bus.py
    ``_OneWriteTransport.connect_tls``), so neither loop logs "returning true from
    eof_received() has no effect when using ssl", nor any other warning."""

    async def open_and_close() -> None:
        nc = await connect(nats_cfg, "admin")
        assert nc._transport is not None
        assert nc._transport._io_writer.get_extra_info("ssl_object") is not None  # TLS
        await nc.flush()
        await nc.close()
        await asyncio.sleep(0.1)  # the transport's last callbacks

    with (
        caplog.at_level(logging.DEBUG, logger="asyncio"),
        asyncio.Runner(loop_factory=loop_factory) as runner,
    ):
        for _ in range(3):
            runner.run(open_and_close())
    assert [
        r.getMessage()
        for r in caplog.records
        if r.name == "asyncio" and r.levelno >= logging.WARNING
    ] == []


def test_ping_without_a_server_fails_within_seconds_with_one_line() -> None:
    """``tessera ping`` is a command someone waits for: no NATS, one line and exit 1."""
    port = free_port()  # nothing listens there
    started = time.monotonic()
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "tessera"),
            "ping",
            "--nats",
            f"nats://127.0.0.1:{port}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, "TESSERA_CONFIG": ""},
    )
    assert proc.returncode == 1
    assert time.monotonic() - started < 5
    assert proc.stderr.strip().splitlines() == [
        f"tessera ping: cannot reach NATS at nats://127.0.0.1:{port}: NoServersError()"
    ]


async def test_a_leader_keeps_its_lease_through_a_start_longer_than_the_lease(
    nats_cfg: NatsConfig,
) -> None:
    """Regression: the lease was renewed only once ``start`` returned, and an allocator
    rebuilding 6,250 nodes (22 s) lost a 15 s lease the moment it was ready."""
    from shared import busauth
    from shared.config import Config, SchedulerConfig
    from shared.runtime import Service, run_service

    started = asyncio.Event()

    class SlowStart(Service):
        NAME = "binder"  # a leading service's user and lease key
        USES_API = False

        async def start(self) -> None:
            await asyncio.sleep(2.5)  # 2.5 leases
            started.set()

    lease_s = 1.0
    cfg = Config(nats=nats_cfg, scheduler=SchedulerConfig(leader_lease_s=lease_s))
    stop = asyncio.Event()
    running = asyncio.create_task(run_service(SlowStart, cfg, stop=stop))
    try:
        await asyncio.wait_for(started.wait(), timeout=10)
        await asyncio.sleep(2 * lease_s)
        assert not running.done(), running.exception()
        nc = await connect(nats_cfg, busauth.ADMIN)
        try:
            kv = await nc.jetstream().key_value(busauth.LEASE_BUCKET)
            holder = (await kv.get("binder")).value or b""
            assert holder.decode().endswith(f"-{os.getpid()}")
        finally:
            await nc.close()
    finally:
        stop.set()
        await asyncio.wait_for(running, timeout=10)


async def test_a_publish_whose_ack_never_comes_is_given_up_not_waited_for_ever(
    nats_cfg: NatsConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nats.errors

    from shared import bus as bus_module

    monkeypatch.setattr(bus_module, "PUBLISH_ACK_S", 0.2)
    monkeypatch.setattr(bus_module, "FAILOVER_S", 0.5)
    async with Bus(nats_cfg, name="test") as bus:
        acks = bus._acks
        assert acks is not None
        assert acks.sub is not None
        await acks.sub.unsubscribe()  # JetStream stores and answers; no answer arrives
        pod = PodRef(namespace="default", name="p", uid=PodUID("u"))
        sent = acks.sent
        started = time.monotonic()
        with pytest.raises(nats.errors.TimeoutError):
            async with asyncio.timeout(5):  # (it waited for ever: a plain TimeoutError here)
                await bus.publish(ev.PodDeleted(pod=pod))
        assert time.monotonic() - started < 5
        assert acks.sent - sent >= 2  # tried again within the failover window
        assert not acks.waiting  # every answer given up is forgotten


async def test_jetstreams_answers_settle_each_publish_with_its_own_outcome(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each answer on the acks inbox settles the publish its subject names: stored; a
    JetStream error as nats-py's own error class; no stream yet as an error
    ``through_failover`` retries; "not now" (a resend still being stored, too many
    requests, a server error, an unreadable answer) as a lost answer, which times out;
    an answer for no one waiting (late, given up) changes nothing; a wait cancelled
    forgets its publishes."""
    import nats.errors
    import nats.js.errors
    from nats.aio.msg import Msg

    monkeypatch.setattr(bus_module, "PUBLISH_ACK_S", 0.1)
    acks = bus_module._Acks("_INBOX.test")

    def answer(reply: str, data: bytes, headers: dict[str, str] | None = None) -> Msg:
        return Msg(_client=None, subject=reply, data=data, headers=headers)  # type: ignore[arg-type]

    def error(code: int, err_code: int, text: str) -> bytes:
        return json.dumps(
            {"error": {"code": code, "err_code": err_code, "description": text}}
        ).encode()

    stored, refused, nobody, garbled, in_process, too_many, broken, odd = (
        acks.expect() for _ in range(8)
    )
    await acks.on_answer(answer(stored[0], b'{"stream":"TESSERA","seq":7}'))
    await acks.on_answer(answer(refused[0], error(400, 10060, "expected stream differs")))
    await acks.on_answer(answer(nobody[0], b"", {"Status": "503"}))
    await acks.on_answer(answer(garbled[0], b"not json"))
    await acks.on_answer(answer(in_process[0], error(409, 10158, "duplicate in process")))
    await acks.on_answer(answer(too_many[0], error(429, 10167, "too many requests")))
    await acks.on_answer(answer(broken[0], error(500, 10000, "server error")))
    await acks.on_answer(answer(odd[0], b'{"error":{"description":"no code"}}'))
    await acks.on_answer(answer("_INBOX.test.99", b'{"stream":"TESSERA","seq":8}'))
    assert stored[1].result() is None
    assert isinstance(refused[1].exception(), nats.js.errors.BadRequestError)
    assert not isinstance(refused[1].exception(), bus_module.TRANSIENT)
    assert isinstance(nobody[1].exception(), nats.js.errors.NoStreamResponseError)
    for lost in (garbled, in_process, too_many, broken):  # time out, and are sent again
        assert not lost[1].done(), lost[0]
    assert isinstance(odd[1].exception(), nats.js.errors.APIError)
    assert not acks.waiting
    with pytest.raises(nats.js.errors.BadRequestError):
        await acks.wait([stored, refused])
    with pytest.raises(nats.errors.TimeoutError):
        await acks.wait([stored, in_process])
    assert in_process[1].cancelled()

    pending = [acks.expect() for _ in range(3)]
    waiter = asyncio.create_task(acks.wait(pending))
    await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not acks.waiting
    assert all(a.cancelled() for _, a in pending)


async def test_a_flush_of_many_commands_is_one_write_on_the_tls_connection(
    nats_cfg: NatsConfig,
) -> None:
    """nats-py flushes its pending commands with ``writelines``; on TLS each would be a
    record of its own (shared/bus.py ``_OneWriteTransport``): they go as one buffer, and
    arrive whole and in order."""
    nc = await connect(nats_cfg, "admin")
    try:
        transport = nc._transport
        assert isinstance(transport, bus_module._OneWriteTransport)
        assert transport._io_writer is not None
        assert transport._io_writer.get_extra_info("ssl_object") is not None  # TLS
        sub = await nc.subscribe("tessera.test.one-write")
        writes: list[int] = []
        real = transport._io_writer

        class Counting:
            def write(self, data: bytes) -> None:
                writes.append(len(data))
                real.write(data)

            def writelines(self, data: list[bytes]) -> None:  # what nats-py would call
                raise AssertionError("writelines reached the TLS stream")

            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

        transport._io_writer = Counting()  # type: ignore[assignment]
        for i in range(200):
            await nc.publish("tessera.test.one-write", str(i).encode())
        await nc.flush()
        transport._io_writer = real
        assert len(writes) <= 2  # the 200 publishes (and the flush's PING) in one or two
        got = [(await sub.next_msg(timeout=5)).data for _ in range(200)]
        assert got == [str(i).encode() for i in range(200)]
        await sub.unsubscribe()
    finally:
        await nc.close()


async def _fresh_lease_bucket(js: Any) -> None:
    with contextlib.suppress(nats.js.errors.NotFoundError, nats.js.errors.BucketNotFoundError):
        await js.delete_key_value(busauth.LEASE_BUCKET)


async def test_a_lease_rides_out_a_short_bus_pause_and_its_holder_pauses_then_resumes_a_long_one(
    nats_cfg: NatsConfig, nats_server: LocalCluster
) -> None:
    """The NATS server stopped (SIGSTOP: no answer, no closed connection, as while
    JetStream elects a leader): a holder keeps its lease through a pause shorter than
    the lease; through a longer one it stops acting once a whole lease has passed since
    its last renewal (not when its renewal request times out later), keeps the lease
    (nobody can take it while the bus does not answer) and acts again within a renewal
    retry of the bus answering. The standby, waiting all along, never takes it."""
    from shared.bus import Lease

    lease_s = 1.5
    admin = await connect(nats_cfg, busauth.ADMIN)
    await _fresh_lease_bucket(admin.jetstream())
    async with Bus(nats_cfg, name="test") as bus:
        lease = Lease(bus, "pause-test", "me", lease_s)
        await lease.acquire()
        holding = asyncio.create_task(lease.hold())
        standby = Lease(bus, "pause-test", "standby", lease_s)
        waiting = asyncio.create_task(standby.acquire())
        try:
            await asyncio.sleep(lease_s / 2)
            nats_server.pause_nats()
            await asyncio.sleep(lease_s * 0.6)
            nats_server.pause_nats(paused=False)
            await asyncio.sleep(lease_s)
            assert lease.acting.is_set()
            assert not holding.done(), holding

            nats_server.pause_nats()
            paused = time.monotonic()
            await eventually(
                lambda: _truthy(not lease.acting.is_set()),
                timeout_s=lease_s + 1,
                interval_s=0.02,
                what="the holder paused",
            )
            # renewed at most a third of the lease before the pause
            assert time.monotonic() - paused <= lease_s + 0.3
            await asyncio.sleep(6 - (time.monotonic() - paused))  # an election's length
            assert not holding.done()
            assert not waiting.done()
            nats_server.pause_nats(paused=False)
            back = time.monotonic()
            await asyncio.wait_for(lease.acting.wait(), timeout=5)
            assert time.monotonic() - back <= bus_module.RENEW_RETRY_S + 1.0
            await asyncio.sleep(2 * lease_s)
            assert not holding.done()
            assert not waiting.done()
            kv = await admin.jetstream().key_value(busauth.LEASE_BUCKET)
            assert (await kv.get("pause-test")).value == b"me"
        finally:
            nats_server.pause_nats(paused=False)
            for task in (holding, waiting):
                task.cancel()
            await asyncio.gather(holding, waiting, return_exceptions=True)
        started = time.monotonic()
        await lease.release()  # given back: the key is gone
        assert time.monotonic() - started < 1
    kv = await admin.jetstream().key_value(busauth.LEASE_BUCKET)
    with pytest.raises(nats.js.errors.KeyNotFoundError):
        await kv.get("pause-test")
    await admin.close()


class _Link:
    """A TCP relay to a server that can be cut (``cut``: nothing passes either way, no
    connection closes, what was sent arrives once ``restore``d), as a network partition
    between one client and the bus looks to both."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.up = asyncio.Event()
        self.up.set()
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    await self.up.wait()
                    dst.write(data)
                    await dst.drain()
            dst.close()

        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(pipe(src, dst))
            self._pipes.add(task)

    async def close(self) -> None:
        self.server.close()
        for task in self._pipes:
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)


async def test_a_holder_cut_off_from_the_bus_pauses_before_a_standby_takes_over_and_stops_when_back(
    nats_cfg: NatsConfig,
) -> None:
    """Only the holder loses the bus (its link cut, the standby's not): it stops acting
    a whole lease after its last renewal; the standby, which counts a whole lease from
    first seeing that renewal, takes the lease after that and never before; when the
    link is back the old holder's renewal is refused (fenced by the revision) and it
    stops for good."""
    from urllib.parse import urlsplit

    from shared.bus import Lease, LeaseLostError

    lease_s = 1.5
    admin = await connect(nats_cfg, busauth.ADMIN)
    await _fresh_lease_bucket(admin.jetstream())
    server = urlsplit(nats_cfg.url)
    link = _Link(server.port or 4222)
    port = await link.start()
    cut_off = msgspec.structs.replace(nats_cfg, url=f"{server.scheme}://127.0.0.1:{port}")
    async with Bus(cut_off, name="test") as far, Bus(nats_cfg, name="test") as near:
        holder = Lease(far, "partition-test", "holder", lease_s)
        await holder.acquire()
        holding = asyncio.create_task(holder.hold())
        standby = Lease(near, "partition-test", "standby", lease_s)
        waiting = asyncio.create_task(standby.acquire())
        paused_at: list[float] = []

        async def note_pause() -> None:
            await eventually(
                lambda: _truthy(not holder.acting.is_set()), interval_s=0.01, what="a pause"
            )
            paused_at.append(time.monotonic())

        noting = asyncio.create_task(note_pause())
        try:
            await asyncio.sleep(lease_s)
            assert not waiting.done()
            link.up.clear()
            cut = time.monotonic()
            await asyncio.wait_for(waiting, timeout=3 * lease_s)
            taken = time.monotonic()
            assert paused_at, "the holder still acts"
            assert paused_at[0] < taken, (paused_at, taken)
            assert taken - cut <= 2 * lease_s
            assert not holding.done()
            link.up.set()
            with pytest.raises(LeaseLostError, match="holder lost the partition-test lease"):
                await asyncio.wait_for(holding, timeout=10)
            assert not holder.acting.is_set()
            assert standby.acting.is_set()
            kv = await admin.jetstream().key_value(busauth.LEASE_BUCKET)
            assert (await kv.get("partition-test")).value == b"standby"
            await holder.release()  # lost: nothing given back
            assert (await kv.get("partition-test")).value == b"standby"
        finally:
            link.up.set()
            for task in (holding, waiting, noting):
                task.cancel()
            await asyncio.gather(holding, waiting, noting, return_exceptions=True)
    await link.close()
    await admin.close()


async def test_the_lease_bucket_never_expires_its_keys_and_an_older_one_is_brought_to_that(
    nats_cfg: NatsConfig,
) -> None:
    """A bucket made by an older release expired its keys after the lease, so a key
    could vanish during a JetStream election and a standby take it: a holder that may
    not change the bucket renews within that expiry; the allocator, which manages
    streams, brings it to no expiry."""
    from shared.bus import Lease

    admin = await connect(nats_cfg, busauth.ADMIN)
    js = admin.jetstream()
    await _fresh_lease_bucket(js)
    await js.create_key_value(KeyValueConfig(bucket=busauth.LEASE_BUCKET, history=1, ttl=2.0))
    try:
        binder = msgspec.structs.replace(nats_cfg, user="binder")
        async with Bus(binder, name="binder") as bus:
            lease = Lease(bus, "binder", "binder-1", 15.0)
            await lease.acquire()
            assert lease.lease_s == 2.0  # the key expires after 2 s: renewed within that
            await lease.release()
        info = await js.stream_info(f"KV_{busauth.LEASE_BUCKET}")
        assert info.config.max_age == 2.0  # the binder may not change it

        allocator = msgspec.structs.replace(nats_cfg, user="device-allocator")
        async with Bus(allocator, name="device-allocator") as bus:
            lease = Lease(bus, "device-allocator", "allocator-1", 15.0)
            await lease.acquire()
            assert lease.lease_s == 15.0
            await lease.release()
        info = await js.stream_info(f"KV_{busauth.LEASE_BUCKET}")
        assert not info.config.max_age
        assert info.config.duplicate_window == bus_module.KV_DUPLICATE_WINDOW_S
    finally:
        await _fresh_lease_bucket(js)
        await admin.close()


def _noting_leader(seen: dict[str, Any]) -> type[Any]:
    """A leading service (the binder's user and lease key, no API server) that notes its
    runtime in ``seen["rt"]`` and counts its starts in ``seen["starts"]``."""
    from shared.runtime import Runtime, Service

    class Leader(Service):
        NAME = "binder"
        USES_API = False

        def __init__(self, rt: Runtime, api: Any) -> None:
            super().__init__(rt, api)
            seen["rt"] = rt

        async def start(self) -> None:
            seen["starts"] = seen.get("starts", 0) + 1

    return Leader


async def test_a_leader_paused_by_its_lease_says_so_holds_its_writes_and_resumes_without_restarting(
    nats_cfg: NatsConfig, nats_server: LocalCluster
) -> None:
    """The service's side: while its lease goes unrenewed the replica reads ``paused``
    (not ready), ``tessera_active`` is 0 and a publish waits; once renewed it goes on in
    the same process with the state it had (``start`` ran once), and the held publish
    is stored."""
    from shared.config import Config, SchedulerConfig
    from shared.runtime import run_service

    seen: dict[str, Any] = {}
    leader = _noting_leader(seen)

    lease_s = 1.5
    admin = await connect(nats_cfg, busauth.ADMIN)
    await _fresh_lease_bucket(admin.jetstream())
    cfg = Config(nats=nats_cfg, scheduler=SchedulerConfig(leader_lease_s=lease_s))
    stop = asyncio.Event()
    running = asyncio.create_task(run_service(leader, cfg, stop=stop))
    try:

        async def active() -> bool:
            return "rt" in seen and seen["rt"].role == "active"

        await eventually(active, timeout_s=10, what="the service active")
        rt = seen["rt"]
        nats_server.pause_nats()
        await eventually(
            lambda: _truthy(not rt.acting), timeout_s=lease_s + 1, interval_s=0.02, what="paused"
        )
        assert (await rt.health.checks["role"]()).startswith("paused")
        assert rt.bus.fence is not None
        assert not rt.bus.fence.is_set()
        assert b'tessera_active{service="binder"} 0.0' in rt.metrics.text()
        nats_server.pause_nats(paused=False)
        await eventually(lambda: _truthy(rt.acting), timeout_s=5, what="acting again")
        assert await rt.health.checks["role"]() is None
        assert b'tessera_active{service="binder"} 1.0' in rt.metrics.text()
        assert seen["starts"] == 1
        assert not running.done()
    finally:
        nats_server.pause_nats(paused=False)
        stop.set()
        await asyncio.wait_for(running, timeout=15)
        await admin.close()


async def _truthy(value: bool) -> bool:
    return value


async def test_a_lowered_fence_holds_publishes_and_deliveries_until_raised(
    nats_cfg: NatsConfig,
) -> None:
    """``Bus.fence`` (a leader's ``Lease.acting``): nothing is stored or handled while it
    is down, everything once it is up again."""
    sent = sample_events()[:3]
    got: asyncio.Queue[tuple[ev.AnyEvent, Delivery]] = asyncio.Queue()

    async def handler(event: ev.AnyEvent, delivery: Delivery) -> None:
        await got.put((event, delivery))

    async with Bus(nats_cfg, name="test") as bus:
        await bus.publish(sent[0])
        bus.fence = Acting()
        bus.consume("fenced", [ev.STREAM_SUBJECTS], handler)
        publishing = asyncio.create_task(bus.publish_many(sent[1:]))
        await asyncio.sleep(0.5)
        assert not publishing.done()
        assert got.empty()
        assert (await bus.js.stream_info(nats_cfg.stream)).state.messages == 1
        bus.fence.renew(time.monotonic() + 60)
        await asyncio.wait_for(publishing, timeout=5)
        received = await _collect(len(sent), got)
    assert [e for e, _ in received] == sent


async def test_a_leader_whose_lease_is_taken_stops_and_reads_lost_while_it_stops(
    nats_cfg: NatsConfig,
) -> None:
    """Another holder took the key: the service stops, its role reads ``lost`` (not
    ready) for the steps run while it stops, which therefore publish nothing more as the
    active replica (the watcher's queue: services/watcher/service.py ``flush``)."""
    from shared import busauth
    from shared.bus import LeaseLostError
    from shared.config import Config, SchedulerConfig
    from shared.runtime import run_service

    seen: dict[str, Any] = {}

    class Leader(_noting_leader(seen)):  # type: ignore[misc]
        async def start(self) -> None:
            async def at_stop() -> None:
                seen["role"] = self.rt.role
                seen["ready"] = await self.rt.health.checks["role"]()

            self.rt.on_stop(at_stop)

    cfg = Config(nats=nats_cfg, scheduler=SchedulerConfig(leader_lease_s=1.5))
    running = asyncio.create_task(run_service(Leader, cfg, stop=asyncio.Event()))
    nc = await connect(nats_cfg, busauth.ADMIN)
    try:

        async def active() -> bool:
            return "rt" in seen and seen["rt"].role == "active"

        await eventually(active, timeout_s=10, what="the service active")
        kv = await nc.jetstream().key_value(busauth.LEASE_BUCKET)
        await kv.put("binder", b"another-replica")
        with pytest.raises(LeaseLostError, match="lost the binder lease"):
            await asyncio.wait_for(running, timeout=10)
        assert seen["role"] == "lost"
        assert seen["ready"] == "it lost its lease: stopping"
        assert (await kv.get("binder")).value == b"another-replica"  # not given back
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await nc.close()


async def test_a_holder_whose_loop_stalled_past_its_lease_does_not_act_before_renewing(
    nats_cfg: NatsConfig,
) -> None:
    """A process busy for longer than its lease (a long computation, a starved
    machine): when its loop runs again, what it writes waits before the renewal loop
    has even run, since a standby may hold the lease by then; renewed, it acts again."""
    from shared.bus import Lease

    lease_s = 1.0
    admin = await connect(nats_cfg, busauth.ADMIN)
    await _fresh_lease_bucket(admin.jetstream())
    async with Bus(nats_cfg, name="test") as bus:
        lease = Lease(bus, "stall-test", "me", lease_s)
        await lease.acquire()
        holding = asyncio.create_task(lease.hold())
        try:
            await asyncio.sleep(lease_s / 2)
            assert lease.acting.is_set()
            time.sleep(lease_s + 0.1)  # noqa: ASYNC251 (the stall itself)
            assert not lease.acting.is_set()
            await asyncio.wait_for(lease.acting.wait(), timeout=3)
            assert not holding.done()
        finally:
            holding.cancel()
            await asyncio.gather(holding, return_exceptions=True)
            await lease.release()
    await admin.close()
