"""Writes searchable within a second: how long from a write's acknowledgement until a search finds it (or, for a
delete, no longer finds it), while clients search without pause, and what the writes cost the searches.

The served index is a copy of ``--index`` made of hard links (versions never change; the copy's change log is its
own), served by the default command (``python -m deployments --router.cache-size 0``). Two phases of ``--seconds`` each:

- idle: ``--clients`` closed-loop clients searching (hybrid, ``limit`` 10, the dataset's queries);
- writes: the same clients, and writers sending ``--rate`` writes a second on a fixed schedule (one new document a
  write, each holding a token no other document has; every 10th write deletes an earlier document instead). After
  each write (or every ``--probe-every``th: the probes are searches too) a prober searches its token (keyword,
  every 50 ms) until the document is found (upsert) or gone (delete).

Recorded: the visibility latency from acknowledgement (p50 / p99 / max, and writes not visible within 10 s), the
write's own latency, search QPS in both phases and their ratio, and every non-200 status.

    python -m bench.live_writes --data ../shared/data/scifact --index bench/out/indexes/scifact-h384 \\
        --out bench/results/live_writes.json
"""

from __future__ import annotations

import argparse
import os
import queue
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.common import ClosedLoop, load_beir, machine, percentile_ms, served, write_record

PROBE_S = 0.05
GIVE_UP_S = 10.0
PROBERS = 8
WRITERS = 4


def copy_root(root: Path, into: Path) -> Path:
    """An index root of hard links to ``root``'s version files, with its ACTIVE pointer and no change log."""
    out = into / "index"
    shutil.copytree(root / "versions", out / "versions", copy_function=os.link)
    shutil.copy2(root / "ACTIVE", out / "ACTIVE")
    return out


def searcher(texts: list[str]):
    def request(client: httpx.Client, rng: random.Random) -> dict:
        r = client.post("/search", json={"query": rng.choice(texts), "limit": 10})
        return {"status": r.status_code}
    return request


def phase(base: str, texts: list[str], clients: int, seconds: float) -> dict:
    with ClosedLoop(base, clients, searcher(texts)) as load:
        time.sleep(seconds)
    statuses: dict[str, int] = {}
    for _, _, kept in load.answers:
        statuses[str(kept["status"])] = statuses.get(str(kept["status"]), 0) + 1
    return {"answered": statuses.get("200", 0), "qps": statuses.get("200", 0) / seconds, "statuses": statuses}


def visible(client: httpx.Client, token: str, doc_id: str, present: bool) -> bool:
    r = client.post("/search", json={"query": token, "method": "keyword", "limit": 3})
    found = r.status_code == 200 and any(x["doc_id"] == doc_id for x in r.json()["results"])
    return found == present


def prober(base: str, todo: queue.Queue, seen: list[dict]) -> None:
    with httpx.Client(base_url=base, timeout=30) as client:
        while (item := todo.get()) is not None:
            kind, doc_id, token, acked = item
            probes = 0
            while True:
                probes += 1
                if visible(client, token, doc_id, present=(kind == "upsert")):
                    seen.append({"kind": kind, "visible_s": time.monotonic() - acked, "probes": probes})
                    break
                if time.monotonic() - acked > GIVE_UP_S:
                    seen.append({"kind": kind, "visible_s": None, "probes": probes})
                    break
                time.sleep(PROBE_S)


class Schedule:
    """The writes' clock, shared by the writer threads: write n is due at start + n / rate."""

    def __init__(self, rate: float, seconds: float, probe_every: int = 1):
        self.rate, self.start, self.end = rate, time.monotonic(), time.monotonic() + seconds
        self.probe_every = probe_every  # write n is probed when n is a multiple of it
        self.n, self.live, self.lock, self.rng = 0, [], threading.Lock(), random.Random(7)

    def next(self):
        with self.lock:
            self.n += 1
            n = self.n
            target = self.live.pop(self.rng.randrange(len(self.live))) if n % 10 == 0 and self.live else None
        due = self.start + n / self.rate
        return (n, due, target) if due < self.end else None


def writer(base: str, texts: list[str], schedule: Schedule, todo: queue.Queue, writes: list[dict]) -> None:
    rng = random.Random(threading.get_ident())
    with httpx.Client(base_url=base, timeout=30) as client:
        while (slot := schedule.next()) is not None:
            n, due, target = slot
            time.sleep(max(0.0, due - time.monotonic()))
            t0 = time.monotonic()
            if target is not None:
                doc_id, token = target
                r = client.delete(f"/collections/default/documents/{doc_id}")
                kind = "delete"
            else:
                doc_id, token = f"live-{n}", f"zq{n}x{rng.randrange(10**6)}"
                record = {"id": doc_id, "title": "live write", "text": f"{rng.choice(texts)} {token}"}
                r = client.put("/collections/default/documents", json={"documents": [record]})
                kind = "upsert"
            acked = time.monotonic()
            writes.append({"kind": kind, "status": r.status_code, "write_s": acked - t0, "late_s": t0 - due})
            if r.status_code == 200:
                if kind == "upsert":
                    with schedule.lock:
                        schedule.live.append((doc_id, token))
                if n % schedule.probe_every == 0:
                    todo.put((kind, doc_id, token, acked))


