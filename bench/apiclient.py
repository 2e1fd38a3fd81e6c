"""What one API call costs a service in CPU: the API server client and the event loop.

    python bench/apiclient.py [--requests 3000] [--callers 32]

Against a real kube-apiserver over TLS, ``--callers`` coroutines at once make
``--requests`` small POSTs (a ConfigMap, as small as a Binding or an Event: the binder
makes two per pod) and the CPU of this process is divided by the requests. Side by side
in one run, each row with its ratio to the first:

- aiohttp's client (what shared/kube.py used before) on asyncio's own event loop;
- the same on uvloop (what every service runs on now: shared/runtime.py run_process);
- shared/http1.py (what shared/kube.py uses now) on asyncio's loop;
- shared/http1.py on uvloop: the services as they are.

Each row runs twice and keeps its second round (the first warms the connections).
"""

from __future__ import annotations

import asyncio
import resource
import ssl
import time
from collections.abc import Awaitable, Callable

import aiohttp
import msgspec
import uvloop
from harness import connect, options

from shared import kube
from shared.http1 import Pool
from tools.localcluster import LocalCluster

NS = "bench-apiclient"
Post = Callable[[str, bytes], Awaitable[int]]


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def one_row(cluster: LocalCluster, client: str, requests: int, callers: int) -> float:
    """µs of CPU per request for ``client`` on the running loop."""
    api = await connect(cluster)
    headers = await api.headers("application/json")
    context = ssl.create_default_context(cafile=api.configuration.ssl_ca_cert)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=callers, ssl=context))
    pool = Pool(api.host, context, limit=callers)

    async def via_aiohttp(path: str, body: bytes) -> int:
        async with session.post(api.host + path, data=body, headers=headers) as response:
            await response.read()
            return response.status

    async def via_http1(path: str, body: bytes) -> int:
        return (await pool.request("POST", path, headers, body)).status

    post: Post = via_aiohttp if client == "aiohttp" else via_http1
    try:
        per_request = 0.0
        for round_ in range(2):
            names = [f"{client}-{round_}-{i}-{time.monotonic_ns()}" for i in range(requests)]

            async def caller(names: list[str] = names) -> None:
                while names:
                    body = {"metadata": {"name": names.pop()}, "data": {"k": "v" * 200}}
                    path = f"/api/v1/namespaces/{NS}/configmaps"
                    status = await post(path, msgspec.json.encode(body))
                    if status != 201:
                        raise SystemExit(f"{client}: the API server answered {status}")

            before = cpu_s()
            await asyncio.gather(*(caller() for _ in range(callers)))
            per_request = (cpu_s() - before) / requests * 1e6
        return per_request
    finally:
        await session.close()
        await pool.close()
        await api.close()


async def namespace(cluster: LocalCluster) -> None:
    async with await connect(cluster) as api:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
        await kube.request(api, "POST", "/api/v1/namespaces", body)


def main() -> None:
    args = options(__doc__, requests=3000, callers=32)
    rows = [
        ("aiohttp", "asyncio"),
        ("aiohttp", "uvloop"),
        ("http1", "asyncio"),
        ("http1", "uvloop"),
    ]
    with LocalCluster() as cluster:
        asyncio.run(namespace(cluster))
        results = []
        for client, loop in rows:
            factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
            with asyncio.Runner(loop_factory=factory) as runner:
                per = runner.run(one_row(cluster, client, args.requests, args.callers))
            results.append((client, loop, per))
            print(f"{client} on {loop}: {per:.0f} µs", flush=True)
    base = results[0][2]
    print(f"\n{args.requests} POSTs, {args.callers} at once, CPU of this process per request\n")
    print("| client | event loop | µs of CPU per request | vs aiohttp on asyncio |")
    print("|---|---|---:|---:|")
    for client, loop, per in results:
        name = "aiohttp" if client == "aiohttp" else "shared/http1.py"
        print(f"| {name} | {loop} | {per:.0f} | {per / base:.2f}x |")


if __name__ == "__main__":
    main()
