"""Documents listed without a query (``POST /collections/{c}/documents/list``'s work), in process, against a brute
force oracle: a version of three shards, each its own slot, and a fresh segment holding documents written, replaced
and deleted since. Every page walked with ``after`` must give exactly the documents the oracle's filter and ACL let
through, in id order, none twice, with the version's text or the written one, and the count of all of them."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deployments.documents.service import open_documents
from deployments.edge.schemas import ListDocumentsRequest
from deployments.errors import InvalidField
from deployments.search.inprocess import inprocess_pipeline
from index_build.build import build_index
from index_build.config import BuildConfig
from index_format.change_log import Change
from tests.conftest import make_corpus, write_jsonl
from tests.unit.test_filters import matches

TOPICS = ["astronomy", "cooking", "databases", "music", "sport"]


def tenant_of(i: int) -> list[str] | None:
    return [["t1"], ["t2"], ["public"], ["t1", "t2"], None][i % 5]


def record(doc: dict) -> dict:
    return {"id": doc["_id"], "title": doc["title"], "text": doc["text"], "metadata": doc["metadata"]}


@pytest.fixture(scope="module")
def listed(ray_local, tmp_path_factory):
    """(the pipeline, the oracle: id -> the record a caller should get)."""
    folder = tmp_path_factory.mktemp("listing")
    docs = make_corpus(40, seed=3)
    for i, d in enumerate(docs):
        if tenant_of(i) is not None:
            d["metadata"]["acl"] = tenant_of(i)
    build_index(BuildConfig(corpus=write_jsonl(folder / "corpus.jsonl", docs), out=folder / "index", shards=3,
                            encoder="hashing:32", chunk_size=40, chunk_overlap=8, progress=False, activate=True))
    pipeline = inprocess_pipeline({"main": folder / "index"}, acl_field="acl", group_size=1)
    target = pipeline.collections["main"]
    assert len(target.shards) == 3
    written = open_documents("main", folder / "index", folder / "index" / "versions" / target.version,
                             target.encoder, 32)
    target.fresh = written.segment
    oracle = {d["_id"]: record(d) for d in docs}
    # New ids between and after the version's, three version documents replaced (their topic and ACL changed), four
    # deleted, and one written then deleted.
    new = [{"id": f"d{i:03d}x", "title": f"new {i}", "text": f"written note {i} about shards and replicas",
            "metadata": {"topic": TOPICS[i % 5], "year": 2030 + i, "acl": tenant_of(i + 1)}} for i in (0, 7, 19, 44)]
    new[1]["metadata"].pop("acl")
    replaced = [{**oracle[i], "text": f"replaced text of {i}", "metadata": {"topic": "sport", "year": 1990,
                                                                               "acl": ["t2"]}}
                for i in ("d004", "d011", "d030")]
    changes = [Change(1, [*new, *replaced]), Change(2, [], ["d001", "d002", "d020", "d039"]),
               Change(3, [{"id": "zz-gone", "title": "", "text": "soon deleted", "metadata": {"acl": ["public"]}}]),
               Change(4, [], ["zz-gone"])]
    asyncio.run(written._apply(changes))
    oracle |= {r["id"]: r for r in [*new, *replaced]}
    for gone in ("d001", "d002", "d020", "d039"):
        del oracle[gone]
    return pipeline, oracle


def sees(metadata: dict, principals: list[str]) -> bool:
    acl = metadata.get("acl")
    return acl is not None and bool(set(acl) & ({"public"} | set(principals)))


def walk(pipeline, principals: list[str], **fields) -> tuple[list[dict], list[int]]:
    """Every page of a listing, followed by ``after``: (the documents, each page's total)."""
    got, totals, after = [], [], None
    while True:
        page = asyncio.run(pipeline.list_documents("main", ListDocumentsRequest(after=after, **fields), principals))
        got += [d.model_dump() for d in page.documents]
        totals.append(page.total)
        if page.next_after is None:
            return got, totals
        assert page.documents and page.next_after == page.documents[-1].id
        after = page.next_after


conditions = st.one_of(
    st.sampled_from(TOPICS).map(lambda t: {"topic": t}),
    st.lists(st.sampled_from(TOPICS), min_size=1, max_size=3).map(lambda ts: {"topic": ts}),
    st.tuples(st.sampled_from(["gt", "gte", "lt", "lte", "ne"]), st.integers(1988, 2036)).map(
        lambda p: {"year": {p[0]: p[1]}}),
)
filters = st.one_of(st.none(), conditions, st.lists(conditions, min_size=1, max_size=3).map(lambda c: {"$or": c}),
                    conditions.map(lambda c: {"$not": c}))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(filter_=filters, principals=st.sets(st.sampled_from(["t1", "t2", "t3"]), max_size=2).map(sorted),
       limit=st.integers(1, 9), ids=st.one_of(st.none(), st.lists(st.sampled_from(
           ["d000", "d001", "d004", "d007", "d007x", "d017", "zz-gone", "nope"]), max_size=5)))
def test_pages_walked_by_after_list_what_the_oracle_lets_through_once_in_id_order(listed, filter_, principals,
                                                                                    limit, ids):
    pipeline, oracle = listed
    want = sorted(i for i, r in oracle.items() if sees(r["metadata"], principals)
                  and (filter_ is None or matches(r["metadata"], filter_)) and (ids is None or i in ids))
    got, totals = walk(pipeline, principals, filters=filter_, limit=limit, ids=ids)
    assert [d["id"] for d in got] == want
    assert set(totals) == {len(want)}
    for d in got:
        r = oracle[d["id"]]
        assert (d["title"], d["text"], d["metadata"]) == (r["title"], r["text"], r["metadata"])
        assert d["source"] == ("api" if d["id"].endswith("x") or r["text"].startswith("replaced") else "index")
        assert d["chunk_ids"][0] == f"{d['id']}#0"


def test_a_count_alone_and_a_full_page_of_everything(listed):
    pipeline, oracle = listed
    everyone = ["t1", "t2"]
    count = asyncio.run(pipeline.list_documents("main", ListDocumentsRequest(limit=0), everyone))
    visible = sorted(i for i, r in oracle.items() if sees(r["metadata"], everyone))
    assert (count.documents, count.total, count.next_after) == ([], len(visible), None)
    page = asyncio.run(pipeline.list_documents("main", ListDocumentsRequest(limit=1000), everyone))
    assert [d.id for d in page.documents] == visible and page.next_after is None


def test_a_filter_the_collection_cannot_apply_is_refused_by_name(listed):
    pipeline, _ = listed
    for bad, says in [({"colour": "red"}, "unknown filter field 'colour'"), ({"topic": {"gt": 3}}, "topic"),
                      ({"topic": None}, "no condition")]:
        with pytest.raises(InvalidField, match=says):
            asyncio.run(pipeline.list_documents("main", ListDocumentsRequest(filters=bad), ["t1"]))
