"""Training data for the encoder and the reranker: judged pairs, hard negatives mined from the index's own
hybrid candidates, and a held-out split kept apart. Ray-free (the index is searched in-process).

Judgments come from a BEIR folder's qrels of one split (``--data DIR --train-split train``) or from what a
running service collected through ``POST /feedback`` (``--judgments ROOT``). A pair is (query, a document
judged relevant); its hard negative is the best-ranked candidate of the index's hybrid search for the
query that is not judged relevant to it, so the model learns what the current ranking gets wrong. Queries
of the held-out split (``--test-split``, BEIR's test by default, or ``--held-out-share`` of one split) never
enter training: the split's name and the number of queries left out are written with the model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from deployments.judgments import judgments_of
from relevance.qrels import read_qrels

TRAINING_FILE = "training.json"  # written beside a trained model: its data, held-out split, settings, time


@dataclass(frozen=True)
class Pair:
    query_id: str
    query: str
    doc_id: str
    doc_text: str  # as the index embeds it: "title\ntext"
    negative_id: str | None = None
    negative_text: str | None = None
    # Further hard negatives (``--hard-negatives`` above 1): (doc id, text), the next best-ranked misses.
    more_negatives: tuple[tuple[str, str], ...] = ()

    @property
    def negatives(self) -> list[str]:
        """The texts of every hard negative, best-ranked first."""
        return ([self.negative_text] if self.negative_text else []) + [text for _, text in self.more_negatives]


def read_corpus(path: Path, ids: set[str] | None = None) -> dict[str, str]:
    """doc id -> "title\\ntext" (the index's default contents), for ``ids`` only when given."""
    out: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            d = json.loads(line)
            did = str(d.get("_id", d.get("id")))
            if ids is None or did in ids:
                title, text = (d.get("title") or "").strip(), (d.get("text") or "").strip()
                out[did] = f"{title}\n{text}" if title and text else (text or title)
    return out


@dataclass
class Judged:
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    source: str  # what they were read from
    held_out: str  # the split (or file) kept out of training
    held_out_queries: int  # judged queries of the held-out split that were dropped from training
    held_out_ids: list[str] | None = None  # when the held-out queries were chosen here (a share of one split)
    left_out_ids: list[str] | None = None  # training queries left out as one cross-fitting fold (``--leave-out-fold``)


def leave_out_fold(judged: Judged, fold: tuple[int, int] | None) -> Judged:
    """``judged`` without the queries of fold K of N (``tuning.fold_of``), which are listed: a model trained on
    each fold's complement has, for every training query, one that never saw it (``train_ranker --cross-fit``)."""
    if fold is None:
        return judged
    from relevance.tuning import fold_of

    k, n = fold
    out = sorted(q for q in judged.qrels if fold_of(q, n) == k)
    gone = set(out)
    return replace(judged, qrels={q: d for q, d in judged.qrels.items() if q not in gone},
                   queries={q: t for q, t in judged.queries.items() if q not in gone}, left_out_ids=out)


def parse_fold(value: str) -> tuple[int, int]:
    try:
        k, n = (int(x) for x in value.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: give K/N, e.g. 0/2 (fold 0 of 2)") from None
    if not (n >= 2 and 0 <= k < n):
        raise argparse.ArgumentTypeError(f"{value!r}: N must be 2 or more and K one of 0 .. N-1")
    return k, n


def beir_judgments(folder: Path, split: str = "train", held_out: str = "test",
                   held_out_share: float | None = None) -> Judged:
    """The qrels of ``split``, minus any query that the held-out split also judges. With
    ``held_out_share`` (for a collection that ships one split, as Cranfield does) that share of the split's
    queries, chosen by a stable hash of the query id (``tuning.split_queries``), is held out instead and
    listed, so an evaluation can use exactly those."""
    qrels = read_qrels(folder / "qrels" / f"{split}.tsv")
    if held_out_share is not None:
        from relevance.tuning import split_queries

        train, test = split_queries(qrels, held_out_share)
        qrels = {q: qrels[q] for q in train}
        judged = beir_judgments_of(folder, qrels, f"{folder} qrels/{split}.tsv",
                                   f"{held_out_share:.0%} of qrels/{split}.tsv by query-id hash", len(test))
        judged.held_out_ids = test
        return judged
    held = folder / "qrels" / f"{held_out}.tsv"
    overlap = set(qrels) & set(read_qrels(held)) if held.is_file() else set()
    for qid in overlap:
        del qrels[qid]
    return beir_judgments_of(folder, qrels, f"{folder} qrels/{split}.tsv", f"qrels/{held_out}.tsv", len(overlap))


def beir_judgments_of(folder: Path, qrels: dict[str, dict[str, int]], source: str, held_out: str,
                      dropped: int) -> Judged:
    queries = {}
    with open(folder / "queries.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                q = json.loads(line)
                if str(q["_id"]) in qrels:
                    queries[str(q["_id"])] = q["text"]
    return Judged(queries, qrels, source, held_out, dropped)


def service_judgments(root: Path, held_out_ids: Iterable[str] = ()) -> Judged:
    """What ``POST /feedback`` stored under ``ROOT/judgments`` (every tenant's: an operator's export)."""
    texts, qrels = judgments_of(root).qrels()
    held = set(held_out_ids)
    dropped = len(set(qrels) & held)
    qrels = {q: d for q, d in qrels.items() if q not in held}
    return Judged({q: texts[q] for q in qrels}, qrels, f"{root}/judgments", "held-out query ids" if held else "none",
                  dropped)


def positive_pairs(judged: Judged, corpus: dict[str, str]) -> list[Pair]:
    return [Pair(qid, judged.queries[qid], did, corpus[did])
            for qid, docs in sorted(judged.qrels.items()) for did, grade in sorted(docs.items())
            if grade > 0 and did in corpus and qid in judged.queries]


def mine_negatives(pairs: list[Pair], index: Path, corpus: dict[str, str], judged: Judged, depth: int = 30,
                   progress=None, count: int = 1) -> list[Pair]:
    """Each pair with the best-ranked hybrid candidates of its query that are not judged relevant to it:
    up to ``count`` documents, best first (none when the first ``depth`` results hold nothing else)."""
    from deployments.config import RouterSettings
    from deployments.edge.schemas import SearchRequest
    from deployments.search.inprocess import inprocess_pipeline
    from index_format.versions import resolve_version_dir

    pipeline = inprocess_pipeline({"default": resolve_version_dir(index)}, RouterSettings(cache_size=0))
    negatives_of: dict[str, list[str]] = {}

    async def mine(qids: list[str]) -> None:
        for qid in qids:
            response = await pipeline.search(SearchRequest(query=judged.queries[qid], limit=depth))
            relevant = {d for d, g in judged.qrels[qid].items() if g > 0}
            misses = dict.fromkeys(r.doc_id for r in response.results
                                   if r.doc_id not in relevant and r.doc_id in corpus)
            negatives_of[qid] = list(misses)[:count]  # a document once, at its best chunk's rank
            if progress:
                progress(1)

    asyncio.run(mine(sorted({p.query_id for p in pairs})))
    out = []
    for p in pairs:
        first, *more = negatives_of.get(p.query_id) or [None]
        out.append(Pair(p.query_id, p.query, p.doc_id, p.doc_text, first, corpus[first] if first else None,
                        tuple((d, corpus[d]) for d in more)))
    return out


def index_documents(index: Path) -> dict[str, str]:
    """doc id -> "title\\ntext" from an index version's stored documents (``documents.parquet`` per shard;
    a version built before those were stored gives each document's chunks joined)."""
    import pyarrow.parquet as pq

    from index_format.manifest import DOCUMENTS_FILE
    from index_format.versions import resolve_version_dir

    version_dir = resolve_version_dir(index, None)  # a root in object storage: its copy in the node's cache
    out: dict[str, str] = {}
    for shard in sorted((version_dir / "shards").iterdir()):
        if (shard / DOCUMENTS_FILE).is_file():
            t = pq.read_table(shard / DOCUMENTS_FILE, columns=["doc_id", "title", "text"])
            for did, title, text in zip(*(t[c].to_pylist() for c in ("doc_id", "title", "text")), strict=True):
                out[did] = f"{title}\n{text}" if title and text else (text or title)
        else:
            t = pq.read_table(shard / "chunks.parquet", columns=["doc_id", "title", "text"])
            parts: dict[str, list[str]] = {}
            titles: dict[str, str] = {}
            for did, title, text in zip(*(t[c].to_pylist() for c in ("doc_id", "title", "text")), strict=True):
                parts.setdefault(did, []).append(text)
                titles.setdefault(did, title)
            for did, texts in parts.items():
                out[did] = f"{titles[did]}\n{' '.join(texts)}" if titles[did] else " ".join(texts)
    return out


# ------------------------------------------------------------------ what both training commands share

def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; give 0 (in-batch negatives only) or more")
    return value


def build_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", type=Path, help="a BEIR folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv)")
    source.add_argument("--judgments", metavar="ROOT",
                        help="an index root whose judgments/ POST /feedback wrote")
    ap.add_argument("--train-split", default="train", metavar="SPLIT",
                    help="the qrels split trained on, with --data (default: %(default)s)")
    ap.add_argument("--test-split", default="test", metavar="SPLIT",
                    help="the qrels split never trained on, with --data; its queries are dropped from training "
                         "(default: %(default)s)")
    ap.add_argument("--held-out-share", type=float, default=None, metavar="SHARE",
                    help="with --data whose only split is --train-split: hold out this share of its queries (by a "
                         "stable hash of the query id) instead of another split; their ids go into training.json")
    ap.add_argument("--leave-out-fold", type=parse_fold, default=None, metavar="K/N",
                    help="also leave out the training queries of fold K of N (by a hash of the query id; their ids "
                         "go into training.json): train one model per fold to cross-fit a ranker on its scores "
                         "(relevance.train_ranker --cross-fit)")
    ap.add_argument("--index", required=True, metavar="ROOT",
                    help="the index whose hybrid candidates give the hard negatives (root or version folder)")
    ap.add_argument("--out", type=Path, required=True, help="the folder the trained model is written to")
    ap.add_argument("--epochs", type=float, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-5, help="learning rate (default: %(default)s)")
    ap.add_argument("--negative-depth", type=int, default=30,
                    help="hybrid candidates searched for each query's hard negatives (default: %(default)s)")
    ap.add_argument("--hard-negatives", type=_count, default=1, metavar="N",
                    help="hard negatives per pair: the N best-ranked candidates not judged relevant (default: "
                         "%(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-steps", type=int, default=20, help="a checkpoint every this many steps")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def load_pairs(args: argparse.Namespace) -> tuple[list, dict]:
    """The training pairs with their hard negatives, and what training.json says of the data."""
    if args.data is not None:
        judged = beir_judgments(args.data, args.train_split, args.test_split, args.held_out_share)
        corpus = read_corpus(args.data / "corpus.jsonl")  # all of it: negatives come from anywhere
    else:
        judged = service_judgments(args.judgments)
        corpus = index_documents(args.index)
    judged = leave_out_fold(judged, args.leave_out_fold)
    pairs = positive_pairs(judged, corpus)
    if not pairs:
        raise SystemExit(f"no relevant judgment in {judged.source} names a document of the corpus: nothing to train")
    from tqdm import tqdm

    with tqdm(total=len({p.query_id for p in pairs}), desc="mining negatives", unit="query",
              disable=args.no_progress) as bar:
        pairs = mine_negatives(pairs, args.index, corpus, judged, args.negative_depth, bar.update,
                               args.hard_negatives)
    data = {"source": judged.source, "held_out": judged.held_out,
            "held_out_queries_dropped": judged.held_out_queries, "queries": len({p.query_id for p in pairs}),
            "pairs": len(pairs), "pairs_with_hard_negative": sum(p.negative_id is not None for p in pairs),
            "hard_negatives": args.hard_negatives,
            "negatives_from": str(args.index)}
    if judged.held_out_ids is not None:
        data["held_out_query_ids"] = judged.held_out_ids
    if judged.left_out_ids is not None:
        data["left_out_fold"] = list(args.leave_out_fold)
        data["left_out_query_ids"] = judged.left_out_ids
    return pairs, data


def training_rows(pairs: list, hard_negatives: int = 1) -> dict[str, list[str]]:
    """(anchor, positive, negative) columns, or (anchor, positive, negative_1 .. negative_N) with N hard
    negatives. Every row needs all N (the loss takes columns): pairs with fewer are left out when they are
    few (under 10%), else every pair is kept and only in-batch negatives are used."""
    complete = [p for p in pairs if len(p.negatives) >= hard_negatives]
    if hard_negatives < 1 or len(complete) < 0.9 * len(pairs):
        return {"anchor": [p.query for p in pairs], "positive": [p.doc_text for p in pairs]}
    rows = {"anchor": [p.query for p in complete], "positive": [p.doc_text for p in complete]}
    names = ["negative"] if hard_negatives == 1 else [f"negative_{i}" for i in range(1, hard_negatives + 1)]
    for i, name in enumerate(names):
        rows[name] = [p.negatives[i] for p in complete]
    return rows


def last_checkpoint(folder: Path) -> str | None:
    done = sorted(folder.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1])) if folder.is_dir() else []
    return str(done[-1]) if done else None


