"""The events of a streamed answer (``POST /search`` with ``synthesize`` and ``stream``), one NDJSON line each:
one ``results`` (the search response), ``token`` events as the answer is written (raw: its citations not yet
checked), then one ``answer`` (the checked answer), or one ``error`` when synthesis failed after the results were
sent (deployments/search/response.py, ``Responder.stream_answer``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, TypeAdapter

from raysearch_client.models import Answer, SearchResponse


class ResultsEvent(SearchResponse):
    type: Literal["results"] = "results"


class TokenEvent(BaseModel):
    type: Literal["token"] = "token"
    text: str


class AnswerEvent(Answer):
    type: Literal["answer"] = "answer"


class ErrorEvent(BaseModel):
    """Synthesis failed (or passed its deadline): no answer, the results event stands."""

    type: Literal["error"] = "error"
    error: str


AnswerStreamEvent = Annotated[ResultsEvent | TokenEvent | AnswerEvent | ErrorEvent, Field(discriminator="type")]
_EVENT: TypeAdapter[AnswerStreamEvent] = TypeAdapter(AnswerStreamEvent)


def event(line: str | bytes) -> AnswerStreamEvent:
    """One NDJSON line as its event."""
    return _EVENT.validate_json(line)
