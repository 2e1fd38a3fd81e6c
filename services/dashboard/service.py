"""The web dashboard: what the scheduler holds now, drawn for people, from the bus alone.

It reads as the ``reader`` bus user (shared/busauth.py), who may ask for views and watch
``tessera.v1.allocation.>`` and nothing else, so nothing a page does can change what
the scheduler decides. The views (shared/views.py) come by request/reply from the
active device-allocator (the ledger) and gang-coordinator (queues, waiting gangs); each
is asked at most once per :data:`VIEW_TTL_S` however many pages look. Allocation events
are fanned out to pages as Server-Sent Events, the last :data:`EVENTS_KEPT` replayed to
a page that opens; a page that does not keep up is dropped (its browser reconnects and
is replayed what it missed while still kept), never buffered for without bound.

The page is static (``static/``): plain HTML, one script that draws with ``textContent``
only (pod names and messages are user input), one stylesheet, nothing fetched from
elsewhere (clusters may be air-gapped); the Content-Security-Policy header holds it to
that.

Routes: ``/`` (the page), ``/api/ledger`` and ``/api/queues`` (a view as JSON, or 503 with
``{"error": "<one line>"}``), ``/api/events`` (``text/event-stream``, one event's JSON
per message), ``/healthz`` and ``/readyz`` (ready while connected to NATS).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
import nats.errors
from aiohttp import web
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from shared import busauth, events
from shared.bus import ViewUnavailable, ask, connect, user_of
from shared.config import Config
from shared.health import Health
from shared.runtime import process_main
from shared.views import VIEW_LEDGER_SUBJECT, VIEW_QUEUES_SUBJECT, LedgerView, QueuesView

log = logging.getLogger(__name__)

NAME = "dashboard"
STATIC = Path(__file__).parent / "static"
ALLOCATION_SUBJECTS = f"{events.SUBJECT_PREFIX}.allocation.>"
"""What the page's event tail shows: the public allocation events (shared/events.py)."""

VIEW_TTL_S = 1.0
"""How long a view's answer (or its refusal) is reused: the page refreshes every 2 s, so
any number of pages costs each answering service one request a second."""
VIEW_TIMEOUT_S = 3.0
"""How long a view may take: less than the page's patience (it asks again in 2 s)."""
EVENTS_KEPT = 50
"""Allocation events replayed to a page that opens."""
CLIENT_BACKLOG = 256
"""Events waiting for one page before it is dropped as too slow."""
WRITE_TIMEOUT_S = 10.0
"""A page whose connection takes no bytes for this long is dropped."""
KEEPALIVE_S = 15.0
"""A comment line sent to an idle page, so proxies keep the stream open."""

