"""What the bus costs per message: publishing and consuming on a real nats-server (TLS and
one user per service, as in a cluster), CPU of this process and of the server.

Side by side in one run, each row with its ratio to the first of its group:
- ``--callers`` handlers each awaiting their own publish, as the binder's binds and the
  allocator's handlers do: one JetStream request each (nats-py's ``publish``, what the
  bus did before) against the bus's group commit (``Bus.publish``, shared/aio.py);
- the same events in pipelined batches of 64: through nats-py's ``publish_async`` (what
  the bus did before) and through ``Bus.publish_many``, whose own acks inbox reads
  JetStream's answers (shared/bus.py ``_Acks``);
- a consumer handling each event with a handler that does nothing: nats-py's ``fetch``
  (what the bus did before) against ``Bus.consume``'s own pull requests;
- the same, for events of a ``BATCHED`` type (the watcher's pod events, the
  coordinator's gangs: shared/events.py), published in batches of 64 that travel as one
  message each, and consumed: per event, against the first rows of their group.

The rows of one event per message publish ``pod.rejected`` (never batched); the
batched rows ``pod.deleted``.
- the allocator's reservations made by ``--callers`` handlers at once: one KV put each
  against ``Reservations.put`` (group-committed, one entry per batch).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import nats.errors
from harness import options

from services.device_allocator.reservations import Reservations
from shared import events as ev
from shared.bus import Bus, Delivery
from shared.core.ledger import PodGrant
from shared.core.model import NodeName, PodRef, PodUID
from tools.localcluster import LocalCluster

GROUPS = (0, 0, 0, 0, 0, 5, 5, 5, 8, 8)
"""Each row's first of its group (publishing, consuming, reservations)."""


def server_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pod(tag: str, i: int) -> PodRef:
    return PodRef(namespace="bench", name=f"{tag}-{i}", uid=PodUID(f"{tag}-{i}"))


def single(tag: str, i: int) -> ev.Event:
    """An event of a type never batched: one message each."""
    return ev.PodRejected(pod=pod(tag, i), errors=())


class Meter:
    def __init__(self, server: int) -> None:
        self.server = server
        self.rows: list[tuple[str, float, float]] = []

    async def run(self, label: str, n: int, work: Callable[[], Awaitable[None]]) -> None:
        """Microseconds of CPU per message here and in nats-server while ``work`` runs."""
        here, there = time.process_time(), server_cpu(self.server)
        await work()
        self.rows.append(
            (
                label,
                1e6 * (time.process_time() - here) / n,
                1e6 * (server_cpu(self.server) - there) / n,
            )
        )
        print(f"{label}: {self.rows[-1][1]:.0f} us here, {self.rows[-1][2]:.0f} us nats-server")


