"""Which shard a document lives in: a stable hash of its id, the same on every machine and run.

Python's ``hash()`` is salted per process, so it is never used here; blake2b of the UTF-8 id is.
All chunks of a document share its shard, so context assembly never has to cross shards.
"""

from __future__ import annotations

import hashlib


def shard_of(doc_id: str, num_shards: int) -> int:
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    digest = hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % num_shards


def shard_name(shard: int) -> str:
    return f"shard-{shard:03d}"
