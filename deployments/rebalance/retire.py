"""The signal that lets one chosen replica go: Serve stops whichever replica it likes when a deployment shrinks (the
one on the emptiest node, which is the one a rebalance just started), so the rebalancer marks the old replica
instead, in Ray's key-value store, and that replica fails its health checks from then on. Serve stops a replica that
fails them gracefully: it sends it no new request, lets those in flight finish and only then ends it."""

from __future__ import annotations

_NAMESPACE = "raysearch-rebalance"


def _key(replica_id: str) -> bytes:
    return f"retire/{replica_id}".encode()


def retire(replica_id: str) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(_key(replica_id), b"1", overwrite=True, namespace=_NAMESPACE)


def retiring(replica_id: str) -> bool:
    from ray.experimental import internal_kv

    return internal_kv._internal_kv_exists(_key(replica_id), namespace=_NAMESPACE)


def forget(replica_id: str) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_del(_key(replica_id), namespace=_NAMESPACE)
