"""Pages read through cursors while documents are written: every page answered, no result repeated, no rank
skipped, and none of the writes made after a search's first page in its later pages.

Serves a copy of ``--index`` (its active version in a scratch root, so the writes land there) with
``python -m deployments`` and, for ``--seconds``, writes ``--writes-per-s`` documents a second through
``PUT /collections/default/documents`` (texts of the corpus's documents under new ids, so they rank for its
queries; every third write also deletes a document written before). Meanwhile one client reads each query's pages
to the end with the project's client (``SearchClient.pages``: ``--limit`` a page, ``--candidates`` ranked). For
each search: the pages it got, 409s (a page refused), repeats, whether ranks run 1..N without a gap, and results
of documents written after its first page (the cursor names that write). ``--repo`` serves another checkout of the
project (an earlier commit, for the figure before a change) with this environment.

    python -m bench.cursor_paging --index INDEX --data ../shared/data/scifact --seconds 60
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from raysearch_client import SearchClient, SearchServiceError

from bench.common import load_beir, machine, started_service, write_record


def scratch_root(index: Path, into: Path) -> Path:
    """A root holding ``index``'s active version and nothing else: the writes' change log lands beside it."""
    active = (index / "ACTIVE").read_text().strip()
    root = into / "root"
    shutil.copytree(index / "versions" / active, root / "versions" / active)
    shutil.copy(index / "ACTIVE", root / "ACTIVE")
    return root


def first_write(cursor: str) -> int:
    """The write a cursor's point in time names (its collection's last applied write at the first page)."""
    body = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    return int(body.get("w", {}).get("default", 0))


class Writer(threading.Thread):
    """Upserts corpus texts under new ids at a steady rate; every third write deletes an earlier one. Keeps each
    acknowledged write's seq by document id (the latest upsert's)."""

    def __init__(self, base: str, texts: list[str], per_s: float):
        super().__init__(daemon=True)
        self.base, self.texts, self.per_s = base, texts, per_s
        self.stop, self.written, self.deleted, self.failed = threading.Event(), {}, {}, []

    def run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=60) as http:
            start, i = time.monotonic(), 0
            while not self.stop.is_set():
                time.sleep(max(0.0, start + i / self.per_s - time.monotonic()))
                doc_id = f"written-{i}"
                body = {"documents": [{"id": doc_id, "text": self.texts[i % len(self.texts)]}]}
                r = http.put("/collections/default/documents", json=body)
                if r.status_code == 200:
                    self.written[doc_id] = r.json()["seq"]
                else:
                    self.failed.append(r.status_code)
                if i % 3 == 2 and f"written-{i - 2}" in self.written:
                    gone = f"written-{i - 2}"
                    r = http.post("/collections/default/documents/delete", json={"ids": [gone]})
                    if r.status_code == 200:
                        self.deleted[gone] = r.json()["seq"]
                i += 1


def read_pages(base: str, query: str, limit: int, candidates: int) -> dict:
    """One search followed to its last page: what each page held, and how the chain ended."""
    pages, error, cursor = [], None, None
    with SearchClient(base, timeout=60, max_retries=3) as client:
        try:
            for page in client.pages(query, limit=limit, candidates=candidates):
                cursor = cursor or page.next_cursor
                pages.append([(r.rank, r.doc_id, r.chunk_id) for r in page.results])
        except SearchServiceError as e:
            error = e.status
    return {"pages": pages, "error": error, "first_write": first_write(cursor) if cursor else None}


def check(chain: dict, writer: Writer) -> dict:
    """A chain's figures: pages, refused, repeats, ranks 1..N unbroken, results of written documents, and of those
    written after its first page."""
    results = [r for page in chain["pages"] for r in page]
    ids = [cid for _, _, cid in results]
    seq = chain["first_write"]
    later = [doc for _, doc, _ in results[len(chain["pages"][0]) if chain["pages"] else 0:]
             if seq is not None and writer.written.get(doc, 0) > seq]
    written = sum(doc in writer.written for _, doc, _ in results)  # the writes do reach the rankings
    return {"pages": len(chain["pages"]), "refused": chain["error"], "results": len(results), "written_seen": written,
            "repeats": len(ids) - len(set(ids)), "ranks_whole": [r for r, _, _ in results] == list(range(1, len(ids) + 1)),
            "written_after_first_page": len(later)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--index", type=Path, required=True, help="an index root (its active version is copied)")
    p.add_argument("--data", type=Path, required=True, help="a BEIR dataset: its test queries and corpus texts")
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--writes-per-s", type=float, default=3)
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--candidates", type=int, default=100)
    p.add_argument("--port", type=int, default=18431)
    p.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1],
                   help="the checkout whose python -m deployments serves (default: this one)")
    p.add_argument("--out", type=Path, default=Path("bench/results/cursor_paging.json"))
    args = p.parse_args(argv)

    queries, _ = load_beir(args.data)
    corpus = [json.loads(line) for line in (args.data / "corpus.jsonl").read_text().splitlines() if line.strip()]
    texts = [f"{d.get('title', '')} {d['text']}" for d in corpus[:2000]]
    with tempfile.TemporaryDirectory() as tmp:
        root = scratch_root(args.index, Path(tmp))
        cmd = [sys.executable, "-m", "deployments", "--index", str(root), "--port", str(args.port)]
        started = time.time()
        with started_service(cmd, args.port, cwd=args.repo) as service:
            writer = Writer(service.base, texts, args.writes_per_s)
            writer.start()
            chains, ends = [], time.monotonic() + args.seconds
            for query in list(queries.values()):
                if time.monotonic() > ends:
                    break
                chains.append(check(read_pages(service.base, query, args.limit, args.candidates), writer))
            writer.stop.set()
            writer.join(60)
    pages = sum(c["pages"] for c in chains)
    totals = {"searches": len(chains), "pages": pages, "refused": sum(c["refused"] is not None for c in chains),
              "repeats": sum(c["repeats"] for c in chains), "ranks_whole": sum(c["ranks_whole"] for c in chains),
              "written_after_first_page_seen": sum(c["written_after_first_page"] for c in chains),
              "results_of_written_documents": sum(c["written_seen"] for c in chains),
              "writes": len(writer.written), "deletes": len(writer.deleted), "writes_failed": len(writer.failed)}
    print(json.dumps(totals, indent=1))
    write_record(args.out, {"command": " ".join(["python -m bench.cursor_paging", *(argv or sys.argv[1:])]),
                            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)),
                            "repo": str(args.repo), "machine": machine(), "totals": totals, "searches": chains})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