def summary(values: list[float | None]) -> dict:
    done = sorted(v for v in values if v is not None)
    return {"n": len(values), "not_visible_within_s": sum(v is None for v in values), "give_up_s": GIVE_UP_S,
            "p50_ms": percentile_ms(done, 0.5), "p99_ms": percentile_ms(done, 0.99),
            "max_ms": round(1000 * done[-1], 1) if done else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.live_writes", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="a BEIR dataset folder (queries to search, texts to write)")
    ap.add_argument("--index", type=Path, required=True, help="an index root (copied by hard links, never written)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rate", type=float, default=20.0, help="writes a second")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--port", type=int, default=8660)
    ap.add_argument("--out", type=Path, default=Path("bench/results/live_writes.json"))
    ap.add_argument("--probe-every", type=int, default=1, help="probe every Nth write's visibility (1: all): the "
                    "probes are searches too, about one a probed write, answered beside the clients'")
    args = ap.parse_args(argv)
    queries, _ = load_beir(args.data)
    texts = list(queries.values())
    record: dict = {"machine": machine(), "index": str(args.index), "clients": args.clients, "rate": args.rate,
                    "seconds": args.seconds, "probe_every": args.probe_every}
    with tempfile.TemporaryDirectory() as tmp, served(copy_root(args.index, Path(tmp)), args.port,
                                                      ["--router.cache-size", "0", "--metrics-port", str(args.port + 1)],
                                                      startup_s=1200) as base:
        phase(base, texts, args.clients, 5)  # warm
        record["idle"] = phase(base, texts, args.clients, args.seconds)
        todo, seen, writes = queue.Queue(), [], []
        # Probers and writers enough that neither queues behind the other: a write is sent when due, and its
        # probe starts when it is acknowledged.
        probes = [threading.Thread(target=prober, args=(base, todo, seen)) for _ in range(PROBERS)]
        schedule = Schedule(args.rate, args.seconds, args.probe_every)
        writing = [threading.Thread(target=writer, args=(base, texts, schedule, todo, writes)) for _ in range(WRITERS)]
        for t in probes + writing:
            t.start()
        record["during_writes"] = phase(base, texts, args.clients, args.seconds)
        for t in writing:
            t.join()
        for _ in probes:
            todo.put(None)
        for t in probes:
            t.join()
    record["writes"] = {"n": len(writes), "rate": len(writes) / args.seconds,
                        "statuses": {s: sum(w["status"] == s for w in writes) for s in {w["status"] for w in writes}},
                        "write_p50_ms": percentile_ms(sorted(w["write_s"] for w in writes), 0.5),
                        "write_p99_ms": percentile_ms(sorted(w["write_s"] for w in writes), 0.99),
                        "sent_late_p99_ms": percentile_ms(sorted(w["late_s"] for w in writes), 0.99)}
    record["visible_upsert"] = summary([s["visible_s"] for s in seen if s["kind"] == "upsert"])
    record["gone_delete"] = summary([s["visible_s"] for s in seen if s["kind"] == "delete"])
    record["search_qps_ratio"] = record["during_writes"]["qps"] / record["idle"]["qps"]
    # The probes are searches too (keyword, limit 3): answered beside the clients' during the writes.
    record["probe_searches_per_s"] = sum(s["probes"] for s in seen) / args.seconds
    record["search_qps_ratio_with_probes"] = ((record["during_writes"]["qps"] + record["probe_searches_per_s"])
                                              / record["idle"]["qps"])
    write_record(args.out, record)
    print(f"idle {record['idle']['qps']:.1f} QPS; during {args.rate:g} writes/s {record['during_writes']['qps']:.1f} QPS "
          f"({record['search_qps_ratio']:.0%}; {record['search_qps_ratio_with_probes']:.0%} with the probes' "
          f"{record['probe_searches_per_s']:.1f}/s); upserts visible p50 {record['visible_upsert']['p50_ms']} ms p99 "
          f"{record['visible_upsert']['p99_ms']} ms; deletes gone p50 {record['gone_delete']['p50_ms']} ms p99 "
          f"{record['gone_delete']['p99_ms']} ms; statuses {record['during_writes']['statuses']} / "
          f"{record['writes']['statuses']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
