"""Multi-node on one machine (Ray's test cluster: 3 raylets): shards placed by resources on the worker
nodes, spread over them, and a worker node removed under load costs no request. Runs ``bench.multinode``
in a child process, since this process already holds the suite's own single-node Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow  # `make test-slow`: about a minute and a 3-raylet cluster, beside the suite's own Ray
def test_shards_spread_over_nodes_and_a_node_removed_under_load(built, tmp_path):
    _, summary = built[3]
    out = tmp_path / "multinode.json"
    root = Path(__file__).parents[2]
    env = os.environ | {"PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-m", "bench.multinode", "--index", str(summary.version_dir),
                           "--seconds", "8", "--port", "18473", "--out", str(out)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    nodes = record["replicas_per_node"]
    shards = {node: [r for r in replicas if "-group-" in r] for node, replicas in nodes.items()}
    assert not shards.get("head"), nodes  # shards only where the search_node resource is
    assert "router" in nodes["head"], nodes  # the ingress where router.resources put it
    # The default: one group of all 3 shards per replica, its 2 replicas on 2 different nodes.
    assert sum("default-group-000" in v for v in shards.values()) == 2, nodes
    assert record["requests"] > record["requests_before_removal"] > 0
    assert record["failed"] == 0, record["errors"]
