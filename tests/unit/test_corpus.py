import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from index_build.corpus import BadRecord, CorpusError, Document, iter_documents, resolve_corpus_file


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_beir_folder_reads_corpus_jsonl_with_metadata(tmp_path):
    (tmp_path / "qrels").mkdir()
    _write(tmp_path / "corpus.jsonl", [json.dumps({"_id": "a", "title": "T", "text": "x y", "metadata": {"year": 1999}})])
    (doc,) = list(iter_documents(tmp_path))
    assert doc == Document("a", "T", "x y", {"year": 1999}, f"{tmp_path / 'corpus.jsonl'}:1")


def test_extra_fields_pass_through_for_filtering(tmp_path):
    f = _write(tmp_path / "c.jsonl", [json.dumps({"id": 7, "contents": "hello", "lang": "en", "tags": ["a", "b"],
                                                   "nested": {"k": 1}})])
    (doc,) = list(iter_documents(f))
    assert doc.doc_id == "7" and doc.text == "hello"
    assert doc.metadata == {"lang": "en", "tags": ["a", "b"], "nested": '{"k": 1}'}


def test_bad_records_are_reported_with_file_and_line(tmp_path):
    f = _write(tmp_path / "c.jsonl", [
        json.dumps({"_id": "a", "text": "fine"}),
        "{not json",
        json.dumps({"text": "no id"}),
        json.dumps({"_id": "b", "text": "   "}),
        json.dumps({"_id": "a", "text": "dup"}),
        json.dumps(["not", "an", "object"]),
        "",
        json.dumps({"_id": "c", "title": "title only"}),
    ])
    items = list(iter_documents(f))
    good = [i for i in items if isinstance(i, Document)]
    bad = [i for i in items if isinstance(i, BadRecord)]
    assert [d.doc_id for d in good] == ["a", "c"]
    assert [(b.line, b.reason.split(":")[0].split(" (")[0]) for b in bad] == [
        (2, "malformed JSON"), (3, "missing id"), (4, "doc 'b'"), (5, "duplicate id 'a'"), (6, "expected a JSON object, got list"),
    ]
    assert all(b.file == str(f) for b in bad)
    assert "empty text" in bad[2].reason
    assert str(bad[0]).startswith(f"{f}:2: malformed JSON")


def test_parquet_rows_count_as_lines(tmp_path):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"doc_id": ["x", "y", "x"], "text": ["one", "two", "three"], "year": [1, 2, 3]}), path)
    items = list(iter_documents(path))
    assert [type(i).__name__ for i in items] == ["Document", "Document", "BadRecord"]
    assert items[0].metadata == {"year": 1}
    assert items[2].line == 3


@pytest.mark.parametrize("name", ["missing.jsonl", "corpus.txt", "empty_dir"])
def test_unreadable_corpus_paths_fail_clearly(tmp_path, name):
    path = tmp_path / name
    if name == "empty_dir":
        path.mkdir()
    if name == "corpus.txt":
        path.write_text("x")
    with pytest.raises(CorpusError):
        resolve_corpus_file(path)
