"""Service tests run against the session's real nats-server, with a clean stream each."""

from __future__ import annotations

import contextlib

import msgspec
import nats.js.errors
import pytest

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
