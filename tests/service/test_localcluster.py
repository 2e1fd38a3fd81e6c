"""The local control plane of tests and benchmarks (tools/localcluster.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HOLDS_A_SERVER = """
import sys, time
from tools.localcluster import LocalCluster
with LocalCluster(with_kube=False) as c:
    print(c.procs[0].popen.pid, flush=True)
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a child reaped by nobody yet is a zombie: gone for our purpose
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_sigterm_stops_the_servers_it_started() -> None:
    """A benchmark ended by ``kill`` (SIGTERM) stops its nats-server, API server and
    etcd as on Ctrl-C: they used to run on, taking the CPU of whatever ran next."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDS_A_SERVER],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert holder.stdout is not None
        server = int(holder.stdout.readline())
        assert _alive(server)
        holder.send_signal(signal.SIGTERM)
        holder.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _alive(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server), "nats-server outlived the process that started it"
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
