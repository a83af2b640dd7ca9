"""A typed client of the raysearch service, installable alone (``pip install ./client``: httpx and pydantic only).

    from raysearch_client import SearchClient

    with SearchClient("http://127.0.0.1:8000") as client:
        page = client.search("how do I parse arguments", limit=5)
        for result in page.results:
            print(result.rank, result.score, result.doc_id)
        for page in client.pages("gzip", limit=10):      # follows next_cursor to the last page
            ...
        answers = client.search_batch(["gzip", {"query": "tar", "method": "keyword"}])

Requests and answers are the API's models (``raysearch_client.models``, generated from the server's): a typo in a
field is a ``ValidationError`` before anything is sent, and an answer is a ``SearchResponse``, not a dict.
"""

from raysearch_client.calls import BuildFailed, SearchServiceError
from raysearch_client.client import AsyncSearchClient, SearchClient
from raysearch_client.events import AnswerEvent, AnswerStreamEvent, ErrorEvent, ResultsEvent, TokenEvent

__all__ = ["AnswerEvent", "AnswerStreamEvent", "AsyncSearchClient", "BuildFailed", "ErrorEvent", "ResultsEvent",
           "SearchClient", "SearchServiceError", "TokenEvent"]
