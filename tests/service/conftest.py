"""Service tests run against the session's real nats-server, with a clean stream each."""

from __future__ import annotations

import asyncio
import contextlib

import msgspec
import nats.js.errors
import pytest
import uvloop

from shared.bus import connect
from shared.config import NatsConfig


@pytest.fixture
async def nats_cfg(nats_admin: NatsConfig) -> NatsConfig:
    """A config for the real server; the stream and bucket start empty for each test."""
    cfg = msgspec.structs.replace(nats_admin, ack_wait_s=1.0, max_deliver=5)
    nc = await connect(nats_admin, "admin")
    js = nc.jetstream()
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await js.delete_stream(cfg.stream)
    with contextlib.suppress(nats.js.errors.NotFoundError, nats.js.errors.BucketNotFoundError):
        await js.delete_key_value(cfg.inventory_bucket)
    await nc.close()
    return cfg


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> object:
    """shared/http1.py's tests run on asyncio's loop and on uvloop, the services' loop
    (shared/runtime.py run_process): the two differ in how a closed transport fails."""
    if item.path.name != "test_http1.py":
        return None
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
