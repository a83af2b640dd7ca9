import pytest

from relevance.qrels import QrelsError, read_qrels


def test_beir_and_trec_layouts_read_the_same(tmp_path):
    beir = tmp_path / "beir.tsv"
    beir.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t0\n\nq2\td9\t2\n")
    trec = tmp_path / "trec.txt"
    trec.write_text("q1 0 d1 1\nq1 0 d2 0\nq2\tQ0\td9\t2\n")
    expected = {"q1": {"d1": 1, "d2": 0}, "q2": {"d9": 2}}
    assert read_qrels(beir) == read_qrels(trec) == expected


@pytest.mark.parametrize("line,says", [("q1\td1\n", "expected"), ("q1 d1 x 1 extra\n", "expected"),
                                       ("q1\td1\tyes\n", "not an integer")])
def test_a_malformed_line_names_the_file_and_line(tmp_path, line, says):
    path = tmp_path / "bad.tsv"
    path.write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\n" + line)
    with pytest.raises(QrelsError, match=rf"bad.tsv:3: .*{says}"):
        read_qrels(path)


def test_every_reader_is_this_one():
    from bench import common
    from relevance import evaluate, training, tune

    assert evaluate.read_qrels is tune.read_qrels is training.read_qrels is read_qrels
    assert "read_qrels" in common.load_beir.__code__.co_names
