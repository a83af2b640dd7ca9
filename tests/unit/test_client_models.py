"""The client's models cannot drift from the server's: each has the JSON schema of the server model of the same
name (deployments.edge.schemas), field names, types, required fields, defaults, enums, limits, titles and
descriptions alike, and models.py is what ``python -m client.generate`` writes today."""

from __future__ import annotations

import pytest
from raysearch_client import models

from client import generate


def differences(server, client, path: str = "") -> list[str]:
    """Where two JSON schemas differ, as ``path: server's != client's``."""
    if isinstance(server, dict) and isinstance(client, dict):
        return [d for key in sorted(server.keys() | client.keys(), key=str)
                for d in differences(server.get(key), client.get(key), f"{path}.{key}" if path else str(key))]
    if isinstance(server, list) and isinstance(client, list) and len(server) == len(client):
        return [d for i, (s, c) in enumerate(zip(server, client, strict=True)) for d in differences(s, c, f"{path}[{i}]")]
    return [] if server == client else [f"{path}: {server!r} != {client!r}"]


PAIRS = sorted({name: cls for root in generate.ROOTS for name, cls in generate.classes(root, {}).items()}.items())


@pytest.mark.parametrize("mode", ["validation", "serialization"])
@pytest.mark.parametrize("name,server", PAIRS, ids=[name for name, _ in PAIRS])
def test_each_client_model_has_the_server_model_s_schema(name, server, mode):
    found = differences(server.model_json_schema(mode=mode), getattr(models, name).model_json_schema(mode=mode))
    assert found == [], f"raysearch_client.models.{name} differs from the server's (run python -m client.generate): {found}"


def test_models_py_is_what_the_generator_writes_today():
    assert generate.MODELS_PY.read_text() == generate.render(), \
        "client/raysearch_client/models.py is stale: run python -m client.generate"


def test_server_only_checks_stay_on_the_server_and_the_schema_s_limits_come_along():
    """Validators are not copied (the server answers them with a 422); every limit of the schema is."""
    assert models.SearchRequest(query="q", stream=True).stream  # the server refuses stream without synthesize
    with pytest.raises(ValueError, match="less than or equal to 100"):
        models.SearchRequest(query="q", limit=101)
    with pytest.raises(ValueError, match="Extra inputs"):
        models.SearchRequest(query="q", limt=5)
