"""Sick shard slots leave rotation: a slot's health check fails once its JVM ran out of heap or a version it
serves lost its files, and an evicted version is closed (real index, real Lucene)."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from deployments.shard.host import ShardHost
from deployments.shard.query import ShardQuery
from index_format.versions import read_version_manifest


def host_of(built, tmp_path) -> tuple[ShardHost, object]:
    _, summary = built[3]
    copy = tmp_path / "versions" / summary.version_dir.name  # a copy we may break
    shutil.copytree(summary.version_dir, copy)
    manifest = read_version_manifest(copy)
    expect = {"encoder": manifest.encoder, "dimension": manifest.dimension}
    return ShardHost(None, str(copy), list(manifest.shards), expect), copy


def test_vanished_index_files_fail_the_health_check(built, tmp_path):
    host, copy = host_of(built, tmp_path)

    async def run():
        await host.load(copy.name)
        await host.check_health()  # healthy as opened
        (copy / "shards" / "shard-001" / "chunks.parquet").unlink()
        with pytest.raises(RuntimeError, match="shard-001.*gone"):
            await host.check_health()

    asyncio.run(run())


def test_a_jvm_out_of_heap_marks_the_slot_sick(built, tmp_path):
    host, _ = host_of(built, tmp_path)

    def oom():
        raise RuntimeError("JVM exception occurred: java.lang.OutOfMemoryError: Java heap space")

    async def run():
        await host.check_health()
        with pytest.raises(RuntimeError):
            await host.run(oom)
        with pytest.raises(RuntimeError, match="ran out of memory"):
            await host.check_health()

    asyncio.run(run())


def test_a_closed_version_releases_its_reader(built, tmp_path):
    host, copy = host_of(built, tmp_path)

    async def run():
        group = await host.load(copy.name)
        assert group.search(ShardQuery(text="telescope", k_keyword=5)).keyword
        await host.run(host.close_version, copy.name, group)
        assert copy.name not in host.opened
        with pytest.raises(Exception, match="(?i)closed"):  # the reader is closed: Lucene refuses to search it
            group.search(ShardQuery(text="telescope", k_keyword=5))
        await host.check_health()  # a closed version is no longer checked

    asyncio.run(run())
