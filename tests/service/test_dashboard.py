"""The dashboard's HTTP side on the real nats-server, without a browser: it reads as the
``reader`` user (so the server's own permissions are under test too), views come from a
responder played here as the allocator and the coordinator would answer, events are
published as the services publish them (services/dashboard/service.py).
tests/integration/test_dashboard.py drives the page in a real browser."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import nats.errors
import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient, TestServer
from nats.aio.msg import Msg

from services.dashboard.service import STATIC, Dashboard, Tail
from shared import busauth
from shared import events as ev
from shared.bus import VIEW_ERROR_HEADER, connect
from shared.config import NatsConfig
from shared.core.model import ContainerGrant, DeviceGrant, DeviceUUID, NodeName, PodRef, PodUID
from shared.views import (
    VIEW_LEDGER_SUBJECT,
    VIEW_QUEUES_SUBJECT,
    DeviceView,
    GangView,
    GrantView,
    LedgerView,
    NodeView,
    QueuesView,
    QueueView,
)

HOSTILE = '<img src=x onerror="document.title=1">"\'&</script>'
"""A pod name as an attacker would write it (the API server refuses it; a view or an
event could still carry it, so the page must show it as text)."""

LEDGER = LedgerView(
    nodes=(
        NodeView(
            name="gpu-0",
            pods=2,
            devices=(
                DeviceView(
                    uuid="GPU-0",
                    index=0,
                    vendor="nvidia",
                    model="NVIDIA-A100-SXM4-80GB",
                    mode="hami-core",
                    memory_mib=81920,
                    cores=100,
                    slots=10,
                    used_memory_mib=12288,
                    used_cores=30,
                    used_slots=2,
                    grants=(
                        GrantView(
                            namespace="team-a",
                            pod="train-0",
                            uid="u1",
                            container="main",
                            memory_mib=10240,
                            cores=30,
                            bound=True,
                        ),
                        GrantView(
                            namespace="team-b",
                            pod=HOSTILE,
                            uid="u2",
                            container="c",
                            memory_mib=2048,
                        ),
                    ),
                ),
            ),
        ),
    ),
    instance="allocator-1",
    taken_at=1.0,
)
QUEUES = QueuesView(
    queues=(
        QueueView(name="default", deserved={"nvidia.count": 2.0}, allocated={"nvidia.count": 1.0}),
    ),
    gangs=(GangView(namespace="team-c", name="big", why="0/1 nodes are available"),),
)


PROBE = "Tessera-Test-Probe"


@asynccontextmanager
async def responder(
    cfg: NatsConfig, subject: str, answer: Callable[[], msgspec.Struct | str]
) -> AsyncIterator[list[bytes]]:
    """Answer ``subject`` as a service would: the view, or (a str) the reason it could not
    be made, in the error header. Yields the requests received."""
    nc = await connect(cfg, busauth.ADMIN)
    asked: list[bytes] = []

    async def respond(msg: Msg) -> None:
        if msg.headers and PROBE in msg.headers:
            await nc.publish(msg.reply, b"")
            return
        asked.append(msg.data)
        view = answer()
        if isinstance(view, str):
            await nc.publish(msg.reply, b"", headers={VIEW_ERROR_HEADER: view})
        else:
            await nc.publish(msg.reply, msgspec.json.encode(view))

    await nc.subscribe(subject, cb=respond)
    await nc.flush()
    # A server just started may answer "no responders" for a moment after the flush
    # (seen once in a few runs): ask until the subscription answers.
    for _ in range(100):
        try:
            await nc.request(subject, b"", headers={PROBE: "1"}, timeout=1.0)
            break
        except nats.errors.NoRespondersError:
            await asyncio.sleep(0.01)
    try:
        yield asked
    finally:
        await nc.close()


@pytest.fixture
async def dashboard(nats_cfg: NatsConfig) -> AsyncIterator[tuple[Dashboard, TestClient[Any, Any]]]:
    """The app on a test server, reading the bus as ``reader``."""
    reader = msgspec.structs.replace(nats_cfg, user=busauth.READER)
    nc = await connect(reader, busauth.READER)
    dash = Dashboard(view_ttl_s=0.5, view_timeout_s=1.0)
    await dash.attach(nc)
    try:
        async with TestClient(TestServer(dash.app())) as client:
            yield dash, client
            await dash.close()  # ends open event streams, as shutdown does
    finally:
        await nc.close()


async def test_views_are_proxied_as_json_and_asked_once_per_ttl(
    nats_cfg: NatsConfig, dashboard: tuple[Dashboard, TestClient[Any, Any]]
) -> None:
    _, client = dashboard
    async with (
        responder(nats_cfg, VIEW_LEDGER_SUBJECT, lambda: LEDGER) as ledger_asks,
        responder(nats_cfg, VIEW_QUEUES_SUBJECT, lambda: QUEUES),
    ):
        pages = await asyncio.gather(*(client.get("/api/ledger") for _ in range(8)))
        for page in pages:
            assert page.status == 200
            assert page.content_type == "application/json"
            assert msgspec.json.decode(await page.read(), type=LedgerView) == LEDGER
        assert len(ledger_asks) == 1, "eight pages at once cost the allocator one request"
        assert ledger_asks == [b""]  # an empty query: every node
        await asyncio.sleep(0.6)  # past the ttl: asked again
        assert (await client.get("/api/ledger")).status == 200
        assert len(ledger_asks) == 2

        queues = await client.get("/api/queues")
        assert queues.status == 200
        assert msgspec.json.decode(await queues.read(), type=QueuesView) == QUEUES


async def test_a_view_not_answered_is_503_with_one_line_saying_why(
    nats_cfg: NatsConfig, dashboard: tuple[Dashboard, TestClient[Any, Any]]
) -> None:
    _, client = dashboard
    nobody = await client.get("/api/queues")
    assert nobody.status == 503
    assert await nobody.json() == {
        "error": f"no gang-coordinator answers {VIEW_QUEUES_SUBJECT}: is it running (and active)?"
    }
    async with responder(nats_cfg, VIEW_LEDGER_SUBJECT, lambda: "the ledger is rebuilding"):
        failed = await client.get("/api/ledger")
        assert failed.status == 503
        why = (await failed.json())["error"]
        assert why == (
            f"device-allocator could not answer {VIEW_LEDGER_SUBJECT}: the ledger is rebuilding"
        )
        assert "\n" not in why


async def test_readyz_follows_the_bus_connection(nats_cfg: NatsConfig) -> None:
    dash = Dashboard()
    async with TestClient(TestServer(dash.app())) as client:
        assert (await client.get("/healthz")).status == 200
        before = await client.get("/readyz")
        assert before.status == 503
        assert "[-]nats failed: not connected to NATS yet" in await before.text()
        assert (await client.get("/api/ledger")).status == 503  # says why, does not hang
        nc = await connect(msgspec.structs.replace(nats_cfg, user="reader"), "reader")
        try:
            await dash.attach(nc)
            assert (await client.get("/readyz")).status == 200
        finally:
            await dash.close()
            await nc.close()
        assert (await client.get("/readyz")).status == 503


def _event(n: int) -> ev.AllocationDecided:
    return ev.AllocationDecided(
        pod=PodRef(namespace="team-a", name=f"pod-{n}", uid=PodUID(f"uid-{n}")),
        node=NodeName("gpu-0"),
        grants=(
            ContainerGrant(
                container="main",
                devices=(DeviceGrant(uuid=DeviceUUID("GPU-0"), memory_mib=1024, cores=10),),
            ),
        ),
    )


async def _next_data(response: ClientResponse) -> tuple[str, dict[str, Any]]:
    """The next event of an SSE stream: its id and its JSON."""
    event_id = ""
    async with asyncio.timeout(5):
        while True:
            line = (await response.content.readline()).decode()
            if line.startswith("id: "):
                event_id = line[4:].strip()
            elif line.startswith("data: "):
                data: dict[str, Any] = json.loads(line[6:])
                return event_id, data


async def test_events_reach_pages_live_and_a_new_page_gets_the_last_ones(
    nats_cfg: NatsConfig, dashboard: tuple[Dashboard, TestClient[Any, Any]]
) -> None:
    dash, client = dashboard
    admin = await connect(nats_cfg, busauth.ADMIN)  # publishes as the allocator would
    try:
        early = _event(0)
        await admin.publish(early.subject(), ev.encode(early))
        await admin.flush()
        await asyncio.sleep(0.2)  # the dashboard has it in its ring

        stream = await client.get("/api/events")
        assert stream.status == 200
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        first_id, replayed = await _next_data(stream)
        assert replayed["event_id"] == early.event_id  # replayed to the new page

        live = _event(1)
        await admin.publish(live.subject(), ev.encode(live))
        live_id, data = await _next_data(stream)
        assert data["type"] == "allocation.decided"
        assert data["event_id"] == live.event_id
        assert ev.decode(json.dumps(data).encode()) == live
        stream.close()

        # A browser reconnecting with the last id it saw is replayed only what followed.
        again = await client.get("/api/events", headers={"Last-Event-ID": first_id})
        _, resumed = await _next_data(again)
        assert resumed["event_id"] == live.event_id
        again.close()
        assert live_id.split("-")[0] == first_id.split("-")[0] == dash.tail.epoch
    finally:
        await admin.close()


def test_the_ring_keeps_the_last_events_and_a_slow_page_is_dropped() -> None:
    tail = Tail(kept=3, backlog=2)
    for n in range(5):
        tail.push(b'{"n":%d}' % n)
    replay, slow = tail.join()
    assert [f.split(b"data: ")[1] for f in replay] == [
        b'{"n":2}\n\n',
        b'{"n":3}\n\n',
        b'{"n":4}\n\n',
    ]
    _, quick = tail.join()
    tail.push(b"{}")
    tail.push(b"{}")
    quick.get_nowait(), quick.get_nowait()  # this page keeps up
    tail.push(b"{}")  # the slow page has 2 waiting: dropped, told to end its stream
    assert tail.dropped == 1
    assert tail.pages == 1
    assert slow.qsize() == 1
    assert slow.get_nowait() is None
    assert quick.get_nowait() is not None
    tail.close()  # shutdown: every stream ends, and one opened now ends at once
    assert quick.get_nowait() is None
    _, late = tail.join()
    assert late.get_nowait() is None


async def test_a_hostile_pod_name_stays_data_never_markup(
    nats_cfg: NatsConfig, dashboard: tuple[Dashboard, TestClient[Any, Any]]
) -> None:
    """The page is static and draws with text nodes only; the name reaches it as a JSON
    string, under a policy that runs no inline script (the browser test shows it drawn)."""
    _, client = dashboard
    async with responder(nats_cfg, VIEW_LEDGER_SUBJECT, lambda: LEDGER):
        answer = await client.get("/api/ledger")
        assert answer.content_type == "application/json"
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
        names = [g["pod"] for g in (await answer.json())["nodes"][0]["devices"][0]["grants"]]
        assert names == ["train-0", HOSTILE]
    page = await client.get("/")
    assert page.status == 200
    assert page.content_type == "text/html"
    html = await page.text()
    assert '<script src="/static/app.js" defer></script>' in html
    assert "<script>" not in html, "no inline script in the page"
    policy = page.headers["Content-Security-Policy"]
    assert "default-src 'self'" in policy
    assert "unsafe" not in policy
    script = (STATIC / "app.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script, f"app.js must not use {sink}"
    # Attributes are set only under names written in app.js, never from data.
    assert re.findall(r"setAttribute\(([^,]+),", script) == ["key"]
    for asset in ("app.js", "dashboard.css", "favicon.svg"):
        assert (await client.get(f"/static/{asset}")).status == 200
    for static in (html, (STATIC / "dashboard.css").read_text()):
        assert "http" not in static, "nothing fetched from elsewhere (air-gapped clusters)"


async def test_each_allocator_shard_answers_for_its_nodes_and_the_page_shows_them_all(
    nats_cfg: NatsConfig, dashboard: tuple[Dashboard, TestClient[Any, Any]]
) -> None:
    _, client = dashboard
    shards = ("pool-a", "pool-b")

    def part(shard: str, node: str, instance: str) -> LedgerView:
        nodes = (msgspec.structs.replace(LEDGER.nodes[0], name=node),)
        return LedgerView(nodes=nodes, instance=instance, taken_at=2.0, shard=shard, shards=shards)

    async with responder(nats_cfg, VIEW_LEDGER_SUBJECT, lambda: part("pool-b", "gpu-b", "b-1")):
        # One shard of two answers: the page says which one did not, not half a cluster.
        half = await client.get("/api/ledger")
        assert half.status == 503
        assert (await half.json())["error"] == (
            f"device-allocator (shards pool-a) did not answer {VIEW_LEDGER_SUBJECT} in 1s"
        )
        await asyncio.sleep(0.6)  # past the cached refusal
        async with responder(nats_cfg, VIEW_LEDGER_SUBJECT, lambda: part("pool-a", "gpu-a", "a-1")):
            whole = await client.get("/api/ledger")
            assert whole.status == 200
            view = msgspec.json.decode(await whole.read(), type=LedgerView)
    assert [n.name for n in view.nodes] == ["gpu-a", "gpu-b"]
    assert view.instance == "a-1,b-1"  # in the order of the shards
    assert (view.shard, view.shards) == ("", ())
