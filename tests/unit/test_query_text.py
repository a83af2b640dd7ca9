import pytest

from deployments.search.query_text import expand_synonyms, expand_with_history, normalize_query


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("  Ray   Serve\tbatching\n", "Ray Serve batching"),
        ("ｆｕｌｌｗｉｄｔｈ　ＡＢＣ１２３", "fullwidth ABC123"),  # NFKC folds width; U+3000 is whitespace
        ("ﬁle\u00a0size", "file size"),  # ligature and no-break space
        ('title:"BM25" AND (k1 OR b)?', 'title:"BM25" AND (k1 OR b)?'),  # case and syntax kept
        ("   ", ""),
    ],
)
def test_normalize_query(raw, expected):
    assert normalize_query(raw) == expected


SYNONYMS = {
    "db": ["database", "DBMS"],
    "vector search": ["ANN", "nearest neighbour"],
    "c++": ["cpp"],
}


@pytest.mark.parametrize(
    ("query", "expanded", "added"),
    [
        ("Which DB is fast", "Which DB is fast database DBMS", ["database", "DBMS"]),
        ("dbms tuning", "dbms tuning", []),  # "db" is not a whole word here
        ("mongodb setup", "mongodb setup", []),  # nor here
        ("Vector   Search at scale", "Vector   Search at scale ANN nearest neighbour", ["ANN", "nearest neighbour"]),
        ("db or database?", "db or database? DBMS", ["DBMS"]),  # already present: not added again
        ("c++ db", "c++ db database DBMS cpp", ["database", "DBMS", "cpp"]),  # mapping order
        ("nothing here", "nothing here", []),
    ],
)
def test_expand_synonyms(query, expanded, added):
    assert expand_synonyms(query, SYNONYMS) == (expanded, added)


def test_synonyms_are_not_transitive_and_not_repeated():
    synonyms = {"car": ["auto", "automobile"], "auto": ["vehicle"], "automobile": ["auto"]}
    assert expand_synonyms("car rental", synonyms) == ("car rental auto automobile", ["auto", "automobile"])
    assert expand_synonyms("db and sql", {"db": ["database"], "sql": ["Database", "query"]}) == (
        "db and sql database query", ["database", "query"])  # added once, whichever key brings it
    assert expand_synonyms("", synonyms) == ("", [])
    assert expand_synonyms("car", {}) == ("car", [])


HISTORY = [
    {"role": "user", "content": "How does  Lucene score documents?"},
    {"role": "assistant", "content": "With BM25."},
    "what about k1",
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "and b?"},
]


def test_history_most_recent_user_turns_first():
    assert expand_with_history("what is the default", HISTORY) == "what is the default and b? what about k1"
    assert expand_with_history("what is the default", HISTORY, turns=3) == (
        "what is the default and b? what about k1 How does Lucene score documents?"
    )


def test_history_skips_the_current_query_and_odd_items():
    history = [*HISTORY, {"role": "user", "content": "What is the  default"}, {"role": "user", "content": None},
               {"role": "user", "content": [{"type": "text", "text": "parts"}]}, {"role": "user"}]
    assert expand_with_history("what is the default", history, turns=1) == "what is the default and b?"


def test_history_cap_cuts_on_a_word():
    # " and b?" costs 7 characters; " what about k1" would need 14 more.
    assert expand_with_history("q", HISTORY, max_chars=7) == "q and b?"
    assert expand_with_history("q", HISTORY, max_chars=7 + 11) == "q and b? what about"
    assert expand_with_history("q", HISTORY, max_chars=6) == "q and"
    assert expand_with_history("q", ["supercalifragilistic"], max_chars=5) == "q"


@pytest.mark.parametrize("kwargs", [{"turns": 0}, {"max_chars": 0}])
def test_history_off(kwargs):
    assert expand_with_history("q", HISTORY, **kwargs) == "q"


def test_no_history_and_empty_query():
    assert expand_with_history("q", []) == "q"
    assert expand_with_history("", ["earlier question"]) == "earlier question"