async def bench(cluster: LocalCluster, n: int, callers: int) -> list[tuple[str, float, float]]:
    server = next(p.popen.pid for p in cluster.procs if p.name.startswith("nats"))
    meter = Meter(server)
    async with Bus(cluster.nats_config(), name="bench") as bus:
        for durable in ("bench", "bench-fetch"):
            await bus.ensure_consumer(durable, [ev.PodRejected.filter_subject()], deliver="new")
        await bus.ensure_consumer("bench-batched", [ev.PodDeleted.filter_subject()], deliver="new")
        slots = asyncio.Semaphore(callers)

        async def each(tag: str, publish: Callable[[ev.Event], Awaitable[object]]) -> None:
            async def one(i: int) -> None:
                async with slots:
                    await publish(single(tag, i))

            await asyncio.gather(*(one(i) for i in range(n)))

        async def request(event: ev.Event) -> object:
            headers = {"Nats-Msg-Id": event.dedup_id()}
            return await bus.js.publish(event.subject(), ev.encode(event), headers=headers)

        await meter.run(f"{callers} handlers, a request each", n, lambda: each("a", request))
        await meter.run(f"{callers} handlers, group commit", n, lambda: each("b", bus.publish))

        async def batches_async() -> None:
            """Pipelined through nats-py's ``publish_async`` (what the bus did before)."""
            for start in range(0, n, 64):
                batch = [single("p", i) for i in range(start, start + 64)]
                acks = [
                    await bus.js.publish_async(
                        e.subject(), ev.encode(e), headers={"Nats-Msg-Id": e.dedup_id()}
                    )
                    for e in batch
                ]
                await asyncio.gather(*acks)

        async def batches(make: Callable[[str, int], ev.Event]) -> None:
            for start in range(0, n, 64):
                await bus.publish_many(make("c", i) for i in range(start, start + 64))

        await meter.run("batches of 64, nats-py's publish_async (the bus before)", n, batches_async)
        await meter.run("batches of 64, pipelined (Bus.publish_many)", n, lambda: batches(single))
        await meter.run(
            "batches of 64 pod events, one message each (Bus.publish_many)",
            n,
            lambda: batches(lambda tag, i: ev.PodDeleted(pod=pod(tag, i))),
        )

        got = 0
        done = asyncio.Event()

        async def nothing(_event: ev.AnyEvent, _delivery: Delivery) -> None:
            nonlocal got
            got += 1
            if got == 4 * n:
                done.set()

        async def fetched() -> None:
            """The bus's consumer before: nats-py's fetch, one message while idle, up to
            64 in a burst (each delivered as ``Bus.consume`` delivers it)."""
            sub = await bus.js.pull_subscribe_bind(durable="bench-fetch", stream=bus.cfg.stream)
            idle, count = True, 0

            async def ignored(_event: ev.AnyEvent, _delivery: Delivery) -> None:
                return None

            while count < 4 * n:
                try:
                    msgs = await sub.fetch(1 if idle else 64, timeout=1.0 if idle else 0.02)
                except (TimeoutError, nats.errors.TimeoutError):
                    idle = True
                    continue
                idle = False
                for msg in msgs:
                    if await bus._deliver(msg, ignored):
                        await msg.ack()
                    count += 1
            await sub.unsubscribe()

        async def consume() -> None:
            bus.consume("bench", [ev.PodRejected.filter_subject()], nothing, deliver="new")
            await asyncio.wait_for(done.wait(), 120)

        batched = 0
        all_batched = asyncio.Event()

        async def counted(_event: ev.AnyEvent, _delivery: Delivery) -> None:
            nonlocal batched
            batched += 1
            if batched == n:
                all_batched.set()

        async def consume_batched() -> None:
            bus.consume("bench-batched", [ev.PodDeleted.filter_subject()], counted, deliver="new")
            await asyncio.wait_for(all_batched.wait(), 120)

        await meter.run("consumed with nats-py's fetch (the bus before)", 4 * n, fetched)
        await meter.run("consumed with the bus's pull requests (Bus.consume)", 4 * n, consume)
        await meter.run("consumed, 64 pod events a message (Bus.consume)", n, consume_batched)

        kv = await bus.bucket("bench-reservations")

        async def puts() -> None:
            async def one(i: int) -> None:
                async with slots:
                    await kv.put(f"d-{i}", b"x" * 300)

            await asyncio.gather(*(one(i) for i in range(n)))

        reserved = Reservations(kv)

        async def grouped() -> None:
            async def one(i: int) -> None:
                async with slots:
                    await reserved.put(
                        PodGrant(pod=pod("e", i), node=NodeName("n"), containers=()), 1
                    )

            await asyncio.gather(*(one(i) for i in range(n)))

        await meter.run(f"{callers} reservations at once, a KV put each", n, puts)
        await meter.run(f"{callers} reservations at once, group commit", n, grouped)
        print(f"(the group commit wrote {reserved.writes} KV entries for {n} reservations)")
    return meter.rows


def main() -> None:
    args = options(__doc__, messages=5000, callers=32)
    with LocalCluster(with_kube=False) as cluster:
        rows = asyncio.run(bench(cluster, args.messages, args.callers))
    print(f"\nCPU per message, {args.messages} messages, {os.cpu_count()} cores")
    print("| what | us here | us nats-server | here vs the first of its group |")
    print("|---|---:|---:|---:|")
    for (label, here, there), first in zip(rows, GROUPS, strict=True):
        print(f"| {label} | {here:.0f} | {there:.0f} | {here / rows[first][1]:.2f}x |")


if __name__ == "__main__":
    main()
