"""What reading a large chunked answer costs: the body of a LIST of every pod.

    python bench/chunked.py [--megabytes 180] [--chunk 3000]

The API server writes a LIST in chunks of about 3 KB (856 MB at 140,000 pods:
bench/restart.py). A loopback server in this process sends ``--megabytes`` of such
chunks; this process reads them as shared/http1.py's ``Stream.chunks`` (what
shared/kube.py's paged lists read) and as aiohttp's client reads a chunked body, on
uvloop, and prints the CPU per MB of each (both ends in this process: the server's share
is the same in every row), with the ratio to the first row. Each row runs twice and
keeps its second round.
"""

from __future__ import annotations

import asyncio
import resource

import aiohttp
import uvloop
from harness import options

from shared.http1 import Pool


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def main() -> None:
    args = options(__doc__, megabytes=180, chunk=3000)
    piece = b"x" * args.chunk
    n = args.megabytes * 10**6 // args.chunk
    body = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(n)) + b"0\r\n\r\n"

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    async def http1() -> int:
        pool = Pool(url, None, limit=1)
        total = 0
        try:
            async with pool.stream("GET", pool.target("/list", {}), {}, timeout_s=120) as s:
                async for chunk in s.chunks():
                    total += len(chunk)
        finally:
            await pool.close()
        return total

    async def aio() -> int:
        total = 0
        async with aiohttp.ClientSession() as session, session.get(f"{url}/list") as r:
            async for chunk in r.content.iter_any():
                total += len(chunk)
        return total

    rows = []
    for name, read in (("shared/http1.py Stream.chunks", http1), ("aiohttp", aio)):
        for _ in range(2):
            began = cpu_s()
            total = await read()
            used = cpu_s() - began
        rows.append((name, used * 1000 / (total / 1e6), total))
    server.close()
    print("| reader | ms of CPU a MB | ratio to the first | read (MB) |")
    print("|---|---:|---:|---:|")
    for name, per_mb, total in rows:
        print(f"| {name} | {per_mb:.2f} | {per_mb / rows[0][1]:.2f} | {total / 1e6:.0f} |")


if __name__ == "__main__":
    uvloop.run(main())