SECURITY_HEADERS = {
    # Scripts, styles and connections from this server only: no inline script runs,
    # whatever text a pod name smuggles in.
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
        "frame-ancestors 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class CachedView:
    """One view as JSON bytes, asked at most once per ``ttl_s``: pages asking meanwhile
    wait for the same answer. A refusal is kept as long (a stopped service is not asked
    by every page)."""

    def __init__(self, ask_view: Callable[[], Awaitable[bytes]], ttl_s: float) -> None:
        self.ask_view = ask_view
        self.ttl_s = ttl_s
        self._lock = asyncio.Lock()
        self._at = -float("inf")
        self._answer: tuple[int, bytes] = (503, b"")

    async def get(self) -> tuple[int, bytes]:
        """The HTTP status and JSON body: 200 and the view, or 503 and why not."""
        async with self._lock:
            if time.monotonic() - self._at >= self.ttl_s:
                try:
                    self._answer = (200, await self.ask_view())
                except ViewUnavailable as exc:
                    self._answer = (503, msgspec.json.encode({"error": str(exc)}))
                self._at = time.monotonic()
            return self._answer


Frame = bytes | None
"""One Server-Sent Event ready to write, or None: the page is dropped, end its stream."""


class Tail:
    """The last allocation events and the pages following them.

    Each event is rendered once as an SSE frame with the id ``<epoch>-<seq>``: a browser
    that reconnects sends the last id it saw (``Last-Event-ID``) and is replayed only what
    came after it, if still kept (a new process has a new epoch, so all that is kept)."""

    def __init__(self, kept: int = EVENTS_KEPT, backlog: int = CLIENT_BACKLOG) -> None:
        self.epoch = secrets.token_hex(4)
        self.backlog = backlog
        self.dropped = 0
        """Pages dropped for being too slow."""
        self.closed = False
        self._seq = 0
        self._kept: deque[tuple[int, bytes]] = deque(maxlen=kept)
        self._pages: set[asyncio.Queue[Frame]] = set()

    def push(self, data: bytes) -> None:
        """One event's JSON (no newline in it: the bus's JSON is compact)."""
        self._seq += 1
        frame = b"id: %s-%d\ndata: %s\n\n" % (self.epoch.encode(), self._seq, data)
        self._kept.append((self._seq, frame))
        for page in list(self._pages):
            try:
                page.put_nowait(frame)
            except asyncio.QueueFull:
                self.dropped += 1
                log.warning("dropping a page %d events behind (it reconnects)", self.backlog)
                self._end(page)

    def join(self, last_event_id: str = "") -> tuple[list[bytes], asyncio.Queue[Frame]]:
        """A new page: what to replay to it, and the queue its next events arrive on."""
        epoch, _, seq = last_event_id.partition("-")
        since = int(seq) if epoch == self.epoch and seq.isdigit() else 0
        page: asyncio.Queue[Frame] = asyncio.Queue(maxsize=self.backlog)
        self._pages.add(page)
        if self.closed:  # a browser reconnecting while the process stops
            self._end(page)
        return [frame for n, frame in self._kept if n > since], page

    def leave(self, page: asyncio.Queue[Frame]) -> None:
        """A page closed: its queue gets no more events."""
        self._pages.discard(page)

    def close(self) -> None:
        """End every page's stream, and those of pages joining later (shutdown)."""
        self.closed = True
        for page in list(self._pages):
            self._end(page)

    def _end(self, page: asyncio.Queue[Frame]) -> None:
        self._pages.discard(page)
        while not page.empty():
            page.get_nowait()
        page.put_nowait(None)

    @property
    def pages(self) -> int:
        """Pages following the events now."""
        return len(self._pages)


class Dashboard:
    """The HTTP app over one NATS connection (``attach``ed once connected, as reader)."""

    def __init__(
        self,
        *,
        view_ttl_s: float = VIEW_TTL_S,
        view_timeout_s: float = VIEW_TIMEOUT_S,
        events_kept: int = EVENTS_KEPT,
        client_backlog: int = CLIENT_BACKLOG,
    ) -> None:
        self.nc: NatsClient | None = None
        self.view_timeout_s = view_timeout_s
        self.tail = Tail(events_kept, client_backlog)
        self.ledger = CachedView(
            lambda: self._ask(VIEW_LEDGER_SUBJECT, LedgerView, "device-allocator"), view_ttl_s
        )
        self.queues = CachedView(
            lambda: self._ask(VIEW_QUEUES_SUBJECT, QueuesView, "gang-coordinator"), view_ttl_s
        )
        self.health = Health(alive=lambda: None)
        self.health.add("nats", self._connected)
        self._sub: Subscription | None = None

    def app(self) -> web.Application:
        """The aiohttp app: the page, ``/api/ledger``, ``/api/queues``, the ``/api/events`` stream,
        the static files and the health routes, with the security headers on every answer."""
        app = web.Application()
        app.router.add_get("/", self._page)
        app.router.add_get("/api/ledger", self._view(self.ledger))
        app.router.add_get("/api/queues", self._view(self.queues))
        app.router.add_get("/api/events", self._events)
        app.router.add_static("/static/", STATIC)
        self.health.install(app)
        app.on_response_prepare.append(_secure)
        app.on_shutdown.append(self._shutdown)  # open streams would hold the shutdown
        return app

    async def attach(self, nc: NatsClient) -> None:
        """Read the bus through ``nc``: views are asked on it, events followed from now."""
        self.nc = nc
        self._sub = await nc.subscribe(ALLOCATION_SUBJECTS, cb=self._on_event)

    async def close(self) -> None:
        """Stop following events and end every page's stream (the connection is the
        caller's)."""
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
            self._sub = None
        self.tail.close()

    async def _shutdown(self, _app: web.Application) -> None:
        self.tail.close()

    async def _connected(self) -> str | None:
        if self.nc is None:
            return "not connected to NATS yet"
        if not self.nc.is_connected:
            return "reconnecting to NATS"
        return None

    async def _ask(self, subject: str, answer: type[msgspec.Struct], service: str) -> bytes:
        why = await self._connected()
        if why is not None or self.nc is None:
            raise ViewUnavailable(f"the dashboard is {why}")
        try:
            view = await ask(
                self.nc, subject, None, answer, service=service, timeout_s=self.view_timeout_s
            )
        except nats.errors.Error as exc:  # closed, reconnecting: one line all the same
            raise ViewUnavailable(f"asking {service} on {subject} failed: {exc!r}") from None
        return msgspec.json.encode(view)

    async def _on_event(self, msg: Msg) -> None:
        try:
            event = events.decode(msg.data)
        except msgspec.DecodeError as exc:
            log.warning("not shown: an undecodable message on %s: %s", msg.subject, exc)
            return
        # Encoded again: compact JSON of the known fields, one line as SSE needs.
        self.tail.push(events.encode(event))

    async def _page(self, _request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    @staticmethod
    def _view(view: CachedView) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def answer(_request: web.Request) -> web.Response:
            status, body = await view.get()
            return web.Response(status=status, body=body, content_type="application/json")

        return answer

    async def _events(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "X-Accel-Buffering": "no"}
        )
        await response.prepare(request)
        replay, page = self.tail.join(request.headers.get("Last-Event-ID", ""))
        try:
            for frame in [b"retry: 2000\n\n", *replay]:
                await asyncio.wait_for(response.write(frame), WRITE_TIMEOUT_S)
            while True:
                try:
                    next_frame = await asyncio.wait_for(page.get(), KEEPALIVE_S)
                except TimeoutError:
                    next_frame = b": keep-alive\n\n"
                if next_frame is None:
                    break
                await asyncio.wait_for(response.write(next_frame), WRITE_TIMEOUT_S)
        except (ConnectionError, TimeoutError):
            pass  # the page went away, or stopped reading
        finally:
            self.tail.leave(page)
        return response


async def _secure(_request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(SECURITY_HEADERS)


async def run(cfg: Config, stop: asyncio.Event, *, host: str, port: int) -> None:
    """Serve until ``stop`` is set. The page answers at once; the views and events follow
    once the bus is reached (``/readyz`` says so meanwhile)."""
    dashboard = Dashboard()
    runner = web.AppRunner(dashboard.app(), access_log=None)
    await runner.setup()
    nc: NatsClient | None = None
    stopped = asyncio.create_task(stop.wait(), name="dashboard:stop")
    connecting = asyncio.create_task(connect(cfg.nats, busauth.READER), name="dashboard:connect")
    try:
        await web.TCPSite(runner, host, port).start()
        log.info(
            "dashboard on http://%s:%d/, reading the bus at %s as %s",
            host,
            port,
            cfg.nats.url,
            user_of(cfg.nats, busauth.READER),
        )
        await asyncio.wait({stopped, connecting}, return_when=asyncio.FIRST_COMPLETED)
        if connecting.done():
            nc = connecting.result()  # a failure to connect ends the process
            await dashboard.attach(nc)
            await stopped
    finally:
        for task in (stopped, connecting):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await dashboard.close()
        await runner.cleanup()
        if nc is not None and not nc.is_closed:
            with contextlib.suppress(nats.errors.Error):
                await nc.drain()


def main(argv: list[str] | None = None) -> None:
    """``python -m services.dashboard [--config FILE] [--host H] [--port N]``."""

    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--host", default="0.0.0.0", help="address to listen on (0.0.0.0)")
        parser.add_argument("--port", type=int, default=8080, help="port to listen on (8080)")

    process_main(
        NAME,
        lambda cfg, stop, args: run(cfg, stop, host=args.host, port=args.port),
        argv,
        options,
    )
