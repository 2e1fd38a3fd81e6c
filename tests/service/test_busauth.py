"""The bus's doors on the real nats-server: no credentials, no entry; each service's user
publishes only its own events and uses only its own consumer; the reader only reads
``tessera.v1.allocation.>`` (shared/busauth.py)."""

from __future__ import annotations

import asyncio
import ssl
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
import nats
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient

from shared import busauth
from shared import events as ev
from shared.bus import Bus, connect, credentials
from shared.config import NatsConfig

SUBJECTS = {t: t.SUBJECT + (".n1" if t.KEY is not None else "") for t in ev.EVENT_TYPES}


@asynccontextmanager
async def client(cfg: NatsConfig, user: str) -> AsyncIterator[tuple[NatsClient, list[str]]]:
    """A connection as ``user`` and the permission errors the server sent it."""
    refused: list[str] = []

    async def on_error(exc: Exception) -> None:
        refused.append(str(exc))

    mine = msgspec.structs.replace(cfg, user=user)
    nc = await nats.connect(cfg.url, tls=_tls(cfg), error_cb=on_error, **credentials(mine, user))
    try:
        yield nc, refused
    finally:
        await nc.close()


def _tls(cfg: NatsConfig) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=cfg.ca_file)


async def stored(cfg: NatsConfig) -> dict[str, int]:
    """How many messages the stream holds per subject (read as admin)."""
    nc = await connect(cfg, busauth.ADMIN)
    try:
        info = await nc.jetstream().stream_info(cfg.stream, subjects_filter=">")
        return dict(info.state.subjects or {})
    finally:
        await nc.close()


async def test_no_credentials_or_a_wrong_password_get_no_connection(nats_cfg: NatsConfig) -> None:
    for options in ({}, {"user": "device-allocator", "password": "guess"}):
        with pytest.raises((nats.errors.Error, OSError, TimeoutError)):
            await nats.connect(
                nats_cfg.url,
                tls=_tls(nats_cfg),
                allow_reconnect=False,
                connect_timeout=2,
                **options,  # type: ignore[arg-type]
            )


async def test_each_user_publishes_only_its_own_events(nats_cfg: NatsConfig) -> None:
    async with Bus(nats_cfg, name="setup"):  # the stream exists
        pass
    for user, role in busauth.ROLES.items():
        async with client(nats_cfg, user) as (nc, refused):
            for subject in SUBJECTS.values():
                await nc.publish(subject, b"{}")
            await nc.flush()
            await asyncio.sleep(0.2)
        own = {SUBJECTS[t] for t in role.publishes}
        assert {s for s in SUBJECTS.values() if any(s in r for r in refused)} == (
            set(SUBJECTS.values()) - own
        ), user
    counts = await stored(nats_cfg)
    # One message per user allowed each subject (gang.ready: the coordinator and the
    # allocator, whose shards pass gangs on).
    assert counts == Counter(SUBJECTS[t] for role in busauth.ROLES.values() for t in role.publishes)


async def test_a_stranger_cannot_decide_a_placement(nats_cfg: NatsConfig) -> None:
    """The attack the bus was open to: ``allocation.decided`` from anyone but the
    allocator. The reader, a node agent and the binder are refused; nothing is stored."""
    async with Bus(nats_cfg, name="setup"):
        pass
    decided = ev.AllocationDecided(
        pod=ev.PodRef(namespace="default", name="victim", uid="u-1"), node="n1", grants=()
    )
    for user in (busauth.READER, busauth.NODE_AGENT, "binder", "watcher"):
        async with client(nats_cfg, user) as (nc, refused):
            await nc.publish(decided.subject(), ev.encode(decided))
            await nc.flush()
            await asyncio.sleep(0.2)
        assert any("permissions violation" in r.lower() for r in refused), user
    assert decided.subject() not in await stored(nats_cfg)
    # The allocator may (the same event, stored once).
    allocator = msgspec.structs.replace(nats_cfg, user="device-allocator")
    async with Bus(allocator, name="device-allocator") as bus:
        await bus.publish(decided)
    assert (await stored(nats_cfg))[decided.subject()] == 1


async def test_the_reader_only_reads_allocations(nats_cfg: NatsConfig) -> None:
    async with client(nats_cfg, busauth.READER) as (nc, refused):
        allowed = await nc.subscribe("tessera.v1.allocation.>")
        await nc.subscribe("tessera.v1.pod.>")
        await nc.flush()
        await asyncio.sleep(0.2)
        assert any("subscription" in r.lower() and "tessera.v1.pod" in r for r in refused)
        async with Bus(msgspec.structs.replace(nats_cfg, user="binder"), name="binder") as bus:
            await bus.publish(
                ev.AllocationBindFailed(
                    pod=ev.PodRef(namespace="d", name="p", uid="u-2"), node="n1", error="x"
                )
            )
        msg = await allowed.next_msg(timeout=5)
        assert msg.subject == "tessera.v1.allocation.bind-failed"


async def test_a_node_agent_cannot_read_the_allocators_consumer(nats_cfg: NatsConfig) -> None:
    """Node agents may create their own per-node consumers, never take the services'."""
    allocator = msgspec.structs.replace(nats_cfg, user="device-allocator")
    async with Bus(allocator, name="device-allocator") as bus:
        await bus.ensure_consumer("device-allocator", ["tessera.v1.gang.ready"])
    agent = msgspec.structs.replace(nats_cfg, user=busauth.NODE_AGENT)
    async with Bus(agent, name=busauth.NODE_AGENT) as bus:
        await bus.ensure_consumer("node-agent-n1", ["tessera.v1.allocation.bound.n1"])
        with pytest.raises(nats.errors.TimeoutError):
            await bus.js.consumer_info(nats_cfg.stream, "device-allocator", timeout=1)
