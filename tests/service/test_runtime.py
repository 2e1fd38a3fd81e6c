"""Each service runs as its own process on the real bus, answers pings, stops cleanly."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from services.cli import SERVICES, _ping
from shared.config import NatsConfig, config_hash, load


@pytest.mark.parametrize("service", list(SERVICES))
async def test_service_process_answers_ping_and_stops_on_sigterm(
    service: str, nats_cfg: NatsConfig, tmp_path: Path
) -> None:
    cfg_file = tmp_path / "tessera.yaml"
    cfg_file.write_text(f"nats: {{url: '{nats_cfg.url}'}}\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        SERVICES[service],
        "--config",
        str(cfg_file),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        hellos: list[dict[str, object]] = []
        async with asyncio.timeout(30):
            while not hellos:
                hellos = [h for h in await _ping(nats_cfg.url, 0.5) if h["service"] == service]
        assert hellos[0]["config_hash"] == config_hash(load(cfg_file))
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            out, _ = await proc.communicate()
    assert proc.returncode == 0, out.decode()
    assert f"{service} stopped" in out.decode()
