"""A closed-loop HTTP/1.1 load generator cheap enough to leave the cores to the server under test.

On a 2-core machine the client shares the cores with the service it measures; httpx spends about a
millisecond of CPU per request in Python, as much as the search itself at these rates. Here each client
is an asyncio task on one keep-alive connection that writes a prebuilt request and reads the response by
its Content-Length (or chunks), with no HTTP library in between. Its CPU is still subtracted from the
machine's (``cpu.py``), so a cheaper client makes the figure steadier, not smaller.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Outcome:
    latencies_s: list[float] = field(default_factory=list)  # answered with 200
    statuses: dict[int, int] = field(default_factory=dict)  # every status seen (-1: no HTTP answer)
    flagged: int = 0  # 200s that the check called partial
    bytes_in: int = 0

    @property
    def answered(self) -> int:
        return len(self.latencies_s)


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        body = b"".join(parts)
    else:
        body = await reader.read()
    keep = headers.get("connection", "").lower() != "close"
    return status, body, keep


def _request(host: str, port: int, path: str, body: dict) -> bytes:
    payload = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload


async def _closed_loop(host: str, port: int, path: str, bodies: list[dict], clients: int, seconds: float,
                       check: Callable[[bytes], bool] | None, timeout_s: float) -> Outcome:
    requests = [_request(host, port, path, b) for b in bodies]
    out = Outcome()
    stop_at = time.perf_counter() + seconds
    counter = iter(range(10**12))

    async def client():
        conn = None
        while time.perf_counter() < stop_at:
            i = next(counter)
            t = time.perf_counter()
            try:
                if conn is None:
                    conn = await asyncio.open_connection(host, port)
                reader, writer = conn
                writer.write(requests[i % len(requests)])
                status, body, keep = await asyncio.wait_for(_read_response(reader), timeout_s)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
                out.statuses[-1] = out.statuses.get(-1, 0) + 1
                if conn is not None:
                    conn[1].close()
                conn = None
                await asyncio.sleep(0.01)
                continue
            dt = time.perf_counter() - t
            out.statuses[status] = out.statuses.get(status, 0) + 1
            out.bytes_in += len(body)
            if status == 200:
                out.latencies_s.append(dt)
                if check is not None and check(body):
                    out.flagged += 1
            if not keep:
                conn[1].close()
                conn = None
        if conn is not None:
            conn[1].close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return out


def closed_loop(base: str, path: str, bodies: list[dict], clients: int, seconds: float,
                check: Callable[[bytes], bool] | None = None, timeout_s: float = 60) -> Outcome:
    """``clients`` connections each sending the next of ``bodies`` (round robin) as soon as the last answer
    came, for ``seconds``. ``check(body)`` flags a 200 (e.g. a partial answer)."""
    hostport = base.split("://", 1)[1].rstrip("/")
    host, port = hostport.rsplit(":", 1)
    return asyncio.run(_closed_loop(host, int(port), path, bodies, clients, seconds, check, timeout_s))


@dataclass
class Arrival:
    status: int  # -1: no HTTP answer
    latency_s: float
    retry_after: str | None


async def _open_loop(host: str, port: int, path: str, bodies: list[dict], rate: float, seconds: float,
                     timeout_s: float, max_connections: int) -> list[Arrival]:
    requests = [_request(host, port, path, b) for b in bodies]
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    opened = 0
    results: list[Arrival] = []
    slots = asyncio.Semaphore(max_connections)

    async def one(i: int) -> None:
        nonlocal opened
        t = time.perf_counter()
        async with slots:
            conn = idle.pop() if idle else None
            try:
                if conn is None:
                    conn = await asyncio.open_connection(host, port)
                    opened += 1
                conn[1].write(requests[i % len(requests)])
                status, _, keep = await asyncio.wait_for(_read_response_headers(conn[0]), timeout_s)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
                results.append(Arrival(-1, time.perf_counter() - t, None))
                if conn is not None:
                    conn[1].close()
                return
            results.append(Arrival(status[0], time.perf_counter() - t, status[1]))
            if keep:
                idle.append(conn)
            else:
                conn[1].close()

    tasks, start, n = [], time.perf_counter(), 0
    while (elapsed := time.perf_counter() - start) < seconds:
        while n < elapsed * rate:
            tasks.append(asyncio.create_task(one(n)))
            n += 1
        await asyncio.sleep(0.002)
    await asyncio.gather(*tasks)
    for _, writer in idle:
        writer.close()
    return results


async def _read_response_headers(reader: asyncio.StreamReader):
    """(status, Retry-After), body read and dropped, keep-alive."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            await reader.readexactly(size + 2)
    return (status, headers.get("retry-after")), None, headers.get("connection", "").lower() != "close"


def open_loop(base: str, path: str, bodies: list[dict], rate: float, seconds: float, timeout_s: float = 120,
              max_connections: int = 512) -> list[Arrival]:
    """Requests arriving at ``rate`` per second for ``seconds`` whether or not earlier ones were answered
    (as real traffic does), each on a free keep-alive connection or a new one (at most ``max_connections``)."""
    hostport = base.split("://", 1)[1].rstrip("/")
    host, port = hostport.rsplit(":", 1)
    return asyncio.run(_open_loop(host, int(port), path, bodies, rate, seconds, timeout_s, max_connections))
