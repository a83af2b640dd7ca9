"""What the leases on served versions cost, and how long a removal waits after a holder dies.

    python -m bench.leases --local-s3 --seconds 120 --out bench/results/leases.json

On a folder root (a temporary one) and on a root in object storage (``s3://bench-leases/idx``; ``--local-s3`` starts
moto's server on loopback, else the AWS variables name the endpoint and the bucket must exist):

- **requests a minute**: a process holds a lease on a version for ``--seconds``; every request it makes to the store
  is counted (the store's methods wrapped), divided by the minutes held. What one serving replica adds per version it
  holds.
- **removal's wait**: a process holding the lease is killed (SIGKILL: it never releases), and ``remove`` is tried
  every 0.1 s from that moment; the seconds until it succeeds, and the lease's time to live they are bounded by.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import machine, write_record

HOLD = r"""
import sys, time
from index_format.versions import open_root
open_root(sys.argv[1]).hold(sys.argv[2])
print("held", flush=True)
time.sleep(3600)
"""


def counted(store) -> dict[str, int]:
    """Wrap the store's request methods to count calls; returns the live counts."""
    counts: dict[str, int] = {}
    for name in ("get", "get_tagged", "put", "put_if", "exists", "list", "modified", "delete"):
        inner = getattr(store, name)

        def wrapper(*args, _inner=inner, _name=name, **kwargs):
            counts[_name] = counts.get(_name, 0) + 1
            return _inner(*args, **kwargs)

        setattr(store, name, wrapper)
    return counts


def one_root(url: str, seconds: float) -> dict:
    from index_format.leases import VERSION_TTL_S
    from index_format.root import VersionHeld
    from index_format.versions import open_root
    from tests.conftest import fake_version  # (imported in main first: it sets the test suite's S3 variables)

    root = open_root(url)
    with tempfile.TemporaryDirectory() as scratch:
        for name in ("held", "live"):
            root.upload_version(fake_version(Path(scratch) / name, name), name) if root.shared_by_nodes else \
                root.publish(fake_version(root.folder / "staging" / name, name), name)
    root.activate("live")

    counts = counted(root.store)
    started = time.perf_counter()
    lease = root.hold("held")
    time.sleep(seconds)
    lease.release()
    held_s = time.perf_counter() - started
    while_held = dict(counts)  # (the removal below counts too: not the holder's cost)
    requests = sum(while_held.values())

    holder = subprocess.Popen([sys.executable, "-c", HOLD, url, "held"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    time.sleep(2)
    holder.kill()
    holder.wait()
    died = time.perf_counter()
    tries = 0
    while True:
        tries += 1
        try:
            root.remove("held")
            break
        except VersionHeld:
            time.sleep(0.1)
    return {"root": url, "held_s": round(held_s, 1), "requests": requests, "by_method": while_held,
            "requests_per_minute": round(requests / (held_s / 60), 2), "ttl_s": VERSION_TTL_S,
            "removal_wait_after_death_s": round(time.perf_counter() - died, 2), "removal_tries": tries}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.leases", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=120.0, help="how long the lease is held and counted")
    parser.add_argument("--local-s3", action="store_true", help="start a local S3 server (moto) for the run")
    parser.add_argument("--out", type=Path, default=Path("bench/results/leases.json"))
    args = parser.parse_args(argv)
    import tests.conftest  # noqa: F401  (a fake version's maker; it points S3 at the suite's port: set again below)

    server = None
    if args.local_s3:
        import boto3

        from bench.object_store import use_local_s3

        server = use_local_s3()
        boto3.client("s3").create_bucket(Bucket="bench-leases")
    try:
        with tempfile.TemporaryDirectory() as folder:
            rows = [one_root(str(Path(folder) / "root"), args.seconds), one_root("s3://bench-leases/idx", args.seconds)]
    finally:
        if server is not None:
            server.terminate()
    for r in rows:
        print(f"{r['root'][:40]:40}  {r['requests_per_minute']:6.2f} requests/min while held  "
              f"removal {r['removal_wait_after_death_s']:5.1f} s after the holder died (ttl {r['ttl_s']:.0f} s)")
    write_record(args.out, {"machine": machine(), "seconds": args.seconds, "results": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
